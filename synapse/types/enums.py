"""Enumerations of the wire protocol: message types, task states and small value sets."""

from __future__ import annotations

from enum import StrEnum


class MessageType(StrEnum):
    """The 17 `p2p:` message types of specs/protocol.md, 'Message types'."""

    TASK_REQUEST = "p2p:task_request"
    """R → E: submit a task."""
    TASK_CONFIRM = "p2p:task_confirm"
    """E → R: the task is accepted (synchronous reply only)."""
    TASK_REJECT = "p2p:task_reject"
    """E → R: the task is refused (synchronous reply only)."""
    TASK_NEED_INFO = "p2p:task_need_info"
    """E → R: information is missing."""
    TASK_INFO_PROVIDED = "p2p:task_info_provided"
    """R → E: the missing information."""
    TASK_STATUS_UPDATE = "p2p:task_status_update"
    """E → R: progress."""
    TASK_COMPLETE = "p2p:task_complete"
    """E → R: the task is done, with its result."""
    TASK_FAILED = "p2p:task_failed"
    """E → R: the task failed."""
    TASK_CANCEL = "p2p:task_cancel"
    """R → E: cancel the task."""
    TASK_ACK = "p2p:task_ack"
    """Either way: task-level acknowledgement (synchronous reply only)."""
    ACK = "p2p:ack"
    """Either way: generic acknowledgement (synchronous reply only)."""
    NACK = "p2p:nack"
    """Either way: refusal with an error code (synchronous reply only)."""
    HEARTBEAT = "p2p:heartbeat"
    """Either way: keep-alive; answered by the replier's own heartbeat."""
    CAPABILITY_QUERY = "p2p:capability_query"
    """Either way: ask for capabilities."""
    CAPABILITY_RESPONSE = "p2p:capability_response"
    """Either way: the capability list (synchronous reply only)."""
    TASK_NEED_HUMAN = "p2p:task_need_human"
    """E → R: a person must decide."""
    HUMAN_DECISION = "p2p:human_decision"
    """R → E: what the person decided."""

    @property
    def short(self) -> str:
        """The type without its `p2p:` prefix (`task_request`)."""
        return self.value[4:]


#: Types that only ever travel as synchronous HTTP replies (specs/protocol.md, 'Signatures' and
#: 'Transport').
REPLY_ONLY_TYPES: frozenset[MessageType] = frozenset(
    {
        MessageType.TASK_CONFIRM,
        MessageType.TASK_REJECT,
        MessageType.CAPABILITY_RESPONSE,
        MessageType.TASK_ACK,
        MessageType.ACK,
        MessageType.NACK,
    }
)

#: Callbacks that only the executor sends about a task (specs/protocol.md, 'Message types').
EXECUTOR_TO_REQUESTER: frozenset[MessageType] = frozenset(
    {
        MessageType.TASK_NEED_INFO,
        MessageType.TASK_STATUS_UPDATE,
        MessageType.TASK_COMPLETE,
        MessageType.TASK_FAILED,
        MessageType.TASK_NEED_HUMAN,
    }
)

#: Messages that only the requester sends about an existing task (specs/protocol.md,
#: 'Message types').
REQUESTER_TO_EXECUTOR: frozenset[MessageType] = frozenset(
    {
        MessageType.TASK_INFO_PROVIDED,
        MessageType.TASK_CANCEL,
        MessageType.HUMAN_DECISION,
    }
)


class TaskState(StrEnum):
    """The 14 task states of specs/protocol.md, 'Task states'."""

    IDLE = "idle"
    """Initial state, nothing sent yet."""
    PENDING = "pending"
    """R sent the request and awaits its reply."""
    CONFIRMED = "confirmed"
    """E accepted the task."""
    EXECUTING = "executing"
    """The handler runs."""
    INFO_NEEDED = "info_needed"
    """E waits for missing information."""
    INFO_PROVIDED = "info_provided"
    """R sent the information; E resumes."""
    NEED_HUMAN = "need_human"
    """E waits for a person's decision."""
    HUMAN_DECIDING = "human_deciding"
    """A person at R is deciding (R only)."""
    HUMAN_APPROVED = "human_approved"
    """The person approved; E resumes."""
    HUMAN_REJECTED = "human_rejected"
    """The person rejected; the task fails."""
    COMPLETED = "completed"
    """Final: done with a result."""
    FAILED = "failed"
    """Final: failed."""
    CANCELLED = "cancelled"
    """Final: cancelled by R."""
    REJECTED = "rejected"
    """Final: refused by E."""

    #: True for the four final states (an attribute of each member, set below: asked a dozen
    #: times a task, it costs a lookup, not a call).
    is_final: bool


FINAL_STATES: frozenset[TaskState] = frozenset(
    {TaskState.COMPLETED, TaskState.FAILED, TaskState.CANCELLED, TaskState.REJECTED}
)
for _state in TaskState:
    _state.is_final = _state in FINAL_STATES
del _state


class Priority(StrEnum):
    """`task.priority` (specs/protocol.md, 'Payloads')."""

    LOW = "low"
    NORMAL = "normal"
    HIGH = "high"
    URGENT = "urgent"

    @property
    def rank(self) -> int:
        """Higher is more urgent."""
        return _PRIORITY_RANK[self]


_PRIORITY_RANK = {Priority.LOW: 0, Priority.NORMAL: 1, Priority.HIGH: 2, Priority.URGENT: 3}


class DecisionAction(StrEnum):
    """`human_decision.decision.action`."""

    APPROVE = "approve"
    REJECT = "reject"


class HeartbeatStatus(StrEnum):
    """`heartbeat.status`."""

    OK = "ok"
    BUSY = "busy"
    DRAINING = "draining"
