"""The parts of `synapse.humans` on their own: signed links, the TOML configuration and its
errors, and what each channel's message says."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from synapse.humans import HumansConfigError, humans_config_from_toml
from synapse.humans.links import LinkRefused, LinkSigner
from synapse.humans.notices import Notice, Option, email_message, slack_body, teams_body

KEY = b"unit-link-key-0123456789abcdef"


# --- links -----------------------------------------------------------------------------------


def test_a_link_reads_back_what_was_signed() -> None:
    signer = LinkSigner(KEY)
    token = signer.sign("task-1", "approve", "alice", time.time() + 60, nonce="n1")
    link = signer.read(token, time.time())
    assert (link.task_id, link.action, link.reviewer, link.nonce) == (
        "task-1",
        "approve",
        "alice",
        "n1",
    )
    other = signer.sign("task-1", "approve", "alice", time.time() + 60)
    assert signer.read(other, time.time()).nonce != "n1"  # a fresh nonce each time


@pytest.mark.parametrize(
    "tamper",
    [
        lambda t: t[:-1] + ("A" if t[-1] != "A" else "B"),  # the signature
        lambda t: "x" + t,  # the claims
        lambda t: t.replace(".", ""),  # no signature at all
        lambda t: t + "." + t,  # two dots
        lambda t: "A" * 2000,  # too long to read
    ],
)
def test_a_changed_token_is_refused_as_forged(tamper: Any) -> None:
    signer = LinkSigner(KEY)
    token = signer.sign("task-1", "approve", "alice", time.time() + 60)
    with pytest.raises(LinkRefused) as refused:
        signer.read(tamper(token), time.time())
    assert refused.value.status == 403


def test_a_link_of_another_key_or_past_its_expiry_is_refused() -> None:
    foreign = LinkSigner(b"another-key-0123456789abcdef").sign("t", "approve", "a", 2e9)
    with pytest.raises(LinkRefused) as refused:
        LinkSigner(KEY).read(foreign, time.time())
    assert refused.value.status == 403
    expired = LinkSigner(KEY).sign("t", "reject", "a", time.time() - 1)
    with pytest.raises(LinkRefused) as refused:
        LinkSigner(KEY).read(expired, time.time())
    assert refused.value.status == 410 and "expired" in refused.value.reason


def test_a_signed_token_with_an_unknown_action_is_refused() -> None:
    signer = LinkSigner(KEY)
    token = signer.sign("t", "delete", "a", time.time() + 60)  # type: ignore[arg-type]
    with pytest.raises(LinkRefused):
        signer.read(token, time.time())


# --- the TOML configuration ------------------------------------------------------------------


def humans_table(**more: Any) -> dict[str, Any]:
    return {
        "link_secret": "k" * 20,
        "reviewer": [{"id": "alice", "email": "a@example.com", "role": "lead"}],
        "channel": [
            {"name": "mail", "kind": "email", "smtp_host": "mx", "password": "p"},
            {"name": "room", "kind": "slack", "url": "https://hooks.example/x"},
        ],
        **more,
    }


def route(**more: Any) -> dict[str, Any]:
    return {"name": "r", "level": [{"reviewers": ["alice"], "channels": ["mail"]}], **more}


def test_a_full_configuration_reads_as_written(tmp_path: Path) -> None:
    (tmp_path / "schema.json").write_text('{"type": "object"}')
    config = humans_config_from_toml(
        humans_table(public_url="https://agents.example"),
        [
            route(
                task_types=["portrait"],
                reason_codes=["low_confidence"],
                reminders=[0.5, 0.9],
                on_timeout="approve_default",
                timeout_margin="30s",
                decide_within="2h",
                quorum=2,
                schema_file="schema.json",
                level=[
                    {"reviewers": ["alice"], "channels": ["mail", "room"], "within": "10m"},
                    {"reviewers": ["alice"], "channels": ["room"]},
                ],
            )
        ],
        base=tmp_path,
    )
    (r,) = config.routes
    assert r.task_types == frozenset({"portrait"}) and r.reminders == (0.5, 0.9)
    assert r.decide_within == 7200.0 and r.timeout_margin == 30.0 and r.quorum == 2
    assert r.levels[0].within == 600.0 and r.levels[1].within is None
    assert r.schema == {"type": "object"}
    assert config.channels["mail"].smtp_port == 587 and config.channels["mail"].starttls
    assert config.reviewers["alice"].role == "lead"
    assert config.public_url == "https://agents.example"
    chosen = config.route_for(
        task_type="portrait", partner="p", question="need_human", reason_code="other", level=1
    )
    assert chosen is None  # reason code not routed


@pytest.mark.parametrize(
    ("humans", "notify", "said"),
    [
        ({"link_secret": "short"}, [], "at least 16 bytes"),
        (humans_table(), [route(level=[{"reviewers": ["bob"], "channels": ["mail"]}])], "bob"),
        (humans_table(), [route(level=[{"reviewers": ["alice"], "channels": ["fax"]}])], "fax"),
        (humans_table(), [route(level=[])], "at least one level"),
        (humans_table(), [route(reminders=[1.5])], "fractions"),
        (humans_table(), [route(on_timeout="explode")], "on_timeout"),
        (humans_table(), [route(quorum=0)], "quorum"),
        (humans_table(), [route(schema={"type": 5})], "bad schema"),
        (humans_table(), [route(colour="red")], "unknown key 'colour'"),
        (humans_table(), [route(questions=["need_money"])], "need_human and need_info"),
        (
            humans_table(channel=[{"name": "h", "kind": "webhook", "url": "ftp://x"}]),
            [],
            "needs an http(s) url",
        ),
        (humans_table(channel=[{"name": "h", "kind": "pager"}]), [], "kind must be"),
        ({"reviewer": []}, [], "needs link_secret"),
    ],
)
def test_a_wrong_configuration_says_where(
    humans: dict[str, Any], notify: list[dict[str, Any]], said: str, tmp_path: Path
) -> None:
    with pytest.raises(HumansConfigError, match=said.replace("(", r"\(").replace(")", r"\)")):
        humans_config_from_toml(humans, notify, base=tmp_path)


# --- what the channels say -------------------------------------------------------------------


def notice(**more: Any) -> Notice:
    values: dict[str, Any] = {
        "kind": "notify",
        "task_id": "task-1",
        "task_type": "portrait",
        "partner": "agent-e",
        "question": "need_human",
        "level": 1,
        "reason_code": "low_confidence",
        "reason": "a <b>bold</b> & risky choice",
        "summary": "Paint Ada",
        "deadline": 1_800_000_000.0,
        "key": "task-1/q/notify:1/mail/alice",
        "options": (Option("width", 1024, "sharper", 80.0),),
        "links": {"approve": "https://a.example/humans/links/T1"},
    }
    return Notice(**(values | more))


def test_an_email_carries_the_question_its_links_and_a_stable_message_id() -> None:
    message = email_message(notice(), sender="synapse@example.com", to="alice@example.com")
    assert message["Message-ID"] == "<task-1/q/notify.1/mail/alice@example.com>"
    assert message["X-Synapse-Notification"] == "task-1/q/notify:1/mail/alice"
    text = message.get_body(preferencelist=("plain",)).get_content()  # type: ignore[union-attr]
    assert "width = 1024 (confidence 80%)" in text and "Approve: https://a.example" in text
    html = message.get_body(preferencelist=("html",)).get_content()  # type: ignore[union-attr]
    assert "&lt;b&gt;bold&lt;/b&gt; &amp; risky" in html  # escaped, never markup


def test_slack_text_is_escaped_and_teams_gets_an_adaptive_card() -> None:
    slack = slack_body(notice())
    section = slack["blocks"][1]["text"]
    assert section["type"] == "mrkdwn" and "&lt;b&gt;bold&lt;/b&gt; &amp; risky" in section["text"]
    (button,) = slack["blocks"][-1]["elements"]
    assert button["style"] == "primary" and button["url"].endswith("/T1")
    card = teams_body(notice())["attachments"][0]["content"]
    assert card["actions"] == [
        {"type": "Action.OpenUrl", "title": "Approve", "url": "https://a.example/humans/links/T1"}
    ]
    facts = {f["title"]: f["value"] for f in card["body"][1]["facts"]}
    assert facts["Reason"] == "low_confidence: a <b>bold</b> & risky choice"  # Teams: plain


def test_routes_match_by_task_type_partner_question_reason_and_level(tmp_path: Path) -> None:
    config = humans_config_from_toml(
        humans_table(),
        [
            route(
                name="exact",
                task_types=["portrait"],
                partners=["agent-e"],
                questions=["need_human"],
                reason_codes=["low_confidence"],
                min_escalation_level=2,
            ),
            route(name="any-info", questions=["need_info"]),
            route(name="fallback"),
        ],
        base=tmp_path,
    )
    ask = {
        "task_type": "portrait",
        "partner": "agent-e",
        "question": "need_human",
        "reason_code": "low_confidence",
        "level": 2,
    }

    def chosen(**change: Any) -> str | None:
        found = config.route_for(**(ask | change))
        return found.name if found is not None else None

    assert chosen() == "exact"
    for change in (
        {"task_type": "echo"},
        {"partner": "agent-x"},
        {"reason_code": "other"},
        {"level": 1},
    ):
        assert chosen(**change) == "fallback", change  # the first route that matches
    assert chosen(question="need_info") == "any-info"
