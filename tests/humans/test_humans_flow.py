"""Human decisions where the people are, between two real peers over loopback HTTP: the
requester's people get an e-mail (a real SMTP server: STARTTLS and login) and webhooks (the
generic JSON, Slack's and Teams' formats); a signed link decides after its confirmation page;
forged, replayed and expired links, and an edit its schema refuses, change nothing; a quorum
sends one decision; an unanswered question escalates and times out by policy; need_info is
answered from a form; every step is in the task's hash-chained audit trail."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from approval_handler import ApprovalHandler
from humanskit import (
    SMTP_USER,
    HookReceiver,
    SmtpServer,
    links_of,
    mail_channel,
)

from synapse.humans import (
    Channel,
    Humans,
    HumansConfig,
    Level,
    NotifyRoute,
    Person,
    enable_humans,
)
from synapse.humans.links import LinkSigner
from synapse.p2p.audit import verify_chain
from synapse.p2p.config import P2PConfig
from synapse.runtime.listener import RuntimeListener
from synapse.runtime.runtime_base import Outcome
from synapse.store import SqliteStore, TaskStore
from synapse.transport.peer import Peer
from synapse.types import MessageType, TaskState

SECRET = "humans-shared-secret-0123456789-"
LINK_KEY = b"link-key-of-the-tests-0123456789"
CONFIG = P2PConfig(heartbeat_interval=3600.0)
SCHEMA = {
    "type": "object",
    "properties": {"width": {"type": "integer", "maximum": 2048}, "style": {"type": "string"}},
}
REVIEWERS = {
    "alice": Person("alice", "Alice", "alice@example.com", "art-director"),
    "bob": Person("bob", "Bob", "bob@example.com"),
    "carol": Person("carol", "Carol", "carol@example.com"),
    "dave": Person("dave", "Dave", "dave@example.com", "lead"),
}


def channels(smtp: SmtpServer, hooks: HookReceiver) -> dict[str, Channel]:
    return {
        "mail": mail_channel(smtp),
        "hook": Channel("hook", "webhook", url=f"{hooks.url}/generic"),
        "slack": Channel("slack", "slack", url=f"{hooks.url}/slack"),
        "teams": Channel("teams", "teams", url=f"{hooks.url}/teams"),
    }


@dataclass
class Setup:
    requester: Peer
    executor: Peer
    humans: Humans

    def audit(self, task_id: str) -> list[Any]:
        rec = self.humans.record(task_id)
        assert rec is not None
        return list(rec.audit)

    async def until(self, check: Callable[[], bool], timeout: float = 10.0) -> None:
        """Once `check()` holds: looked at after each of the requester's commits."""
        committed = asyncio.Event()
        listener = _OnCommit(committed)
        self.requester.protocol.listeners.append(listener)
        try:
            async with asyncio.timeout(timeout):
                while not check():
                    committed.clear()
                    await committed.wait()
        finally:
            self.requester.protocol.listeners.remove(listener)

    def state(self, task_id: str) -> TaskState:
        rec = self.humans.record(task_id)
        assert rec is not None
        return rec.state


@asynccontextmanager
async def peers(
    route: NotifyRoute, smtp: SmtpServer, hooks: HookReceiver, store: TaskStore | None = None
) -> AsyncIterator[Setup]:
    config = HumansConfig(
        link_secret=LINK_KEY,
        routes=(route,),
        reviewers=REVIEWERS,
        channels=channels(smtp, hooks),
    )
    async with humans_pair(config, store=store) as setup:
        yield setup


@asynccontextmanager
async def humans_pair(
    config: HumansConfig,
    setup_requester: Callable[[Peer], object] = lambda _peer: None,
    *,
    store: TaskStore | None = None,
) -> AsyncIterator[Setup]:
    """agent-r with `config`'s people (and whatever `setup_requester` adds), asking
    agent-e, whose handler is `ApprovalHandler`; both stopped at the end."""
    requester = Peer("agent-r", config=CONFIG, store=store)
    humans = enable_humans(requester, config)
    setup_requester(requester)
    executor = Peer("agent-e", handler=ApprovalHandler(), config=CONFIG)
    async with requester, executor:
        requester.add_partner("agent-e", executor.endpoint, (SECRET,))
        executor.add_partner("agent-r", requester.endpoint, (SECRET,))
        await humans.start()
        try:
            yield Setup(requester, executor, humans)
        finally:
            await humans.close()


def one_level(**route: Any) -> NotifyRoute:
    level = Level(reviewers=("alice",), channels=("mail", "hook", "slack", "teams"))
    return NotifyRoute(
        name="portraits",
        levels=(level,),
        task_types=frozenset({"portrait_review"}),
        schema=SCHEMA,
        **route,
    )


async def get(url: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as http:
        return await http.get(url)


async def post(url: str, **form: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as http:
        return await http.post(url, data=form)


def output(outcome: Outcome) -> Any:
    assert outcome.result is not None, outcome
    return outcome.result.output


def answers(audit: list[Any]) -> list[Any]:
    """The entries that are not the delivery's own bookkeeping (written as it goes on)."""
    return [e for e in audit if e.action not in ("human.queued", "human.notified")]


def actions(audit: list[Any]) -> list[str]:
    return [e.action for e in audit]


async def test_one_email_and_webhooks_then_the_approve_link_completes_the_task(
    smtp: SmtpServer, hooks: HookReceiver
) -> None:
    async with peers(one_level(), smtp, hooks) as setup:
        handle = await setup.requester.submit(
            "agent-e", "portrait_review", {"subject": "Ada", "deadline_seconds": 600}
        )
        (mail,) = await smtp.box.wait(1)
        assert smtp.box.tls == [True] and smtp.box.logins == [SMTP_USER]
        assert mail["To"] == "alice@example.com"
        assert handle.task_id in mail["Subject"] and "portrait_review" in mail["Subject"]
        text = mail.get_body(preferencelist=("plain",)).get_content()
        for said in (
            "low_confidence",
            "two widths fit",
            "width = 1024",
            "sharper, slower",
            "confidence 80%",
            "Decide before",
        ):
            assert said in text, said
        generic = (await hooks.wait(1, "/generic"))[0]
        slack = (await hooks.wait(1, "/slack"))[0]
        teams = (await hooks.wait(1, "/teams"))[0]
        # The generic body, and its idempotency key (the same as the e-mail's, per channel).
        assert generic.body["event"] == "synapse.human.notify"
        assert generic.body["task_id"] == handle.task_id
        assert generic.body["reason"] == {
            "code": "low_confidence",
            "message": "two widths fit the brief",
        }
        assert {o["value"] for o in generic.body["options"]} == {1024, 512, "oil"}
        assert generic.headers["Idempotency-Key"] == generic.body["idempotency_key"]
        assert set(generic.body["links"]) == {"approve", "reject", "form"}
        # Slack: an incoming-webhook message, `text` plus Block Kit blocks with URL buttons.
        assert isinstance(slack.body["text"], str) and slack.body["text"]
        kinds = [b["type"] for b in slack.body["blocks"]]
        assert kinds[0] == "header" and "section" in kinds and kinds[-1] == "actions"
        buttons = slack.body["blocks"][-1]["elements"]
        assert {b["type"] for b in buttons} == {"button"}
        assert all(
            b["url"].startswith("http") and b["text"]["type"] == "plain_text" for b in buttons
        )
        # Teams: a message carrying one Adaptive Card with OpenUrl actions.
        assert teams.body["type"] == "message"
        (attachment,) = teams.body["attachments"]
        assert attachment["contentType"] == "application/vnd.microsoft.card.adaptive"
        card = attachment["content"]
        assert card["type"] == "AdaptiveCard" and card["version"] == "1.4"
        assert {a["type"] for a in card["actions"]} == {"Action.OpenUrl"}

        approve = links_of(mail)["approve"]
        page = await get(approve)  # the confirmation page: no decision on GET
        assert page.status_code == 200 and "Approve this decision?" in page.text
        assert page.headers["Cache-Control"] == "no-store"
        assert setup.state(handle.task_id) is TaskState.NEED_HUMAN
        assert "human.viewed" in actions(setup.audit(handle.task_id))
        done = await post(approve, decision="approve")
        assert done.status_code == 200 and "approved" in done.text
        outcome = await handle.result(timeout=10)
        assert output(outcome) == {"approved": {"width": 1024, "style": "oil"}, "by": "alice"}
        audit = setup.audit(handle.task_id)
        trail = actions(audit)
        assert trail.count("human.queued") == 4 and trail.count("human.notified") == 4
        assert trail.index("human.link_used") < trail.index("approve")
        assert verify_chain(audit).intact


async def test_forged_replayed_and_expired_links_change_nothing(
    smtp: SmtpServer, hooks: HookReceiver
) -> None:
    async with peers(one_level(quorum=2), smtp, hooks) as setup:
        handle = await setup.requester.submit(
            "agent-e", "portrait_review", {"subject": "Bo", "deadline_seconds": 600}
        )
        (mail,) = await smtp.box.wait(1)
        approve = links_of(mail)["approve"]
        token = approve.rsplit("/", 1)[1]
        before = answers(setup.audit(handle.task_id))

        forged = approve[:-3] + ("AAA" if not approve.endswith("AAA") else "BBB")
        for response in (await get(forged), await post(forged, decision="approve")):
            assert response.status_code == 403 and "signature" in response.text
        other = LinkSigner(b"somebody-elses-key-0123456789").sign(
            handle.task_id, "approve", "alice", time.time() + 600
        )
        assert (await post(approve.replace(token, other), decision="approve")).status_code == 403
        expired = LinkSigner(LINK_KEY).sign(handle.task_id, "approve", "alice", time.time() - 1)
        response = await post(approve.replace(token, expired), decision="approve")
        assert response.status_code == 410 and "expired" in response.text
        assert answers(setup.audit(handle.task_id)) == before  # nothing written

        first = await post(approve, decision="approve")  # 1 of 2: recorded, not sent
        assert first.status_code == 200 and "1 of 2" in first.text
        replay = await post(approve, decision="approve")
        assert replay.status_code == 409 and "used already" in replay.text
        assert setup.state(handle.task_id) is TaskState.NEED_HUMAN
        assert actions(setup.audit(handle.task_id)).count("human.approval") == 1
        await handle.cancel("done with this test")


async def test_an_edit_its_schema_refuses_changes_nothing_and_a_good_one_is_sent(
    smtp: SmtpServer, hooks: HookReceiver
) -> None:
    async with peers(one_level(), smtp, hooks) as setup:
        handle = await setup.requester.submit(
            "agent-e", "portrait_review", {"subject": "Cy", "deadline_seconds": 600}
        )
        (mail,) = await smtp.box.wait(1)
        form = links_of(mail)["form"]
        page = await get(form)
        assert "name='field:width'" in page.text and "1024" in page.text
        before = answers(setup.audit(handle.task_id))
        for value, why in (("4096", "maximum"), ('"wide"', "must be an integer")):
            refused = await post(form, decision="approve", **{"field:width": value})
            assert refused.status_code == 400 and why in refused.text, refused.text
        unknown = await post(form, decision="approve", **{"field:height": "3"})
        assert unknown.status_code == 400
        assert answers(setup.audit(handle.task_id)) == before
        assert setup.state(handle.task_id) is TaskState.NEED_HUMAN
        done = await post(
            form, decision="approve", **{"field:width": "2000", "field:style": '"ink"'}
        )
        assert done.status_code == 200
        outcome = await handle.result(timeout=10)
        assert output(outcome)["approved"] == {"width": 2000, "style": "ink"}


async def test_two_of_three_approvals_send_one_decision(
    smtp: SmtpServer, hooks: HookReceiver
) -> None:
    level = Level(reviewers=("alice", "bob", "carol"), channels=("mail",))
    route = NotifyRoute(name="committee", levels=(level,), quorum=2)
    async with peers(route, smtp, hooks) as setup:
        sent: list[str] = []
        setup.requester.protocol.listeners.append(_OnOut(sent))
        handle = await setup.requester.submit(
            "agent-e", "portrait_review", {"deadline_seconds": 600}
        )
        mails = await smtp.box.wait(3)
        by_reviewer = {m["To"].split("@")[0]: links_of(m) for m in mails}
        assert set(by_reviewer) == {"alice", "bob", "carol"}
        assert "1 of 2" in (await post(by_reviewer["alice"]["approve"], decision="approve")).text
        assert setup.state(handle.task_id) is TaskState.NEED_HUMAN
        assert sent.count(MessageType.HUMAN_DECISION.value) == 0
        done = await post(by_reviewer["bob"]["approve"], decision="approve")
        assert done.status_code == 200 and "approved" in done.text
        outcome = await handle.result(timeout=10)
        assert output(outcome)["by"] == "bob"
        assert sent.count(MessageType.HUMAN_DECISION.value) == 1
        late = await post(by_reviewer["carol"]["approve"], decision="approve")
        assert late.status_code == 409  # answered already
        trail = actions(setup.audit(handle.task_id))
        assert (
            trail.count("human.approval") == 2 and verify_chain(setup.audit(handle.task_id)).intact
        )


async def test_a_named_role_decides_alone_and_others_are_recorded(
    smtp: SmtpServer, hooks: HookReceiver
) -> None:
    level = Level(reviewers=("bob", "dave"), channels=("mail",))
    route = NotifyRoute(name="leads", levels=(level,), role="lead")
    async with peers(route, smtp, hooks) as setup:
        handle = await setup.requester.submit(
            "agent-e", "portrait_review", {"deadline_seconds": 600}
        )
        mails = await smtp.box.wait(2)
        by_reviewer = {m["To"].split("@")[0]: links_of(m) for m in mails}
        recorded = await post(by_reviewer["bob"]["approve"], decision="approve")
        assert "recorded" in recorded.text and setup.state(handle.task_id) is TaskState.NEED_HUMAN
        await post(by_reviewer["dave"]["approve"], decision="approve")
        assert output(await handle.result(timeout=10))["by"] == "dave"


async def test_an_unanswered_question_escalates_then_times_out_by_policy(
    smtp: SmtpServer, hooks: HookReceiver
) -> None:
    route = NotifyRoute(
        name="urgent",
        levels=(
            Level(reviewers=("alice",), channels=("mail",), within=1.0),
            Level(reviewers=("bob",), channels=("mail", "hook")),
        ),
        reminders=(0.8,),
        on_timeout="reject",
    )
    async with peers(route, smtp, hooks) as setup:
        handle = await setup.requester.submit(
            "agent-e", "portrait_review", {"deadline_seconds": 3.0}
        )
        mails = await smtp.box.wait(3)  # level 1, escalation to level 2, the reminder
        assert [m["To"] for m in mails[:2]] == ["alice@example.com", "bob@example.com"]
        assert "Escalated" in mails[1]["Subject"] and "Reminder" in mails[2]["Subject"]
        assert (await hooks.wait(2, "/generic"))[0].body["event"] == "synapse.human.escalate"
        outcome = await handle.result(timeout=15)
        assert outcome.state is TaskState.FAILED and outcome.error is not None
        assert outcome.error.code == "permission_denied"  # a rejection fails the task
        audit = setup.audit(handle.task_id)
        timeout = next(e for e in audit if e.action == "human.timeout")
        assert timeout.detail["action"] == "reject"
        decision = next(e for e in audit if e.action == "reject")
        assert decision.actor == "policy:urgent"  # decided by the policy, not a person
        assert verify_chain(audit).intact
        # Links expire when the policy acts: a link of level 1 decides nothing now.
        late = await post(links_of(mails[0])["approve"], decision="approve")
        assert late.status_code == 410


async def test_a_recipients_notifications_arrive_in_the_order_they_were_queued(
    smtp: SmtpServer, hooks: HookReceiver
) -> None:
    """A reminder falls due while the first notice to the same channel is still being
    delivered (its receiver holds it unanswered, as a slow server or a restart's catch-up
    would): it is queued, but not sent until the notice before it was delivered, so it never
    arrives first."""
    route = NotifyRoute(
        name="slow-hook",
        levels=(Level(reviewers=("alice",), channels=("hook",)),),
        reminders=(0.02,),
        on_timeout="protocol",
    )
    release = asyncio.Event()
    hooks.hold.append(release)  # the first POST (the notice) waits, unanswered
    async with peers(route, smtp, hooks) as setup:
        handle = await setup.requester.submit(
            "agent-e", "portrait_review", {"deadline_seconds": 60.0}
        )
        await hooks.wait(1, "/generic")
        task_id = handle.task_id
        # The reminder (at 2 % of the window: about a second in) is queued meanwhile.
        await setup.until(
            lambda: any(e.action == "human.remind" for e in setup.audit(task_id)), timeout=10
        )
        sending = sorted(k.split("/")[2] for k in setup.humans._sending)
        assert sending == ["notify:1"], sending  # not the reminder: it waits its turn
        release.set()
        arrived = await hooks.wait(2, "/generic")
        assert [h.body["event"] for h in arrived] == [
            "synapse.human.notify",
            "synapse.human.remind",
        ]


async def test_need_info_is_answered_from_the_form(smtp: SmtpServer, hooks: HookReceiver) -> None:
    route = NotifyRoute(name="info", levels=(Level(reviewers=("carol",), channels=("mail",)),))
    async with peers(route, smtp, hooks) as setup:
        handle = await setup.requester.submit("agent-e", "profile", {"deadline_seconds": 600})
        (mail,) = await smtp.box.wait(1)
        assert set(links_of(mail)) == {"form"}
        form = links_of(mail)["form"]
        assert (await post(form, decision="provide")).status_code == 400  # email missing
        assert setup.state(handle.task_id) is TaskState.INFO_NEEDED
        await post(form, decision="provide", **{"field:email": "carol@example.com"})
        outcome = await handle.result(timeout=10)
        assert output(outcome) == {"provided": {"email": "carol@example.com"}}


class _OnOut:
    """Counts the message types this peer POSTs."""

    def __init__(self, sent: list[str]) -> None:
        self.sent = sent

    def __getattr__(self, name: str) -> Callable[..., None]:
        def ignore(*args: Any) -> None:
            return None

        return ignore

    def on_message(self, event: Any) -> None:
        if event.direction == "out":
            self.sent.append(event.message.type)


@pytest.mark.parametrize(
    ("on_timeout", "state", "by"),
    [
        ("approve_default", TaskState.COMPLETED, "policy:quiet"),
        ("fail", TaskState.CANCELLED, None),
        ("protocol", TaskState.FAILED, None),
    ],
)
async def test_each_time_out_action(
    smtp: SmtpServer, hooks: HookReceiver, on_timeout: Any, state: TaskState, by: str | None
) -> None:
    route = NotifyRoute(
        name="quiet",
        levels=(Level(reviewers=("alice",), channels=("hook",)),),
        on_timeout=on_timeout,
    )
    async with peers(route, smtp, hooks) as setup:
        handle = await setup.requester.submit(
            "agent-e", "portrait_review", {"deadline_seconds": 1.5}
        )
        outcome = await handle.result(timeout=15)
        assert outcome.state is state, outcome
        if by is not None:  # approved by the policy with the most confident values
            assert output(outcome) == {"approved": {"width": 1024, "style": "oil"}, "by": by}
        if on_timeout == "protocol":  # the executor's own deadline ended it
            assert outcome.error is not None and outcome.error.code == "execution_timeout"
        timeout = next(e for e in setup.audit(handle.task_id) if e.action == "human.timeout")
        assert timeout.detail["action"] == on_timeout and timeout.actor == "policy:quiet"


async def test_need_info_times_out_with_its_suggested_values_or_is_cancelled(
    smtp: SmtpServer, hooks: HookReceiver
) -> None:
    # The `profile` question suggests no value: approve_default leaves it to the protocol.
    route = NotifyRoute(
        name="info",
        levels=(Level(reviewers=("carol",), channels=("hook",)),),
        on_timeout="approve_default",
    )
    async with peers(route, smtp, hooks) as setup:
        handle = await setup.requester.submit("agent-e", "profile", {"deadline_seconds": 1.5})
        outcome = await handle.result(timeout=15)
        assert outcome.state is TaskState.FAILED  # the executor's required_by passed
        timeout = next(e for e in setup.audit(handle.task_id) if e.action == "human.timeout")
        assert timeout.detail["action"] == "protocol"
    route = NotifyRoute(
        name="info",
        levels=(Level(reviewers=("carol",), channels=("hook",)),),
        on_timeout="reject",
    )
    async with peers(route, smtp, hooks) as setup:
        handle = await setup.requester.submit("agent-e", "profile", {"deadline_seconds": 1.5})
        outcome = await handle.result(timeout=15)
        assert outcome.state is TaskState.CANCELLED


async def test_a_failing_webhook_is_tried_again_until_it_takes_it(
    smtp: SmtpServer, hooks: HookReceiver
) -> None:
    route = NotifyRoute(name="r", levels=(Level(reviewers=("alice",), channels=("hook",)),))
    hooks.status[0] = 503
    async with peers(route, smtp, hooks) as setup:
        handle = await setup.requester.submit(
            "agent-e", "portrait_review", {"deadline_seconds": 600}
        )
        tried = await hooks.wait(3, "/generic")  # one pass: three attempts, all refused
        hooks.status[0] = 200
        later = await hooks.wait(4, "/generic")  # after a pause, again: taken
        assert len({h.headers["Idempotency-Key"] for h in later}) == 1
        assert all(h.body == tried[0].body for h in later)
        await setup.until(lambda: "human.notified" in actions(setup.audit(handle.task_id)))
        assert actions(setup.audit(handle.task_id)).count("human.notified") == 1
        await handle.cancel("done")


class _OnCommit(RuntimeListener):
    def __init__(self, committed: asyncio.Event) -> None:
        self.committed = committed

    def on_commit(self, seconds: float, error: BaseException | None) -> None:
        self.committed.set()


async def test_two_clicks_at_once_decide_once(smtp: SmtpServer, hooks: HookReceiver) -> None:
    """The same link posted twice at once (a double click, a retrying proxy): one answer,
    one `human_decision`; the other is told it was used."""
    level = Level(reviewers=("alice",), channels=("mail",))
    async with peers(NotifyRoute(name="r", levels=(level,)), smtp, hooks) as setup:
        sent: list[str] = []
        setup.requester.protocol.listeners.append(_OnOut(sent))
        handle = await setup.requester.submit("agent-e", "portrait_review", {})
        (mail,) = await smtp.box.wait(1)
        approve = links_of(mail)["approve"]
        answers_ = await asyncio.gather(*(post(approve, decision="approve") for _ in range(4)))
        assert sorted(a.status_code for a in answers_) == [200, 409, 409, 409]
        assert (await handle.result(timeout=10)).state is TaskState.COMPLETED
        assert sent.count(MessageType.HUMAN_DECISION.value) == 1


async def test_what_a_reviewer_reads_for_information_asked(
    smtp: SmtpServer, hooks: HookReceiver
) -> None:
    """A need_info is no decision: the mail and the page say information is asked, give the
    question (not an internal code), the time to answer before and the suggested value,
    written as text."""
    route = NotifyRoute(name="info", levels=(Level(reviewers=("carol",), channels=("mail",)),))
    async with peers(route, smtp, hooks) as setup:
        payload = {"deadline_seconds": 600, "suggest": "someone@example.com"}
        handle = await setup.requester.submit("agent-e", "profile", payload)
        (mail,) = await smtp.box.wait(1)
        assert "Information is asked of you" in mail["Subject"]
        body = mail.get_body(preferencelist=("plain",))
        assert body is not None
        text = body.get_content()
        assert "Question: Which address?" in text and "Answer before" in text
        assert "Decide before" not in text and "decision" not in text.lower()
        assert "suggested: someone@example.com" in text
        page = (await get(links_of(mail)["form"])).text
        assert "Question" in page and "Which address?" in page and "need_info:" not in page
        assert "Answer before" in page
        assert "value='someone@example.com'" in page  # as text, no JSON quotes
        await handle.cancel("not needed")
        await handle.result(timeout=10)
        closed = await get(links_of(mail)["form"])
        assert closed.status_code == 409 and "cancelled" in closed.text


async def test_what_a_reviewer_reads_for_a_decision(smtp: SmtpServer, hooks: HookReceiver) -> None:
    """The page shows every value proposed for a field (the alternative too) with what it
    is for, strings without JSON quotes, the deadline; a refused edit leads back to the form."""
    async with peers(one_level(), smtp, hooks) as setup:
        handle = await setup.requester.submit(
            "agent-e", "portrait_review", {"deadline_seconds": 600}
        )
        mail = (await smtp.box.wait(1))[0]
        form = links_of(mail)["form"]
        page = (await get(form)).text
        assert "1024 — 80% — sharper, slower" in page and "512 — 40% — faster" in page
        assert "value='oil'" in page and "&quot;oil&quot;" not in page
        assert "Decide before" in page
        refused = await post(form, decision="approve", **{"field:width": "wide"})
        assert refused.status_code == 400
        assert "must be an integer" in refused.text and "Back to the form" in refused.text
        approved = await post(form, decision="approve", **{"field:style": "ink"})
        assert approved.status_code == 200
        assert output(await handle.result(timeout=10))["approved"]["style"] == "ink"


def _delivering(task_id: str) -> list[asyncio.Task[Any]]:
    """The notification deliveries of task `task_id` in flight (`Humans._deliver`)."""
    return [t for t in asyncio.all_tasks() if t.get_name().startswith(f"synapse-humans {task_id}/")]


async def test_a_notification_sent_while_the_task_moved_to_another_replica_ends_quietly(
    smtp: SmtpServer, hooks: HookReceiver, tmp_path: Path
) -> None:
    """A replica sends a notification; meanwhile another replica takes the task over. The
    send is not recorded here (the task is not this replica's any more: the holder sends it
    again, the same links), and the delivery ends without an error nobody reads (it raised
    `agent_not_ready` into a task nobody awaited: the replica simulation found it)."""
    route = NotifyRoute(name="r", levels=(Level(reviewers=("alice",), channels=("hook",)),))
    answer = asyncio.Event()
    hooks.hold.append(answer)
    async with peers(route, smtp, hooks, SqliteStore(tmp_path / "r.db")) as setup:
        handle = await setup.requester.submit("agent-e", "portrait_review", {})
        await hooks.wait(1, "/generic")  # sent, not yet answered
        (delivery,) = _delivering(handle.task_id)
        setup.requester.protocol.release(handle.key)  # as a replica losing the lease does
        answer.set()
        await asyncio.wait_for(delivery, 10)  # ends, and raises nothing
        stored = setup.requester.store.get_task(handle.key)
        assert stored is not None
        assert "human.notified" not in actions(list(stored.audit))


async def test_a_link_opened_as_its_task_moves_to_another_replica_asks_to_reload(
    smtp: SmtpServer, hooks: HookReceiver, tmp_path: Path
) -> None:
    """Opening a link records who viewed it in the task's audit trail; a task another
    replica took over meanwhile cannot be written here: 503 with Retry-After, not a 500."""
    level = Level(reviewers=("alice",), channels=("mail",))
    store = SqliteStore(tmp_path / "r.db")
    async with peers(NotifyRoute(name="r", levels=(level,)), smtp, hooks, store) as setup:
        handle = await setup.requester.submit("agent-e", "portrait_review", {})
        (mail,) = await smtp.box.wait(1)
        setup.requester.protocol.release(handle.key)
        page = await get(links_of(mail)["approve"])
        assert page.status_code == 503, page.text
        assert page.headers["Retry-After"] == "1"
        stored = setup.requester.store.get_task(handle.key)
        assert stored is not None
        assert "human.viewed" not in actions(list(stored.audit))
