"""People in the simulation with replicas: the humans service (`synapse.humans`) on every
replica of the requester, its routes, escalation and quorum, and people answering through
its one gate at two replicas at once.

Each replica runs `Humans` with `PEOPLE`: a question of `beta`'s goes first to alice and
bob, and after `ESCALATE_AFTER` seconds without a decision to carol as well; an approval
takes two of them (a quorum), a rejection one; dave is a reviewer of the agent whom no route
sends a question to. Notifications are not sent (`SimulatedHumans`), but the audit entries
the service commits for them (queued, notified) are the real ones, so that a replica taking
a question over knows who was told.

The person at the requester answers as one of the four, chosen by the seed, through two
replicas at once (a front that does not hold the task passes the answer to the one that
does). In half the seeds (`links_in`), each of those answers is given through a signed link
three times in four, as the link's page takes it (`LinkPages.answer`: the link read and
checked, then the same gate), and otherwise on the operator console, as its page posts it
(`Console.decide`, `Console.provide`: who may see the task, what it waits for, the body;
then the same gate); a quarter of those links were issued for another question (one
answered long ago), which must decide nothing. The invariant `decided_only_by_routed` reads
the stored record at the end: every answer the question counted came from someone it was
routed to by then (a reviewer of the first level, or one it had been queued for), an
approval was sent only with a quorum of distinct approvers, every link used decided only the
question it was issued for, and each question got at most one decision
(`answers_kept_once`).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from synapse.humans.config import Channel, HumansConfig, Level, NotifyRoute, Person
from synapse.humans.pages import LinkAnswer, LinkPages
from synapse.humans.question import APPROVAL, LINK_USED, QUEUED, REJECTION, OpenQuestion
from synapse.humans.service import Humans
from synapse.ops.console import Console, Reviewer, TokenAuth, enable_console
from synapse.p2p.engine import TaskKey, TaskRecord
from synapse.p2p.states import Event
from synapse.transport.peer import Peer

#: Who answers `beta`'s questions, and how (see the module's docstring).
FIRST_LEVEL = ("alice", "bob")
SECOND_LEVEL = ("carol",)
NOT_ROUTED = ("dave",)
QUORUM = 2
ESCALATE_AFTER = 120.0
PEOPLE = HumansConfig(
    link_secret=b"simulation-link-secret-0123456789",
    routes=(
        NotifyRoute(
            "beta-questions",
            levels=(
                Level(FIRST_LEVEL, ("inbox",), within=ESCALATE_AFTER),
                Level(SECOND_LEVEL, ("inbox",)),
            ),
            quorum=QUORUM,
        ),
    ),
    reviewers={name: Person(name) for name in (*FIRST_LEVEL, *SECOND_LEVEL, *NOT_ROUTED)},
    channels={"inbox": Channel("inbox", "email")},
    public_url="http://beta.test",
)


#: `PEOPLE` with an address each, for the seeds with links: notifications are then queued to
#: them (and go nowhere), which is what makes a link theirs to open.
MAILED = HumansConfig(
    link_secret=PEOPLE.link_secret,
    routes=PEOPLE.routes,
    reviewers={
        name: Person(name, email=f"{name}@beta.test")
        for name in (*FIRST_LEVEL, *SECOND_LEVEL, *NOT_ROUTED)
    },
    channels=PEOPLE.channels,
    public_url=PEOPLE.public_url,
)


#: Whom the person at the requester answers as, chosen by the seed for each front.
EVERYONE = (*FIRST_LEVEL, *SECOND_LEVEL, *NOT_ROUTED)


def decided(told: str) -> bool:
    """Whether what an answer's front was told says it decided the question (not one
    approval of a quorum, recorded: "your approval is recorded (1 of 2)")."""
    return "recorded" not in told


class SimulatedHumans(Humans):
    """`Humans` whose notifications go nowhere (see the module's docstring), and whose link
    pages are called directly (`pages.answer`)."""

    def __init__(self, peer: Peer, config: HumansConfig) -> None:
        super().__init__(peer, config)
        self.pages = LinkPages(self)

    async def start(self) -> None:
        await super().start()
        # Nothing is sent: no HTTP session (a killed process, which closes nothing, would
        # leave it open).
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _send(self, question: OpenQuestion, detail: Mapping[str, Any]) -> None:
        pass  # delivered, as far as the service knows: it commits `human.notified`


def enable_people(peer: Peer, *, mailed: bool = False) -> SimulatedHumans:
    """What `enable_humans` does, with `SimulatedHumans` and without the link pages' HTTP
    routes; `mailed`: the people have addresses (`MAILED`)."""
    humans = SimulatedHumans(peer, MAILED if mailed else PEOPLE)
    peer.protocol_hooks.append(humans.bind)
    return humans


def enable_people_console(peer: Peer, humans: Humans) -> Console:
    """The operator console on `peer`, its reviewers the people (each signed in with a
    token of their own), shown what the humans service routes to them, as `synapse serve
    --console` with people configured runs it; its answers are called directly
    (`Console.decide`, `Console.provide`), without the HTTP request."""
    auth = TokenAuth(
        {f"console-token-of-{name}": Reviewer(name, name.title()) for name in EVERYONE}
    )
    console = enable_console(peer, auth)
    humans.attach_console(console)
    return console


async def answer_by_console(
    console: Console, key: TaskKey, reviewer: str, decision: str
) -> tuple[int, str]:
    """`reviewer` answers the question of `key`'s task with `decision` (approve, reject,
    provide) on the console, as its page posts it: the HTTP status, and what the answer
    gate said (or why the console refused)."""
    who = Reviewer(reviewer, reviewer.title())
    try:
        if decision == "provide":
            view = await console.provide(who, key, {"fields": {"detail": "x", "more": "y"}})
        else:
            body = {"action": decision, "rejection_reason": "no" if decision == "reject" else ""}
            view = await console.decide(who, key, body)
    except web.HTTPException as exc:
        return exc.status, exc.text or ""
    return 200, str(view["said"])


def links_in(seed: int) -> random.Random | None:
    """The stream of a replica seed's link answers, in about half the seeds; None in the
    others, which run exactly as they did before links were in the simulation. Which half is
    the stream's first draw; stream 640 was chosen among those whose half leaves out the
    seeds recorded before links existed (1, 3, 5, 33, 137, 148, 1295: each finds a defect
    with its fix taken out) and takes six of CI's twelve."""
    rng = random.Random(f"replicas:{seed}:links:640")
    return rng if rng.random() < 0.5 else None


def _nonce(question: str, reviewer: str, action: str) -> str:
    """A link's nonce, naming the question it was issued for (the invariant reads it)."""
    return f"{question}/{reviewer}/{action}"


async def answer_by_link(
    humans: SimulatedHumans,
    key: TaskKey,
    question: str,
    reviewer: str,
    decision: str,
    *,
    stale: bool,
) -> LinkAnswer:
    """`reviewer` answers `question` of `key`'s task with `decision` (approve, reject,
    provide) through a link of theirs, as its page takes it; `stale`: the link was issued
    for another question of the task, answered long ago."""
    issued_for = f"{question}-earlier" if stale else question
    action = "form" if decision == "provide" else decision
    token = humans.links.sign(
        key.task_id,
        action,  # type: ignore[arg-type]
        reviewer,
        humans.clock() + 3600,
        nonce=_nonce(issued_for, reviewer, action),
        question=issued_for,
    )
    form = {"decision": decision}
    if decision == "provide":
        form |= {"field:detail": "x", "field:more": "y"}
    return await humans.pages.answer(token, form)


def decided_only_by_routed(rec: TaskRecord | None) -> str | None:
    """Every answer a question of `rec` counted came from someone it was routed to by then,
    an approval was sent only with a quorum of distinct approvers, and every link used
    answered the question it was issued for (None: it holds)."""
    if rec is None:
        return None
    for entry in rec.audit:
        if entry.action == LINK_USED:
            question = str(entry.detail.get("question", ""))
            issued_for = str(entry.detail.get("nonce", "")).split("/")[0]
            if issued_for != question:
                return (
                    f"{rec.task_id}: a link issued for question {issued_for} answered "
                    f"question {question}"
                )
    told: dict[str, set[str]] = {}
    approvals: dict[str, set[str]] = {}
    for entry in rec.audit:
        question = str(entry.detail.get("question", ""))
        reviewer = str(entry.detail.get("reviewer", ""))
        if entry.action == QUEUED:
            told.setdefault(question, set()).add(reviewer)
        elif entry.action in (APPROVAL, REJECTION):
            routed = set(FIRST_LEVEL) | told.get(question, set())
            if reviewer not in routed:
                return (
                    f"{rec.task_id}: {reviewer} answered question {question}, "
                    f"routed to {sorted(routed)} only"
                )
            if entry.action == APPROVAL:
                approvals.setdefault(question, set()).add(reviewer)
    asked = ""
    for t in rec.history:
        if t.event is Event.RECV_TASK_NEED_HUMAN:
            asked = t.message_id or ""  # the question's id is its message's
        elif t.event is Event.SEND_HUMAN_APPROVE:
            counted = len(approvals.get(asked, ()))
            if counted < QUORUM:
                return (
                    f"{rec.task_id}: question {asked} approved with {counted} "
                    f"approval(s) of {QUORUM}"
                )
    return None


__all__ = [
    "EVERYONE",
    "FIRST_LEVEL",
    "MAILED",
    "NOT_ROUTED",
    "PEOPLE",
    "QUORUM",
    "SECOND_LEVEL",
    "SimulatedHumans",
    "answer_by_console",
    "answer_by_link",
    "decided",
    "decided_only_by_routed",
    "enable_people",
    "enable_people_console",
    "links_in",
]
