"""The envelope (`UnifiedSynapseMessage`, specs/protocol.md, 'Envelope') and one typed message class
per type.

Each class is the envelope with its `payload` typed; `type` is the msgspec tag, so a single
decoder picks the payload type from `type` while it decodes the bytes.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Generic, TypeAlias, TypeVar, get_args

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

_WORD_START = re.compile(r"(?<!^)(?=[A-Z])")


def wire_type_of(class_name: str) -> str:
    """The wire `type` of the message class `class_name`: `TaskNeedInfo` → `p2p:task_need_info`."""
    return "p2p:" + _WORD_START.sub("_", class_name).lower()


class Envelope(
    msgspec.Struct,
    Generic[P],
    frozen=True,
    kw_only=True,
    gc=False,
    omit_defaults=True,
    tag_field="type",
    tag=wire_type_of,
):
    """Fields shared by every message. Not decoded directly: use a subclass or the codec.

    A message type is declared once, in `MessageType`; its class is named after it
    (`p2p:task_need_info` → `TaskNeedInfo`), which gives the class its msgspec tag (the `type`
    on the wire) and its `message_type`. A subclass whose name is no message type fails at
    import.

    Not tracked by the garbage collector (`gc=False`), like the payloads: see `Payload`.
    """

    message_type: ClassVar[MessageType]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.message_type = MessageType(wire_type_of(cls.__name__))

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


class TaskRequest(Envelope[TaskRequestPayload], frozen=True):
    """The requester asks the executor to do a task."""


class TaskConfirm(Envelope[TaskConfirmPayload], frozen=True):
    """The executor accepts the task and starts it."""


class TaskReject(Envelope[TaskRejectPayload], frozen=True):
    """The executor declines the task."""


class TaskNeedInfo(Envelope[TaskNeedInfoPayload], frozen=True):
    """The executor asks the requester for missing information."""


class TaskInfoProvided(Envelope[TaskInfoProvidedPayload], frozen=True):
    """The requester answers a `need_info`."""


class TaskStatusUpdate(Envelope[TaskStatusUpdatePayload], frozen=True):
    """The executor reports progress."""


class TaskComplete(Envelope[TaskCompletePayload], frozen=True):
    """The executor finished the task: its result."""


class TaskFailed(Envelope[TaskFailedPayload], frozen=True):
    """The executor could not finish the task."""


class TaskCancel(Envelope[TaskCancelPayload], frozen=True):
    """Either side cancels the task."""


class TaskAck(Envelope[TaskAckPayload], frozen=True):
    """The requester acknowledges a final message."""


class Ack(Envelope[AckPayload], frozen=True):
    """A message was received and accepted (the synchronous reply)."""


class Nack(Envelope[NackPayload], frozen=True):
    """A message was refused (the synchronous reply): its code says why."""


class Heartbeat(Envelope[HeartbeatPayload], frozen=True):
    """A peer asks whether its partner is alive."""


class CapabilityQuery(Envelope[CapabilityQueryPayload], frozen=True):
    """A peer asks what task types its partner offers."""


class CapabilityResponse(Envelope[CapabilityResponsePayload], frozen=True):
    """The task types a peer offers."""


class TaskNeedHuman(Envelope[TaskNeedHumanPayload], frozen=True):
    """The executor asks for a person's decision."""


class HumanDecision(Envelope[HumanDecisionPayload], frozen=True):
    """The requester's person decided."""


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

#: The class of each message type, from the `Message` union.
MESSAGE_CLASSES: dict[MessageType, type[Envelope[Any]]] = {
    cls.message_type: cls for cls in get_args(Message)
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
