"""Each kind of malformed input is refused with its specs/protocol.md, 'Error codes' code and says
where."""

from __future__ import annotations

import json
import re
from typing import Annotated, Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from synapse.types import (
    ErrorCode,
    HumanDecision,
    SynapseError,
    TaskNeedHuman,
    TaskRequest,
    decode_head,
    decode_message,
    parse_i_json,
)
from synapse.types.messages import MESSAGE_CLASSES

FORMAT = ErrorCode.MESSAGE_FORMAT_INVALID
PARAMS = ErrorCode.INVALID_PARAMS


def envelope(message_type: str = "p2p:task_request", **changes: Any) -> dict[str, Any]:
    payloads: dict[str, Any] = {
        "p2p:task_request": {"task": {"id": "task-1", "type": "echo", "payload": {"text": "hi"}}},
        "p2p:task_status_update": {"task_id": "task-1", "status": "executing", "progress": 50},
        "p2p:task_need_human": {
            "task_id": "task-1",
            "reason": {"code": "ethical_decision", "message": "涉及伦理决策需要人工审核"},
            "options": [{"field": "authorized", "value": True, "confidence": 70}],
        },
        "p2p:human_decision": {
            "task_id": "task-1",
            "decision_id": "dec-1",
            "reply_to": "msg-9",
            "decided_by": {"user_id": "user-123"},
            "decision": {"action": "approve"},
            "timestamp": "2026-01-01T00:03:00Z",
        },
        "p2p:ack": {},
    }
    value: dict[str, Any] = {
        "version": "1.0",
        "id": "msg-1",
        "type": message_type,
        "from": {"agent_id": "agent-a", "endpoint": "http://127.0.0.1:8001/synapse/callback"},
        "to": {"agent_id": "agent-b"},
        "timestamp": "2026-01-01T00:00:00Z",
        "payload": payloads[message_type],
    }
    value.update(changes)
    return value


def encode(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode()


def refusal(data: bytes) -> SynapseError:
    with pytest.raises(SynapseError) as info:
        decode_message(data)
    return info.value


def test_the_valid_baselines_decode() -> None:
    for message_type in ("p2p:task_request", "p2p:task_status_update", "p2p:task_need_human"):
        decode_message(encode(envelope(message_type)))
    decode_message(encode(envelope("p2p:human_decision")))
    decode_message(encode(envelope("p2p:ack", reply_to="msg-0")))


# --- not JSON, not I-JSON -------------------------------------------------------------------

NOT_I_JSON = {
    "not json": b"this is not json",
    "truncated": b'{"version": "1.0", "id": ',
    "empty": b"",
    "duplicate member": b'{"version": "1.0", "version": "1.0"}',
    "nested duplicate": b'{"payload": {"task_id": "a", "task_id": "b"}}',
    "int 2**53": b'{"n": 9007199254740992}',
    "int -2**53": b'{"n": -9007199254740992}',
    "int with 5000 digits": b'{"n": ' + b"7" * 5000 + b"}",
    "1e999": b'{"n": 1e999}',
    "-1e999": b'{"n": -1e999}',
    "NaN": b'{"n": NaN}',
    "Infinity": b'{"n": Infinity}',
    "lone surrogate": b'{"s": "\\ud800"}',
    "lone low surrogate": b'{"s": "a\\udc00b"}',
    "invalid utf-8": b'{"s": "\xff\xfe"}',
    "utf-8 encoded surrogate": b'{"s": "\xed\xa0\x80"}',
    "deep nesting": b"[" * 100_000 + b"]" * 100_000,
}


@pytest.mark.parametrize("data", NOT_I_JSON.values(), ids=NOT_I_JSON.keys())
def test_not_i_json_is_message_format_invalid(data: bytes) -> None:
    error = refusal(data)
    assert error.code is FORMAT
    assert error.http_status == 400
    assert error.details is not None and error.details["reason"]
    with pytest.raises(SynapseError):
        parse_i_json(data)


def test_the_i_json_edges_that_are_allowed() -> None:
    value = parse_i_json(
        b'{"max": 9007199254740991, "min": -9007199254740991, "f": 2.5e-7, "one": 1.0,'
        b' "pair": "\\ud83d\\ude00", "escaped_backslash": "\\\\ud800", "zh": "\xe5\x86\x99"}'
    )
    assert value["max"] == 2**53 - 1
    assert value["min"] == -(2**53 - 1)
    assert value["pair"] == "😀"
    assert value["escaped_backslash"] == "\\ud800"
    assert value["zh"] == "写"


def test_dangerous_content_is_refused_where_it_is_nested() -> None:
    bad = envelope()
    bad["payload"]["task"]["payload"] = {"n": 2**53}
    assert refusal(encode(bad)).code is FORMAT


# --- not an envelope --------------------------------------------------------------------------


@pytest.mark.parametrize("data", [b"[]", b"1", b'"p2p:ack"', b"null", b"true"])
def test_not_an_object(data: bytes) -> None:
    error = refusal(data)
    assert error.code is FORMAT
    assert error.details == {"path": "$"}


@pytest.mark.parametrize("field", ["version", "id", "type", "from", "to", "timestamp", "payload"])
def test_missing_envelope_field(field: str) -> None:
    value = envelope()
    del value[field]
    error = refusal(encode(value))
    assert error.code is FORMAT
    assert f"`{field}`" in error.message
    assert error.details == {"path": "$"}


@pytest.mark.parametrize(
    ("changes", "path"),
    [
        ({"id": ""}, "$.id"),
        ({"id": "x" * 129}, "$.id"),
        ({"reply_to": ""}, "$.reply_to"),
        ({"from": {"agent_id": "", "endpoint": "http://a"}}, "$.from.agent_id"),
        ({"from": {"agent_id": "a"}}, "$.from"),
        ({"to": {"agent_id": ""}}, "$.to.agent_id"),
        ({"to": "agent-b"}, "$.to"),
        ({"timestamp": "2026-01-01T00:00:00"}, "$.timestamp"),
        ({"timestamp": "yesterday"}, "$.timestamp"),
        ({"version": "1"}, "$.version"),
        ({"version": 1.0}, "$.version"),
        ({"signature": 7}, "$.signature"),
        ({"payload": []}, "$.payload"),
        ({"payload": None}, "$.payload"),
        ({"type": "p2p:task_progress"}, "$.type"),
        ({"type": "task_request"}, "$.type"),
    ],
)
def test_bad_envelope_is_message_format_invalid(changes: dict[str, Any], path: str) -> None:
    error = refusal(encode(envelope(**changes)))
    assert error.code is FORMAT
    assert error.details is not None and error.details["path"] == path


def test_the_envelope_is_judged_before_the_payload() -> None:
    value = envelope(id="")
    value["payload"]["task"]["id"] = ""
    assert refusal(encode(value)).code is FORMAT


@pytest.mark.parametrize("version", ["2.0", "0.9", "10.0"])
def test_another_major_version_is_refused_with_the_supported_versions(version: str) -> None:
    error = refusal(encode(envelope(version=version)))
    assert error.code is FORMAT
    assert error.details is not None
    assert error.details["supported_versions"] == ["1.x"]
    assert error.details["path"] == "$.version"
    with pytest.raises(SynapseError) as info:
        decode_head(encode(envelope(version=version)))
    assert info.value.details == error.details


def test_another_major_is_named_even_if_its_envelope_changed() -> None:
    value = envelope(version="2.0", type="p2p:task_delegate")
    del value["to"]
    error = refusal(encode(value))
    assert error.details is not None and error.details["supported_versions"] == ["1.x"]


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.42"])
def test_any_minor_version_is_accepted(version: str) -> None:
    assert decode_message(encode(envelope(version=version))).version == version


# --- bad payloads -----------------------------------------------------------------------------


def _set(value: dict[str, Any], path: str, new: Any) -> None:
    *parents, last = path.split(".")
    node: Any = value
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if isinstance(node, list):
        node[int(last)] = new
    elif new is _DELETE:
        del node[last]
    else:
        node[last] = new


_DELETE = object()

PAYLOAD_CASES = [
    ("p2p:task_request", "payload.task.id", "", "$.payload.task.id"),
    ("p2p:task_request", "payload.task.id", 17, "$.payload.task.id"),
    ("p2p:task_request", "payload.task.type", "", "$.payload.task.type"),
    ("p2p:task_request", "payload.task.priority", "whenever", "$.payload.task.priority"),
    ("p2p:task_request", "payload.task.deadline", "2026-01-01T00:00:00", "$.payload.task.deadline"),
    ("p2p:task_request", "payload.task.payload", [], "$.payload.task.payload"),
    ("p2p:task_request", "payload.task", _DELETE, "$.payload"),
    ("p2p:task_status_update", "payload.progress", 101, "$.payload.progress"),
    ("p2p:task_status_update", "payload.progress", 100.5, "$.payload.progress"),
    ("p2p:task_status_update", "payload.progress", -1, "$.payload.progress"),
    ("p2p:task_status_update", "payload.progress", True, "$.payload.progress"),
    ("p2p:task_status_update", "payload.status", "canceled", "$.payload.status"),
    ("p2p:task_status_update", "payload.task_id", "", "$.payload.task_id"),
    ("p2p:task_need_human", "payload.options.0.confidence", -1, "$.payload.options[0].confidence"),
    ("p2p:task_need_human", "payload.options.0.field", "", "$.payload.options[0].field"),
    ("p2p:task_need_human", "payload.reason.code", "", "$.payload.reason.code"),
    ("p2p:human_decision", "payload.decision.action", "maybe", "$.payload.decision.action"),
    ("p2p:human_decision", "payload.timestamp", "2026-01-01T00:03:00", "$.payload.timestamp"),
    ("p2p:human_decision", "payload.decided_by.user_id", "", "$.payload.decided_by.user_id"),
    ("p2p:human_decision", "payload.decision_id", "", "$.payload.decision_id"),
]


@pytest.mark.parametrize(
    ("message_type", "where", "new", "path"),
    PAYLOAD_CASES,
    ids=[f"{t[4:]}:{w}={n!r}" for t, w, n, _ in PAYLOAD_CASES],
)
def test_bad_payload_is_invalid_params_with_its_path(
    message_type: str, where: str, new: Any, path: str
) -> None:
    value = envelope(message_type)
    _set(value, where, new)
    error = refusal(encode(value))
    assert error.code is PARAMS
    assert error.http_status == 400
    assert error.details is not None and error.details["path"] == path


def test_a_missing_payload_field_names_it() -> None:
    value = envelope("p2p:task_status_update")
    del value["payload"]["status"]
    error = refusal(encode(value))
    assert error.code is PARAMS
    assert "`status`" in error.message
    assert error.details == {"path": "$.payload"}


def test_a_payload_of_another_type_is_invalid_params() -> None:
    value = envelope("p2p:task_status_update")
    value["payload"] = envelope("p2p:task_request")["payload"]
    assert refusal(encode(value)).code is PARAMS


# --- unknown members are ignored (a newer minor may add some) ----------------------------------


def test_unknown_members_are_ignored_at_every_level() -> None:
    value = envelope("p2p:task_need_human")
    value["x_trace_id"] = "trace-1"
    value["from"]["x_region"] = "eu"
    value["payload"]["x_hint"] = {"nested": [1, 2.5]}
    value["payload"]["reason"]["x_source"] = "policy"
    value["payload"]["options"][0]["x_weight"] = 0.5
    message = decode_message(encode(value))
    assert isinstance(message, TaskNeedHuman)
    assert message == decode_message(encode(envelope("p2p:task_need_human")))


def test_unknown_members_inside_free_form_objects_are_kept() -> None:
    value = envelope()
    value["payload"]["task"]["payload"] = {"text": "写一首诗", "x_new": {"a": 1}}
    message = decode_message(encode(value))
    assert isinstance(message, TaskRequest)
    assert message.payload.task.payload == {"text": "写一首诗", "x_new": {"a": 1}}


def test_human_decision_reply_to_is_a_payload_field() -> None:
    message = decode_message(encode(envelope("p2p:human_decision")))
    assert isinstance(message, HumanDecision)
    assert message.payload.reply_to == "msg-9"
    assert message.reply_to is None


@pytest.mark.parametrize("version", ["1.0\n", "\n1.0", "1.0\n\n", "1.0 ", " 1.0", "2.0\n"])
def test_a_version_is_the_whole_string(version: str) -> None:
    error = refusal(encode(envelope(version=version)))
    assert error.code is FORMAT
    assert error.details is not None and error.details["path"] == "$.version"


def _string_patterns() -> list[str]:
    """Every `pattern` a wire type constrains a string with."""
    found: set[str] = set()
    seen: list[object] = []  # kept alive, so that no id is reused during the walk
    stack: list[object] = [msgspec.inspect.type_info(c) for c in MESSAGE_CLASSES.values()]
    while stack:
        node = stack.pop()
        if any(node is s for s in seen):
            continue
        seen.append(node)
        if isinstance(node, msgspec.inspect.StrType) and node.pattern is not None:
            found.add(node.pattern)
        if isinstance(node, msgspec.inspect.Field):
            stack.append(node.type)
            continue
        if not isinstance(node, msgspec.inspect.Type):
            continue
        for name in type(node).__struct_fields__:
            value = getattr(node, name)
            items = value if isinstance(value, tuple | list) else (value,)
            stack.extend(
                v for v in items if isinstance(v, msgspec.inspect.Type | msgspec.inspect.Field)
            )
    return sorted(found)


PATTERNS = _string_patterns()


@given(data=st.data())
def test_every_pattern_matches_whole_strings_only(data: st.DataObject) -> None:
    """msgspec *searches* a pattern, and `$` also matches before a final newline: every
    pattern of the wire types must refuse a valid value with anything around it."""
    assert PATTERNS, "no pattern found: the walk is broken"
    pattern = data.draw(st.sampled_from(PATTERNS))
    value = data.draw(st.from_regex(pattern, fullmatch=True))
    assert re.search(pattern, value)
    for spoiled in (value + "\n", "\n" + value, value + "\n\n", value + " \n"):
        assert re.search(pattern, spoiled) is None, (pattern, spoiled)
        with pytest.raises(msgspec.ValidationError):
            msgspec.convert(spoiled, Annotated[str, msgspec.Meta(pattern=pattern)])
