"""`P2PProtocol` (specs/protocol.md, 'Peer interfaces and configuration'): the asyncio runtime that
drives the sans-IO `Engine`.

It runs handlers as tasks, delivers each task's outgoing messages one at a time and in order
through a `CallbackSender`, fires the engine's timers from one sleeping coroutine, and gives
requesters `TaskHandle`s. It does no network I/O itself: the transport plugs in below it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

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
    TaskEventKind,
    TaskKey,
    TaskRecord,
    Validation,
)
from synapse.p2p.handler import (
    ExecutionContext,
    ResumableHandler,
    TaskFailure,
    TaskHandler,
    as_result,
)
from synapse.p2p.listener import AuditEntry, Direction, MessageEvent, RuntimeListener
from synapse.p2p.logs import get_logger
from synapse.p2p.persistence import (
    FencedOut,
    MemoryStore,
    OutboxItem,
    Snapshot,
    StoreUnavailable,
    TaskStore,
)
from synapse.p2p.sender import CallbackSender, DeliveryError
from synapse.p2p.states import Event
from synapse.p2p.stream import EventStream
from synapse.p2p.view import RuntimeView
from synapse.types import (
    CapabilityResponse,
    CapabilityResponsePayload,
    DecidedBy,
    DecisionAction,
    ErrorCode,
    Heartbeat,
    HeartbeatPayload,
    HumanContext,
    HumanDecisionPayload,
    HumanOption,
    LocalProtocolError,
    Message,
    MissingField,
    Nack,
    NackPayload,
    Priority,
    Reason,
    RemoteProtocolError,
    Sender,
    TaskContext,
    TaskError,
    TaskRejectPayload,
    TaskResult,
    TaskState,
    decode_typed,
    encode_message,
)
from synapse.types.codec import IdFactory
from synapse.types.errors import SynapseException

log = get_logger("synapse.p2p")

#: Seconds between commit attempts of a delivery worker while the store cannot write.
_STORE_RETRY_FIRST, _STORE_RETRY_MAX = 0.05, 2.0


@dataclass(slots=True)
class _Queued:
    """An outgoing message in a task's delivery queue, with its outbox entry."""

    out: Outgoing
    item: OutboxItem


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


@dataclass(frozen=True, slots=True)
class Receipt:
    """What became of one POSTed message (`P2PProtocol.receive_message`): the reply, or the
    refusal to answer with, and what the transport logs about it, so that it never reads the
    engine."""

    reply: Message | None
    #: The refusal when the message was refused (`reply` is then None); it changed nothing.
    error: RemoteProtocolError | None
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

    def __init__(self, runtime: P2PProtocol, key: TaskKey, partner: str) -> None:
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

    def _settle(self) -> None:
        rec = self._final = self.record
        outcome = Outcome.of(rec)
        if rec.history and rec.history[-1].event is Event.GIVE_UP:
            gave_up: Exception = TaskAbandoned(rec.task_id, rec.partner, outcome)
            if rec.error is not None and rec.error.code == UNDELIVERABLE:
                gave_up = TaskUndeliverable(rec.task_id, rec.partner, outcome)
            self._fail_with(gave_up)
            # Retrieved by whoever awaits the handle; nobody may, and that is no error.
            self._done.exception()
        else:
            self._settle_with(outcome)

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
        self, fields: Mapping[str, Any], notes: str | None = None, *, provided_by: str = ""
    ) -> None:
        """Answer `task_need_info` (`provided_by`: who answered, for the task's audit trail).
        Returns once the answer is durable (it is sent then)."""
        rt = self._runtime
        await rt.settled(self.key)
        step = rt.engine.provide_info(self.key, fields, now=rt.clock(), notes=notes)
        self._audit(
            step,
            provided_by or rt.engine.agent_id,
            "info_provided",
            {"fields": dict(fields), "notes": notes},
        )
        await rt.apply_durably(step)

    async def start_deciding(self) -> None:
        """Note that a person is deciding (`need_human → human_deciding`)."""
        rt = self._runtime
        await rt.settled(self.key)
        await rt.apply_durably(rt.engine.start_deciding(self.key, now=rt.clock()))

    async def decide(
        self,
        action: DecisionAction,
        *,
        approved_fields: Mapping[str, Any] | None = None,
        rejection_reason: str = "",
        notes: str = "",
        decided_by: DecidedBy | None = None,
    ) -> None:
        """Answer `task_need_human` with a `human_decision` (returns once it is durable)."""
        rt = self._runtime
        await rt.settled(self.key)
        by = decided_by or DecidedBy(user_id=rt.engine.agent_id)
        step = rt.engine.decide(
            self.key,
            action,
            now=rt.clock(),
            decided_by=by,
            decision_id=f"dec-{rt.engine.ids.message_id()[4:]}",
            approved_fields=approved_fields,
            rejection_reason=rejection_reason,
            notes=notes,
        )
        detail: dict[str, Any] = {"user_name": by.user_name, "role": by.role, "notes": notes}
        if action is DecisionAction.APPROVE:
            detail["approved_fields"] = dict(approved_fields or {})
        else:
            detail["rejection_reason"] = rejection_reason
        self._audit(step, by.user_id, action.value, detail)
        await rt.apply_durably(step)

    def _audit(self, step: Step, actor: str, action: str, detail: dict[str, Any]) -> None:
        # Before `apply`, which stores the record: the entry is durable with the answer.
        message_id = step.outgoing[0].message.id if step.outgoing else None
        entry = AuditEntry(self._runtime.clock(), actor, action, message_id, detail)
        self.record.audit.append(entry)

    async def approve(self, approved_fields: Mapping[str, Any] | None = None, **kw: Any) -> None:
        await self.decide(DecisionAction.APPROVE, approved_fields=approved_fields, **kw)

    async def reject(self, reason: str = "", **kw: Any) -> None:
        await self.decide(DecisionAction.REJECT, rejection_reason=reason, **kw)

    async def cancel(self, reason: str | None = None) -> None:
        """Send `task_cancel` (once the request has its reply); await `result()` for the end.
        Returns once the cancel is durable."""
        rt = self._runtime
        await rt.settled(self.key)
        await rt.apply_durably(rt.engine.cancel(self.key, now=rt.clock(), reason=reason))


class P2PProtocol:
    """The protocol handler of one peer (specs/protocol.md, 'Peer interfaces and configuration'),
    transport-independent."""

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
        self._commits_started = 0
        self._commits_done = 0
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
        #: Called synchronously for every message in or out; must not raise or block.
        self.observers: list[Callable[[MessageEvent], None]] = []
        #: Told of messages, transitions, handler runs, deliveries and commits (metrics,
        #: tracing, health, the console: `synapse.ops`).
        self.listeners: list[RuntimeListener] = []
        self._hooks_for: tuple[RuntimeListener, ...] = ()
        self._hooks_cache: dict[str, list[tuple[Any, Callable[..., Any]]]] = {}
        if handler is not None:
            self.set_task_handler(handler)

    # --- specs/protocol.md, 'Peer interfaces and configuration'
    # ------------------------------------------------------------------------

    async def handle_message(
        self,
        message: Message,
        *,
        commit: bool = True,
        stage: Callable[[Message], None] | None = None,
    ) -> Message:
        """Apply a POSTed message from an authenticated partner and return the reply.

        Raises `RemoteProtocolError` when the message is refused (the transport answers a `nack`).
        With `commit` (the default) its effects are durable when this returns, or, when the
        store cannot write them, undone (engine and store alike, nothing started or sent)
        and the message refused with a retryable `agent_not_ready`. `stage(reply)`, called
        before that commit, buffers writes that belong with the message (the transport's
        stored reply for deduplication): they are committed or dropped with it. With
        `commit=False` the caller commits, and nothing is undone if that fails.
        """
        self._observe("in", message, message.sender_id)
        if commit:
            # One message about a task at a time: the one before is durable or undone.
            key = self.engine.incoming_key(message)
            if key is not None and key in self._committing:
                await self.settled(key)
        mark = self.store.mark()
        checkpoint = self.engine.checkpoint(message) if commit else None
        try:
            step = self.engine.receive(message, self.clock())
        except RemoteProtocolError as exc:
            self._notify("on_refused", message, exc)
            log.info(
                "message_refused",
                message_id=message.id,
                type=message.message_type.value,
                sender=message.sender_id,
                task_id=getattr(message.payload, "task_id", None),
                code=exc.code.value,
                reason=exc.message,
            )
            raise
        assert step.reply is not None
        if not commit:
            self.apply(step)
        else:
            assert checkpoint is not None
            # What the message itself changed: others go on while its commit is awaited.
            after = self.engine.counted(checkpoint)
            # Record, commit, and only then start handlers and deliveries: what this
            # message set going must not run if the message is refused after all.
            committing = False
            key = checkpoint.key
            # Until the commit is done, nothing else about the task is decided (`settled`).
            held = self._hold(key) if key is not None else None
            try:
                queued = self._record(step)
                if stage is not None:
                    stage(step.reply)
                committing = True
                await self._commit(discard_after=mark)
            except BaseException as exc:
                # Whatever failed (the commit, or recording: a value the store cannot
                # encode), the message leaves no trace: nothing of it stored, nothing started.
                # A failed commit dropped this message's writes itself (`discard_after`);
                # what is buffered now was written by others while it ran (a handler's
                # completion, say), and must stay.
                if not committing:
                    self.store.discard(mark)
                self.engine.rollback(checkpoint, after)
                if isinstance(exc, FencedOut):
                    for key in exc.keys:  # another replica owns the task now
                        self.release(key)
                if not isinstance(exc, StoreUnavailable):
                    raise
                raise RemoteProtocolError(
                    ErrorCode.AGENT_NOT_READY,
                    "cannot store the message's effects; retry later",
                    {"reason": "store_unavailable"},
                ) from exc
            else:
                self._carry_out(step, queued, committed=True)
            finally:
                if held is not None and key is not None:
                    self._release_hold(key, held)
        self._observe("reply_out", step.reply, message.sender_id)
        if isinstance(message, Heartbeat):
            self._heartbeat_succeeded(message.sender_id)
        return step.reply

    async def receive_message(
        self,
        message: Message,
        *,
        stage: Callable[[Message], None] | None = None,
        states: bool = False,
    ) -> Receipt:
        """`handle_message` for a transport: a refusal is returned, not raised, and the
        receipt says which task the message was about and, with `states` (a lookup in the
        store for a task not in memory: ask only when it is logged), its states before and
        after."""
        key = self.engine.incoming_key(message)
        task_id = key.task_id if key is not None else None
        before = self._state_of(key) if states else None
        try:
            reply = await self.handle_message(message, stage=stage)
        except RemoteProtocolError as error:
            return Receipt(None, error, task_id, before, before)
        return Receipt(reply, None, task_id, before, self._state_of(key) if states else None)

    def _state_of(self, key: TaskKey | None) -> TaskState | None:
        rec = self.engine.get(key) if key is not None else None
        return rec.state if rec is not None else None

    def task_key_of(self, message: Message) -> TaskKey | None:
        """The key of the task a POSTed `message` is about (None if about no task)."""
        return self.engine.incoming_key(message)

    def live_task_keys(self) -> set[TaskKey]:
        """The keys of the tasks held in memory (the live ones, and finals not yet evicted)."""
        return set(self.engine.tasks)

    @property
    def agent_id(self) -> str:
        return self.engine.agent_id

    @property
    def endpoint(self) -> str:
        return self.engine.endpoint

    @property
    def ready(self) -> bool:
        """False while messages are answered `agent_not_ready` (recovery not done, say)."""
        return self.engine.ready

    @ready.setter
    def ready(self, value: bool) -> None:
        self.engine.ready = value

    async def commit(self) -> None:
        """Make every effect applied so far durable (see `TaskStore.commit`)."""
        await self._commit()

    async def _commit(self, *, discard_after: int | None = None) -> None:
        self._commits_started += 1
        number = self._commits_started
        if not self.listeners:
            await self._store_commit(discard_after)
        else:
            started = time.perf_counter()
            try:
                await self._store_commit(discard_after)
            except Exception as exc:
                self._notify("on_commit", time.perf_counter() - started, exc)
                raise
            self._notify("on_commit", time.perf_counter() - started, None)
        self._commits_done = max(self._commits_done, number)
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
        self.engine.forget(key)
        self._notify("on_evicted", key)
        handle = self._handles.pop(key, None)
        if handle is not None and not handle.settled:
            handle._settle()

    def release(self, key: TaskKey) -> None:
        """Let a task go without writing anything: another process owns it now (replicas
        sharing a store, `synapse.store.leases`). Its handler and deliveries stop here."""
        for registry in (self._running, self._workers):
            task = registry.pop(key, None)
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        self._queues.pop(key, None)
        self._finals.pop(key, None)
        self._finals_awaiting_commit.pop(key, None)
        self._waiters.pop(key, None)
        self.engine.release(key)

    async def _store_commit(self, discard_after: int | None) -> None:
        # A store written before `discard_after` existed takes no argument.
        if discard_after is None:
            await self.store.commit()
        else:
            await self.store.commit(discard_after=discard_after)

    def set_task_handler(self, handler: TaskHandler) -> None:
        self._handler = handler
        self.engine.validator = handler.validate_task
        self.engine.capabilities = handler.get_capabilities

    def set_callback_sender(self, sender: CallbackSender) -> None:
        self._sender = sender

    def route_local(self, prefix: str, sender: CallbackSender) -> None:
        """Deliver messages for partners whose agent id starts with `prefix` to `sender`.

        For virtual partners served in-process (the A2A binding's requesters): their
        callbacks still go through the outbox, in order, with its retries and durability,
        but reach `sender` instead of the transport.
        """
        self._local_senders[prefix] = sender

    def agent_endpoint(self) -> Sender:
        return self.engine.sender

    def get_task_status(self, task_id: str, requester: str | None = None) -> TaskState | None:
        """State of a task by id (as requester by default, else the given requester's)."""
        rec = self.engine.get(TaskKey(requester or self.engine.agent_id, task_id))
        if rec is None and requester is None:
            for key, candidate in self.engine.tasks.items():
                if key.task_id == task_id:
                    return candidate.state
        return rec.state if rec else None

    def partner_status(self) -> dict[str, bool]:
        """Every partner we have heard of: True if reachable, False once it missed
        `missed_heartbeat_limit` heartbeats (until it answers again)."""
        return self.engine.partner_status()

    def list_tasks(self, page_size: int = 1000) -> dict[str, TaskState]:
        """Every task kept, keyed `requester/task_id`: those in flight, and the finished ones
        the store keeps (read page by page, see `TaskStore.list_tasks`)."""
        found: dict[str, TaskState] = {}
        cursor = None
        while True:
            rows = self.store.list_tasks(limit=page_size, before=cursor)
            found.update((str(row.key), row.state) for row in rows)
            if len(rows) < page_size:
                break
            cursor = rows[-1].cursor
        found.update((str(key), rec.state) for key, rec in self.engine.tasks.items())
        return found

    # --- requester API ----------------------------------------------------------------------

    async def submit(
        self,
        partner: str,
        task_type: str,
        payload: Mapping[str, Any] | None = None,
        *,
        task_id: str | None = None,
        priority: Priority = Priority.NORMAL,
        deadline: datetime | None = None,
        context: TaskContext | None = None,
    ) -> TaskHandle:
        """Request a task of `partner`; the handle follows it to its end."""
        key, step = self.engine.submit(
            partner,
            task_type,
            payload,
            now=self.clock(),
            task_id=task_id,
            priority=priority,
            deadline=deadline,
            context=context,
        )
        handle = TaskHandle(self, key, partner)
        self._handles[key] = handle
        await self.apply_durably(step)
        return handle

    def handle(self, key: TaskKey) -> TaskHandle | None:
        """The handle of a task we requested (made anew for tasks restored at start-up)."""
        handle = self._handles.get(key)
        rec = self.engine.get(key)
        if handle is None and rec is not None and rec.role.value == "requester":
            handle = self._handles[key] = TaskHandle(self, key, rec.partner)
            if rec.is_final:
                handle._settle()
        return handle

    async def query_capabilities(
        self, partner: str, task_type: str | None = None
    ) -> CapabilityResponsePayload:
        """Send `capability_query` and return the partner's answer."""
        reply = await self._exchange(
            partner, self.engine.capability_query(partner, task_type, self.clock())
        )
        if not isinstance(reply, CapabilityResponse):
            raise _unexpected(reply)
        return reply.payload

    async def ping(self, partner: str) -> tuple[HeartbeatPayload, float]:
        """Send a heartbeat; return the partner's heartbeat and the round-trip time in seconds."""
        started = time.perf_counter()
        reply = await self._exchange(partner, self.engine.heartbeat(partner, self.clock()))
        elapsed = time.perf_counter() - started
        if not isinstance(reply, Heartbeat):
            raise _unexpected(reply)
        self._heartbeat_succeeded(partner)
        return reply.payload, elapsed

    async def _exchange(self, partner: str, message: Message) -> Message:
        sender = self._require_sender(partner)
        log.debug("message_out", message_id=message.id, type=message.message_type.value, to=partner)
        self._observe("out", message, partner)
        reply = await sender.send_callback(partner, message)
        self._observe("reply_in", reply, partner)
        self.apply(self.engine.on_reply(message, reply, self.clock()))
        return reply

    # --- lifecycle --------------------------------------------------------------------------

    def restore(self, snapshot: Snapshot) -> None:
        """Take back what a store kept: tasks, their timers, and undelivered messages.

        Executor tasks whose handler the restart interrupted are resumed (handlers with an
        `is_resumable(task_type)` method returning true) or failed with a recoverable
        `execution_failed`; requester tasks go on waiting for their callbacks.
        """
        now = self.clock()
        self.engine.restore(snapshot.tasks, now)
        for item in snapshot.outbox:
            message = decode_typed(item.body)
            self._queue(_Queued(Outgoing(item.partner, message, item.key), item))
        handler = self._handler
        for rec in snapshot.tasks:
            if rec.role.value == "executor" and not rec.is_final:
                can_resume = isinstance(handler, ResumableHandler) and bool(
                    handler.is_resumable(rec.task.type)
                )
                self.apply(self.engine.recover(rec.key, resumable=can_resume, now=now))
        log.info(
            "restored",
            tasks=len(snapshot.tasks),
            outbox=len(snapshot.outbox),
            dead_letters=len(snapshot.dead_letters),
        )

    async def start(self) -> None:
        if self._timer_task is None:
            self._timer_task = asyncio.create_task(self._timer_loop(), name="synapse-timers")
        if self._purge_task is None:
            from synapse.p2p.retention import purge_loop

            self._purge_task = asyncio.create_task(purge_loop(self), name="synapse-purge")

    async def drain(self, timeout: float) -> bool:
        """Refuse new tasks, then wait up to `timeout` for queued messages to be delivered."""
        self.engine.draining = True
        deadline = time.monotonic() + timeout
        while self._workers and time.monotonic() < deadline:
            await asyncio.wait(
                list(self._workers.values()), timeout=max(0.0, deadline - time.monotonic())
            )
        return not self._workers

    async def shutdown(
        self,
        drain_timeout: float | None = None,
        outbox_grace: float | None = None,
        *,
        now: asyncio.Event | None = None,
    ) -> bool:
        """Stop gracefully (SIGTERM): see `synapse.p2p.shutdown.graceful_shutdown`.

        Returns False if `now` was set (a second signal) and the drain was cut short.
        """
        from synapse.p2p.shutdown import graceful_shutdown

        return await graceful_shutdown(
            self,
            self.config.drain_timeout if drain_timeout is None else drain_timeout,
            self.config.outbox_grace if outbox_grace is None else outbox_grace,
            now,
        )

    async def close(self) -> None:
        self._closed = True
        tasks = [*self._running.values(), *self._workers.values(), *self._background]
        if self._timer_task is not None:
            tasks.append(self._timer_task)
        if self._purge_task is not None:
            tasks.append(self._purge_task)
            self._purge_task = None
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._timer_task = None

    async def __aenter__(self) -> P2PProtocol:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def pending_deliveries(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def delivering(self, key: TaskKey) -> bool:
        """Whether messages about `key` are still queued for delivery."""
        return bool(self._queues.get(key))

    @property
    def running(self) -> bool:
        """Started and not yet closed."""
        return self._timer_task is not None and not self._closed

    def oldest_pending_since(self) -> float | None:
        """When the oldest message still waiting for delivery was queued (clock time)."""
        heads = [queue.head.item.created_at for queue in self._queues.values() if queue.head]
        return min(heads) if heads else None

    async def close_store(self) -> None:
        await self.store.close()

    # --- applying engine steps ----------------------------------------------------------------

    def apply(self, step: Step) -> None:
        """Carry out what the engine decided. Never awaits: engine calls stay atomic."""
        self._carry_out(step, self._record(step))

    def _record(self, step: Step) -> list[_Queued | Outgoing]:
        """The step's writes: its tasks and its outbox entries (buffered in the store)."""
        for transition in step.transitions:
            self._notify("on_transition", transition)
            # A task's outcome is what an operator follows (one info line a task); the steps
            # before it are detail (debug), as is every message in and out.
            lifecycle = transition.to_state.is_final
            if lifecycle or log.isEnabledFor(logging.DEBUG):
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
        if step.transitions:
            self._persist(step)
        return [self._outbox(out) for out in step.outgoing]

    def _carry_out(
        self, step: Step, queued: list[_Queued | Outgoing], *, committed: bool = False
    ) -> None:
        """Start the step's deliveries and actions once its writes are recorded (and, when
        `committed`, already durable)."""
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
            if not isinstance(action, DropQueued):
                self._act(action)
        for transition in step.transitions:
            if transition.to_state.is_final:
                # Durable already, or with the next commit to start (its put_task is
                # buffered now).
                durable_with = self._commits_done if committed else self._commits_started + 1
                self._finals[transition.key] = durable_with
                if durable_with > self._commits_done:
                    self._finals_awaiting_commit[transition.key] = durable_with
                handle = self._handles.get(transition.key)
                if handle is not None:
                    handle._settle()
        if committed:
            for transition in step.transitions:
                if transition.to_state.is_final:
                    self._evict(transition.key)
        self._rearm_timer()

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
                handle._push(action)
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
                self._heartbeat_succeeded(action.partner)
        elif isinstance(action, Refusal):
            log.warning(
                "message_refused_by_partner",
                task_id=action.key.task_id if action.key else None,
                message_id=action.sent.id,
                type=action.sent.message_type.value,
                code=action.nack.code,
                reason=action.nack.message,
            )

    def expect_resume(self, key: TaskKey) -> asyncio.Future[Any]:
        """A future the next `ResumeExecution` for `key` resolves (used by the handler context)."""
        waiter: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiters[key] = waiter
        return waiter

    # --- what a running handler asks of the runtime (ExecutionContext's TaskRuntime) -----------

    def task_record(self, key: TaskKey) -> TaskRecord | None:
        return self.engine.get(key)

    def report_status(
        self, key: TaskKey, *, progress: float | None, message: str, intermediate_result: Any
    ) -> None:
        """Send a `task_status_update` for the running task `key`."""
        self.apply(
            self.engine.report_status(
                key,
                now=self.clock(),
                progress=progress,
                message=message,
                intermediate_result=intermediate_result,
            )
        )

    async def request_info(
        self,
        key: TaskKey,
        missing_fields: list[MissingField],
        *,
        question: str,
        required_by: datetime | None,
    ) -> Mapping[str, Any]:
        """Send `task_need_info` and wait for the fields of the `task_info_provided`."""
        await self.settled(key)
        waiter = self.expect_resume(key)
        self.apply(
            self.engine.request_info(
                key, missing_fields, now=self.clock(), question=question, required_by=required_by
            )
        )
        fields: Mapping[str, Any] = await waiter
        return fields

    async def request_human(
        self,
        key: TaskKey,
        reason: Reason,
        *,
        context: HumanContext | None,
        options: Iterable[HumanOption],
        escalation_level: int,
        deadline: datetime | None,
    ) -> HumanDecisionPayload:
        """Send `task_need_human` and wait for an approving `human_decision`."""
        await self.settled(key)
        waiter = self.expect_resume(key)
        self.apply(
            self.engine.request_human(
                key,
                reason,
                now=self.clock(),
                context=context,
                options=options,
                escalation_level=escalation_level,
                deadline=deadline,
            )
        )
        decision: HumanDecisionPayload = await waiter
        return decision

    # --- handlers -------------------------------------------------------------------------------

    async def settled(self, key: TaskKey) -> None:
        """Wait until no incoming message about task `key` is being committed.

        Its effect is durable then, or undone (a failed commit): only then is anything else
        about the task decided (a person's answer, a handler's progress or outcome, a timer,
        the next message), so that nothing is built on an effect that may yet vanish."""
        while holds := self._committing.get(key):
            await asyncio.wait(list(holds))

    async def _settled_for_handler(self, key: TaskKey) -> bool:
        """`settled`, for a handler that ended: False if the task was cancelled meanwhile
        (the message being committed was its task_cancel: the outcome is moot)."""
        try:
            await self.settled(key)
        except asyncio.CancelledError:
            return False
        return True

    async def apply_durably(self, step: Step) -> None:
        """Apply a step of our own making, and return once it is durable (a store that
        cannot write is waited out)."""
        self.apply(step)
        await self._commit_patiently()

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

    def _start_handler(self, action: StartExecution) -> None:
        rec = self.engine.get(action.key)
        assert rec is not None
        task = asyncio.create_task(
            self._run_handler(action, ExecutionContext(self, action.key, rec.task)),
            name=f"synapse-task-{action.key}",
        )
        self._running[action.key] = task

    async def _run_handler(self, action: StartExecution, ctx: ExecutionContext) -> None:
        key = action.key
        started, wall = time.perf_counter(), self.clock()
        outcome = "completed"
        try:
            if self._handler is None:
                raise LocalProtocolError("no TaskHandler set")
            value = await self._handler.execute_task(ctx, action.task_type, action.payload)
            # A message about this task is being committed (a task_cancel, say): its effect
            # on the task is not settled until that commit succeeds (then it is carried out:
            # a cancel cancels us here) or fails (then it is rolled back). The outcome is
            # applied after that, so that it is judged on what holds, and built once.
            await self.settled(key)
        except asyncio.CancelledError:
            outcome = "cancelled"
            if not self._closed:
                log.info("handler_cancelled", task_id=key.task_id, requester=key.requester)
            return
        except TaskFailure as failure:  # the handler's own verdict: no bug, no traceback
            outcome = "failed"
            log.info(
                "handler_failed",
                task_id=key.task_id,
                requester=key.requester,
                code=failure.error.code,
                error=failure.error.message,
            )
            if await self._settled_for_handler(key):
                self.apply(self.engine.fail(key, failure.error, now=self.clock()))
        except Exception as exc:
            outcome = "failed"
            # A bug in the handler: its traceback for whoever runs this peer (where the
            # application's logging sends errors), only its type and message for the partner.
            log.error(
                "handler_failed",
                task_id=key.task_id,
                requester=key.requester,
                task_type=action.task_type,
                error=repr(exc),
                exc_info=exc,
            )
            text = str(exc)
            error = TaskError(
                code=ErrorCode.EXECUTION_FAILED.value,
                message=f"{type(exc).__name__}: {text}" if text else type(exc).__name__,
                recoverable=True,
            )
            if await self._settled_for_handler(key):
                self.apply(self.engine.fail(key, error, now=self.clock()))
        else:
            step = self.engine.complete(key, as_result(value), now=self.clock())
            if step.discarded:
                log.info("late_result_discarded", task_id=key.task_id, requester=key.requester)
            self.apply(step)
        finally:
            self._running.pop(key, None)
            self._waiters.pop(key, None)
            if self.listeners:
                seconds = time.perf_counter() - started
                self._notify("on_handler_done", key, action.task_type, wall, seconds, outcome)

    # --- delivery -------------------------------------------------------------------------------

    def _require_sender(self, partner: str) -> CallbackSender:
        for prefix, local in self._local_senders.items():
            if partner.startswith(prefix):
                return local
        if self._sender is None:
            raise LocalProtocolError("no CallbackSender set")
        return self._sender

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _outbox(self, out: Outgoing) -> _Queued | Outgoing:
        """The outbox entry of a message about a task (a heartbeat has none)."""
        if out.key is None:
            return out
        item = OutboxItem(
            seq=self.store.next_seq(),
            message_id=out.message.id,
            partner=out.partner,
            key=out.key,
            body=encode_message(out.message),
            created_at=self.clock(),
        )
        self.store.add_outbox(item)
        return _Queued(out, item)

    def _queue(self, queued: _Queued) -> None:
        key = queued.out.key
        assert key is not None
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = TaskQueue()
        queue.push(queued)
        if key not in self._workers and not self._closed:
            self._workers[key] = asyncio.create_task(self._deliver(key))

    def _drop_queued(self, key: TaskKey) -> None:
        """Nothing more is sent about the task (see `synapse.p2p.delivery`): its queued
        messages leave the outbox, and a POST in progress is not retried (its worker stops)."""
        queue = self._queues.get(key)
        if not queue:
            return
        dropped = queue.drop()
        for queued in dropped:
            self.store.remove_outbox(queued.item.message_id)
        worker = self._workers.get(key)
        if worker is not None and worker is not asyncio.current_task():
            worker.cancel()
            # Gone now, not when its cancellation runs: a message queued next (the
            # requester's task_cancel) gets a worker of its own.
            del self._workers[key]
        log.info(
            "callbacks_dropped", task_id=key.task_id, requester=key.requester, count=len(dropped)
        )

    async def _deliver(self, key: TaskKey) -> None:
        """Deliver `key`'s messages one at a time, in order; each waits for its reply.

        A message leaves the outbox only once answered (a refusal is an answer too). When
        retries run out it waits for the partner's next successful heartbeat; past
        `dead_letter_after` it becomes a dead letter, listed until a person retries or
        drops it (`synapse outbox`).
        """
        queue = self._queues[key]
        try:
            while queue and not self._closed:
                queued = queue.head
                assert queued is not None
                out = queued.out
                sender = self._require_sender(out.partner)
                # What the partner is about to see must survive our crash.
                await self._commit_patiently()
                if self._queues.get(key) is not queue:
                    return  # let go meanwhile: another replica owns the task now
                if queue.head is not queued:
                    continue  # dropped meanwhile: nothing more about it is sent
                if self.delivery_gate is not None:
                    verdict = await self.delivery_gate(queued.item)
                    if verdict == "lost":
                        self.release(key)
                        return
                    if verdict == "gone":  # another replica delivered it
                        queue.answered(queued)
                        continue
                    if queue.head is not queued:
                        continue
                try:
                    self._observe("out", out.message, out.partner)
                    rec = self.engine.get(key)
                    if log.isEnabledFor(logging.DEBUG):
                        log.debug(
                            "message_out",
                            message_id=out.message.id,
                            type=out.message.message_type.value,
                            to=out.partner,
                            task_id=key.task_id,
                            state=rec.state.value if rec is not None else None,
                        )
                    queue.start_sending()
                    reply = await sender.send_callback(out.partner, out.message)
                except DeliveryError as exc:
                    queue.retry()
                    self._notify("on_delivery_failed", out.message, out.partner, exc)
                    if not exc.retryable:
                        self._dead_letter(queue, f"unusable reply: {exc}")
                        continue
                    await self.settled(key)
                    self.apply(self.engine.on_undeliverable(out.message, self.clock(), str(exc)))
                    if self._queues.get(key) is not queue or queue.head is not queued:
                        continue  # let go: a request that never arrived failed its task
                    if self.clock() - queued.item.created_at >= self.config.dead_letter_after:
                        self._dead_letter(queue, f"undeliverable: {exc}")
                        continue
                    log.warning("delivery_parked", message_id=out.message.id, partner=out.partner)
                    self.engine.keep_heartbeat(out.partner, self.clock())
                    self._rearm_timer()
                    # Until the partner's next successful heartbeat, or until the message is
                    # due to become a dead letter (one more round of attempts decides).
                    due = queued.item.created_at + self.config.dead_letter_after - self.clock()
                    await self._await_heartbeat(out.partner, timeout=due)
                    continue
                queue.answered(queued)
                self.store.remove_outbox(out.message.id)
                self._observe("reply_in", reply, out.partner)
                if key in self._committing:  # judged on what holds (see `settled`)
                    await self.settled(key)
                    rec = self.engine.get(key)
                before = rec.state.value if rec is not None else None
                self.apply(self.engine.on_reply(out.message, reply, self.clock()))
                if log.isEnabledFor(logging.DEBUG):
                    log.debug(
                        "reply_in",
                        message_id=reply.id,
                        reply_to=out.message.id,
                        type=reply.message_type.value,
                        task_id=key.task_id,
                        from_state=before,
                        to_state=rec.state.value if rec is not None else None,
                    )
                if not queue:
                    # Delivered is delivered: the outbox entry's removal is not left to
                    # whichever commit comes next (a restart would send it again meanwhile).
                    with contextlib.suppress(StoreUnavailable):
                        await self._commit()
        finally:
            if self._workers.get(key) is asyncio.current_task():
                self._workers.pop(key, None)
            if not queue and self._queues.get(key) is queue:
                self._queues.pop(key, None)
                if key in self._finals:
                    self._evict(key)

    async def _commit_patiently(self) -> None:
        """Commit, waiting out a store that cannot write (it logs the failure episode once);
        the delivery worker resumes where it stopped once the store writes again."""
        delay = _STORE_RETRY_FIRST
        while True:
            try:
                await self._commit()
                return
            except Exception as exc:  # any store's failure, not only SQLite's
                if self._closed:
                    raise
                if delay == _STORE_RETRY_FIRST and not isinstance(exc, StoreUnavailable):
                    log.error("commit_failed", error=repr(exc))  # SqliteStore logs its own
                await asyncio.sleep(delay)
                delay = min(delay * 2, _STORE_RETRY_MAX)

    def _dead_letter(self, queue: TaskQueue[_Queued], reason: str) -> None:
        queued = queue.head
        assert queued is not None
        queue.answered(queued)  # it leaves the queue (listed as a dead letter)
        message = queued.out.message
        log.error(
            "dead_letter",
            message_id=message.id,
            type=message.message_type.value,
            partner=queued.out.partner,
            reason=reason,
        )
        self.store.dead_letter(message.id, reason, self.clock())
        self._notify("on_dead_letter", message, queued.out.partner, reason)
        key = queued.out.key
        rec = self.engine.get(key) if key is not None else None
        if key is not None and rec is not None:
            rec.dead_letters.append(message.id)
            self.store.put_task(rec, [])
            handle = self._handles.get(key)
            if handle is not None:
                handle._push(TaskEvent(key, TaskEventKind.DEAD_LETTER, rec.state, message, reason))

    async def _send_once(self, out: Outgoing) -> None:
        sender = self._require_sender(out.partner)
        self._observe("out", out.message, out.partner)
        try:
            reply = await sender.send_callback(out.partner, out.message, retry=False)
        except DeliveryError as exc:
            self._notify("on_delivery_failed", out.message, out.partner, exc)
            return  # a missed heartbeat: the engine notices the silence
        self._observe("reply_in", reply, out.partner)
        if isinstance(reply, Heartbeat):
            self._heartbeat_succeeded(out.partner)
        self.apply(self.engine.on_reply(out.message, reply, self.clock()))

    def _observe(self, direction: Direction, message: Message, partner: str) -> None:
        if not self.observers and not self.listeners:
            return
        event = MessageEvent(direction, message, partner)
        for observer in self.observers:
            observer(event)
        self._notify("on_message", event)

    def _notify(self, method: str, *args: Any) -> None:
        for listener, hook in self._hooks(method):
            try:
                hook(*args)
            except Exception as exc:  # watching a peer must never break it
                log.warning("listener_failed", listener=type(listener).__name__, error=repr(exc))

    def share_partner_liveness(self, watch: Any) -> None:
        """Judge partner liveness on what other processes sharing the store heard, and let
        `watch` decide which process heartbeats each partner (`Engine.partner_watch`)."""
        self.engine.partner_watch = watch

    def partner_alive(self, partner: str) -> None:
        """Another process sharing the store heard from `partner`: deliveries to it that
        wait for a heartbeat go on now."""
        self._heartbeat_succeeded(partner)

    def _hooks(self, method: str) -> list[tuple[Any, Callable[..., Any]]]:
        """The listeners that implement `method` (the no-ops of `RuntimeListener` left out:
        a dozen notifications a task, most of them to listeners that ignore them), with
        their bound method; found again whenever `listeners` changes."""
        listeners = tuple(self.listeners)
        if listeners != self._hooks_for:
            self._hooks_for, self._hooks_cache = listeners, {}
        hooks = self._hooks_cache.get(method)
        if hooks is None:
            noop = getattr(RuntimeListener, method, None)
            found = [(listener, getattr(listener, method, None)) for listener in listeners]
            hooks = self._hooks_cache[method] = [
                (listener, hook)
                for listener, hook in found
                if hook is not None
                and (noop is None or getattr(hook, "__func__", None) is not noop)
            ]
        return hooks

    def _heartbeat_succeeded(self, partner: str) -> None:
        event = self._heartbeat_ok.pop(partner, None)
        if event is not None:
            event.set()

    async def _await_heartbeat(self, partner: str, timeout: float | None = None) -> None:
        event = self._heartbeat_ok.setdefault(partner, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)

    # --- timers ---------------------------------------------------------------------------------

    def _rearm_timer(self) -> None:
        deadline = self.engine.next_deadline()
        if deadline is not None and deadline < self._sleep_until:
            self._wake.set()

    async def _timer_loop(self) -> None:
        while not self._closed:
            deadline = self.engine.next_deadline()
            self._sleep_until = deadline if deadline is not None else float("inf")
            self._wake.clear()
            timeout = None if deadline is None else max(0.0, deadline - self.clock())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
            now = self.clock()
            # A timer of a task whose incoming message is being committed fires once that
            # commit is done or undone (`settled`), judged on what holds then.
            while holds := [
                held
                for key, pending in self._committing.items()
                if self.engine.timer_due(key, now)
                for held in pending
            ]:
                await asyncio.wait(holds)
                now = self.clock()
            self.apply(self.engine.on_timer(now))


def _unexpected(reply: Message) -> RemoteProtocolError:
    if isinstance(reply, Nack):
        return RemoteProtocolError(
            _code(reply.payload.code), reply.payload.message, reply.payload.details
        )
    return RemoteProtocolError(
        ErrorCode.INVALID_PARAMS, f"unexpected reply {reply.message_type.value}", None
    )


def _code(code: str) -> ErrorCode:
    try:
        return ErrorCode(code)
    except ValueError:
        return ErrorCode.INVALID_PARAMS


__all__ = [
    "Direction",
    "MessageEvent",
    "Outcome",
    "P2PProtocol",
    "Receipt",
    "TaskAbandoned",
    "TaskHandle",
    "TaskUndeliverable",
    "Validation",
]
