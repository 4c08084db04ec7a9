"""A message type is declared once, in `MessageType`: its class, wire tag, payload type, the
event kinds of a requester's handle and the table's `recv …` events follow from it."""

from __future__ import annotations

from typing import get_args

import msgspec
import pytest

from synapse.p2p.engine import TaskEventKind
from synapse.p2p.states import Event
from synapse.types import MESSAGE_CLASSES, PAYLOAD_CLASSES, MessageType
from synapse.types.messages import Envelope, Message, wire_type_of
from synapse.types.payloads import AckPayload


def test_every_message_type_has_its_class_named_after_it() -> None:
    assert set(MESSAGE_CLASSES) == set(MessageType) == set(PAYLOAD_CLASSES)
    for message_type, cls in MESSAGE_CLASSES.items():
        assert cls.message_type is message_type
        assert wire_type_of(cls.__name__) == message_type.value
        assert cls.__struct_config__.tag == message_type.value  # the `type` on the wire
    assert len(get_args(Message)) == len(MessageType)


def test_the_tag_decides_the_class_when_decoding() -> None:
    for message_type, cls in MESSAGE_CLASSES.items():
        encoded = msgspec.json.encode({"type": message_type.value})
        with pytest.raises(msgspec.ValidationError) as refused:
            msgspec.json.decode(encoded, type=Message)
        # The tag was understood: what is missing is a field of that very class.
        assert "missing required field" in str(refused.value), cls


def test_a_message_class_whose_name_is_no_message_type_fails_at_import() -> None:
    with pytest.raises(ValueError, match="p2p:task_teleport"):

        class TaskTeleport(Envelope[AckPayload], frozen=True):
            """Not a message type of the protocol."""


def test_event_kinds_are_the_message_types_and_nothing_restates_them() -> None:
    message_types, notes = get_args(TaskEventKind)
    assert message_types is MessageType
    assert {note.value for note in notes}.isdisjoint(t.value for t in MessageType)


def test_each_receipt_event_names_its_message_type_in_its_own_text() -> None:
    for event in Event:
        received = event.message_type
        if event.value.startswith("recv ") and "nack" not in event.value:
            assert received is not None and received.short in event.value, event
        else:
            assert received is None, event
