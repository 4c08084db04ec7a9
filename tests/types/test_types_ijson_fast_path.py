"""The I-JSON fast path is pinned to the reference parser: on any input it either steps aside
or returns exactly what the reference returns (same values, same types), and it never accepts
what the reference refuses."""

from __future__ import annotations

import json
import os
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from synapse.types.errors import SynapseError
from synapse.types.ijson import _NOT_PLAIN, _parse_plain, _parse_reference, parse_i_json

SCALE = max(1, int(os.environ.get("SYNAPSE_FUZZ_SCALE", "1")))

safe_ints = st.integers(min_value=-(2**53 - 1), max_value=2**53 - 1)
any_ints = st.integers(min_value=-(2**70), max_value=2**70)
floats = st.floats(allow_nan=False, allow_infinity=False)
texts = st.text(st.characters(codec="utf-8"), max_size=12) | st.sampled_from(
    ["", "a:b", "é", "日本", "\\", '"', "\u2028", "🙂", "{", "[1]"]
)
scalars = st.none() | st.booleans() | safe_ints | any_ints | floats | texts
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=20,
)


def typed(value: Any) -> Any:
    """`value` with every scalar tagged by its type, so 1, 1.0 and True stay apart."""
    if isinstance(value, dict):
        return ("dict", [(k, typed(v)) for k, v in value.items()])
    if isinstance(value, list):
        return ("list", [typed(v) for v in value])
    return (type(value).__name__, repr(value))


def reference(data: bytes) -> Any:
    try:
        return ("ok", typed(_parse_reference(data)))
    except SynapseError as exc:
        return ("refused", exc.code)


def check(data: bytes) -> None:
    expected = reference(data)
    fast = _parse_plain(data)
    if fast is not _NOT_PLAIN:
        assert expected == ("ok", typed(fast)), data
    try:
        got: Any = ("ok", typed(parse_i_json(data)))
    except SynapseError as exc:
        got = ("refused", exc.code)
    assert got == expected, data


def with_duplicate(document: dict[str, Any], key: str, first: Any, second: Any) -> bytes:
    body = json.dumps(document, ensure_ascii=False)[1:-1]
    members = [body] if body else []
    members += [
        f"{json.dumps(key)}: {json.dumps(first)}",
        f"{json.dumps(key)}:{json.dumps(second)}",
    ]
    return ("{" + ", ".join(members) + "}").encode()


@settings(max_examples=300 * SCALE, deadline=None)
@given(values, st.booleans(), st.booleans())
def test_documents_of_any_shape(value: Any, ascii_only: bool, compact: bool) -> None:
    separators = (",", ":") if compact else (", ", ": ")
    check(json.dumps(value, ensure_ascii=ascii_only, separators=separators).encode())


@settings(max_examples=200 * SCALE, deadline=None)
@given(st.dictionaries(texts, values, max_size=3), texts, scalars, scalars)
def test_duplicate_member_names(document: dict[str, Any], key: str, a: Any, b: Any) -> None:
    check(with_duplicate(document, key, a, b))


@settings(max_examples=300 * SCALE, deadline=None)
@given(values, st.data())
def test_mutated_bytes(value: Any, data: st.DataObject) -> None:
    raw = bytearray(json.dumps(value, ensure_ascii=False).encode())
    for _ in range(data.draw(st.integers(1, 3))):
        if not raw:
            break
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at] = data.draw(st.sampled_from(b'{}[]":,\\0123456789eE.-+ \x80\xff'))
    check(bytes(raw))


def test_known_edges() -> None:
    for data in (
        b'{"a": 1, "a": 1}',
        b'{"a": "x:y", "a": 2}',
        b'{"n": 9007199254740992}',
        b'{"n": 9007199254740991}',
        b'{"n": 1e400}',
        b'{"s": "\\ud800"}',
        b'{"s": "\\u00e9"}',
        b"[" * 300 + b"]" * 300,
        b'{"x": 1.0, "y": 1, "z": true}',
        b"\xff",
        b"",
    ):
        check(data)
