"""The envelope (`UnifiedSynapseMessage`, specs/protocol.md, 'Envelope') and one typed message class
per type.

Each class is the envelope with its `payload` typed; `type` is the msgspec tag, so a single
decoder picks the payload type from `type` while it decodes the bytes.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Generic, TypeAlias, TypeVar

import msgspec
from msgspec import Meta

from synapse.types.enums import MessageType
from synapse.types.payloads import (
    AckPayload,
    CapabilityQueryPayload,
    CapabilityResponsePayload,
    HeartbeatPayload,
    HumanDecisionPayload,
    NackPayload,
    NonEmptyStr,
    TaskAckPayload,
    TaskCancelPayload,
    TaskCompletePayload,
    TaskConfirmPayload,
    TaskFailedPayload,
    TaskInfoProvidedPayload,
    TaskNeedHumanPayload,
    TaskNeedInfoPayload,
    TaskRejectPayload,
    TaskRequestPayload,
    TaskStatusUpdatePayload,
    Timestamp,
)

#: A message id: chosen by its sender, 1–128 characters.
MessageId = Annotated[str, Meta(min_length=1, max_length=128)]
#: `MAJOR.MINOR`.
#: MAJOR.MINOR, the whole string. msgspec searches a pattern and `$` also matches before a
#: final newline, so `(?!\n)` refuses "1.0\n"; it is written so that JSON Schema (ECMA-262)
#: readers of the generated schemas understand it too, which `\A`/`\Z` would not be.
Version = Annotated[str, Meta(pattern=r"^[0-9]+\.[0-9]+$(?!\n)")]

PROTOCOL_VERSION = "1.0"
SUPPORTED_MAJOR = 1


class Sender(msgspec.Struct, frozen=True, kw_only=True):
    """Envelope `from`: who sent it and the URL it receives POSTs on."""

    agent_id: NonEmptyStr
    endpoint: NonEmptyStr


class Recipient(msgspec.Struct, frozen=True, kw_only=True):
    """Envelope `to`: the intended receiver."""

    agent_id: NonEmptyStr


P = TypeVar("P", bound=msgspec.Struct)


class Envelope(
    msgspec.Struct,
    Generic[P],
    frozen=True,
    kw_only=True,
    gc=False,
    omit_defaults=True,
    tag_field="type",
):
    """Fields shared by every message. Not decoded directly: use a subclass or the codec.

    Not tracked by the garbage collector (`gc=False`), like the payloads: see `Payload`.
    """

    message_type: ClassVar[MessageType]

    version: Version
    id: MessageId
    from_: Sender = msgspec.field(name="from")
    to: Recipient
    timestamp: Timestamp
    reply_to: MessageId | None = None
    payload: P
    signature: str | None = None

    @property
    def type(self) -> MessageType:
        return self.message_type

    @property
    def sender_id(self) -> str:
        return self.from_.agent_id


class TaskRequest(Envelope[TaskRequestPayload], tag=MessageType.TASK_REQUEST.value, frozen=True):
    message_type = MessageType.TASK_REQUEST


class TaskConfirm(Envelope[TaskConfirmPayload], tag=MessageType.TASK_CONFIRM.value, frozen=True):
    message_type = MessageType.TASK_CONFIRM


class TaskReject(Envelope[TaskRejectPayload], tag=MessageType.TASK_REJECT.value, frozen=True):
    message_type = MessageType.TASK_REJECT


class TaskNeedInfo(
    Envelope[TaskNeedInfoPayload], tag=MessageType.TASK_NEED_INFO.value, frozen=True
):
    message_type = MessageType.TASK_NEED_INFO


class TaskInfoProvided(
    Envelope[TaskInfoProvidedPayload], tag=MessageType.TASK_INFO_PROVIDED.value, frozen=True
):
    message_type = MessageType.TASK_INFO_PROVIDED


class TaskStatusUpdate(
    Envelope[TaskStatusUpdatePayload], tag=MessageType.TASK_STATUS_UPDATE.value, frozen=True
):
    message_type = MessageType.TASK_STATUS_UPDATE


class TaskComplete(Envelope[TaskCompletePayload], tag=MessageType.TASK_COMPLETE.value, frozen=True):
    message_type = MessageType.TASK_COMPLETE


class TaskFailed(Envelope[TaskFailedPayload], tag=MessageType.TASK_FAILED.value, frozen=True):
    message_type = MessageType.TASK_FAILED


class TaskCancel(Envelope[TaskCancelPayload], tag=MessageType.TASK_CANCEL.value, frozen=True):
    message_type = MessageType.TASK_CANCEL


class TaskAck(Envelope[TaskAckPayload], tag=MessageType.TASK_ACK.value, frozen=True):
    message_type = MessageType.TASK_ACK


class Ack(Envelope[AckPayload], tag=MessageType.ACK.value, frozen=True):
    message_type = MessageType.ACK


class Nack(Envelope[NackPayload], tag=MessageType.NACK.value, frozen=True):
    message_type = MessageType.NACK


class Heartbeat(Envelope[HeartbeatPayload], tag=MessageType.HEARTBEAT.value, frozen=True):
    message_type = MessageType.HEARTBEAT


class CapabilityQuery(
    Envelope[CapabilityQueryPayload], tag=MessageType.CAPABILITY_QUERY.value, frozen=True
):
    message_type = MessageType.CAPABILITY_QUERY


class CapabilityResponse(
    Envelope[CapabilityResponsePayload], tag=MessageType.CAPABILITY_RESPONSE.value, frozen=True
):
    message_type = MessageType.CAPABILITY_RESPONSE


class TaskNeedHuman(
    Envelope[TaskNeedHumanPayload], tag=MessageType.TASK_NEED_HUMAN.value, frozen=True
):
    message_type = MessageType.TASK_NEED_HUMAN


class HumanDecision(
    Envelope[HumanDecisionPayload], tag=MessageType.HUMAN_DECISION.value, frozen=True
):
    message_type = MessageType.HUMAN_DECISION


Message: TypeAlias = (
    TaskRequest
    | TaskConfirm
    | TaskReject
    | TaskNeedInfo
    | TaskInfoProvided
    | TaskStatusUpdate
    | TaskComplete
    | TaskFailed
    | TaskCancel
    | TaskAck
    | Ack
    | Nack
    | Heartbeat
    | CapabilityQuery
    | CapabilityResponse
    | TaskNeedHuman
    | HumanDecision
)

MESSAGE_CLASSES: dict[MessageType, type[Envelope[Any]]] = {
    cls.message_type: cls
    for cls in (
        TaskRequest,
        TaskConfirm,
        TaskReject,
        TaskNeedInfo,
        TaskInfoProvided,
        TaskStatusUpdate,
        TaskComplete,
        TaskFailed,
        TaskCancel,
        TaskAck,
        Ack,
        Nack,
        Heartbeat,
        CapabilityQuery,
        CapabilityResponse,
        TaskNeedHuman,
        HumanDecision,
    )
}


def _payload_type(cls: type[Envelope[Any]]) -> type[msgspec.Struct]:
    (base,) = cls.__orig_bases__  # type: ignore[attr-defined]
    (payload_type,) = base.__args__
    assert isinstance(payload_type, type)
    return payload_type


#: The payload struct of each message type.
PAYLOAD_CLASSES: dict[MessageType, type[msgspec.Struct]] = {
    t: _payload_type(cls) for t, cls in MESSAGE_CLASSES.items()
}
