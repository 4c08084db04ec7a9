"""Builders fill in what every envelope needs; `decode_head` leaves the payload alone."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone

import msgspec
import pytest

from synapse.types import (
    PROTOCOL_VERSION,
    Ack,
    AckPayload,
    CountingIds,
    Heartbeat,
    HeartbeatPayload,
    MessageType,
    Sender,
    TaskRequest,
    TaskRequestPayload,
    TaskSpec,
    build_message,
    build_message_now,
    build_reply,
    decode_head,
    decode_message,
    encode_message,
    format_timestamp,
    new_task_id,
    refreshed,
)

ALICE = Sender(agent_id="agent-alice", endpoint="https://alice.example.com/synapse/callback")
BOB = Sender(agent_id="agent-bob", endpoint="https://bob.example.com/synapse/callback")


def _request() -> TaskRequest:
    task = TaskSpec(id=new_task_id(), type="echo", payload={"text": "你好"})
    payload = TaskRequestPayload(task=task)
    return build_message_now(TaskRequest, payload, sender=ALICE, to="agent-bob")


def test_build_message_fills_version_id_and_timestamp() -> None:
    before = datetime.now(UTC)
    message = _request()
    after = datetime.now(UTC)
    assert message.version == PROTOCOL_VERSION == "1.0"
    assert message.type is MessageType.TASK_REQUEST
    assert 1 <= len(message.id) <= 128
    assert message.timestamp.tzinfo is not None
    assert before <= message.timestamp <= after
    assert message.to.agent_id == "agent-bob"
    assert message.from_ == ALICE
    assert message.reply_to is None and message.signature is None
    assert message.payload.task.id.startswith("task-")


def test_ids_are_unique() -> None:
    assert len({_request().id for _ in range(200)}) == 200
    assert len({new_task_id() for _ in range(200)}) == 200


def test_explicit_id_and_timestamp_are_kept() -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    message = build_message(
        Heartbeat,
        HeartbeatPayload(),
        sender=BOB,
        to="agent-alice",
        message_id="msg-7",
        timestamp=at,
    )
    assert (message.id, message.timestamp) == ("msg-7", at)


def test_build_reply_answers_the_request() -> None:
    request = _request()
    at = datetime(2026, 1, 1, tzinfo=UTC)
    reply = build_reply(Ack, AckPayload(), request=request, sender=BOB, timestamp=at)
    assert reply.reply_to == request.id and reply.timestamp == at
    assert reply.to.agent_id == request.from_.agent_id
    assert reply.from_ == BOB
    assert reply.id != request.id


def test_built_messages_are_on_the_wire_as_the_contract_says() -> None:
    wire = msgspec.json.decode(encode_message(_request()))
    assert list(wire) == ["type", "version", "id", "from", "to", "timestamp", "payload"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", wire["timestamp"])
    assert wire["from"] == {"agent_id": "agent-alice", "endpoint": ALICE.endpoint}
    assert wire["payload"]["task"]["priority"] == "normal"
    assert decode_message(encode_message(_request())).type is MessageType.TASK_REQUEST


def test_refreshed_keeps_the_id_and_drops_the_signature() -> None:
    message = msgspec.structs.replace(_request(), signature="sha256=00")
    later = message.timestamp + timedelta(seconds=30)
    retry = refreshed(message, later)
    assert retry.id == message.id
    assert retry.timestamp == later
    assert retry.signature is None
    assert retry.payload == message.payload
    assert refreshed(message).timestamp >= message.timestamp


def test_format_timestamp_is_utc_with_z() -> None:
    at = datetime(2026, 1, 1, 8, 0, tzinfo=timezone(timedelta(hours=8)))
    assert format_timestamp(at) == "2026-01-01T00:00:00Z"
    assert format_timestamp(datetime(2026, 1, 1, 0, 0, 0, 500000, tzinfo=UTC)) == (
        "2026-01-01T00:00:00.500000Z"
    )


def test_decode_head_leaves_the_payload_raw_and_unchecked() -> None:
    value = msgspec.json.decode(encode_message(_request()))
    value["payload"]["task"]["id"] = ""  # invalid, but only the payload check may say so
    data = msgspec.json.encode(value)
    head = decode_head(data)
    assert head.type is MessageType.TASK_REQUEST
    assert isinstance(head.payload, msgspec.Raw)
    assert msgspec.json.decode(head.payload) == value["payload"]


def test_build_message_has_no_wall_clock_fallback() -> None:
    """The core's builder takes the time it is given and nothing else (`build_message_now` is
    the edges' wall-clock variant)."""
    with pytest.raises(TypeError):
        build_message(Heartbeat, HeartbeatPayload(), sender=BOB, to="agent-alice")  # type: ignore[call-arg]
    request = _request()
    with pytest.raises(TypeError):
        build_reply(Ack, AckPayload(), request=request, sender=BOB)  # type: ignore[call-arg]


def test_counting_ids_are_deterministic() -> None:
    ids = CountingIds("a")
    assert [ids.message_id(), ids.message_id(), ids.task_id()] == ["msg-a1", "msg-a2", "task-a1"]
