"""specs/examples/: one valid example envelope per message type."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from synapse.types import (
    EXECUTOR_TO_REQUESTER,
    MESSAGE_CLASSES,
    REPLY_ONLY_TYPES,
    REQUESTER_TO_EXECUTOR,
    MessageType,
    decode_head,
    decode_message,
    encode_message,
)

SPECS = Path(__file__).resolve().parents[2] / "specs"
EXAMPLES = SPECS / "examples"
SCHEMA = SPECS / "schema"


def _example_files() -> list[Path]:
    return sorted(EXAMPLES.glob("*.json"))


def test_one_example_per_type() -> None:
    assert {p.stem for p in _example_files()} == {t.short for t in MessageType}


@pytest.mark.parametrize("path", _example_files(), ids=lambda p: p.stem)
def test_example_decodes_and_round_trips(path: Path) -> None:
    data = path.read_bytes()
    message = decode_message(data)
    assert message.type.short == path.stem
    assert type(message) is MESSAGE_CLASSES[message.type]
    assert decode_head(data).type is message.type
    again = encode_message(message)
    assert decode_message(again) == message
    # Nothing the example says is lost on the way through the types.
    assert _paths(msgspec.json.decode(data)) <= _paths(msgspec.json.decode(again))


def _paths(node: Any, prefix: str = "$") -> set[str]:
    if isinstance(node, dict):
        return {prefix} | {p for k, v in node.items() for p in _paths(v, f"{prefix}.{k}")}
    if isinstance(node, list):
        return {prefix} | {p for i, v in enumerate(node) for p in _paths(v, f"{prefix}[{i}]")}
    return {prefix}


@pytest.mark.parametrize("path", _example_files(), ids=lambda p: p.stem)
def test_example_follows_the_reply_and_direction_rules(path: Path) -> None:
    message = decode_message(path.read_bytes())
    if message.type in REPLY_ONLY_TYPES:
        assert message.reply_to is not None
    elif message.type is not MessageType.TASK_NEED_INFO:  # a reply or a callback: either
        assert message.reply_to is None
    requester, executor = "agent-alice", "agent-bob"
    if message.type in EXECUTOR_TO_REQUESTER | {MessageType.TASK_CONFIRM, MessageType.TASK_REJECT}:
        assert (message.from_.agent_id, message.to.agent_id) == (executor, requester)
    if message.type in REQUESTER_TO_EXECUTOR | {MessageType.TASK_REQUEST}:
        assert (message.from_.agent_id, message.to.agent_id) == (requester, executor)
    assert message.from_.agent_id != message.to.agent_id


@pytest.mark.parametrize("path", _example_files(), ids=lambda p: p.stem)
def test_example_validates_against_its_json_schema(path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    instance = json.loads(path.read_bytes())
    for name in (f"{path.stem}.json", "message.json"):
        jsonschema.validate(instance, json.loads((SCHEMA / name).read_bytes()))
