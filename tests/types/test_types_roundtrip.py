"""Every message type survives encode → decode unchanged, for values drawn from its own types."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from type_strategies import any_message, json_values, message_strategy, strategy_for

from synapse.types import (
    MESSAGE_CLASSES,
    PAYLOAD_CLASSES,
    Envelope,
    MessageType,
    SynapseError,
    decode_head,
    decode_message,
    decode_typed,
    encode_message,
    parse_i_json,
)


def test_seventeen_types_each_with_a_class_and_a_payload() -> None:
    assert len(MessageType) == 17
    assert set(MESSAGE_CLASSES) == set(MessageType) == set(PAYLOAD_CLASSES)
    for message_type, cls in MESSAGE_CLASSES.items():
        assert cls.message_type is message_type
        assert msgspec.inspect.type_info(cls).tag == message_type.value  # type: ignore[attr-defined]


@pytest.mark.parametrize("message_type", list(MessageType), ids=lambda t: t.short)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_round_trip(message_type: MessageType, data: st.DataObject) -> None:
    message = data.draw(message_strategy(message_type))
    wire = encode_message(message)
    decoded = decode_message(wire)
    assert type(decoded) is type(message)
    assert decoded == message
    assert encode_message(decoded) == wire
    assert decode_typed(wire) == message


@settings(max_examples=100, deadline=None)
@given(message=any_message)
def test_head_agrees_with_typed_decode(message: Envelope[Any]) -> None:
    wire = encode_message(message)
    head = decode_head(wire)
    assert head.type is message.type
    assert head.id == message.id
    assert head.from_ == message.from_
    assert head.reply_to == message.reply_to
    # The payload stays raw bytes, to be decoded after the sender is authenticated.
    assert isinstance(head.payload, msgspec.Raw)
    payload = msgspec.json.decode(head.payload, type=PAYLOAD_CLASSES[message.type])
    assert payload == message.payload


@settings(max_examples=100, deadline=None)
@given(message=any_message)
def test_encoded_messages_are_i_json(message: Envelope[Any]) -> None:
    value = parse_i_json(encode_message(message))
    assert value["type"] == message.type.value
    assert ("reply_to" in value) is (message.reply_to is not None)
    assert ("signature" in value) is (message.signature is not None)


@settings(max_examples=200, deadline=None)
@given(data=st.one_of(st.binary(max_size=64), json_values.map(msgspec.json.encode)))
def test_any_input_decodes_or_is_refused_as_a_protocol_error(data: bytes) -> None:
    """h11's fuzz property: bytes either decode or raise SynapseError, never anything else."""
    try:
        decode_message(data)
    except SynapseError as exc:
        assert exc.http_status in (400, 413)
        assert exc.code.value in ("message_format_invalid", "invalid_params")


@settings(max_examples=200, deadline=None)
@given(message=any_message, data=st.data())
def test_mutated_messages_decode_or_are_refused(
    message: Envelope[Any], data: st.DataObject
) -> None:
    """Replace one member somewhere in a valid envelope by an arbitrary JSON value."""
    value = msgspec.json.decode(encode_message(message))
    node = value
    while True:
        keys = list(node) if isinstance(node, dict) else []
        if not keys:
            break
        key = data.draw(st.sampled_from(keys))
        if isinstance(node[key], dict) and node[key] and data.draw(st.booleans()):
            node = node[key]
            continue
        node[key] = data.draw(json_values)
        break
    try:
        decode_message(msgspec.json.encode(value))
    except SynapseError as exc:
        assert exc.details is not None
        assert "path" in exc.details or "reason" in exc.details


@pytest.mark.parametrize("cls", sorted(PAYLOAD_CLASSES.values(), key=lambda c: c.__name__))
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_payloads_round_trip_alone(cls: type[msgspec.Struct], data: st.DataObject) -> None:
    payload = data.draw(strategy_for(cls))
    assert msgspec.json.decode(msgspec.json.encode(payload), type=cls) == payload
