"""The values the engine hands out and keeps: task keys and records, transitions, the
messages to POST and the actions for the runtime (`Step`), task events, validations."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, TypeAlias

import msgspec

from synapse.p2p.states import (
    Event,
    Role,
)
from synapse.types import (
    Capability,
    Message,
    MessageType,
    MissingField,
    NackPayload,
    Reason,
    TaskComplete,
    TaskConfirm,
    TaskContext,
    TaskError,
    TaskFailed,
    TaskNeedHuman,
    TaskNeedHumanPayload,
    TaskNeedInfo,
    TaskNeedInfoPayload,
    TaskReject,
    TaskRejectPayload,
    TaskResult,
    TaskSpec,
    TaskState,
    TaskStatusUpdate,
    TaskStatusUpdatePayload,
)

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
    #: The hash chain (`synapse.p2p.audit`): the previous entry's `digest` ("" for the
    #: first), and this entry's SHA-256 over it and the fields above. "" in entries written
    #: before the chain existed.
    prev: str = ""
    digest: str = ""


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


class StartExecution(msgspec.Struct, frozen=True):
    """Run the handler's `execute_task` for this task."""

    key: TaskKey
    task_type: str
    payload: dict[str, Any]
    #: The answer to the question the task waited on when a restart interrupted its
    #: (resumable) handler: the fields of a `task_info_provided` or the `human_decision`. The
    #: handler, started again, is given it when it asks that question again.
    answered: Any = None


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


class TaskNote(StrEnum):
    """What a `TaskEvent` that is no message says: something the requester's runtime saw."""

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


#: What a `TaskEvent` is: a message about the task (its `MessageType`), or a `TaskNote`. Both
#: are `StrEnum`s: `kind == "p2p:task_need_info"` and `kind is MessageType.TASK_NEED_INFO` both
#: hold for the same event; `kind == "gave_up"` and `kind is TaskNote.GAVE_UP` likewise.
TaskEventKind: TypeAlias = MessageType | TaskNote


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


class Step(msgspec.Struct):
    """What one engine call decided (a Struct: made several times a task, initialised in C)."""

    reply: Message | None = None
    outgoing: list[Outgoing] = msgspec.field(default_factory=list)
    actions: list[Action] = msgspec.field(default_factory=list)
    transitions: list[Transition] = msgspec.field(default_factory=list)
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
    #: The keyed seal of `audit` (`synapse.p2p.audit.audit_seal`): "" while unkeyed.
    audit_seal: str = ""

    @property
    def task_id(self) -> str:
        return self.key.task_id

    @property
    def is_final(self) -> bool:
        return self.state.is_final
