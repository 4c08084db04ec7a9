"""The sans-IO protocol engine: decoded messages and the clock in, messages and actions out.

`Engine` holds every task of one peer, in either role, and applies the transition table of
`synapse.p2p.states`. It never touches a socket, a timer or a disk: each call returns a `Step`
saying what to answer, what to POST, what the handler runner should do and which transitions
happened. The asyncio runtime (`synapse.p2p.protocol`) and the transport drive it; tests drive
it with a fake clock.

Time is wall-clock seconds since the epoch (`now: float`), the clock message timestamps and
deadlines are written in.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Protocol, TypeAlias, TypeVar

import msgspec

from synapse.p2p.config import P2PConfig
from synapse.p2p.states import (
    AWAITING_REPLY,
    RUNNING_STATES,
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
    EXECUTOR_TO_REQUESTER,
    Ack,
    AckPayload,
    Alternatives,
    Capability,
    CapabilityQuery,
    CapabilityQueryPayload,
    CapabilityResponse,
    CapabilityResponsePayload,
    DecidedBy,
    Decision,
    DecisionAction,
    Envelope,
    ErrorCode,
    Heartbeat,
    HeartbeatPayload,
    HeartbeatStatus,
    HumanContext,
    HumanDecision,
    HumanDecisionPayload,
    HumanOption,
    LocalProtocolError,
    Message,
    MessageType,
    MissingField,
    Nack,
    NackPayload,
    Priority,
    Reason,
    RemoteProtocolError,
    Sender,
    TaskAck,
    TaskAckPayload,
    TaskCancel,
    TaskCancelPayload,
    TaskComplete,
    TaskCompletePayload,
    TaskConfirm,
    TaskConfirmPayload,
    TaskContext,
    TaskError,
    TaskFailed,
    TaskFailedPayload,
    TaskInfoProvided,
    TaskInfoProvidedPayload,
    TaskNeedHuman,
    TaskNeedHumanPayload,
    TaskNeedInfo,
    TaskNeedInfoPayload,
    TaskReject,
    TaskRejectPayload,
    TaskRequest,
    TaskRequestPayload,
    TaskResult,
    TaskSpec,
    TaskState,
    TaskStatusUpdate,
    TaskStatusUpdatePayload,
    build_message,
    build_reply,
)
from synapse.types.codec import IdFactory, RandomIds

# --- values the engine hands out ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """Who did what to a task from this side (a person's answer, say): its audit trail.

    Kept on the task record (`TaskRecord.audit`), so a durable store keeps it with the task.
    """

    at: float
    #: The person or program that acted (`decided_by.user_id` for a decision).
    actor: str
    #: `info_provided`, `approve` or `reject`.
    action: str
    #: The id of the message that carried it.
    message_id: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)


class TaskKey(msgspec.Struct, frozen=True, gc=False):
    """A task is keyed by its requester's agent id and the `task.id` it chose (specs/protocol.md,
    'Roles and peers').

    A frozen msgspec struct, not a dataclass: it keys every table of the runtime, and its
    hash, comparison and construction run in C (a dict lookup 2× and a construction 7×
    faster than a frozen dataclass's); it encodes as the same JSON object."""

    requester: str
    task_id: str

    def __str__(self) -> str:
        return f"{self.requester}/{self.task_id}"


class Transition(msgspec.Struct, frozen=True, gc=False):
    """One state change of one task, as logged and stored (a frozen msgspec struct, built
    in C: several per task)."""

    key: TaskKey
    role: Role
    from_state: TaskState
    to_state: TaskState
    event: Event
    message_id: str | None
    at: float


class Outgoing(msgspec.Struct, frozen=True, gc=False):
    """A message to POST to `partner` (a request or a callback, never a reply). (A frozen
    msgspec struct: built in C, several per task.)

    Messages about one task (`key` set) are delivered one at a time, in order.
    """

    partner: str
    message: Message
    key: TaskKey | None = None


@dataclass(frozen=True, slots=True)
class StartExecution:
    """Run the handler's `execute_task` for this task."""

    key: TaskKey
    task_type: str
    payload: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ResumeExecution:
    """Wake the handler waiting on `need_info` (value: the fields) or `need_human` (decision)."""

    key: TaskKey
    value: Any


@dataclass(frozen=True, slots=True)
class CancelExecution:
    """Stop the handler: the task was cancelled, timed out or failed."""

    key: TaskKey
    reason: str


@dataclass(frozen=True, slots=True)
class DropQueued:
    """Discard callbacks still queued for this task (it was cancelled)."""

    key: TaskKey


@dataclass(frozen=True, slots=True)
class PartnerReachability:
    """A partner became unreachable (missed heartbeats) or answered again."""

    partner: str
    reachable: bool


class TaskEventKind(StrEnum):
    """What a `TaskEvent` is: a message about the task (its type), or a note.

    A `StrEnum`: `kind == "p2p:task_need_info"` and `kind is TaskEventKind.TASK_NEED_INFO`
    both hold for the same event.
    """

    TASK_REQUEST = "p2p:task_request"
    TASK_CONFIRM = "p2p:task_confirm"
    TASK_REJECT = "p2p:task_reject"
    TASK_NEED_INFO = "p2p:task_need_info"
    TASK_INFO_PROVIDED = "p2p:task_info_provided"
    TASK_STATUS_UPDATE = "p2p:task_status_update"
    TASK_COMPLETE = "p2p:task_complete"
    TASK_FAILED = "p2p:task_failed"
    TASK_CANCEL = "p2p:task_cancel"
    TASK_ACK = "p2p:task_ack"
    ACK = "p2p:ack"
    NACK = "p2p:nack"
    HEARTBEAT = "p2p:heartbeat"
    CAPABILITY_QUERY = "p2p:capability_query"
    CAPABILITY_RESPONSE = "p2p:capability_response"
    TASK_NEED_HUMAN = "p2p:task_need_human"
    HUMAN_DECISION = "p2p:human_decision"
    PARTNER_UNREACHABLE = "partner_unreachable"
    """The executor missed its heartbeats; no state changed."""
    GAVE_UP = "gave_up"
    """We gave up on the task ourselves (executor silent, deadline passed, or the executor
    has no such task): it failed here, `detail` says why."""
    PARTNER_REACHABLE = "partner_reachable"
    """The executor answered again."""
    UNDELIVERABLE = "undeliverable"
    """Retries ran out; the message waits in the outbox for the partner's next heartbeat."""
    REFUSED = "refused"
    """The partner answered one of our messages with a `nack` (`detail` says why)."""
    DEAD_LETTER = "dead_letter"
    """A message stayed undeliverable past `dead_letter_after`."""

    @classmethod
    def of(cls, message_type: MessageType) -> TaskEventKind:
        return cls(message_type.value)


@dataclass(frozen=True, slots=True)
class TaskEvent:
    """Something the requester's handle should see: a message about the task, or a note.

    `kind` says which; the typed accessors give a message's payload when the event is one
    (`if (asked := event.need_info) is not None: …`), which `message` (any message type)
    cannot tell a type checker.
    """

    key: TaskKey
    kind: TaskEventKind
    state: TaskState
    message: Message | None = None
    detail: str = ""

    @property
    def need_info(self) -> TaskNeedInfoPayload | None:
        """What the executor asks for (a `p2p:task_need_info`), else None."""
        return self.message.payload if isinstance(self.message, TaskNeedInfo) else None

    @property
    def need_human(self) -> TaskNeedHumanPayload | None:
        """The decision the executor asks a person for (a `p2p:task_need_human`), else None."""
        return self.message.payload if isinstance(self.message, TaskNeedHuman) else None

    @property
    def status_update(self) -> TaskStatusUpdatePayload | None:
        """Progress the executor reports (a `p2p:task_status_update`), else None."""
        return self.message.payload if isinstance(self.message, TaskStatusUpdate) else None

    @property
    def result(self) -> TaskResult | None:
        """The task's result (a `p2p:task_complete`), else None."""
        return self.message.payload.result if isinstance(self.message, TaskComplete) else None

    @property
    def error(self) -> TaskError | None:
        """Why the task failed (a `p2p:task_failed`), else None."""
        return self.message.payload.error if isinstance(self.message, TaskFailed) else None


@dataclass(frozen=True, slots=True)
class Refusal:
    """The partner answered one of our POSTs with a `nack`."""

    key: TaskKey | None
    sent: Message
    nack: NackPayload


Action: TypeAlias = (
    StartExecution
    | ResumeExecution
    | CancelExecution
    | DropQueued
    | PartnerReachability
    | TaskEvent
    | Refusal
)


@dataclass(slots=True)
class Step:
    """What one engine call decided."""

    reply: Message | None = None
    outgoing: list[Outgoing] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    transitions: list[Transition] = field(default_factory=list)
    #: True when a handler's late call was ignored because its task is already final.
    discarded: bool = False


# --- what the handler tells the engine ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class Validation:
    """The answer of `TaskHandler.validate_task` (specs/protocol.md,
    'Peer interfaces and configuration': missing fields and can-handle)."""

    ok: bool = True
    #: What is missing; a plain field name stands for `MissingField(field=name)`.
    missing_fields: Sequence[MissingField | str] = ()
    question: str = ""
    required_by: datetime | None = None
    #: Why the task is refused when `ok` is false (default: `invalid_params`).
    reason: Reason | None = None
    estimated_duration: int | None = None

    def __post_init__(self) -> None:
        fields = tuple(
            f if isinstance(f, MissingField) else MissingField(field=f) for f in self.missing_fields
        )
        object.__setattr__(self, "missing_fields", fields)

    @property
    def missing(self) -> list[MissingField]:
        return [f for f in self.missing_fields if isinstance(f, MissingField)]

    @classmethod
    def coerce(cls, value: Validation | tuple[Sequence[MissingField | str], bool]) -> Validation:
        """Accept the protocol's `([]MissingField, bool)` shape as well."""
        if isinstance(value, Validation):
            return value
        missing, ok = value
        return cls(ok=ok, missing_fields=tuple(missing))


ValidationResult: TypeAlias = Validation | tuple[Sequence[MissingField | str], bool]
Validator: TypeAlias = Callable[[str, dict[str, Any]], ValidationResult]
CapabilityProvider: TypeAlias = Callable[[], Sequence[str | Capability]]


def as_capability(value: str | Capability) -> Capability:
    return value if isinstance(value, Capability) else Capability(name=value)


# --- task records ---------------------------------------------------------------------------


@dataclass(slots=True)
class TaskRecord:
    """Everything one peer knows about one task, in one role."""

    key: TaskKey
    role: Role
    partner: str
    task: TaskSpec
    context: TaskContext | None
    request_id: str
    created_at: float
    state: TaskState = TaskState.IDLE
    updated_at: float = 0.0
    history: list[Transition] = field(default_factory=list)
    #: E: the synchronous answer to the task_request, repeated for a same-task re-request.
    decision: TaskConfirm | TaskReject | TaskNeedInfo | None = None
    result: TaskResult | None = None
    error: TaskError | None = None
    reject: TaskRejectPayload | None = None
    refusal: NackPayload | None = None
    progress: float | None = None
    status_message: str = ""
    need_info: TaskNeedInfoPayload | None = None
    need_human: TaskNeedHumanPayload | None = None
    need_human_id: str | None = None
    provided: dict[str, Any] = field(default_factory=dict)
    executing_since: float | None = None
    executed_time: float = 0.0
    handler_started: bool = False
    cancel_requested: bool = False
    cancel_reason: str | None = None
    cancel_sent: bool = False
    #: Ids of our messages about this task that were given up on (see `synapse outbox`).
    dead_letters: list[str] = field(default_factory=list)
    #: Who answered this task's questions from this side, and how (a person's decision).
    audit: list[AuditEntry] = field(default_factory=list)

    @property
    def task_id(self) -> str:
        return self.key.task_id

    @property
    def is_final(self) -> bool:
        return self.state.is_final


@dataclass(slots=True)
class _PartnerLiveness:
    last_heard: float
    reachable: bool = True


M = TypeVar("M", bound=Envelope[Any])
_TimerKey: TypeAlias = tuple[str, TaskKey | str]
_TIMEOUT = "timeout"
_DEADLINE = "deadline"
_WAIT = "wait"
_HEARTBEAT = "heartbeat"
#: The timer-queue kind of each timer a state runs.
_TIMER_KINDS = {StateTimer.TASK_TIMEOUT: _TIMEOUT, StateTimer.ANSWER_WAIT: _WAIT}
#: R's own timers: the executor's silence about a task, and the task's deadline.
_SILENCE = "silence"
_R_DEADLINE = "r_deadline"
#: Every timer a task may have, either side's.


def _timer_owner(key: _TimerKey) -> TaskKey | str:
    """A timer belongs to its task (or, for heartbeats, its partner)."""
    return key[1]


#: States in which R owes the next message (E waits for it): E's silence is expected.
_R_ANSWERING = frozenset({TaskState.INFO_NEEDED, TaskState.NEED_HUMAN, TaskState.HUMAN_DECIDING})

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


class Engine:
    """All tasks of one peer (`agent_id`, reachable at `endpoint`), as requester and executor."""

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
        #: and heartbeats sent by one replica at a time (`synapse.store.liveness`).
        self.partner_watch: PartnerWatch | None = None

    # --- as a value -----------------------------------------------------------------------

    def clone(self) -> Engine:
        """An independent engine in the same state (its tasks, timers, partners' liveness,
        counts), sharing this one's configuration and collaborators; its id factory is
        copied, so that both go on minting the same ids (a model checker's branches)."""
        twin = object.__new__(Engine)
        twin.__dict__.update(self.__dict__)
        twin.ids = copy.copy(self.ids)
        twin.tasks = {key: _copy_record(rec) for key, rec in self.tasks.items()}
        twin._timers = self._timers.copy()
        twin._partners = {
            p: _PartnerLiveness(v.last_heard, v.reachable) for p, v in self._partners.items()
        }
        twin._in_flight = dict(self._in_flight)
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

    def timer_deadlines(self) -> dict[tuple[str, TaskKey | str], float]:
        """Every armed timer (its kind and task key or partner) and when it is due."""
        return self._timers.armed()

    def counts(self) -> tuple[int, tuple[tuple[str, int], ...], tuple[tuple[str, int], ...]]:
        """Executor tasks in flight, and tasks in flight per partner (all, and as executor)."""
        return (
            self._executing,
            tuple(sorted(self._in_flight.items())),
            tuple(sorted(self._executing_for.items())),
        )

    # --- queries --------------------------------------------------------------------------

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

    # --- building messages ------------------------------------------------------------------

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

    # --- transitions ------------------------------------------------------------------------

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
            self._timers.cancel((_TIMER_KINDS[timer], rec.key))
        for timer in entered:
            self._start_state_timer(rec, timer, now, wait_until)
        if rec.role is Role.REQUESTER and not new.is_final:
            # Any word about the task (or our answer to it) restarts R's patience.
            if new in _R_ANSWERING:
                self._timers.cancel((_SILENCE, rec.key))
            else:
                self._timers.set((_SILENCE, rec.key), now + self.silence_limit())
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
        heartbeat_key = (_HEARTBEAT, rec.partner)
        if heartbeat_key not in self._timers:
            # Heartbeats (re)start now: count missed ones from here, not from an idle spell.
            liveness.last_heard = max(liveness.last_heard, now)
            self._timers.set(heartbeat_key, now + self.config.heartbeat_interval)

    def _finished(self, rec: TaskRecord) -> None:
        self._timers.replace_owned(rec.key, {})
        self._account(rec, -1)

    def _account(self, rec: TaskRecord, sign: int) -> None:
        """Count `rec` in (+1) or out (-1) of the counts of tasks in flight. The counts are a
        function of the records: a record held here and not final is counted, once."""
        _add(self._in_flight, rec.partner, sign)
        if rec.role is Role.EXECUTOR:
            self._executing += sign
            _add(self._executing_for, rec.partner, sign)

    # --- receiving POSTed requests and callbacks -----------------------------------------------

    def receive(self, message: Message, now: float) -> Step:
        """Apply a POSTed message from an authenticated partner; `step.reply` answers it.

        Raises `RemoteProtocolError` (and changes nothing) when the message is refused: only an
        accepted message is a sign of life of its sender.
        """
        step = Step()
        if isinstance(message, TaskRequest):
            self._on_task_request(message, now, step)
        elif isinstance(message, TaskInfoProvided | TaskCancel | HumanDecision):
            self._on_requester_message(message, now, step)
        elif message.message_type in EXECUTOR_TO_REQUESTER:
            self._on_executor_callback(message, now, step)
        elif isinstance(message, Heartbeat):
            reply = self.heartbeat(message.from_.agent_id, now)
            step.reply = self._reply(Heartbeat, reply.payload, message, now)
        elif isinstance(message, CapabilityQuery):
            step.reply = self._capability_response(message, now)
        else:
            raise RemoteProtocolError(
                ErrorCode.INVALID_PARAMS,
                f"{message.message_type.value} is only ever a synchronous reply",
                {"reason": "reply_only_type"},
            )
        self.heard(message.from_.agent_id, now, step)
        return step

    def _capability_response(self, query: CapabilityQuery, now: float) -> CapabilityResponse:
        wanted = query.payload.task_type
        caps = [as_capability(c) for c in self.capabilities()]
        if wanted is not None:
            caps = [c for c in caps if c.name == wanted]
        payload = CapabilityResponsePayload(
            agent_id=self.agent_id,
            capabilities=caps,
            max_concurrent_tasks=self.config.max_concurrent_tasks,
        )
        response: CapabilityResponse = self._reply(CapabilityResponse, payload, query, now)
        return response

    # executor side ---------------------------------------------------------------------------

    def _on_task_request(self, message: TaskRequest, now: float, step: Step) -> None:
        spec = message.payload.task
        key = TaskKey(message.from_.agent_id, spec.id)
        existing = self.get(key)
        if existing is not None:
            if existing.role is Role.EXECUTOR and existing.task == spec:
                step.reply = self._decision_reply(existing, message, now)
                return
            if existing.is_final:
                raise RemoteProtocolError(
                    ErrorCode.TASK_ALREADY_COMPLETED,
                    f"task {spec.id!r} is already {existing.state.value}",
                    {"state": existing.state.value, "task_id": spec.id},
                )
            raise RemoteProtocolError(
                ErrorCode.INVALID_PARAMS,
                f"task id {spec.id!r} is already in use for another task",
                {"reason": "task_id_in_use", "task_id": spec.id},
            )
        if not self.ready or self.draining:
            raise RemoteProtocolError(
                ErrorCode.AGENT_NOT_READY,
                "draining: not accepting new tasks" if self.draining else "starting up",
                {"reason": "draining" if self.draining else "starting"},
            )
        rec = TaskRecord(
            key=key,
            role=Role.EXECUTOR,
            partner=message.from_.agent_id,
            task=spec,
            context=message.payload.context,
            request_id=message.id,
            created_at=now,
            updated_at=now,
        )
        verdict = self._judge(spec, now)
        if not isinstance(verdict, TaskRejectPayload):
            verdict = self._share_refusal(spec, key.requester) or verdict
        self._track(rec, now)
        if isinstance(verdict, TaskRejectPayload):
            rec.reject = verdict
            self._move(rec, Event.SEND_TASK_REJECT, now, message.id, step)
        elif isinstance(verdict, TaskNeedInfoPayload):
            rec.need_info = verdict
            self._move(
                rec,
                Event.SEND_TASK_NEED_INFO,
                now,
                message.id,
                step,
                wait_until=verdict.required_by,
            )
        else:
            self._move(rec, Event.SEND_TASK_CONFIRM, now, message.id, step)
            self._start(rec, now, step)
        if spec.deadline is not None and not rec.is_final:
            self._timers.set((_DEADLINE, key), _epoch(spec.deadline))
        rec.decision = self._reply(_DECISIONS[type(verdict)], verdict, message, now)
        step.reply = rec.decision

    def _share_refusal(self, spec: TaskSpec, partner: str) -> TaskRejectPayload | None:
        """`rate_limited` if `partner` holds its whole share of the capacity already."""
        share = self.config.max_tasks_per_partner
        if share is None or self._executing_for.get(partner, 0) < share:
            return None
        retry = self.config.capacity_retry_after
        return TaskRejectPayload(
            task_id=spec.id,
            reason=Reason(
                code=ErrorCode.RATE_LIMITED.value, message=f"at max tasks per partner ({share})"
            ),
            alternatives=Alternatives(retry_after=retry) if retry else None,
        )

    def _judge(
        self, spec: TaskSpec, now: float
    ) -> TaskConfirmPayload | TaskRejectPayload | TaskNeedInfoPayload:
        """Decide the synchronous answer to a new task (specs/protocol.md, 'Transport' and
        'Error codes')."""

        def reject(code: ErrorCode, text: str, retry_after: int | None = None) -> TaskRejectPayload:
            alternatives = Alternatives(retry_after=retry_after) if retry_after else None
            return TaskRejectPayload(
                task_id=spec.id,
                reason=Reason(code=code.value, message=text),
                alternatives=alternatives,
            )

        if spec.deadline is not None and _epoch(spec.deadline) <= now:
            return reject(ErrorCode.EXECUTION_TIMEOUT, "the task's deadline has already passed")
        offered = self.capabilities()
        if not isinstance(offered, list | tuple):
            offered = list(offered)  # a provider may hand back any iterable
        # Names as plain strings are the common case: one C-level search of the list.
        if spec.type not in offered and not any(
            isinstance(c, Capability) and c.name == spec.type for c in offered
        ):
            return reject(ErrorCode.CAPABILITY_LACKING, f"task type {spec.type!r} is not offered")
        if self._executing >= self.config.max_concurrent_tasks:
            return reject(
                ErrorCode.RATE_LIMITED,
                "at max concurrent tasks",
                self.config.capacity_retry_after,
            )
        try:
            validation = Validation.coerce(self.validator(spec.type, dict(spec.payload)))
        except Exception as exc:  # the handler's bug must not become a 500
            return reject(ErrorCode.EXECUTION_FAILED, f"validate_task raised: {exc!r}")
        if not validation.ok:
            reason = validation.reason or Reason(
                code=ErrorCode.INVALID_PARAMS.value, message="task payload not acceptable"
            )
            return TaskRejectPayload(task_id=spec.id, reason=reason)
        if validation.missing_fields:
            return TaskNeedInfoPayload(
                task_id=spec.id,
                missing_fields=validation.missing,
                question=validation.question,
                required_by=validation.required_by,
            )
        return TaskConfirmPayload(
            task_id=spec.id,
            confirmed=True,
            estimated_duration=validation.estimated_duration,
            capabilities_used=[spec.type],
        )

    def _decision_reply(self, rec: TaskRecord, request: TaskRequest, now: float) -> Message:
        """The original synchronous answer again, now answering `request`."""
        decision = rec.decision
        assert decision is not None
        reply: Message = self._reply(type(decision), decision.payload, request, now)
        return reply

    def _start_state_timer(
        self, rec: TaskRecord, timer: StateTimer, now: float, wait_until: datetime | None
    ) -> None:
        """Arm `timer` of the state `rec` enters (or, at restore, is in)."""
        if timer is StateTimer.TASK_TIMEOUT:
            remaining = max(0.0, self.config.task_timeout - rec.executed_time)
            self._timers.set((_TIMEOUT, rec.key), now + remaining)
        else:
            # ANSWER_WAIT: until the question's `required_by` / `deadline`, else for
            # `input_timeout`: a question nobody answers must not hold capacity forever.
            when = _epoch(wait_until) if wait_until is not None else now + self.config.input_timeout
            self._timers.set((_WAIT, rec.key), when)

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

    def _status_callback(
        self,
        rec: TaskRecord,
        now: float,
        step: Step,
        *,
        progress: float | None = None,
        message: str = "",
        intermediate_result: Any = None,
    ) -> None:
        payload = TaskStatusUpdatePayload(
            task_id=rec.task_id,
            status=rec.state,
            progress=progress,
            message=message,
            intermediate_result=intermediate_result,
        )
        step.outgoing.append(self._callback(rec, TaskStatusUpdate, payload, now))

    def _executor_record(self, message: Message, task_id: str) -> TaskRecord:
        rec = self.get(TaskKey(message.from_.agent_id, task_id))
        if rec is None or rec.role is not Role.EXECUTOR:
            raise _not_found(task_id)
        return rec

    def _on_requester_message(
        self, message: TaskInfoProvided | TaskCancel | HumanDecision, now: float, step: Step
    ) -> None:
        rec = self._executor_record(message, message.payload.task_id)
        if self._answered_before(rec, message, now, step):
            return
        if isinstance(message, TaskCancel):
            self._move(rec, Event.RECV_TASK_CANCEL, now, message.id, step)
            step.reply = self.task_ack(message, rec, now)
            step.actions += [CancelExecution(rec.key, "cancelled"), DropQueued(rec.key)]
        elif isinstance(message, TaskInfoProvided):
            self._move(rec, Event.RECV_TASK_INFO_PROVIDED, now, message.id, step)
            step.reply = self.task_ack(message, rec, now)
            rec.provided.update(message.payload.fields)
            self._after_info(rec, message.payload.fields, now, step)
        else:
            decision = message.payload.decision
            approve = decision.action is DecisionAction.APPROVE
            event = Event.RECV_HUMAN_APPROVE if approve else Event.RECV_HUMAN_REJECT
            next_state(rec.role, rec.state, event)  # refuse a wrong state before the payload
            if message.payload.reply_to != rec.need_human_id:
                raise RemoteProtocolError(
                    ErrorCode.INVALID_PARAMS,
                    "human_decision.reply_to is not the pending task_need_human",
                    {"reason": "reply_to_mismatch", "expected": rec.need_human_id},
                )
            self._move(rec, event, now, message.id, step)
            step.reply = self.task_ack(message, rec, now)
            if approve:
                self._start(rec, now, step)
                step.actions.append(ResumeExecution(rec.key, message.payload))
            else:
                reason = decision.rejection_reason or "a person rejected the task"
                error = TaskError(
                    code=ErrorCode.PERMISSION_DENIED.value, message=reason, recoverable=False
                )
                self._fail(rec, error, now, step)

    def _after_info(
        self, rec: TaskRecord, fields: Mapping[str, Any], now: float, step: Step
    ) -> None:
        if rec.handler_started:
            self._start(rec, now, step)
            step.actions.append(ResumeExecution(rec.key, dict(fields)))
            return
        # The information answered the synchronous task_need_info: judge the task again.
        payload = self._payload(rec)
        try:
            validation = Validation.coerce(self.validator(rec.task.type, dict(payload)))
        except Exception as exc:
            validation = Validation(
                ok=False, reason=Reason(code="execution_failed", message=repr(exc))
            )
        if not validation.ok:
            reason = validation.reason or Reason(
                code=ErrorCode.INVALID_PARAMS.value, message="task payload not acceptable"
            )
            error = TaskError(code=reason.code, message=reason.message, recoverable=False)
            self._fail(rec, error, now, step)
        elif validation.missing_fields:
            need = TaskNeedInfoPayload(
                task_id=rec.task_id,
                missing_fields=validation.missing,
                question=validation.question,
                required_by=validation.required_by,
            )
            rec.need_info = need
            self._move(rec, Event.SEND_TASK_NEED_INFO, now, None, step, wait_until=need.required_by)
            step.outgoing.append(self._callback(rec, TaskNeedInfo, need, now))
        else:
            self._start(rec, now, step)

    def _fail(self, rec: TaskRecord, error: TaskError, now: float, step: Step) -> None:
        rec.error = error
        self._move(rec, Event.SEND_TASK_FAILED, now, None, step)
        failed = TaskFailedPayload(task_id=rec.task_id, error=error)
        step.outgoing.append(self._callback(rec, TaskFailed, failed, now))
        step.actions.append(CancelExecution(rec.key, error.code))

    # requester side --------------------------------------------------------------------------

    def _requester_record(self, message: Message, task_id: str) -> TaskRecord:
        rec = self.get(TaskKey(self.agent_id, task_id))
        if rec is None or rec.role is not Role.REQUESTER or rec.partner != message.sender_id:
            raise _not_found(task_id)
        return rec

    def _answered_before(self, rec: TaskRecord, message: Message, now: float, step: Step) -> bool:
        """A message this task already applied (its id is in the task's history), received
        again: answered as it was the first time, and applied never again, however late it
        comes (a retry past the deduplication window: specs/protocol.md, 'Deduplication')."""
        applied = next((t for t in rec.history if t.message_id == message.id), None)
        if applied is None:
            return False
        if message.message_type in _ACKED:
            step.reply = self._reply(Ack, AckPayload(), message, now)
        else:
            payload = TaskAckPayload(task_id=rec.task_id, state=applied.to_state)
            step.reply = self._reply(TaskAck, payload, message, now)
        return True

    def _on_executor_callback(self, message: Message, now: float, step: Step) -> None:
        payload: Any = message.payload
        rec = self._requester_record(message, payload.task_id)
        if self._answered_before(rec, message, now, step):
            return
        if isinstance(message, TaskStatusUpdate):
            self._move(rec, Event.RECV_TASK_STATUS_UPDATE, now, message.id, step)
            if message.payload.progress is not None:
                rec.progress = message.payload.progress
            rec.status_message = message.payload.message
            step.reply = self._reply(Ack, AckPayload(), message, now)
        elif isinstance(message, TaskNeedInfo):
            self._move(rec, Event.RECV_TASK_NEED_INFO, now, message.id, step)
            rec.need_info = message.payload
            step.reply = self._reply(Ack, AckPayload(), message, now)
        elif isinstance(message, TaskNeedHuman):
            self._move(rec, Event.RECV_TASK_NEED_HUMAN, now, message.id, step)
            rec.need_human, rec.need_human_id = message.payload, message.id
            step.reply = self._reply(Ack, AckPayload(), message, now)
        elif isinstance(message, TaskComplete):
            self._move(rec, Event.RECV_TASK_COMPLETE, now, message.id, step)
            rec.result = message.payload.result
            step.reply = self.task_ack(message, rec, now)
        elif isinstance(message, TaskFailed):
            self._move(rec, Event.RECV_TASK_FAILED, now, message.id, step)
            rec.error = message.payload.error
            step.reply = self.task_ack(message, rec, now)
        step.actions.append(
            TaskEvent(rec.key, TaskEventKind.of(message.message_type), rec.state, message)
        )

    # --- replies to what we POSTed --------------------------------------------------------------

    def on_reply(self, sent: Message, reply: Message, now: float) -> Step:
        """Apply the synchronous reply to a message we POSTed (delivered or refused)."""
        step = Step()
        self.heard(sent.to.agent_id, now, step)
        if isinstance(reply, Nack):
            self._on_nack(sent, reply.payload, now, step)
            return step
        if isinstance(sent, TaskRequest):
            rec = self.get(TaskKey(self.agent_id, sent.payload.task.id))
            event = _REPLY_EVENTS.get(type(reply))
            if rec is None or event is None:
                return step
            if rec.state in AWAITING_REPLY:
                self._move(rec, event, now, reply.id, step)
                if isinstance(reply, TaskReject):
                    rec.reject = reply.payload
                elif isinstance(reply, TaskNeedInfo):
                    rec.need_info = reply.payload
                step.actions.append(
                    TaskEvent(rec.key, TaskEventKind.of(reply.message_type), rec.state, reply)
                )
            # Otherwise a callback overtook this reply and implicitly confirmed the task.
            self._send_requested_cancel(rec, now, step)
        elif isinstance(sent, TaskCancel) and isinstance(reply, TaskAck):
            rec = self.get(TaskKey(self.agent_id, sent.payload.task_id))
            if rec is not None and not rec.is_final and reply.payload.state is TaskState.CANCELLED:
                self._move(rec, Event.RECV_CANCEL_ACK, now, reply.id, step)
                step.actions.append(
                    TaskEvent(rec.key, TaskEventKind.of(reply.message_type), rec.state, reply)
                )
        return step

    def _on_nack(self, sent: Message, nack: NackPayload, now: float, step: Step) -> None:
        key = self._key_of(sent)
        step.actions.append(Refusal(key, sent, nack))
        rec = self.tasks.get(key) if key is not None else None
        if rec is None or rec.role is not Role.REQUESTER:
            return
        if isinstance(sent, TaskRequest) and rec.state in AWAITING_REPLY:
            rec.refusal = nack
            self._move(rec, Event.REQUEST_REFUSED, now, None, step)
            step.actions.append(
                TaskEvent(rec.key, TaskEventKind.REFUSED, rec.state, None, nack.message)
            )
        elif not rec.is_final and nack.code == ErrorCode.TASK_NOT_FOUND.value:
            # E has no such task (it lost it, or never had it): waiting would be forever.
            text = f"{rec.partner} has no such task: {nack.message}"
            self._give_up(rec, ErrorCode.TASK_NOT_FOUND, text, now, step)
        elif not rec.is_final:
            # 409 on a cancel: E finished first; its final callback is on its way.
            step.actions.append(
                TaskEvent(rec.key, TaskEventKind.REFUSED, rec.state, None, nack.message)
            )

    def incoming_key(self, message: Message) -> TaskKey | None:
        """The key of the task a POSTed `message` is about (None if about no task)."""
        if isinstance(message, TaskRequest):
            return TaskKey(message.from_.agent_id, message.payload.task.id)
        task_id = getattr(message.payload, "task_id", None)
        if task_id is None:
            return None
        if message.message_type in EXECUTOR_TO_REQUESTER:
            return TaskKey(self.agent_id, task_id)
        return TaskKey(message.from_.agent_id, task_id)

    def _key_of(self, sent: Message) -> TaskKey | None:
        if isinstance(sent, TaskRequest):
            return TaskKey(self.agent_id, sent.payload.task.id)
        task_id = getattr(sent.payload, "task_id", None)
        if task_id is None:
            return None
        if sent.message_type in EXECUTOR_TO_REQUESTER:
            return TaskKey(sent.to.agent_id, task_id)
        return TaskKey(self.agent_id, task_id)

    def on_undeliverable(self, sent: Message, now: float, cause: str = "") -> Step:
        """Retries of `sent` ran out; it stays queued until the partner answers again.

        Except a `task_request` never answered (`P2PConfig.fail_undelivered_requests`, the
        default): waiting for a partner that may never come back would hold the task
        forever, so the task fails here (`undeliverable`) and the request is dropped."""
        step = Step()
        key = self._key_of(sent)
        rec = self.tasks.get(key) if key is not None else None
        if (
            rec is not None
            and isinstance(sent, TaskRequest)
            and rec.state in AWAITING_REPLY
            and self.config.fail_undelivered_requests
        ):
            text = f"the task_request never reached {rec.partner}: " + (
                cause or "its deliveries ran out"
            )
            self._give_up(rec, UNDELIVERABLE, text, now, step)
            return step
        if rec is not None and rec.role is Role.REQUESTER and not rec.is_final:
            # (A final task's outcome was told: that its task_cancel waits is no news.)
            step.actions.append(
                TaskEvent(
                    rec.key, TaskEventKind.UNDELIVERABLE, rec.state, sent, "partner did not answer"
                )
            )
        return step

    # --- requester commands ---------------------------------------------------------------------

    def submit(
        self,
        partner: str,
        task_type: str,
        payload: Mapping[str, Any] | None = None,
        *,
        now: float,
        task_id: str | None = None,
        priority: Priority = Priority.NORMAL,
        deadline: datetime | None = None,
        context: TaskContext | None = None,
    ) -> tuple[TaskKey, Step]:
        """Create a task as requester and queue its `task_request` to `partner`."""
        spec = TaskSpec(
            id=task_id or self.ids.task_id(),
            type=task_type,
            priority=priority,
            deadline=deadline,
            payload=dict(payload or {}),
        )
        key = TaskKey(self.agent_id, spec.id)
        if self.get(key) is not None:  # in flight, or finished and kept by the store
            raise LocalProtocolError(f"task id {spec.id!r} is already used")
        message: TaskRequest = self._message(
            TaskRequest, TaskRequestPayload(task=spec, context=context), partner, now
        )
        rec = TaskRecord(
            key=key,
            role=Role.REQUESTER,
            partner=partner,
            task=spec,
            context=context,
            request_id=message.id,
            created_at=now,
            updated_at=now,
        )
        self._track(rec, now)
        step = Step()
        self._move(rec, Event.SEND_TASK_REQUEST, now, message.id, step)
        self._arm_requester(rec, now)
        step.outgoing.append(Outgoing(partner, message, key))
        return key, step

    def _arm_requester(self, rec: TaskRecord, now: float) -> None:
        """R's own timers: E's silence (re-armed by `_move`) and the task's deadline, plus a
        heartbeat interval for E's `task_failed` about it to arrive first."""
        if rec.state not in _R_ANSWERING:
            self._timers.set((_SILENCE, rec.key), now + self.silence_limit())
        if rec.task.deadline is not None:
            grace = self.config.heartbeat_interval
            self._timers.set((_R_DEADLINE, rec.key), _epoch(rec.task.deadline) + grace)

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
        step.actions.append(TaskEvent(rec.key, TaskEventKind.GAVE_UP, rec.state, None, text))

    def _requester(self, key: TaskKey) -> TaskRecord:
        rec = self.get(key)
        if rec is None or rec.role is not Role.REQUESTER:
            raise LocalProtocolError(f"no task {key} of ours as requester")
        return rec

    def _local(
        self, rec: TaskRecord, event: Event, now: float, step: Step, mid: str | None
    ) -> None:
        try:
            self._move(rec, event, now, mid, step)
        except TransitionError as exc:
            raise LocalProtocolError(f"{event.value} in state {rec.state.value}") from exc

    def provide_info(
        self, key: TaskKey, fields: Mapping[str, Any], *, now: float, notes: str | None = None
    ) -> Step:
        rec = self._requester(key)
        payload = TaskInfoProvidedPayload(task_id=rec.task_id, fields=dict(fields), notes=notes)
        out = self._callback(rec, TaskInfoProvided, payload, now)
        step = Step()
        self._local(rec, Event.SEND_TASK_INFO_PROVIDED, now, step, out.message.id)
        step.outgoing.append(out)
        return step

    def start_deciding(self, key: TaskKey, *, now: float) -> Step:
        """A person at R started to decide on a `task_need_human` (R only)."""
        rec = self._requester(key)
        step = Step()
        self._local(rec, Event.HUMAN_DECIDING, now, step, None)
        return step

    def decide(
        self,
        key: TaskKey,
        action: DecisionAction,
        *,
        now: float,
        decided_by: DecidedBy,
        decision_id: str,
        approved_fields: Mapping[str, Any] | None = None,
        rejection_reason: str = "",
        notes: str = "",
    ) -> Step:
        rec = self._requester(key)
        if rec.need_human_id is None:
            raise LocalProtocolError(f"task {key} has no pending task_need_human")
        payload = HumanDecisionPayload(
            task_id=rec.task_id,
            decision_id=decision_id,
            reply_to=rec.need_human_id,
            decided_by=decided_by,
            decision=Decision(
                action=action,
                approved_fields=dict(approved_fields or {}),
                rejection_reason=rejection_reason,
            ),
            notes=notes,
            timestamp=_at(now),
        )
        out = self._callback(rec, HumanDecision, payload, now)
        event = (
            Event.SEND_HUMAN_APPROVE
            if action is DecisionAction.APPROVE
            else Event.SEND_HUMAN_REJECT
        )
        step = Step()
        self._local(rec, event, now, step, out.message.id)
        step.outgoing.append(out)
        return step

    def cancel(self, key: TaskKey, *, now: float, reason: str | None = None) -> Step:
        """Ask E to cancel. Sent once R has the reply to its request (specs/protocol.md,
        'Task states')."""
        rec = self._requester(key)
        step = Step()
        if rec.is_final or rec.cancel_requested:
            return step
        rec.cancel_requested, rec.cancel_reason = True, reason
        self._send_requested_cancel(rec, now, step)
        return step

    def _send_requested_cancel(self, rec: TaskRecord, now: float, step: Step) -> None:
        if not rec.cancel_requested or rec.cancel_sent or rec.is_final:
            return
        if rec.state in AWAITING_REPLY:
            return  # wait for the reply to the task_request
        rec.cancel_sent = True
        payload = TaskCancelPayload(task_id=rec.task_id, reason=rec.cancel_reason)
        step.outgoing.append(self._callback(rec, TaskCancel, payload, now))

    # --- executor commands (from the running handler) -------------------------------------------

    def _executor(self, key: TaskKey, step: Step) -> TaskRecord | None:
        rec = self.get(key)
        if rec is None or rec.role is not Role.EXECUTOR:
            raise LocalProtocolError(f"no task {key} of ours as executor")
        if rec.is_final:
            step.discarded = True  # a late call after cancel or timeout: dropped by design
            return None
        return rec

    def _handler_move(
        self,
        rec: TaskRecord,
        event: Event,
        now: float,
        step: Step,
        *,
        wait_until: datetime | None = None,
    ) -> None:
        try:
            self._move(rec, event, now, None, step, wait_until=wait_until)
        except TransitionError as exc:
            raise LocalProtocolError(
                f"handler asked for {event.value} in state {rec.state.value}"
            ) from exc

    def report_status(
        self,
        key: TaskKey,
        *,
        now: float,
        progress: float | None = None,
        message: str = "",
        intermediate_result: Any = None,
    ) -> Step:
        step = Step()
        rec = self._executor(key, step)
        if rec is None:
            return step
        self._handler_move(rec, Event.SEND_TASK_STATUS_UPDATE, now, step)
        self._status_callback(
            rec,
            now,
            step,
            progress=progress,
            message=message,
            intermediate_result=intermediate_result,
        )
        return step

    def request_info(
        self,
        key: TaskKey,
        missing_fields: Iterable[MissingField],
        *,
        now: float,
        question: str = "",
        required_by: datetime | None = None,
    ) -> Step:
        step = Step()
        rec = self._executor(key, step)
        if rec is None:
            return step
        need = TaskNeedInfoPayload(
            task_id=rec.task_id,
            missing_fields=list(missing_fields),
            question=question,
            required_by=required_by,
        )
        self._handler_move(rec, Event.SEND_TASK_NEED_INFO, now, step, wait_until=required_by)
        rec.need_info = need
        step.outgoing.append(self._callback(rec, TaskNeedInfo, need, now))
        return step

    def request_human(
        self,
        key: TaskKey,
        reason: Reason,
        *,
        now: float,
        context: HumanContext | None = None,
        options: Iterable[HumanOption] = (),
        escalation_level: int = 1,
        deadline: datetime | None = None,
    ) -> Step:
        step = Step()
        rec = self._executor(key, step)
        if rec is None:
            return step
        need = TaskNeedHumanPayload(
            task_id=rec.task_id,
            reason=reason,
            context=context,
            options=list(options),
            escalation_level=escalation_level,
            deadline=deadline,
        )
        self._handler_move(rec, Event.SEND_TASK_NEED_HUMAN, now, step, wait_until=deadline)
        out = self._callback(rec, TaskNeedHuman, need, now)
        rec.need_human, rec.need_human_id = need, out.message.id
        step.outgoing.append(out)
        return step

    def complete(self, key: TaskKey, result: TaskResult, *, now: float, summary: str = "") -> Step:
        step = Step()
        rec = self._executor(key, step)
        if rec is None:
            return step
        self._handler_move(rec, Event.SEND_TASK_COMPLETE, now, step)
        rec.result = result
        payload = TaskCompletePayload(task_id=rec.task_id, result=result, summary=summary)
        step.outgoing.append(self._callback(rec, TaskComplete, payload, now))
        return step

    def fail(self, key: TaskKey, error: TaskError, *, now: float) -> Step:
        step = Step()
        rec = self._executor(key, step)
        if rec is None:
            return step
        self._fail(rec, error, now, step)
        return step

    # --- restart ---------------------------------------------------------------------------------

    def restore(self, records: Iterable[TaskRecord], now: float) -> None:
        """Take back the tasks a store kept, and re-arm their timers (at start-up)."""
        for rec in records:
            self.tasks[rec.key] = rec
            if rec.is_final:
                continue
            self._track(rec, now)
            executor = rec.role is Role.EXECUTOR
            if executor and rec.task.deadline is not None:
                self._timers.set((_DEADLINE, rec.key), _epoch(rec.task.deadline))
            if rec.state is TaskState.EXECUTING:
                rec.executing_since = now  # time spent down is not executing time
            # The same timers a live move into this state starts (STATE_TIMERS).
            for timer in state_timers(rec.role, rec.state):
                self._start_state_timer(rec, timer, now, self._wait_until(rec))
            if not executor:
                self._arm_requester(rec, now)

    def recover(self, key: TaskKey, *, resumable: bool, now: float) -> Step:
        """Decide the fate of an executor task whose handler a restart interrupted.

        A resumable handler is started again from the beginning (with the fields provided
        so far) if the task was running; otherwise the task fails with a recoverable
        `execution_failed` ("interrupted by restart"). A task whose handler never started
        (waiting on a synchronous `task_need_info`) just goes on waiting.
        """
        step = Step()
        rec = self.tasks.get(key)
        if rec is None or rec.is_final or rec.role is not Role.EXECUTOR:
            return step
        if not rec.handler_started:
            return step
        if resumable and rec.state in RUNNING_STATES:
            if rec.state is not TaskState.EXECUTING:
                self._move(rec, Event.START_EXECUTION, now, None, step)
                self._status_callback(rec, now, step, message="executing")
            step.actions.append(StartExecution(rec.key, rec.task.type, self._payload(rec)))
            return step
        error = TaskError(
            code=ErrorCode.EXECUTION_FAILED.value,
            message="interrupted by restart",
            recoverable=True,
        )
        self._fail(rec, error, now, step)
        return step

    # --- clock ---------------------------------------------------------------------------------

    def on_timer(self, now: float) -> Step:
        """Fire every timer due at `now`: task timeouts, deadlines, heartbeats."""
        step = Step()
        for kind, target in list(self._timers.pop_due(now)):
            if kind == _HEARTBEAT:
                assert isinstance(target, str)
                self._heartbeat_due(target, now, step)
                continue
            assert isinstance(target, TaskKey)
            rec = self.tasks.get(target)
            if rec is None or rec.is_final:
                continue
            if rec.role is Role.REQUESTER:
                if kind == _SILENCE:
                    silent = (
                        f"no word from {rec.partner} about the task for "
                        f"{self.silence_limit():g} s (task_timeout plus heartbeat loss)"
                    )
                    self._give_up(rec, ErrorCode.EXECUTION_TIMEOUT, silent, now, step)
                elif kind == _R_DEADLINE:
                    late = f"the task's deadline passed with no outcome from {rec.partner}"
                    self._give_up(rec, ErrorCode.EXECUTION_TIMEOUT, late, now, step)
                continue
            text = {
                _TIMEOUT: f"TaskTimeout of {self.config.task_timeout:g} s passed",
                _DEADLINE: "the task's deadline passed",
                _WAIT: "no answer to the question in time (required_by, deadline or "
                f"input_timeout of {self.config.input_timeout:g} s)",
            }[kind]
            error = TaskError(
                code=ErrorCode.EXECUTION_TIMEOUT.value, message=text, recoverable=True
            )
            self._fail(rec, error, now, step)
        return step

    def timer_due(self, key: TaskKey, now: float) -> bool:
        """True if a timer of task `key` is due at `now` (the next `on_timer` fires it)."""
        return any(when <= now for when in self._timers.owned(key).values())

    def keep_heartbeat(self, partner: str, now: float) -> None:
        """Heartbeat `partner` even with no task in flight: messages to it are waiting.

        Delivery resumes after its next successful heartbeat (specs/protocol.md, 'Transport').
        """
        self._backlog.add(partner)
        if (_HEARTBEAT, partner) not in self._timers:
            self._timers.set((_HEARTBEAT, partner), now + self.config.heartbeat_interval)

    def _heartbeat_due(self, partner: str, now: float, step: Step) -> None:
        if not self.in_flight_with(partner) and partner not in self._backlog:
            return  # nothing in flight: stop heartbeating until the next task
        liveness = self._partners.setdefault(partner, _PartnerLiveness(last_heard=now))
        send = True
        if self.partner_watch is not None:
            shared, send = self.partner_watch.beat(partner, liveness.last_heard, now)
            if shared > liveness.last_heard:
                self.heard(partner, shared, step)  # another replica heard from it
        silent_for = now - liveness.last_heard
        limit = self.config.missed_heartbeat_limit * self.config.heartbeat_interval
        if liveness.reachable and silent_for >= limit:
            liveness.reachable = False
            step.actions.append(PartnerReachability(partner, reachable=False))
            self._partner_events(partner, TaskEventKind.PARTNER_UNREACHABLE, step)
        if send:
            step.outgoing.append(Outgoing(partner, self.heartbeat(partner, now)))
        self._timers.set((_HEARTBEAT, partner), now + self.config.heartbeat_interval)

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
            self._partner_events(partner, TaskEventKind.PARTNER_REACHABLE, step)
        return step

    def _partner_events(self, partner: str, kind: TaskEventKind, step: Step) -> None:
        for rec in self.tasks.values():
            if rec.partner == partner and rec.role is Role.REQUESTER and not rec.is_final:
                step.actions.append(TaskEvent(rec.key, kind, rec.state))

    # --- a message whose effects could not be stored -----------------------------------------

    def checkpoint(self, message: Message) -> Checkpoint:
        """Prepare to apply `message` so that `rollback` can leave the engine as if it had
        never seen it (the runtime then refuses it as `agent_not_ready`).

        Nothing is copied back field by field. The one task a message touches is copied on
        write: `receive` works on a copy, and the original stays as it was; the timers of
        that task and the state of the partners involved (liveness, backlog, heartbeat) are
        kept whole, as values; the counts of tasks in flight follow from the records.
        """
        key = self.incoming_key(message)
        rec = self.tasks.get(key) if key is not None else None
        if rec is not None:
            assert key is not None
            self.tasks[key] = _copy_record(rec)
        partners = {message.from_.agent_id}
        if rec is not None:
            partners.add(rec.partner)
        return Checkpoint(
            key=key,
            record=rec,
            timers=self._timers.owned(key) if key is not None else {},
            partners={p: self._partner_state(p) for p in partners},
        )

    def counted(self, checkpoint: Checkpoint) -> Applied:
        """What `receive` left for the checkpoint's task, just after it: `rollback` takes it
        back only if nothing moved the task since."""
        key = checkpoint.key
        rec = self.tasks.get(key) if key is not None else None
        return Applied(rec, len(rec.history) if rec is not None else 0)

    def rollback(self, checkpoint: Checkpoint, after: Applied | None = None) -> None:
        """Leave the engine as `checkpoint` found it: the task's record and timers, and the
        partners' state, each put back whole.

        With `after` (`counted` just after `receive`), a task that another step moved since
        (its handler completed it while the commit was awaited) is left as that step left it,
        so that what it recorded and queued stays true; the other tasks are never touched."""
        key = checkpoint.key
        if key is not None:
            current = self.tasks.get(key)
            moved = (
                after is not None
                and current is not None
                and (current is not after.record or len(current.history) != after.history)
            )
            if not moved:
                if current is not None and not current.is_final:
                    self._account(current, -1)
                original = checkpoint.record
                if original is None:
                    self.tasks.pop(key, None)
                else:
                    self.tasks[key] = original
                    if not original.is_final:
                        self._account(original, +1)
                self._timers.replace_owned(key, checkpoint.timers)
        for partner, state in checkpoint.partners.items():
            self._put_partner_state(partner, state)

    def _partner_state(self, partner: str) -> _PartnerState:
        liveness = self._partners.get(partner)
        return _PartnerState(
            liveness=None
            if liveness is None
            else _PartnerLiveness(liveness.last_heard, liveness.reachable),
            backlog=partner in self._backlog,
            timers=self._timers.owned(partner),
        )

    def _put_partner_state(self, partner: str, state: _PartnerState) -> None:
        if state.liveness is None:
            self._partners.pop(partner, None)
        else:
            self._partners[partner] = state.liveness
        if state.backlog:
            self._backlog.add(partner)
        else:
            self._backlog.discard(partner)
        self._timers.replace_owned(partner, state.timers)


@dataclass(frozen=True, slots=True)
class _PartnerState:
    """What the engine holds about one partner, as a value."""

    liveness: _PartnerLiveness | None
    backlog: bool
    timers: dict[_TimerKey, float]


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """What one incoming message may change, as values (see `Engine.checkpoint`): the task's
    record as it was (untouched: `receive` works on a copy) and its timers, and the state of
    the partners involved."""

    key: TaskKey | None
    record: TaskRecord | None
    timers: dict[_TimerKey, float]
    partners: dict[str, _PartnerState]


@dataclass(frozen=True, slots=True)
class Applied:
    """The record `receive` left for a checkpoint's task, and its length of history."""

    record: TaskRecord | None
    history: int


_RECORD_SLOTS: tuple[str, ...] = TaskRecord.__slots__


class EngineSnapshot(msgspec.Struct, frozen=True):
    """What `Engine.snapshot` returns: compared with `==`."""

    tasks: dict[TaskKey, dict[str, Any]]
    timers: dict[tuple[str, TaskKey | str], float]
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
