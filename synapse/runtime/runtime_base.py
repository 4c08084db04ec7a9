"""The asyncio runtime's state and the moves its parts share: the engine and the store it
commits to, applying a `Step` (record, commit, carry out), one change of a task at a time
(`settled`), observers. Also the values it hands out: `TaskHandle`, `Outcome`, `Receipt`.
`synapse.runtime.protocol.P2PProtocol` is this with the handler it runs (`running`) and the
messages it delivers (`delivering`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from synapse.logs import get_logger
from synapse.p2p.audit import AuditKeys, append_audit, audit_seal
from synapse.p2p.commands import Cancel, Decide, ProvideInfo, StartDeciding
from synapse.p2p.config import P2PConfig
from synapse.p2p.delivery import TaskQueue
from synapse.p2p.engine import (
    UNDELIVERABLE,
    CancelExecution,
    DropQueued,
    Engine,
    Outgoing,
    PartnerReachability,
    Refusal,
    ResumeExecution,
    StartExecution,
    Step,
    TaskEvent,
    TaskKey,
    TaskRecord,
)
from synapse.p2p.states import Event
from synapse.runtime.answers import AnswerGate, BasicGate, Front, TaskAnswer
from synapse.runtime.handler import TaskHandler
from synapse.runtime.listener import Direction, Listeners, MessageEvent
from synapse.runtime.sender import CallbackSender, DeliveryError
from synapse.runtime.stream import EventStream
from synapse.runtime.view import RuntimeView
from synapse.store.base import OutboxItem, TaskStore
from synapse.store.memory import MemoryStore
from synapse.types import (
    DecidedBy,
    DecisionAction,
    LocalProtocolError,
    Message,
    NackError,
    NackPayload,
    NotReady,
    TaskError,
    TaskRejectPayload,
    TaskResult,
    TaskState,
)
from synapse.types.codec import IdFactory
from synapse.types.errors import SynapseException

log = get_logger("synapse.p2p")
#: The standard-library logger `log` writes to: its level is asked before a debug line's
#: fields are gathered (asking `log` goes through structlog's method first).
p2p_logger = logging.getLogger("synapse.p2p")


@dataclass(slots=True)
class _Queued:
    """An outgoing message in a task's delivery queue, with its outbox entry."""

    out: Outgoing
    item: OutboxItem
    #: The number of the commit that makes its outbox entry durable (every commit started
    #: after the entry was buffered does): 0 for an entry read from the store.
    durable_with: int = 0


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a task we requested ended."""

    state: TaskState
    result: TaskResult | None = None
    error: TaskError | None = None
    reject: TaskRejectPayload | None = None
    #: The `nack` the executor answered our `task_request` with, if it refused it.
    refusal: NackPayload | None = None

    @property
    def ok(self) -> bool:
        return self.state is TaskState.COMPLETED

    @classmethod
    def of(cls, rec: TaskRecord) -> Outcome:
        return cls(rec.state, rec.result, rec.error, rec.reject, rec.refusal)


class Receipt(msgspec.Struct, frozen=True):
    """What became of one POSTed message (`P2PProtocol.receive_message`): the reply, or the
    refusal to answer with, and what the transport logs about it, so that it never reads the
    engine."""

    reply: Message | None
    #: The refusal when the message was refused (`reply` is then None); it changed nothing.
    error: NackError | None
    #: The task the message is about, if any.
    task_id: str | None
    #: The task's state before the message (None: no such task here, or not asked for).
    from_state: TaskState | None
    #: Its state after (the same as `from_state` when refused).
    to_state: TaskState | None


class TaskAbandoned(SynapseException):
    """The requester gave up on a task by itself: its executor fell silent past
    `task_timeout` plus the heartbeat-loss time, the deadline passed, or the executor
    answered `task_not_found`. `outcome` is the local failure (`state` failed)."""

    def __init__(self, task_id: str, partner: str, outcome: Outcome) -> None:
        error = outcome.error
        why = f"{error.code}: {error.message}" if error is not None else "gave up"
        super().__init__(f"task {task_id} at {partner} given up: {why}")
        self.task_id = task_id
        self.partner = partner
        self.outcome = outcome


class TaskUndeliverable(DeliveryError):
    """The `task_request` never reached its executor: every delivery attempt failed (the
    partner is down, or unreachable). The task failed here (`outcome.error.code` is
    `undeliverable`); nothing of it runs anywhere."""

    def __init__(self, task_id: str, partner: str, outcome: Outcome) -> None:
        error = outcome.error
        super().__init__(
            f"task {task_id} never reached {partner}: {error.message if error else ''}",
            retryable=False,
        )
        self.task_id = task_id
        self.partner = partner
        self.outcome = outcome


class TaskHandle(EventStream[TaskEvent, "Outcome"]):
    """A task we requested: await it, iterate its events, answer it, cancel it."""

    def __init__(self, runtime: RuntimeBase, key: TaskKey, partner: str) -> None:
        super().__init__()
        self._runtime = runtime
        self.key = key
        self.partner = partner
        #: Kept once final: the engine lets go of finished tasks (the store keeps them).
        self._final: TaskRecord | None = None

    @property
    def task_id(self) -> str:
        return self.key.task_id

    @property
    def record(self) -> TaskRecord:
        if self._final is not None:
            return self._final
        rec = self._runtime.engine.get(self.key)
        if rec is None:
            raise LocalProtocolError(f"task {self.key} is no longer kept (past its retention)")
        return rec

    @property
    def state(self) -> TaskState:
        return self.record.state

    def _is_last(self, event: TaskEvent) -> bool:
        return event.state.is_final

    def settle(self) -> None:
        """The task ended: settle the outcome from its record (the runtime's call)."""
        rec = self._final = self.record
        outcome = Outcome.of(rec)
        if rec.history and rec.history[-1].event is Event.GIVE_UP:
            gave_up: Exception = TaskAbandoned(rec.task_id, rec.partner, outcome)
            if rec.error is not None and rec.error.code == UNDELIVERABLE:
                gave_up = TaskUndeliverable(rec.task_id, rec.partner, outcome)
            self.fail_with(gave_up)
            # Retrieved by whoever awaits the handle; nobody may, and that is no error.
            self._done.exception()
        else:
            self.settle_with(outcome)

    async def result(self, timeout: float | None = None) -> Outcome:
        """Wait for the outcome (at most `timeout` seconds: then `TimeoutError`, saying what
        was waited for). Raises `TaskAbandoned` if the requester gave up on the task, and
        `TaskUndeliverable` if its request never reached the executor."""
        try:
            return await super().result(timeout)
        except TimeoutError:
            raise TimeoutError(
                f"no outcome of task {self.task_id} from {self.partner} within {timeout:g} s "
                f"(still {self.state.value})"
            ) from None

    async def provide_info(
        self,
        fields: Mapping[str, Any],
        notes: str | None = None,
        *,
        provided_by: str = "",
        front: Front = "python",
        link: str = "",
    ) -> str:
        """Answer `task_need_info` (`provided_by`: who answered, for the task's audit trail),
        through the runtime's `AnswerGate`: `AnswerRefused` if it cannot be taken. Returns
        once the answer is durable (it is sent then), with what to tell whoever answered."""
        rt = self._runtime
        by = DecidedBy(user_id=provided_by or rt.engine.agent_id)
        answer = TaskAnswer("provide", by, front, fields=dict(fields), notes=notes or "", link=link)
        return await rt.answer_gate.admit(self, answer, self._send)

    async def start_deciding(self) -> None:
        """Note that a person is deciding (`need_human → human_deciding`)."""
        rt = self._runtime
        await rt.settled(self.key)
        moves = rt.held_here(self.key)
        await rt.apply_durably(rt.engine.handle(StartDeciding(self.key), rt.clock()), moves)

    async def decide(
        self,
        action: DecisionAction,
        *,
        approved_fields: Mapping[str, Any] | None = None,
        rejection_reason: str = "",
        notes: str = "",
        decided_by: DecidedBy | None = None,
        front: Front = "python",
        link: str = "",
    ) -> str:
        """Answer `task_need_human` with a `human_decision`, through the runtime's
        `AnswerGate`: `AnswerRefused` if it cannot be taken. Returns once the decision is
        durable (or, short of a quorum, the answer recorded), with what to tell whoever
        answered. `front` says where it came from, `link` the nonce of the signed link it
        was given through (both for the audit trail)."""
        rt = self._runtime
        by = decided_by or DecidedBy(user_id=rt.engine.agent_id)
        answer = TaskAnswer(
            "decide",
            by,
            front,
            action=action,
            fields=dict(approved_fields) if approved_fields is not None else None,
            rejection_reason=rejection_reason,
            notes=notes,
            link=link,
        )
        return await rt.answer_gate.admit(self, answer, self._send)

    async def _send(self, answer: TaskAnswer) -> None:
        """Send an answer the gate admitted, with its audit entry; return once durable."""
        rt = self._runtime
        await rt.settled(self.key)
        moves = rt.held_here(self.key)
        by = answer.by
        if answer.kind == "provide":
            fields = answer.fields or {}
            step = rt.engine.handle(ProvideInfo(self.key, fields, answer.notes or None), rt.clock())
            detail: dict[str, Any] = {"fields": dict(fields), "notes": answer.notes or None}
            self._audit(step, by.user_id, "info_provided", {**detail, "front": answer.front})
            await rt.apply_durably(step, moves)
            return
        action = answer.action
        assert action is not None
        decision_id = f"dec-{rt.engine.ids.message_id()[4:]}"
        command = Decide(
            self.key,
            action,
            by,
            decision_id,
            answer.fields,
            answer.rejection_reason.strip() if action is DecisionAction.REJECT else "",
            answer.notes,
        )
        step = rt.engine.handle(command, rt.clock())
        detail = {
            "user_name": by.user_name,
            "role": by.role,
            "notes": answer.notes,
            "front": answer.front,
        }
        if action is DecisionAction.APPROVE:
            detail["approved_fields"] = dict(answer.fields or {})
        else:
            detail["rejection_reason"] = answer.rejection_reason
        self._audit(step, by.user_id, action.value, detail)
        await rt.apply_durably(step, moves)

    def _audit(self, step: Step, actor: str, action: str, detail: dict[str, Any]) -> None:
        # Before `apply`, which stores the record: the entry is durable with the answer.
        message_id = step.outgoing[0].message.id if step.outgoing else None
        self._runtime.append_audit(self.record, actor, action, message_id, detail)

    async def approve(self, approved_fields: Mapping[str, Any] | None = None, **kw: Any) -> str:
        return await self.decide(DecisionAction.APPROVE, approved_fields=approved_fields, **kw)

    async def reject(self, reason: str = "", **kw: Any) -> str:
        return await self.decide(DecisionAction.REJECT, rejection_reason=reason, **kw)

    async def cancel(self, reason: str | None = None) -> None:
        """Send `task_cancel` (once the request has its reply); await `result()` for the end.
        Returns once the cancel is durable."""
        rt = self._runtime
        await rt.settled(self.key)
        moves = rt.held_here(self.key)
        await rt.apply_durably(rt.engine.handle(Cancel(self.key, reason), rt.clock()), moves)


def _elsewhere() -> NotReady:
    """A change of a task that another replica works on (and holds the lease of)."""
    return NotReady(
        "another replica works on this task now: nothing was changed here; retry",
        {"reason": "owner_elsewhere"},
    )


class RuntimeBase:
    """The runtime's state, and what its handler runner and its deliveries share."""

    def __init__(
        self,
        *,
        agent_id: str,
        endpoint: str,
        config: P2PConfig | None = None,
        handler: TaskHandler | None = None,
        sender: CallbackSender | None = None,
        store: TaskStore | None = None,
        clock: Callable[[], float] = time.time,
        ids: IdFactory | None = None,
        listeners: Listeners | None = None,
    ) -> None:
        self.config = config or P2PConfig()
        self.store: TaskStore = store or MemoryStore()
        self.engine = Engine(agent_id=agent_id, endpoint=endpoint, config=self.config, ids=ids)
        #: What the layers above may read of the tasks (they never touch `engine`).
        self.view = RuntimeView(self.engine)
        # Finished tasks leave memory (see `_evict`); the engine finds them in the store.
        self.engine.finished_lookup = self.store.get_task
        if isinstance(self.store, MemoryStore):
            self.store.max_finished = self.config.max_finished_in_memory
        #: Final tasks not yet evicted → the commit after which their record is durable.
        self._finals: dict[TaskKey, int] = {}
        #: Those of `_finals` whose commit was not done at the last commit: all a commit
        #: looks through (a final task still delivering its last callback is evicted by
        #: its delivery worker, not rescanned at every commit).
        self._finals_awaiting_commit: dict[TaskKey, int] = {}
        #: When each task was last let go (`release`), numbered: a change decided before
        #: and stored after was fenced out. Forgotten by the thousand (a missing task reads
        #: as the last forgetting's number: a check made before it fails, safely).
        self._releases: dict[TaskKey, int] = {}
        self._release_number = self._releases_floor = 0
        #: The tasks let go while announcements wait for a commit, in order: one leaves out
        #: those let go after its step (`_announce_kept`). Emptied when none waits.
        self._released: list[TaskKey] = []
        self._commits_started = 0
        self._commits_done = 0
        #: Commits started and not yet ended (succeeded or failed).
        self._commits_in_flight = 0
        #: Set when the next commit ends, however it ends; made only while the announcer
        #: waits for one (no object a commit otherwise).
        self._commit_ended: asyncio.Event | None = None
        #: What steps applied without a commit of their own announce (to handles, listeners,
        #: the log), held until the commit that makes their writes durable is done: (its
        #: number, the announcement), in the order the steps were applied. Announced means
        #: durable: a crash before that commit takes back the change and its announcement
        #: together.
        self._unannounced: deque[tuple[int, Callable[[], None]]] = deque()
        #: Makes sure a commit comes for `_unannounced` (an idle peer makes none by itself).
        self._announcer: asyncio.Task[None] | None = None
        self._purge_task: asyncio.Task[None] | None = None
        self.clock = clock
        self._handler: TaskHandler | None = None
        self._sender = sender
        #: Agent-id prefix → in-process sender for virtual partners (see `route_local`).
        self._local_senders: dict[str, CallbackSender] = {}
        self._handles: dict[TaskKey, TaskHandle] = {}
        self._running: dict[TaskKey, asyncio.Task[None]] = {}
        self._waiters: dict[TaskKey, asyncio.Future[Any]] = {}
        self._queues: dict[TaskKey, TaskQueue[_Queued]] = {}
        #: Tasks with a running handler that an incoming message's commit is about: the
        #: handler's outcome waits for it (see `_run_handler`).
        self._committing: dict[TaskKey, set[asyncio.Future[None]]] = {}
        self._workers: dict[TaskKey, asyncio.Task[None]] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._heartbeat_ok: dict[str, asyncio.Event] = {}
        self._timer_task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._sleep_until = float("inf")
        self._closed = False
        #: Replicas sharing a store (`synapse.store.leases`): asked before each POST of an
        #: outbox message whether this process may send it now: "send", "gone" (another
        #: replica delivered or dropped it) or "lost" (the task is not ours any more).
        self.delivery_gate: Callable[[OutboxItem], Awaitable[str]] | None = None
        #: Every answer to a question of ours passes it (`synapse.runtime.answers`):
        #: `synapse.humans` installs one with the configured people's rules.
        self.answer_gate: AnswerGate = BasicGate()
        #: The secrets audit trails are keyed with (`synapse.p2p.audit`), kept outside the
        #: store; None: unkeyed SHA-256 chains.
        self.audit_keys: AuditKeys | None = None
        #: Told of messages, transitions, handler runs, deliveries, commits, nacks, retries
        #: (metrics, tracing, health, the console, timelines: `RuntimeListener`). A `Peer`
        #: shares this list with its server, client and lean route.
        self.listeners: Listeners = listeners if listeners is not None else Listeners()
        if handler is not None:
            self.set_task_handler(handler)

    def append_audit(
        self,
        rec: TaskRecord,
        actor: str,
        action: str,
        message_id: str | None,
        detail: Mapping[str, Any],
    ) -> None:
        """Add an entry to `rec`'s audit trail (keyed and sealed with `audit_keys`, when this
        peer has them); it is stored with the record's next write."""
        keys = self.audit_keys
        append_audit(rec.audit, self.clock(), actor, action, message_id, detail, keys)
        if keys is not None:
            rec.audit_seal = audit_seal(rec.key, rec.audit, keys)

    def _state_of(self, key: TaskKey | None) -> TaskState | None:
        rec = self.engine.get(key) if key is not None else None
        return rec.state if rec is not None else None

    async def commit(self) -> None:
        """Make every effect applied so far durable (see `TaskStore.commit`)."""
        await self._commit()

    async def _commit(self, *, discard_after: int | None = None) -> None:
        self._commits_started += 1
        number = self._commits_started
        self._commits_in_flight += 1
        try:
            if not self.listeners:
                await self._store_commit(discard_after)
            else:
                started = time.perf_counter()
                try:
                    await self._store_commit(discard_after)
                except Exception as exc:
                    self.listeners.on_commit(time.perf_counter() - started, exc)
                    raise
                self.listeners.on_commit(time.perf_counter() - started, None)
            self._commits_done = max(self._commits_done, number)
        finally:
            self._commits_in_flight -= 1
            if self._commit_ended is not None:
                self._commit_ended.set()
                self._commit_ended = None
        if self._unannounced:
            self._announce_durable()
        awaiting = self._finals_awaiting_commit
        if awaiting:
            done = self._commits_done
            for key in [k for k, n in awaiting.items() if n <= done]:
                del awaiting[key]
                self._evict(key)

    def _evict(self, key: TaskKey) -> None:
        """Let a final task go from memory once its record is durable and nothing about it
        is left to deliver (its last callback was answered); the store keeps it."""
        number = self._finals.get(key)
        if number is None or number > self._commits_done or key in self._queues:
            return
        del self._finals[key]
        handle = self._handles.pop(key, None)
        if handle is not None and not handle.settled:
            handle.settle()  # from the record, before it leaves memory
        self.engine.forget(key)
        self.listeners.on_evicted(key)

    def release(self, key: TaskKey) -> None:
        """Let a task go without writing anything: another process owns it now (replicas
        sharing a store, `synapse.store.leases`). Its handler and deliveries stop here."""
        for registry in (self._running, self._workers):
            task = registry.pop(key, None)
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        for kept in (self._queues, self._finals, self._finals_awaiting_commit, self._waiters):
            kept.pop(key, None)
        self.engine.release(key)
        self._release_number += 1
        if len(self._releases) >= 1000:
            self._releases.clear()
            self._releases_floor = self._release_number
        self._releases[key] = self._release_number
        if self._unannounced:
            self._released.append(key)

    async def _store_commit(self, discard_after: int | None) -> None:
        # A store written before `discard_after` existed takes no argument.
        if discard_after is None:
            await self.store.commit()
        else:
            await self.store.commit(discard_after=discard_after)

    def apply(self, step: Step) -> None:
        """Carry out what the engine decided. Never awaits: engine calls stay atomic."""
        self._carry_out(step, self._record(step))

    def _record(self, step: Step) -> list[_Queued | Outgoing]:
        """The step's writes: its tasks and its outbox entries (buffered in the store)."""
        if step.transitions:
            self._persist(step)
        return [self._outbox(out) for out in step.outgoing]

    def _carry_out(
        self, step: Step, queued: list[_Queued | Outgoing], *, committed: bool = False
    ) -> None:
        """Start the step's deliveries and actions once its writes are recorded, and announce
        it once they are durable: now when `committed`, else with the next commit to start
        (one is made sure of, see `_announce_when_durable`)."""
        # A drop takes the task's messages queued before this step, never this step's own (a
        # requester giving up drops what was queued and then sends its task_cancel).
        for action in step.actions:
            if isinstance(action, DropQueued):
                self._drop_queued(action.key)
        for item in queued:
            if isinstance(item, Outgoing):
                self._spawn(self._send_once(item))  # heartbeats: the next one comes anyway
            else:
                self._queue(item)
        for action in step.actions:
            if not isinstance(action, DropQueued | TaskEvent):
                self._act(action)
        # Durable already, or with the next commit to start (the step's writes are buffered).
        durable_with = self._commits_done if committed else self._commits_started + 1
        for transition in step.transitions:
            if transition.to_state.is_final:
                self._finals[transition.key] = durable_with
                if durable_with > self._commits_done:
                    self._finals_awaiting_commit[transition.key] = durable_with
        if committed:
            self._announce(step)
            for transition in step.transitions:
                if transition.to_state.is_final:
                    self._evict(transition.key)
        elif step.transitions or step.actions:
            released = len(self._released)
            self.announce_when_durable(lambda: self._announce_kept(step, released))
        self._rearm_timer()

    def _announce_kept(self, step: Step, released: int) -> None:
        """Announce `step` once its commit is done, but nothing of a task let go since it
        was applied (the first `released` of `_released` came before): between replicas, the
        task's lease was lost, the commit dropped the step's writes of it, and another
        replica's outcome is the one that stands."""
        if len(self._released) == released:
            self._announce(step)
            return
        let_go = set(self._released[released:])
        gone = {t.key for t in step.transitions if t.key in let_go}
        gone.update(key for a in step.actions if (key := getattr(a, "key", None)) in let_go)
        if not gone:
            self._announce(step)
            return
        for key in sorted(gone, key=lambda k: (k.requester, k.task_id)):
            log.info("announcement_withheld", task_id=key.task_id, requester=key.requester)
        kept = msgspec.structs.replace(
            step,
            transitions=[t for t in step.transitions if t.key not in gone],
            actions=[a for a in step.actions if getattr(a, "key", None) not in gone],
        )
        self._announce(kept)

    def announce_when_durable(self, announce: Callable[[], None]) -> None:
        """Call `announce` once what is buffered in the store now is durable (with the next
        commit to start), in order with the other announcements; a commit is made sure of."""
        self._unannounced.append((self._commits_started + 1, announce))
        if self._announcer is None:
            self._announcer = asyncio.create_task(self._announce_when_durable())

    def _announce(self, step: Step) -> None:
        """Tell of a step whose writes are durable: listeners and the log of its transitions,
        handles of its events and of the outcomes it settled."""
        for transition in step.transitions:
            self.listeners.on_transition(transition)
            # A task's outcome is what an operator follows (one info line a task); the steps
            # before it are detail (debug), as is every message in and out.
            lifecycle = transition.to_state.is_final
            if lifecycle or p2p_logger.isEnabledFor(logging.DEBUG):
                (log.info if lifecycle else log.debug)(
                    "transition",
                    task_id=transition.key.task_id,
                    requester=transition.key.requester,
                    role=transition.role.value,
                    from_state=transition.from_state.value,
                    to_state=transition.to_state.value,
                    trigger=transition.event.value,
                    message_id=transition.message_id,
                )
        for action in step.actions:
            if isinstance(action, TaskEvent):
                self._act(action)
        for transition in step.transitions:
            if transition.to_state.is_final:
                handle = self._handles.get(transition.key)
                if handle is not None and not handle.settled:
                    handle.settle()

    def _announce_durable(self) -> None:
        """Announce the held steps whose commit is done, in the order they were applied."""
        held, done = self._unannounced, self._commits_done
        while held and held[0][0] <= done:
            try:
                held.popleft()[1]()
            except Exception as exc:  # telling is no part of the commit: it never undoes it
                log.error("announce_failed", error=repr(exc), exc_info=exc)
        if not held:
            self._released.clear()

    async def _announce_when_durable(self) -> None:
        """Make sure a commit comes for every held announcement: a commit under way (a
        delivery worker's, say) is waited for; when none covers them, this one commits."""
        try:
            while self._unannounced and not self._closed:
                needed = self._unannounced[-1][0]
                if needed <= self._commits_done:
                    self._announce_durable()
                    continue
                # Whoever applied the step may be about to commit (a handler's outcome is
                # committed by its delivery worker): one round of the loop lets it start.
                await asyncio.sleep(0)
                if self._commits_started >= needed and self._commits_in_flight:
                    if self._commit_ended is None:
                        self._commit_ended = asyncio.Event()
                    await self._commit_ended.wait()
                elif needed > self._commits_done:
                    await self._commit_patiently()
        except Exception as exc:  # closed while a store could not write
            if not self._closed:
                log.error("announce_failed", error=repr(exc))
        finally:
            self._announcer = None

    def _persist(self, step: Step) -> None:
        by_task: dict[TaskKey, list[Any]] = {}
        for transition in step.transitions:
            by_task.setdefault(transition.key, []).append(transition)
        for key, transitions in by_task.items():
            rec = self.engine.get(key)
            if rec is not None:
                self.store.put_task(rec, transitions)

    def _act(self, action: Any) -> None:
        if isinstance(action, TaskEvent):
            handle = self._handles.get(action.key)
            if handle is not None:
                handle.push(action)
        elif isinstance(action, StartExecution):
            self._start_handler(action)
        elif isinstance(action, ResumeExecution):
            waiter = self._waiters.pop(action.key, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(action.value)
        elif isinstance(action, CancelExecution):
            task = self._running.get(action.key)
            if task is not None and task is not asyncio.current_task() and not task.done():
                task.cancel()
        elif isinstance(action, PartnerReachability):
            log.warning("partner_reachability", partner=action.partner, reachable=action.reachable)
            if action.reachable:
                self._partner_heard(action.partner)
        elif isinstance(action, Refusal):
            log.warning(
                "message_refused_by_partner",
                task_id=action.key.task_id if action.key else None,
                message_id=action.sent.id,
                type=action.sent.message_type.value,
                code=action.nack.code,
                reason=action.nack.message,
            )

    async def settled(self, key: TaskKey) -> None:
        """Wait until no incoming message about task `key` is being committed.

        Its effect is durable then, or undone (a failed commit): only then is anything else
        about the task decided (a person's answer, a handler's progress or outcome, a timer,
        the next message), so that nothing is built on an effect that may yet vanish."""
        while holds := self._committing.get(key):
            await asyncio.wait(list(holds))

    async def apply_durably(self, step: Step, moves: tuple[TaskKey, int] | None = None) -> None:
        """Apply a step of our own making, and return once it is durable (a store that
        cannot write is waited out). `moves`: the task it changes, as `held_here` found it;
        `NotReady` if the task was let go meanwhile (another replica took it over, and the
        step's writes were dropped): nothing of it is kept, and nothing may say otherwise."""
        self.apply(step)
        await self._commit_patiently()
        if moves is not None:
            self._still_held(*moves)

    @property
    def tasks_held(self) -> frozenset[TaskKey]:
        """The tasks a message's commit holds now (nothing else about them is decided until
        it is done, see `settled`): empty whenever no such commit is in flight."""
        return frozenset(self._committing)

    def held_here(self, key: TaskKey) -> tuple[TaskKey, int]:
        """Check, before a change of task `key` is decided here, that this runtime holds it
        (in memory, or finished): `NotReady` if not (replicas: another one works on it, and
        this one has at most a stale copy from the store). Returns what `apply_durably`
        checks again once the change is durable."""
        if key not in self.engine.tasks:
            rec = self.engine.get(key)
            if rec is not None and not rec.is_final:
                raise _elsewhere()
        return key, self.releases_of(key)

    def releases_of(self, key: TaskKey) -> int:  # the number of its last release here
        return self._releases.get(key, self._releases_floor)

    def _still_held(self, key: TaskKey, releases: int) -> None:
        if self.releases_of(key) != releases:
            raise _elsewhere()

    def _hold(self, key: TaskKey) -> asyncio.Future[None]:
        held: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._committing.setdefault(key, set()).add(held)
        return held

    def _release_hold(self, key: TaskKey, held: asyncio.Future[None]) -> None:
        holds = self._committing.get(key)
        if holds is not None:
            holds.discard(held)
            if not holds:
                del self._committing[key]
        if not held.done():
            held.set_result(None)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _observe(
        self, direction: Direction, message: Message, partner: str, *answering: Message
    ) -> None:
        if self.listeners:  # `answering`: for a reply, the message it answers
            self.listeners.on_message(MessageEvent(direction, message, partner, *answering))

    @property
    def handler(self) -> TaskHandler | None:
        """The handler that runs our executor tasks (None until one is set)."""
        return self._handler

    def running_handlers(self) -> list[asyncio.Task[None]]:
        """The handlers running now, one per executor task."""
        return [task for task in self._running.values() if not task.done()]

    def delivery_workers(self) -> list[asyncio.Task[None]]:
        """The delivery workers with messages still to deliver, one per task."""
        return list(self._workers.values())

    def set_task_handler(self, handler: TaskHandler) -> None:
        self._handler = handler
        self.engine.validator = handler.validate_task
        self.engine.capabilities = handler.get_capabilities

    # --- provided by the runtime's parts (`Delivering`, `HandlerRunning`) ---------------------

    def _outbox(self, out: Outgoing) -> _Queued | Outgoing:
        raise NotImplementedError  # Delivering

    def _queue(self, queued: _Queued) -> None:
        raise NotImplementedError  # Delivering

    def _drop_queued(self, key: TaskKey) -> None:
        raise NotImplementedError  # Delivering

    async def _commit_patiently(self) -> None:
        raise NotImplementedError  # Delivering

    async def _send_once(self, out: Outgoing) -> None:
        raise NotImplementedError  # Delivering

    def _partner_heard(self, partner: str) -> None:
        raise NotImplementedError  # Delivering

    def _rearm_timer(self) -> None:
        raise NotImplementedError  # TimerFiring

    def _start_handler(self, action: StartExecution) -> None:
        raise NotImplementedError  # HandlerRunning

    def _require_sender(self, partner: str) -> CallbackSender:
        raise NotImplementedError  # HandlerRunning
