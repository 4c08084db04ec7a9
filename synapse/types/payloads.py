"""Payload structs of the 17 message types (specs/protocol.md, 'Payloads').

Field names are the wire names. Constraints the protocol implies live in the types, so that a
payload that decodes is a payload we can act on. Unknown fields are ignored at every level.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from synapse.types.enums import DecisionAction, HeartbeatStatus, Priority, TaskState

#: A task id: chosen by the requester, non-empty.
TaskId = Annotated[str, Meta(min_length=1, max_length=256)]
#: A non-empty identifier (agent ids, decision ids, field names, codes).
NonEmptyStr = Annotated[str, Meta(min_length=1)]
#: RFC 3339 time with an explicit offset (we send UTC with `Z`).
Timestamp = Annotated[datetime, Meta(tz=True)]
#: A percentage, integer or fractional.
Percent = Annotated[int, Meta(ge=0, le=100)] | Annotated[float, Meta(ge=0, le=100)]
#: A count of seconds or items, never negative, within the I-JSON integer range.
NonNegativeInt = Annotated[int, Meta(ge=0, le=2**53 - 1)]
JsonObject = dict[str, Any]


class Payload(msgspec.Struct, kw_only=True, frozen=True, gc=False):
    """Base of every payload and nested object: frozen value objects, keyword-only.

    `gc=False`: instances are not tracked by the cyclic garbage collector (less work for it
    per message, and 16 bytes less each). They hold JSON values only, which cannot form a
    reference cycle back to them (such a message could not be encoded).
    """


# --- task_request -------------------------------------------------------------------------


class TaskSpec(Payload, frozen=True):
    """`task_request.task`."""

    id: TaskId
    type: NonEmptyStr
    priority: Priority = Priority.NORMAL
    deadline: Timestamp | None = None
    payload: JsonObject = msgspec.field(default_factory=dict)


class TaskContext(Payload, frozen=True):
    """`task_request.context`."""

    session_id: str | None = None
    parent_task_id: str | None = None
    correlation_id: str | None = None
    metadata: JsonObject = msgspec.field(default_factory=dict)


class TaskRequestPayload(Payload, frozen=True):
    task: TaskSpec
    context: TaskContext | None = None


# --- task_confirm -------------------------------------------------------------------------


class Constraints(Payload, frozen=True):
    """`task_confirm.constraints`."""

    max_retries: NonNegativeInt | None = None
    fallback_enabled: bool | None = None


class TaskConfirmPayload(Payload, frozen=True):
    task_id: TaskId
    confirmed: bool = True
    estimated_duration: NonNegativeInt | None = None
    expected_completion: Timestamp | None = None
    capabilities_used: list[str] = msgspec.field(default_factory=list)
    constraints: Constraints | None = None


# --- task_reject --------------------------------------------------------------------------


class Reason(Payload, frozen=True):
    """A coded reason (`task_reject.reason`, `task_need_human.reason`)."""

    code: NonEmptyStr
    message: str = ""
    details: Any = None


class Alternatives(Payload, frozen=True):
    """`task_reject.alternatives`."""

    suggested_agent_id: str | None = None
    retry_after: NonNegativeInt | None = None
    partial_support: bool | None = None


class TaskRejectPayload(Payload, frozen=True):
    task_id: TaskId
    reason: Reason
    alternatives: Alternatives | None = None


# --- task_status_update -------------------------------------------------------------------


class TaskStatusUpdatePayload(Payload, frozen=True):
    task_id: TaskId
    status: TaskState
    progress: Percent | None = None
    message: str = ""
    intermediate_result: Any = None


# --- task_complete / task_failed ----------------------------------------------------------


class TaskResult(Payload, frozen=True):
    """`task_complete.result`."""

    output_type: NonEmptyStr
    output: Any = None
    metadata: JsonObject = msgspec.field(default_factory=dict)


class TaskCompletePayload(Payload, frozen=True):
    task_id: TaskId
    result: TaskResult
    summary: str = ""


class TaskError(Payload, frozen=True):
    """`task_failed.error`."""

    code: NonEmptyStr
    message: str = ""
    recoverable: bool = False
    details: Any = None


class TaskFailedPayload(Payload, frozen=True):
    task_id: TaskId
    error: TaskError
    partial_result: Any = None


# --- task_need_info / task_info_provided --------------------------------------------------


class MissingField(Payload, frozen=True):
    """One entry of `task_need_info.missing_fields` (also what `ValidateTask` returns)."""

    field: NonEmptyStr
    reason: str = ""
    suggested_value: Any = None
    alternatives: list[Any] = msgspec.field(default_factory=list)


class TaskNeedInfoPayload(Payload, frozen=True):
    task_id: TaskId
    missing_fields: Annotated[list[MissingField], Meta(min_length=1)]
    question: str = ""
    required_by: Timestamp | None = None


class TaskInfoProvidedPayload(Payload, frozen=True):
    task_id: TaskId
    fields: JsonObject
    notes: str | None = None


# --- task_need_human / human_decision -----------------------------------------------------


class HumanContext(Payload, frozen=True):
    """`task_need_human.context`."""

    task_summary: str = ""
    current_progress: Percent | None = None
    blocked_reason: str = ""


class HumanOption(Payload, frozen=True):
    """One entry of `task_need_human.options`."""

    field: NonEmptyStr
    value: Any = None
    pros_cons: str = ""
    confidence: Percent | None = None


class TaskNeedHumanPayload(Payload, frozen=True):
    task_id: TaskId
    reason: Reason
    context: HumanContext | None = None
    options: list[HumanOption] = msgspec.field(default_factory=list)
    escalation_level: NonNegativeInt = 1
    deadline: Timestamp | None = None


class DecidedBy(Payload, frozen=True):
    """`human_decision.decided_by`."""

    user_id: NonEmptyStr
    user_name: str = ""
    role: str = ""


class Decision(Payload, frozen=True):
    """`human_decision.decision`."""

    action: DecisionAction
    approved_fields: JsonObject = msgspec.field(default_factory=dict)
    rejection_reason: str = ""


class HumanDecisionPayload(Payload, frozen=True):
    task_id: TaskId
    decision_id: NonEmptyStr
    #: The `id` of the `task_need_human` message being answered.
    reply_to: NonEmptyStr
    decided_by: DecidedBy
    decision: Decision
    notes: str = ""
    timestamp: Timestamp | None = None


# --- cancel / acknowledgements ------------------------------------------------------------


class TaskCancelPayload(Payload, frozen=True):
    task_id: TaskId
    reason: str | None = None


class TaskAckPayload(Payload, frozen=True):
    task_id: TaskId
    #: The acknowledging side's state right after it applied the acknowledged message.
    state: TaskState


class AckPayload(Payload, frozen=True):
    """`p2p:ack` carries nothing: what it acknowledges is the envelope's `reply_to`."""


class NackPayload(Payload, frozen=True):
    code: NonEmptyStr
    message: str = ""
    details: JsonObject | None = None


# --- heartbeat / capabilities -------------------------------------------------------------


class HeartbeatPayload(Payload, frozen=True):
    status: HeartbeatStatus = HeartbeatStatus.OK
    #: Tasks in flight with the recipient.
    active_tasks: NonNegativeInt = 0


class CapabilityQueryPayload(Payload, frozen=True):
    task_type: str | None = None


class Capability(Payload, frozen=True):
    """One entry of `capability_response.capabilities`."""

    name: NonEmptyStr
    description: str = ""
    version: str = ""
    input_schema: JsonObject | None = None


class CapabilityResponsePayload(Payload, frozen=True):
    agent_id: NonEmptyStr
    capabilities: list[Capability] = msgspec.field(default_factory=list)
    max_concurrent_tasks: NonNegativeInt = 0
