"""One gate for every answer: the rules of a decision hold whichever front it comes through.

Between two real peers over loopback HTTP, with the requester's people told by a real SMTP
server: signed links decide only the question they were issued for, and only for a reviewer
the configuration names now and the question was sent to. Then a matrix: each rule (who is a
reviewer, who was sent the question, the quorum, the options' types, the route's schema, who
is recorded as deciding) against each front (a signed link, the console's HTTP API, the MCP
tool's answer, the Python API, the command line's prompts). A refused answer changes nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from humanskit import SmtpServer, links_of, mail_channel
from test_humans_flow import LINK_KEY, REVIEWERS, SCHEMA, Setup, get, humans_pair, post

from synapse.humans import HumansConfig, Level, NotifyRoute, Person
from synapse.humans.links import LinkSigner
from synapse.mcp.questions import BadAnswer, Question, answer_from_arguments
from synapse.mcp.tracking import Delegation
from synapse.ops.console import Reviewer, TokenAuth, enable_console
from synapse.runtime.answers import AnswerRefused
from synapse.runtime.runtime_base import TaskHandle
from synapse.types import DecidedBy, DecisionAction, MessageType, TaskState

E = "agent-e"
TOKENS = {f"{name}-console-token-0123456789": name for name in ("alice", "bob", "carol", "eve")}


@asynccontextmanager
async def gated(routes: tuple[NotifyRoute, ...], smtp: SmtpServer) -> AsyncIterator[Setup]:
    config = HumansConfig(
        link_secret=LINK_KEY,
        routes=routes,
        reviewers=REVIEWERS,
        channels={"mail": mail_channel(smtp)},
    )
    auth = TokenAuth({token: Reviewer(name) for token, name in TOKENS.items()})
    async with humans_pair(config, lambda peer: enable_console(peer, auth)) as setup:
        yield setup


def sent_decisions(setup: Setup) -> Callable[[], int]:
    """How many human_decision messages the requester has sent so far."""
    sent: list[str] = []

    class Out:
        def on_message(self, event: Any) -> None:
            if event.direction == "out":
                sent.append(event.message.message_type.value)

    setup.requester.protocol.listeners.append(Out())  # type: ignore[arg-type]
    return lambda: sent.count(MessageType.HUMAN_DECISION.value)


# --- links decide their own question, for the people it was sent to ----------------------------


async def test_a_link_decides_only_the_question_it_was_issued_for(smtp: SmtpServer) -> None:
    first = NotifyRoute(
        name="first",
        levels=(Level(reviewers=("alice", "bob"), channels=("mail",)),),
        reason_codes=frozenset({"first"}),
    )
    second = NotifyRoute(
        name="second",
        levels=(Level(reviewers=("carol",), channels=("mail",)),),
        reason_codes=frozenset({"second"}),
    )
    async with gated((first, second), smtp) as setup:
        decisions = sent_decisions(setup)
        handle = await setup.requester.submit(E, "two_steps")
        mails = {m["To"].split("@")[0]: links_of(m) for m in await smtp.box.wait(2)}
        assert (await post(mails["alice"]["approve"], decision="approve")).status_code == 200
        # Question B is open now, routed to carol alone.
        carol = links_of((await smtp.box.wait(3))[2])
        for action in ("approve", "reject"):  # bob's unused links of question A
            stale = await post(mails["bob"][action], decision=action, reason="no")
            assert stale.status_code == 409, stale.text
            assert "another question" in stale.text
        shown = await get(mails["bob"]["form"])
        assert shown.status_code == 409 and "another question" in shown.text
        assert setup.state(handle.task_id) is TaskState.NEED_HUMAN
        assert decisions() == 1
        assert (await post(carol["approve"], decision="approve")).status_code == 200
        outcome = await handle.result(timeout=10)
        assert outcome.result is not None
        assert outcome.result.output == {"first": "alice", "second": "carol"}


async def test_a_link_for_a_reviewer_not_configured_or_not_sent_the_question_decides_nothing(
    smtp: SmtpServer,
) -> None:
    route = NotifyRoute(name="portraits", levels=(Level(reviewers=("alice",), channels=("mail",)),))
    async with gated((route,), smtp) as setup:
        handle = await setup.requester.submit(E, "portrait_review", {"deadline_seconds": 600})
        [mail] = await smtp.box.wait(1)
        rec = setup.humans.record(handle.task_id)
        assert rec is not None
        question = setup.humans.question_of(rec)
        assert question is not None
        signer = LinkSigner(LINK_KEY)

        def forged(reviewer: str) -> str:
            token = signer.sign(
                handle.task_id, "approve", reviewer, question.window.closes, None, question.id
            )
            return f"{setup.humans.public_url()}{setup.humans.config.path}/links/{token}"

        # Signed with the right key, for the right question: but eve is no reviewer, and
        # carol is one the question was not sent to.
        assert (await post(forged("eve"), decision="approve")).status_code == 403
        assert (await post(forged("carol"), decision="approve")).status_code == 403
        # A reviewer removed from the configuration after the mail was sent (the route
        # now asks dave): refused too.
        kept = setup.humans.config
        setup.humans.config = dataclasses.replace(
            kept,
            routes=(dataclasses.replace(route, levels=(Level(("dave",), ("mail",)),)),),
            reviewers={k: v for k, v in kept.reviewers.items() if k != "alice"},
        )
        removed = await post(links_of(mail)["approve"], decision="approve")
        assert removed.status_code == 403, removed.text
        assert setup.state(handle.task_id) is TaskState.NEED_HUMAN
        setup.humans.config = kept
        assert (await post(links_of(mail)["approve"], decision="approve")).status_code == 200
        assert (await handle.result(timeout=10)).ok


# --- the matrix: every rule on every front --------------------------------------------------


class Front:
    """One way to answer a waiting question, as the person using it would."""

    name = ""

    def __init__(self, setup: Setup, smtp: SmtpServer) -> None:
        self.setup, self.smtp = setup, smtp

    async def answer(
        self, handle: TaskHandle, who: str, action: str, fields: dict[str, Any], reason: str = ""
    ) -> tuple[int, str]:
        """(an HTTP-like status, what the person is told)."""
        raise NotImplementedError


class LinkFront(Front):
    name = "link"

    async def answer(
        self, handle: TaskHandle, who: str, action: str, fields: dict[str, Any], reason: str = ""
    ) -> tuple[int, str]:
        rec = self.setup.humans.record(handle.task_id)
        assert rec is not None
        question = self.setup.humans.question_of(rec)
        assert question is not None
        # The link that person's mail carries (or, for one no mail went to, one signed
        # with the right key for this question: the pages must refuse it all the same).
        token = LinkSigner(LINK_KEY).sign(
            handle.task_id, "form", who, question.window.closes, None, question.id
        )
        url = f"{self.setup.humans.public_url()}{self.setup.humans.config.path}/links/{token}"
        form = {f"field:{k}": v if isinstance(v, str) else repr(v) for k, v in fields.items()}
        response = await post(url, decision=action, reason=reason, **form)
        return response.status_code, response.text


class ConsoleFront(Front):
    name = "console"

    async def answer(
        self, handle: TaskHandle, who: str, action: str, fields: dict[str, Any], reason: str = ""
    ) -> tuple[int, str]:
        token = next(t for t, name in TOKENS.items() if name == who)
        base = self.setup.humans.public_url()
        url = f"{base}/console/api/tasks/{handle.task_id}/decision"
        body = {"action": action, "approved_fields": fields, "rejection_reason": reason}
        headers = {"Authorization": f"Bearer {token}", "Origin": base}
        async with (
            aiohttp.ClientSession() as http,
            http.post(url, json=body, headers=headers) as response,
        ):
            return response.status, await response.text()


class McpFront(Front):
    """The MCP tools' answer (`answer_task`'s arguments, as a client sends them), by the
    authenticated principal `who`."""

    name = "mcp"

    async def answer(
        self, handle: TaskHandle, who: str, action: str, fields: dict[str, Any], reason: str = ""
    ) -> tuple[int, str]:
        delegation = Delegation(handle, partner=E, task_type="portrait_review", follow=False)
        need = handle.record.need_human
        try:
            answer = answer_from_arguments(
                Question(human=need),
                fields=fields,
                decision=action,
                rejection_reason=reason,
                notes="",
            )
        except BadAnswer as exc:  # the tool's own reading of its arguments: a tool error
            return 400, str(exc)
        return await _refusal_status(delegation.answer(answer, by=who))


class PythonFront(Front):
    name = "python"

    async def answer(
        self, handle: TaskHandle, who: str, action: str, fields: dict[str, Any], reason: str = ""
    ) -> tuple[int, str]:
        return await _refusal_status(
            handle.decide(
                DecisionAction(action),
                approved_fields=fields,
                rejection_reason=reason,
                decided_by=DecidedBy(user_id=who),
            )
        )


class CliFront(Front):
    """The command line's prompts answer through the handle's `approve` / `reject`, as
    `synapse send` does, marked as the `cli` front."""

    name = "cli"

    async def answer(
        self, handle: TaskHandle, who: str, action: str, fields: dict[str, Any], reason: str = ""
    ) -> tuple[int, str]:
        by = DecidedBy(user_id=who)
        if action == "approve":
            said = handle.approve(fields, decided_by=by, front="cli")
        else:
            said = handle.reject(reason, decided_by=by, front="cli")
        return await _refusal_status(said)


async def _refusal_status(answering: Awaitable[Any]) -> tuple[int, str]:
    try:
        said = await answering
    except AnswerRefused as exc:
        return exc.status, exc.reason
    except Exception as exc:  # a front's own wrapping (MCP's tool error)
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, AnswerRefused):
            return cause.status, cause.reason
        raise
    return 200, str(said)


FRONTS = [LinkFront, ConsoleFront, McpFront, PythonFront, CliFront]
QUORUM = NotifyRoute(
    name="committee",
    levels=(Level(reviewers=("alice", "bob"), channels=("mail",)),),
    quorum=2,
    schema=SCHEMA,
    task_types=frozenset({"portrait_review"}),
)


@asynccontextmanager
async def waiting(
    front_type: type[Front], smtp: SmtpServer
) -> AsyncIterator[tuple[Front, Setup, TaskHandle]]:
    """A portrait_review task waiting on the committee, both of whom were mailed."""
    async with gated((QUORUM,), smtp) as setup:
        handle = await setup.requester.submit(E, "portrait_review", {"deadline_seconds": 600})
        await smtp.box.wait(2)
        yield front_type(setup, smtp), setup, handle


@pytest.mark.parametrize("front_type", FRONTS, ids=lambda f: f.name)
async def test_only_a_configured_reviewer_the_question_was_sent_to_decides(
    front_type: type[Front], smtp: SmtpServer
) -> None:
    async with waiting(front_type, smtp) as (front, setup, handle):
        decisions = sent_decisions(setup)
        status, said = await front.answer(handle, "eve", "approve", {})
        assert status == 403 and "not (or no longer) a reviewer" in said, (status, said)
        status, said = await front.answer(handle, "carol", "reject", {}, reason="no")
        assert status == 403 and "not sent to" in said, (status, said)
        assert setup.state(handle.task_id) is TaskState.NEED_HUMAN
        assert decisions() == 0
        assert not [e for e in setup.audit(handle.task_id) if e.action.startswith("human.app")]


@pytest.mark.parametrize("front_type", FRONTS, ids=lambda f: f.name)
async def test_one_reviewer_alone_does_not_complete_a_quorum_of_two(
    front_type: type[Front], smtp: SmtpServer
) -> None:
    async with waiting(front_type, smtp) as (front, setup, handle):
        decisions = sent_decisions(setup)
        status, said = await front.answer(handle, "alice", "approve", {"width": 512})
        assert status == 200 and "1 of 2" in said, (status, said)
        assert setup.state(handle.task_id) is TaskState.NEED_HUMAN and decisions() == 0
        status, said = await front.answer(handle, "alice", "approve", {})
        assert status == 409 and "already" in said, (status, said)
        status, said = await front.answer(handle, "bob", "approve", {})
        assert status == 200, (status, said)
        outcome = await handle.result(timeout=10)
        assert outcome.result is not None and outcome.result.output["by"] == "bob"
        assert decisions() == 1


@pytest.mark.parametrize("front_type", FRONTS, ids=lambda f: f.name)
async def test_an_edit_must_keep_its_type_and_pass_the_schema(
    front_type: type[Front], smtp: SmtpServer
) -> None:
    async with waiting(front_type, smtp) as (front, setup, handle):
        for fields, why in [
            ({"width": "big"}, "must be an integer"),
            ({"width": 4096}, "schema"),
            ({"height": 10}, "not a field"),
        ]:
            status, said = await front.answer(handle, "alice", "approve", fields)
            assert status == 400 and why in said, (fields, status, said)
        assert setup.state(handle.task_id) is TaskState.NEED_HUMAN
        assert not [e for e in setup.audit(handle.task_id) if e.action.startswith("human.app")]


@pytest.mark.parametrize("front_type", FRONTS, ids=lambda f: f.name)
async def test_who_decided_is_recorded_from_the_configuration(
    front_type: type[Front], smtp: SmtpServer
) -> None:
    route = dataclasses.replace(QUORUM, quorum=1)
    async with gated((route,), smtp) as setup:
        handle = await setup.requester.submit(E, "portrait_review", {"deadline_seconds": 600})
        await smtp.box.wait(2)
        front = front_type(setup, smtp)
        status, said = await front.answer(handle, "alice", "approve", {"width": 512})
        assert status == 200, (status, said)
        outcome = await handle.result(timeout=10)
        assert outcome.result is not None
        assert outcome.result.output == {
            "approved": {"width": 512, "style": "oil"},
            "by": "alice",
        }
        [entry] = [e for e in setup.audit(handle.task_id) if e.action == "approve"]
        alice: Person = REVIEWERS["alice"]
        assert entry.actor == "alice"
        assert entry.detail["user_name"] == alice.name and entry.detail["role"] == alice.role
        assert entry.detail["front"] == front.name


def test_the_matrix_names_every_front() -> None:
    assert {f.name for f in FRONTS} == {"link", "console", "mcp", "python", "cli"}
