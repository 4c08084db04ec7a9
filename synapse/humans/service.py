"""`Humans`: tells people that a decision waits, reminds and escalates, times out by policy,
and takes decisions from signed links, keeping every step in the task's audit trail.

It watches the peer's own requests (the requester side, whose people decide): a task that
enters `need_human` (or `human_deciding`) or `info_needed` and matches a route is handled by
that route's policy (`synapse.humans.policy`).

**Nothing is lost, nothing is sent twice.** Before a notification goes out, an entry
`human.queued` naming it is committed with the task; once delivered, `human.notified`. After a
restart, whatever was queued and not delivered is sent again, with the same key
(`Message-ID`, `Idempotency-Key`), and an action once queued is never planned again. Only a
crash between a delivery and its `human.notified` sends one twice, under the same key.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from synapse.humans import decisions
from synapse.humans.channels import NotificationFailed, send_email, send_webhook
from synapse.humans.config import HumansConfig, Person
from synapse.humans.links import LinkAction, LinkSigner
from synapse.humans.notices import Notice, Option
from synapse.humans.pages import add_routes
from synapse.humans.panel import humans_panel
from synapse.humans.policy import Due, due, window_of
from synapse.humans.question import (
    NOTIFIED,
    QUEUED,
    WAITING,
    OpenQuestion,
)
from synapse.logs import get_logger
from synapse.ops.console import Console
from synapse.ops.console import Reviewer as ConsoleReviewer
from synapse.p2p.engine import TaskKey, TaskRecord, Transition
from synapse.p2p.states import Role
from synapse.runtime.listener import RuntimeListener
from synapse.runtime.protocol import P2PProtocol
from synapse.transport.peer import Peer
from synapse.types import NackError, TaskState

log = get_logger("synapse.humans")

#: Attempts at one notification in one pass, then again after a pause that doubles.
ATTEMPTS = 3
MAX_PAUSE = 60.0


def _stamp(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


class Humans(RuntimeListener):
    """See the module's docstring; made by `enable_humans`."""

    def __init__(self, peer: Peer, config: HumansConfig) -> None:
        self.peer = peer
        self.config = config
        self.links = LinkSigner(config.link_secret)
        self._protocol: P2PProtocol | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None
        #: Notification key → (failures so far, not before this time).
        self._backoff: dict[str, tuple[int, float]] = {}
        #: Notification key → the delivery under way.
        self._sending: dict[str, asyncio.Task[None]] = {}
        self._closing = False

    # --- wiring ----------------------------------------------------------------------------

    def bind(self, protocol: P2PProtocol) -> None:
        self._protocol = protocol
        protocol.listeners.append(self)
        # Every answer to our questions, from any front, meets the configuration's rules.
        protocol.answer_gate = decisions.HumansGate(self)

    @property
    def protocol(self) -> P2PProtocol:
        if self._protocol is None:
            raise RuntimeError("the peer has not started")
        return self._protocol

    def clock(self) -> float:
        return self.protocol.clock()

    async def start(self) -> None:
        """Start watching (after `peer.start()`): questions waiting since before a restart,
        and notifications queued and not delivered, are taken up at once."""
        if self._task is None:
            self._closing = False
            self._session = aiohttp.ClientSession()
            self._task = asyncio.create_task(self._run(), name="synapse-humans")

    async def close(self) -> None:
        """Stop: deliveries under way are cancelled (what they did not record as delivered
        is sent again at the next start, under the same key)."""
        self._closing = True
        self._wake.set()
        task, self._task = self._task, None
        running = [t for t in (task, *self._sending.values()) if t is not None]
        for each in running:
            each.cancel()
        for each in running:
            with contextlib.suppress(asyncio.CancelledError):
                await each
        if self._session is not None:
            await self._session.close()
            self._session = None

    def on_transition(self, transition: Transition) -> None:
        if transition.role is Role.REQUESTER and (
            transition.to_state in WAITING or transition.from_state in WAITING
        ):
            self._wake.set()

    def on_restored(self, keys: tuple[TaskKey, ...]) -> None:
        # Tasks taken over from another replica may wait on a question: its reminders,
        # escalations and time-out are this replica's to keep now.
        self._wake.set()

    def public_url(self) -> str:
        if self.config.public_url:
            return self.config.public_url.rstrip("/")
        parts = urlsplit(self.protocol.view.endpoint)
        return f"{parts.scheme}://{parts.netloc}"

    # --- questions -------------------------------------------------------------------------

    def question_of(self, rec: TaskRecord) -> OpenQuestion | None:
        """The question `rec` waits on, if it is ours to handle (a route matches)."""
        if rec.role is not Role.REQUESTER or rec.state not in WAITING:
            return None
        start = next((t.at for t in reversed(rec.history) if t.to_state in WAITING), rec.updated_at)
        if rec.state is TaskState.INFO_NEEDED:
            if rec.need_info is None:
                return None
            need_info = rec.need_info
            kind, level, code = "need_info", 1, "need_info"
            reason, summary, deadline = need_info.question, "", _stamp(need_info.required_by)
            options: tuple[Option, ...] = ()
            missing = tuple((f.field, f.reason) for f in need_info.missing_fields)
            question_id = f"info@{start:.3f}"
        else:
            if rec.need_human is None:
                return None
            need = rec.need_human
            kind, level, code = "need_human", need.escalation_level, need.reason.code
            reason, deadline = need.reason.message, _stamp(need.deadline)
            summary = need.context.task_summary if need.context else ""
            options = tuple(
                Option(o.field, o.value, o.pros_cons, o.confidence) for o in need.options
            )
            missing = ()
            question_id = rec.need_human_id or f"human@{start:.3f}"
        route = self.config.route_for(
            task_type=rec.task.type,
            partner=rec.partner,
            question=kind,
            reason_code=code,
            level=level,
        )
        if route is None:
            return None
        window = window_of(route, start=start, deadline=deadline, escalation_level=level)
        return OpenQuestion(
            rec, route, window, kind, question_id, code, reason, summary, options, missing
        )

    def reviewer(self, reviewer_id: str) -> Person:
        return self.config.reviewers.get(reviewer_id) or Person(reviewer_id)

    # --- the loop ----------------------------------------------------------------------------

    async def _run(self) -> None:
        while not self._closing:
            self._wake.clear()
            try:
                next_at = await self.run_once()
            except Exception as exc:  # the loop outlives one bad pass
                log.warning("humans_pass_failed", error=repr(exc))
                next_at = self.clock() + 1.0
            timeout = None if next_at is None else max(0.0, next_at - self.clock())
            # `asyncio.timeout`, not `wait_for`: on 3.11 a cancel that comes as the event is
            # set is lost by `wait_for`, and `close` would wait for ever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wake.wait()

    async def run_once(self) -> float | None:
        """One pass over the waiting questions, each on its own (a slow mail server delays
        no other task's time-out): do what is due, deliver what is queued; return when the
        next thing falls due (None: nothing planned)."""
        questions = [q for rec in self.protocol.view.records() if (q := self.question_of(rec))]
        waiting = {q.rec.task_id for q in questions}
        for notification in [k for k in self._backoff if k.split("/", 1)[0] not in waiting]:
            del self._backoff[notification]  # its question was answered meanwhile
        found = await asyncio.gather(*(self._advance(q) for q in questions), return_exceptions=True)
        next_times: list[float] = []
        for question, when in zip(questions, found, strict=True):
            if isinstance(when, BaseException):
                if not isinstance(when, Exception):
                    raise when
                log.warning("humans_step_failed", task_id=question.rec.task_id, error=repr(when))
                next_times.append(self.clock() + 1.0)
            elif when is not None:
                next_times.append(when)
        return min(next_times) if next_times else None

    async def _advance(self, question: OpenQuestion) -> float | None:
        done = {
            str(e.detail["step"])
            for e in question.rec.audit
            if e.detail.get("question") == question.id and "step" in e.detail
        }
        ready, next_at = due(question.route, question.window, done, self.clock())
        for action in ready:
            if question.rec.state not in WAITING:
                break
            if action.kind == "timeout":
                await decisions.time_out(self, question)
            else:
                await self._queue(question, action)
        retry_at = await self._deliver_pending(question)
        times = [t for t in (next_at, retry_at) if t is not None]
        return min(times) if times else None

    async def _queue(self, question: OpenQuestion, action: Due) -> None:
        """Write what `action` sends (one entry per notification) and mark it done, in one
        commit, before anything is sent."""
        protocol, key = self.protocol, question.rec.key
        level = question.route.levels[action.level - 1]
        for channel_name in level.channels:
            channel = self.config.channels[channel_name]
            if channel.kind == "email":
                people = [self.reviewer(r) for r in level.reviewers]
                targets = [(p.id, p.email) for p in people if p.email]
            else:
                targets = [(f"channel:{channel_name}", channel.url)]
            for reviewer_id, to in targets:
                notification = (
                    f"{key.task_id}/{question.id}/{action.key}/{channel_name}/{reviewer_id}"
                )
                protocol.note_task_soon(
                    key,
                    QUEUED,
                    {
                        "question": question.id,
                        "key": notification,
                        "kind": action.kind,
                        "level": action.level,
                        "channel": channel_name,
                        "reviewer": reviewer_id,
                        "to": to,
                    },
                )
        await protocol.note_task(
            key,
            f"human.{action.kind}",
            {"question": question.id, "step": action.key, "level": action.level},
        )
        log.info(
            "human_" + action.kind,
            task_id=key.task_id,
            route=question.route.name,
            level=action.level,
        )

    async def _deliver_pending(self, question: OpenQuestion) -> float | None:
        """Start delivering what is queued and not delivered, each recipient's notifications
        one after the other, in the order they were queued (a reminder never overtakes the
        escalation it follows, when a restart finds both due), recipients apart (a slow
        server holds up no other); when to look again for those failing."""
        delivered = {e.detail.get("key") for e in question.entries(NOTIFIED)}
        now, retry_at = self.clock(), None
        busy: set[tuple[str, str]] = set()  # recipients with an earlier one not delivered
        for entry in question.entries(QUEUED):
            notification = str(entry.detail["key"])
            if notification in delivered:
                continue
            recipient = (str(entry.detail["channel"]), str(entry.detail["reviewer"]))
            if recipient in busy:
                continue  # started once the one before it is delivered
            busy.add(recipient)
            if notification in self._sending:
                continue
            not_before = self._backoff.get(notification, (0, 0.0))[1]
            if not_before > now:
                retry_at = not_before if retry_at is None else min(retry_at, not_before)
                continue
            self._sending[notification] = asyncio.create_task(
                self._deliver(question, entry.detail), name=f"synapse-humans {notification}"
            )
        return retry_at

    async def _deliver(self, question: OpenQuestion, detail: Mapping[str, Any]) -> None:
        notification = str(detail["key"])
        try:
            await self._send(question, detail)
        except NotificationFailed as exc:
            failures = self._backoff.get(notification, (0, 0.0))[0] + 1
            pause = min(MAX_PAUSE, 2.0**failures)
            self._backoff[notification] = (failures, self.clock() + pause)
            log.warning(
                "human_notification_failed",
                task_id=question.rec.task_id,
                key=notification,
                failures=failures,
                error=str(exc),
            )
        else:
            self._backoff.pop(notification, None)
            try:
                await self.protocol.note_task(
                    question.rec.key,
                    NOTIFIED,
                    {"question": question.id, "key": notification, "channel": detail["channel"]},
                )
            except NackError as exc:
                # Another replica took the task over while this one sent: the replica that
                # holds it reads the notification queued and not recorded sent, and sends it
                # again (the same links: a copy, not a second set).
                log.info(
                    "human_notification_unrecorded",
                    task_id=question.rec.task_id,
                    key=notification,
                    reason=exc.message,
                )
        finally:
            self._sending.pop(notification, None)
            self._wake.set()  # a failure plans its retry; a success may end a wait

    async def _send(self, question: OpenQuestion, detail: Mapping[str, Any]) -> None:
        channel = self.config.channels[str(detail["channel"])]
        notice = self.notice(question, detail)
        last: NotificationFailed | None = None
        for attempt in range(ATTEMPTS):
            try:
                if channel.kind == "email":
                    await send_email(channel, notice, str(detail["to"]))
                else:
                    assert self._session is not None
                    await send_webhook(self._session, channel, notice)
                return
            except NotificationFailed as exc:
                last = exc
                if attempt + 1 < ATTEMPTS:
                    await asyncio.sleep(0.2 * 2**attempt)
        assert last is not None
        raise last

    def notice(self, question: OpenQuestion, detail: Mapping[str, Any]) -> Notice:
        reviewer = str(detail["reviewer"])
        actions: tuple[LinkAction, ...] = (
            ("approve", "reject", "form") if question.kind == "need_human" else ("form",)
        )
        return Notice(
            kind=str(detail["kind"]),
            task_id=question.rec.task_id,
            task_type=question.rec.task.type,
            partner=question.rec.partner,
            question=question.kind,
            level=int(detail["level"]),
            reason_code=question.reason_code,
            reason=question.reason,
            summary=question.summary,
            deadline=question.window.deadline,
            key=str(detail["key"]),
            options=question.options,
            missing=question.missing,
            links={a: self.link(question, a, reviewer, str(detail["key"])) for a in actions},
            suggested=suggested_values(question),
        )

    def link(
        self, question: OpenQuestion, action: LinkAction, reviewer: str, notification: str
    ) -> str:
        """The link of `action` for `reviewer` in `notification`: the same each time that
        notification is sent (its nonce comes from its key), so a copy sent again after a
        crash is the same single-use link, not a second one."""
        nonce = self.links.nonce_of(f"{notification}/{action}")
        token = self.links.sign(
            question.rec.task_id, action, reviewer, question.window.closes, nonce, question.id
        )
        return f"{self.public_url()}{self.config.path}/links/{token}"

    def routed_to(self, reviewer: ConsoleReviewer, rec: TaskRecord) -> bool:
        """Whether the console shows `rec` to `reviewer`: a question routed to reviewers is
        shown to those of its levels told so far (and the first); everything else, and
        everything to a console user who is no configured reviewer, is shown as before."""
        if reviewer.user_id not in self.config.reviewers:
            return True
        question = self.question_of(rec)
        if question is None:
            return True
        return reviewer.user_id in decisions.routed_to(question)

    def attach_console(self, console: Console) -> None:
        """Show each task's people on its console page, and each reviewer only the
        questions routed to them."""
        console.add_panel("humans", "People told, links opened, decisions", humans_panel)
        console.restrict(self.routed_to)

    def record(self, task_id: str) -> TaskRecord | None:
        return self.protocol.view.get(TaskKey(self.protocol.view.agent_id, task_id))


def suggested_values(question: OpenQuestion) -> dict[str, Any]:
    """The value the partner suggests for each field a need_info asks (those with one)."""
    need = question.rec.need_info if question.kind == "need_info" else None
    if need is None:
        return {}
    return {
        f.field: f.suggested_value for f in need.missing_fields if f.suggested_value is not None
    }


def enable_humans(peer: Peer, config: HumansConfig) -> Humans:
    """Notify, escalate and take decisions from links for `peer`'s requests (call before
    `peer.start()`; then `await humans.start()` after it, and `close()` before closing)."""
    humans = Humans(peer, config)
    peer.protocol_hooks.append(humans.bind)
    peer.app_hooks.append(lambda app: add_routes(app, humans))
    return humans


__all__ = ["Humans", "enable_humans"]
