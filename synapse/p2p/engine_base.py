"""The engine's state and the moves every part of it shares: the tasks and their timers,
the counts of tasks in flight, partner liveness, messages built, transitions applied
(`_move`). `synapse.p2p.engine.Engine` is this with what it receives, what it is told to
do, and its clock."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Protocol, Self, TypeAlias, TypeVar

import msgspec

from synapse.p2p.config import P2PConfig
from synapse.p2p.records import (
    CancelExecution,
    CapabilityProvider,
    DropQueued,
    Outgoing,
    PartnerReachability,
    ResumeExecution,
    StartExecution,
    Step,
    TaskEvent,
    TaskKey,
    TaskNote,
    TaskRecord,
    Transition,
    Validation,
    Validator,
)
from synapse.p2p.states import (
    AWAITING_REPLY,
    RESTARTED_BY_EVERY_MOVE,
    Event,
    Role,
    StateTimer,
    TransitionError,
    next_state,
    state_timers,
    timer_changes,
)
from synapse.p2p.timers import TimerQueue
from synapse.types import (
    CapabilityQuery,
    CapabilityQueryPayload,
    Envelope,
    ErrorCode,
    Heartbeat,
    HeartbeatPayload,
    HeartbeatStatus,
    LocalProtocolError,
    MessageType,
    RemoteProtocolError,
    Sender,
    TaskAck,
    TaskAckPayload,
    TaskCancel,
    TaskCancelPayload,
    TaskConfirm,
    TaskConfirmPayload,
    TaskError,
    TaskFailed,
    TaskFailedPayload,
    TaskNeedInfo,
    TaskNeedInfoPayload,
    TaskReject,
    TaskRejectPayload,
    TaskState,
    TaskStatusUpdate,
    TaskStatusUpdatePayload,
    build_message,
    build_reply,
)
from synapse.types.codec import IdFactory, RandomIds


@dataclass(slots=True)
class _PartnerLiveness:
    last_heard: float
    reachable: bool = True


M = TypeVar("M", bound=Envelope[Any])


class EngineTimer(StrEnum):
    """A timer of the engine that no state runs (those are `StateTimer`s)."""

    DEADLINE = "deadline"
    """E: the task's `deadline`; passing it fails the task (`execution_timeout`)."""
    REQUESTER_DEADLINE = "requester_deadline"
    """R: the task's `deadline` plus a heartbeat interval for E's `task_failed` to arrive."""
    HEARTBEAT = "heartbeat"
    """A partner's next heartbeat (its target is the partner's agent id)."""


#: What an armed timer is, and whose: a task's key or, for heartbeats, a partner's id.
TimerKind: TypeAlias = StateTimer | EngineTimer
_TimerKey: TypeAlias = tuple[TimerKind, TaskKey | str]


def _timer_owner(key: _TimerKey) -> TaskKey | str:
    """A timer belongs to its task (or, for heartbeats, its partner)."""
    return key[1]


#: `task_failed.error.code` of a task whose `task_request` never reached its executor (a
#: local outcome: never on the wire).
UNDELIVERABLE = "undeliverable"

_DECISIONS: Mapping[type[Any], type[TaskConfirm | TaskReject | TaskNeedInfo]] = {
    TaskConfirmPayload: TaskConfirm,
    TaskRejectPayload: TaskReject,
    TaskNeedInfoPayload: TaskNeedInfo,
}
#: The callbacks answered with `ack` (the others about a task with `task_ack`).
_ACKED = frozenset(
    {MessageType.TASK_STATUS_UPDATE, MessageType.TASK_NEED_INFO, MessageType.TASK_NEED_HUMAN}
)
_REPLY_EVENTS: Mapping[type[Envelope[Any]], Event] = {
    TaskConfirm: Event.RECV_TASK_CONFIRM,
    TaskReject: Event.RECV_TASK_REJECT,
    TaskNeedInfo: Event.RECV_TASK_NEED_INFO,
}


def _epoch(value: datetime) -> float:
    return value.timestamp()


def _at(now: float) -> datetime:
    return datetime.fromtimestamp(now, UTC)


def _not_found(task_id: str) -> RemoteProtocolError:
    return RemoteProtocolError(
        ErrorCode.TASK_NOT_FOUND, f"no task {task_id!r} with this sender", {"task_id": task_id}
    )


class PartnerWatch(Protocol):
    """Partner liveness shared with other processes (replicas of one agent)."""

    def beat(self, partner: str, last_heard: float, now: float) -> tuple[float, bool]:
        """A heartbeat to `partner` is due: the latest time any process heard from it
        (given ours, `last_heard`), and whether this process sends the heartbeat."""
        ...


class EngineBase:
    """The state of all tasks of one peer, and the moves shared by what the engine receives
    (`Receiving`), what it is told (`Commands`) and its clock (`Engine`)."""

    def __init__(
        self,
        *,
        agent_id: str,
        endpoint: str,
        config: P2PConfig | None = None,
        validator: Validator | None = None,
        capabilities: CapabilityProvider | None = None,
        ids: IdFactory | None = None,
    ) -> None:
        self.agent_id = agent_id
        #: Where message and task ids come from (random by default; `CountingIds` in tests).
        self.ids: IdFactory = ids or RandomIds()
        self.endpoint = endpoint
        self.config = config or P2PConfig()
        self.sender = Sender(agent_id=agent_id, endpoint=endpoint)
        self.validator: Validator = validator or (lambda _t, _p: Validation())
        self.capabilities: CapabilityProvider = capabilities or (lambda: ())
        self.tasks: dict[TaskKey, TaskRecord] = {}
        self.ready = True
        self.draining = False
        self._timers: TimerQueue[_TimerKey] = TimerQueue(owner=_timer_owner)
        self._partners: dict[str, _PartnerLiveness] = {}
        self._in_flight: dict[str, int] = {}  # partner → non-final tasks with it
        self._executing = 0  # non-final executor tasks (capacity)
        self._executing_for: dict[str, int] = {}  # partner → its non-final executor tasks
        #: Finished tasks no longer held here (see `forget`): the store's lookup.
        self.finished_lookup: Callable[[TaskKey], TaskRecord | None] = lambda _key: None
        self._backlog: set[str] = set()  # partners holding messages we could not deliver
        #: Replicas sharing a store: partner liveness judged on what every replica heard,
        #: and heartbeats sent by one replica at a time (`synapse.runtime.liveness`).
        self.partner_watch: PartnerWatch | None = None
        #: Executor tasks that wait on a question with no handler waiting for the answer (a
        #: restart interrupted their resumable handler): the answer starts it again.
        self.restart_on_answer: set[TaskKey] = set()

    def clone(self) -> Self:
        """An independent engine in the same state (its tasks, timers, partners' liveness,
        counts), sharing this one's configuration and collaborators; its id factory is
        copied, so that both go on minting the same ids (a model checker's branches)."""
        twin = object.__new__(type(self))
        twin.__dict__.update(self.__dict__)
        twin.ids = copy.copy(self.ids)
        twin.tasks = {key: _copy_record(rec) for key, rec in self.tasks.items()}
        twin._timers = self._timers.copy()
        twin._partners = {
            p: _PartnerLiveness(v.last_heard, v.reachable) for p, v in self._partners.items()
        }
        twin._in_flight = dict(self._in_flight)
        twin.restart_on_answer = set(self.restart_on_answer)
        twin._executing_for = dict(self._executing_for)
        twin._backlog = set(self._backlog)
        return twin

    def snapshot(self) -> EngineSnapshot:
        """Everything this engine holds, as a value: two engines in the same state give
        equal snapshots (the model checker compares them)."""
        return EngineSnapshot(
            tasks={key: _record_fields(rec) for key, rec in self.tasks.items()},
            timers=self._timers.armed(),
            partners={p: (v.last_heard, v.reachable) for p, v in self._partners.items()},
            counts=self.counts(),
            backlog=frozenset(self._backlog),
        )

    def timer_deadlines(self) -> dict[_TimerKey, float]:
        """Every armed timer (its kind and task key or partner) and when it is due."""
        return self._timers.armed()

    def counts(self) -> tuple[int, tuple[tuple[str, int], ...], tuple[tuple[str, int], ...]]:
        """Executor tasks in flight, and tasks in flight per partner (all, and as executor)."""
        return (
            self._executing,
            tuple(sorted(self._in_flight.items())),
            tuple(sorted(self._executing_for.items())),
        )

    def get(self, key: TaskKey) -> TaskRecord | None:
        """The task, in flight (held here) or finished (looked up in the store)."""
        rec = self.tasks.get(key)
        return rec if rec is not None else self.finished_lookup(key)

    def forget(self, key: TaskKey) -> bool:
        """Drop a final task from memory (its record is in the store); False if not final."""
        rec = self.tasks.get(key)
        if rec is None or not rec.is_final:
            return False
        del self.tasks[key]
        return True

    def release(self, key: TaskKey) -> None:
        """Drop a task, live or not, with its timers: another process owns it now."""
        rec = self.tasks.get(key)
        if rec is None:
            return
        if not rec.is_final:
            self._finished(rec)  # its timers and its counts go, as if it had ended here
        del self.tasks[key]

    def active_executor_tasks(self) -> int:
        return self._executing

    def in_flight_with(self, partner: str) -> int:
        return self._in_flight.get(partner, 0)

    def is_reachable(self, partner: str) -> bool:
        liveness = self._partners.get(partner)
        return liveness is None or liveness.reachable

    def partner_status(self) -> dict[str, bool]:
        """Reachability of every partner heard of (see `heard` and heartbeats)."""
        return {partner: liveness.reachable for partner, liveness in self._partners.items()}

    def heartbeat_status(self) -> HeartbeatStatus:
        if self.draining or not self.ready:
            return HeartbeatStatus.DRAINING
        if self._executing >= self.config.max_concurrent_tasks:
            return HeartbeatStatus.BUSY
        return HeartbeatStatus.OK

    def silence_limit(self) -> float:
        """How long R waits for word about a task before it gives up on its executor:
        `task_timeout` (E fails a task that runs longer) plus the heartbeat-loss time."""
        cfg = self.config
        return cfg.task_timeout + cfg.missed_heartbeat_limit * cfg.heartbeat_interval

    def next_deadline(self) -> float | None:
        """When `on_timer` should next be called."""
        return self._timers.next_deadline()

    def _message(self, cls: type[M], payload: Any, to: str, now: float) -> M:
        return build_message(
            cls,
            payload,
            sender=self.sender,
            to=to,
            timestamp=_at(now),
            message_id=self.ids.message_id(),
        )

    def _reply(self, cls: type[M], payload: Any, request: Envelope[Any], now: float) -> M:
        return build_reply(
            cls,
            payload,
            request=request,
            sender=self.sender,
            timestamp=_at(now),
            message_id=self.ids.message_id(),
        )

    def _callback(
        self, rec: TaskRecord, cls: type[Envelope[Any]], payload: Any, now: float
    ) -> Outgoing:
        message: Any = self._message(cls, payload, rec.partner, now)
        return Outgoing(rec.partner, message, rec.key)

    def task_ack(self, request: Envelope[Any], rec: TaskRecord, now: float) -> TaskAck:
        payload = TaskAckPayload(task_id=rec.task_id, state=rec.state)
        return self._reply(TaskAck, payload, request, now)

    def heartbeat(self, partner: str, now: float) -> Heartbeat:
        payload = HeartbeatPayload(
            status=self.heartbeat_status(), active_tasks=self.in_flight_with(partner)
        )
        message: Heartbeat = self._message(Heartbeat, payload, partner, now)
        return message

    def capability_query(self, partner: str, task_type: str | None, now: float) -> CapabilityQuery:
        message: CapabilityQuery = self._message(
            CapabilityQuery, CapabilityQueryPayload(task_type=task_type), partner, now
        )
        return message

    def _move(
        self,
        rec: TaskRecord,
        event: Event,
        now: float,
        message_id: str | None,
        step: Step,
        *,
        wait_until: datetime | None = None,
    ) -> TaskState:
        """Apply `event` to `rec`, or raise and change nothing.

        A received message the state does not allow raises `TransitionError` (a remote
        protocol error: the partner's fault, answered with a nack). A local step the table does
        not allow (starting execution, sending a message, ...) is a bug of ours, even while a
        received message is being applied: `LocalProtocolError`, never sent to the partner.
        """
        old = rec.state
        try:
            new = next_state(rec.role, old, event)
        except TransitionError as exc:
            if event.message_type is None and event is not Event.REQUEST_REFUSED:
                raise LocalProtocolError(f"{event.value} in state {old.value}") from exc
            raise
        if old is TaskState.EXECUTING and new is not TaskState.EXECUTING:
            rec.executed_time += now - (rec.executing_since or now)
            rec.executing_since = None
        if new is TaskState.EXECUTING and old is not TaskState.EXECUTING:
            rec.executing_since = now
        # The timers of the state left stop, those of the state entered start (STATE_TIMERS).
        left, entered = timer_changes(rec.role, old, new)
        for timer in left:
            self._timers.cancel((timer, rec.key))
        # Some timers also start again on every move within their state (R's patience).
        for timer in entered | (state_timers(rec.role, new) & RESTARTED_BY_EVERY_MOVE):
            self._start_state_timer(rec, timer, now, wait_until)
        rec.state = new
        rec.updated_at = now
        transition = Transition(rec.key, rec.role, old, new, event, message_id, now)
        rec.history.append(transition)
        step.transitions.append(transition)
        if new.is_final and not old.is_final:
            self._finished(rec)
        return new

    def _track(self, rec: TaskRecord, now: float) -> None:
        """A new non-final task: count it, and heartbeat its partner while it is in flight."""
        self.tasks[rec.key] = rec
        self._account(rec, +1)
        liveness = self._partners.setdefault(rec.partner, _PartnerLiveness(last_heard=now))
        heartbeat_key = (EngineTimer.HEARTBEAT, rec.partner)
        if heartbeat_key not in self._timers:
            # Heartbeats (re)start now: count missed ones from here, not from an idle spell.
            liveness.last_heard = max(liveness.last_heard, now)
            self._timers.set(heartbeat_key, now + self.config.heartbeat_interval)

    def _resume(self, rec: TaskRecord, answer: Any, step: Step) -> None:
        """Give the handler the answer to its question: to the one waiting for it, or to one
        started again (its task waited through a restart)."""
        if rec.key in self.restart_on_answer:
            self.restart_on_answer.discard(rec.key)
            step.actions.append(
                StartExecution(rec.key, rec.task.type, self._payload(rec), answered=answer)
            )
        else:
            step.actions.append(ResumeExecution(rec.key, answer))

    def _finished(self, rec: TaskRecord) -> None:
        self.restart_on_answer.discard(rec.key)
        self._timers.replace_owned(rec.key, {})
        self._account(rec, -1)

    def _account(self, rec: TaskRecord, sign: int) -> None:
        """Count `rec` in (+1) or out (-1) of the counts of tasks in flight. The counts are a
        function of the records: a record held here and not final is counted, once."""
        _add(self._in_flight, rec.partner, sign)
        if rec.role is Role.EXECUTOR:
            self._executing += sign
            _add(self._executing_for, rec.partner, sign)

    def _start_state_timer(
        self, rec: TaskRecord, timer: StateTimer, now: float, wait_until: datetime | None
    ) -> None:
        """Arm `timer` of the state `rec` enters (or, at restore, is in)."""
        if timer is StateTimer.TASK_TIMEOUT:
            remaining = max(0.0, self.config.task_timeout - rec.executed_time)
            self._timers.set((StateTimer.TASK_TIMEOUT, rec.key), now + remaining)
        elif timer is StateTimer.SILENCE:
            self._timers.set((StateTimer.SILENCE, rec.key), now + self.silence_limit())
        else:
            # ANSWER_WAIT: until the question's `required_by` / `deadline`, else for
            # `input_timeout`: a question nobody answers must not hold capacity forever.
            when = _epoch(wait_until) if wait_until is not None else now + self.config.input_timeout
            self._timers.set((StateTimer.ANSWER_WAIT, rec.key), when)

    def _wait_until(self, rec: TaskRecord) -> datetime | None:
        """The limit of the answer `rec` waits for, from the question it asked (at restore)."""
        if rec.state is TaskState.INFO_NEEDED and rec.need_info is not None:
            return rec.need_info.required_by
        if rec.state is TaskState.NEED_HUMAN and rec.need_human is not None:
            return rec.need_human.deadline
        return None

    def _start(self, rec: TaskRecord, now: float, step: Step) -> None:
        """Enter `executing` and tell R so (its first callback is a status update)."""
        self._move(rec, Event.START_EXECUTION, now, None, step)
        self._status_callback(rec, now, step, message="executing")
        if rec.handler_started:
            return
        rec.handler_started = True
        step.actions.append(StartExecution(rec.key, rec.task.type, self._payload(rec)))

    @staticmethod
    def _payload(rec: TaskRecord) -> dict[str, Any]:
        """The task's payload with every field the requester provided since."""
        return {**rec.task.payload, **rec.provided}

    def _status_callback(self, rec: TaskRecord, now: float, step: Step, **fields: Any) -> None:
        """Queue a `task_status_update` with the task's state and `fields` (a `ReportStatus`'s,
        or the runtime's own `message`)."""
        payload = TaskStatusUpdatePayload(task_id=rec.task_id, status=rec.state, **fields)
        step.outgoing.append(self._callback(rec, TaskStatusUpdate, payload, now))

    def _fail(self, rec: TaskRecord, error: TaskError, now: float, step: Step) -> None:
        rec.error = error
        self._move(rec, Event.SEND_TASK_FAILED, now, None, step)
        failed = TaskFailedPayload(task_id=rec.task_id, error=error)
        step.outgoing.append(self._callback(rec, TaskFailed, failed, now))
        step.actions.append(CancelExecution(rec.key, error.code))

    def _arm_requester(self, rec: TaskRecord, now: float) -> None:
        """R's deadline for the task, plus a heartbeat interval for E's `task_failed` about it to
        arrive first. (E's silence is a state timer: `_move` and `restore` arm it.)"""
        if rec.task.deadline is not None:
            grace = self.config.heartbeat_interval
            self._timers.set(
                (EngineTimer.REQUESTER_DEADLINE, rec.key), _epoch(rec.task.deadline) + grace
            )

    def _give_up(
        self, rec: TaskRecord, code: ErrorCode | str, text: str, now: float, step: Step
    ) -> None:
        was = rec.state
        code = code.value if isinstance(code, ErrorCode) else code
        rec.error = TaskError(code=code, message=text, recoverable=True)
        self._move(rec, Event.GIVE_UP, now, None, step)
        # Tell E, in case it still runs the task (not when it said it has none, and not
        # before it answered the request: the queued request is dropped instead).
        if code != ErrorCode.TASK_NOT_FOUND.value and was is not TaskState.PENDING:
            payload = TaskCancelPayload(task_id=rec.task_id, reason=text)
            step.actions.append(DropQueued(rec.key))
            step.outgoing.append(self._callback(rec, TaskCancel, payload, now))
            rec.cancel_sent = True
        else:
            step.actions.append(DropQueued(rec.key))
        step.actions.append(TaskEvent(rec.key, TaskNote.GAVE_UP, rec.state, None, text))

    def _send_requested_cancel(self, rec: TaskRecord, now: float, step: Step) -> None:
        if not rec.cancel_requested or rec.cancel_sent or rec.is_final:
            return
        if rec.state in AWAITING_REPLY:
            return  # wait for the reply to the task_request
        rec.cancel_sent = True
        payload = TaskCancelPayload(task_id=rec.task_id, reason=rec.cancel_reason)
        step.outgoing.append(self._callback(rec, TaskCancel, payload, now))

    def heard(self, partner: str, now: float, step: Step | None = None) -> Step:
        """`partner` proved alive (an authenticated message, or a reply to us)."""
        step = step if step is not None else Step()
        self._backlog.discard(partner)
        liveness = self._partners.get(partner)
        if liveness is None:
            self._partners[partner] = _PartnerLiveness(last_heard=now)
            return step
        liveness.last_heard = now
        if not liveness.reachable:
            liveness.reachable = True
            step.actions.append(PartnerReachability(partner, reachable=True))
            self._partner_events(partner, TaskNote.PARTNER_REACHABLE, step)
        return step

    def _partner_events(self, partner: str, kind: TaskNote, step: Step) -> None:
        for rec in self.tasks.values():
            if rec.partner == partner and rec.role is Role.REQUESTER and not rec.is_final:
                step.actions.append(TaskEvent(rec.key, kind, rec.state))


_RECORD_SLOTS: tuple[str, ...] = TaskRecord.__slots__


class EngineSnapshot(msgspec.Struct, frozen=True):
    """What `Engine.snapshot` returns: compared with `==`."""

    tasks: dict[TaskKey, dict[str, Any]]
    timers: dict[_TimerKey, float]
    partners: dict[str, tuple[float, bool]]
    counts: tuple[int, tuple[tuple[str, int], ...], tuple[tuple[str, int], ...]]
    backlog: frozenset[str]


def _copy_record(rec: TaskRecord) -> TaskRecord:
    """An independent copy of `rec` (its lists and dicts copied; the rest is immutable)."""
    twin = object.__new__(TaskRecord)
    for name in _RECORD_SLOTS:
        setattr(twin, name, getattr(rec, name))
    twin.history = list(rec.history)
    twin.provided = dict(rec.provided)
    twin.dead_letters = list(rec.dead_letters)
    twin.audit = list(rec.audit)
    return twin


def _add(counts: dict[str, int], partner: str, sign: int) -> None:
    left = counts.get(partner, 0) + sign
    if left > 0:
        counts[partner] = left
    else:
        counts.pop(partner, None)


def _record_fields(rec: TaskRecord) -> dict[str, Any]:
    """A copy of every field of `rec`, its mutable containers copied too."""
    fields: dict[str, Any] = {}
    for name in TaskRecord.__slots__:
        value = getattr(rec, name)
        if isinstance(value, list | dict):
            value = value.copy()
        fields[name] = value
    return fields
