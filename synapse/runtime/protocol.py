"""`P2PProtocol` (specs/protocol.md, 'Peer interfaces and configuration'): the asyncio runtime that
drives the sans-IO `Engine`.

It runs handlers as tasks, delivers each task's outgoing messages one at a time and in order
through a `CallbackSender`, fires the engine's timers from one sleeping coroutine, and gives
requesters `TaskHandle`s. It does no network I/O itself: the transport plugs in below it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from synapse.p2p.commands import Submit
from synapse.p2p.engine import (
    Outgoing,
    TaskKey,
    Validation,
)
from synapse.runtime.delivering import Delivering, retry_pause
from synapse.runtime.following import HandleFollower
from synapse.runtime.handler import (
    ResumableHandler,
)
from synapse.runtime.listener import Direction, MessageEvent
from synapse.runtime.running import HandlerRunning
from synapse.runtime.runtime_base import (
    Outcome,
    Receipt,
    TaskAbandoned,
    TaskHandle,
    TaskUndeliverable,
    _Queued,
    log,
)
from synapse.runtime.sender import CallbackSender
from synapse.runtime.timing import TimerFiring
from synapse.store.base import (
    FencedOut,
    Snapshot,
    StoreUnavailable,
)
from synapse.types import (
    CapabilityResponse,
    CapabilityResponsePayload,
    ErrorCode,
    Heartbeat,
    HeartbeatPayload,
    Message,
    Nack,
    NackError,
    NotReady,
    RemoteProtocolError,
    Sender,
    TaskState,
    decode_typed,
)


class P2PProtocol(HandlerRunning, Delivering, TimerFiring):
    """The protocol handler of one peer (specs/protocol.md, 'Peer interfaces and configuration'),
    transport-independent."""

    #: The handles of tasks let go to another replica, followed until they end (made when
    #: the first is let go).
    _follower: HandleFollower | None = None

    async def handle_message(
        self,
        message: Message,
        *,
        commit: bool = True,
        stage: Callable[[Message], None] | None = None,
    ) -> Message:
        """Apply a POSTed message from an authenticated partner and return the reply.

        Raises `NackError` when the message is refused (the transport answers a `nack`).
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
        # Replicas: a task let go while this message's commit is awaited stays let go.
        released = self.releases_of(checkpoint.key) if checkpoint and checkpoint.key else 0
        try:
            step = self.engine.receive(message, self.clock())
        except NackError as exc:
            self.listeners.on_refused(message, exc)
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
                put_back = self.engine.rollback(checkpoint, after)
                if put_back and key is not None and self._let_go_since(key, released):
                    # Let go meanwhile (its lease found lost): the rollback put back the
                    # record as it was before the message, which must not come back to life
                    # here (its handle, timers and answers would act on a stale copy). A
                    # task taken back meanwhile (restored from the store under a new lease)
                    # is not put back, and stays: released, it would be held here with no
                    # record in memory, and its next message moved a copy read from the
                    # store that was never written back.
                    self.engine.release(key)
                if isinstance(exc, FencedOut):
                    # Another replica owns these tasks now. (Not `key`: the hold on the
                    # message's own task is released below, whichever tasks were lost.)
                    for lost in exc.keys:
                        self.release(lost)
                if not isinstance(exc, StoreUnavailable):
                    raise
                raise NotReady(
                    "cannot store the message's effects; retry later",
                    {"reason": "store_unavailable"},
                ) from exc
            else:
                self._carry_out(step, queued, committed=True)
            finally:
                if held is not None and key is not None:
                    self._release_hold(key, held)
        self._observe("reply_out", step.reply, message.sender_id, message)
        # Any authenticated message proves the partner alive, not only a heartbeat: what
        # waits to be delivered to it goes on now (the engine, hearing it, stops the
        # heartbeats that would otherwise have woken those deliveries).
        self._partner_heard(message.sender_id)
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
        except NackError as error:
            return Receipt(None, error, task_id, before, before)
        return Receipt(reply, None, task_id, before, self._state_of(key) if states else None)

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

    async def submit(self, command: Submit) -> TaskHandle:
        """Request a task (`synapse.p2p.commands.Submit`); the handle follows it to its end.
        A store that cannot be read (to check that the task id is new) is waited out, as one
        that cannot write is (`apply_durably`)."""
        failures = 0
        while True:
            try:
                key, step = self.engine.submit(command, self.clock())
                break
            except StoreUnavailable:
                if self._closed:
                    raise
                failures += 1
                await asyncio.sleep(retry_pause(failures))
        handle = TaskHandle(self, key, command.partner)
        self._handles[key] = handle
        await self.apply_durably(step)
        return handle

    def handle(self, key: TaskKey) -> TaskHandle | None:
        """The handle of a task we requested (made anew for tasks restored at start-up).
        A task not in memory is read from the store: `StoreUnavailable` if it cannot be read
        now (a database out of reach; this call cannot wait it out: ask again later)."""
        handle = self._handles.get(key)
        rec = self.engine.get(key)
        if rec is not None and not rec.is_final and key not in self.engine.tasks:
            # Unfinished in the store and not held here: another replica works on it (and
            # holds its lease); a command from here would change a stale copy.
            return None
        if handle is None and rec is not None and rec.role.value == "requester":
            handle = self._handles[key] = TaskHandle(self, key, rec.partner)
            if rec.is_final:
                handle.settle()
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
        self._partner_heard(partner)
        return reply.payload, elapsed

    async def _exchange(self, partner: str, message: Message) -> Message:
        sender = self._require_sender(partner)
        log.debug("message_out", message_id=message.id, type=message.message_type.value, to=partner)
        self._observe("out", message, partner)
        reply = await sender.send_callback(partner, message)
        self._partner_heard(partner)  # a reply: the partner is alive
        self._observe("reply_in", reply, partner, message)
        self.apply(self.engine.on_reply(message, reply, self.clock()))
        return reply

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
        if snapshot.tasks:
            self.listeners.on_restored(tuple(rec.key for rec in snapshot.tasks))
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
            from synapse.runtime.retention import purge_loop

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
        """Stop gracefully (SIGTERM): see `synapse.runtime.shutdown.graceful_shutdown`.

        Returns False if `now` was set (a second signal) and the drain was cut short.
        """
        from synapse.runtime.shutdown import graceful_shutdown

        return await graceful_shutdown(
            self,
            self.config.drain_timeout if drain_timeout is None else drain_timeout,
            self.config.outbox_grace if outbox_grace is None else outbox_grace,
            now,
        )

    def _let_go_since(self, key: TaskKey, released: int) -> bool:
        """Whether task `key` was let go since `releases_of(key)` was `released`."""
        return self.releases_of(key) != released

    def release(self, key: TaskKey) -> None:
        super().release(key)
        self.listeners.on_released(key)
        # A handle here still waits for the task's outcome: it learns it from the store.
        if key in self._handles:
            if self._follower is None:
                self._follower = HandleFollower(self, self._handles, self.config.lease_ttl / 5)
            self._follower.let_go(key)

    async def close(self) -> None:
        self._closed = True
        if self._follower is not None:
            await self._follower.close()
        tasks = [*self._running.values(), *self._workers.values(), *self._background]
        if self._announcer is not None:
            tasks.append(self._announcer)
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
    def running(self) -> bool:
        """Started and not yet closed."""
        return self._timer_task is not None and not self._closed

    def share_partner_liveness(self, watch: Any) -> None:
        """Judge partner liveness on what other processes sharing the store heard, and let
        `watch` decide which process heartbeats each partner (`Engine.partner_watch`)."""
        self.engine.partner_watch = watch

    def partner_alive(self, partner: str) -> None:
        """Another process sharing the store heard from `partner`: deliveries to it that
        wait for a heartbeat go on now."""
        self._partner_heard(partner)


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
