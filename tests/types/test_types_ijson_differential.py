"""Issue 16 item 4: every faster way through a body gives exactly what the reference parser
gives: the same value (types included: `1` is not `1.0`, nor `True`) or the same refusal."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from synapse.transport.inbound import message_fingerprint
from synapse.types.codec import decode_message
from synapse.types.errors import SynapseError
from synapse.types.ijson import _parse_reference as parse_i_json_reference
from synapse.types.ijson import parse_i_json, parse_i_json_noting_floats

MAX = 2**53 - 1

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**60), max_value=2**60),  # some beyond ±(2**53-1)
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    st.sampled_from(["\ud800", "a\udfffb", "é", "\u2028", "\\", '"', "/", "\x00", "9" * 17]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(st.tuples(st.text(max_size=4), inner), max_size=4),  # possibly repeated names
    ),
    max_leaves=25,
)


def render(value: Any, ensure_ascii: bool) -> str:
    """JSON text of `value`; a list of pairs is an object whose names may repeat."""
    if isinstance(value, tuple):
        value = list(value)
    if isinstance(value, list) and value and all(isinstance(x, tuple) for x in value):
        members = (
            f"{json.dumps(k, ensure_ascii=ensure_ascii)}:{render(v, ensure_ascii)}"
            for k, v in value
        )
        return "{" + ",".join(members) + "}"
    if isinstance(value, list):
        return "[" + ",".join(render(v, ensure_ascii) for v in value) + "]"
    return json.dumps(value, ensure_ascii=ensure_ascii)


def outcome(parse: Any, data: bytes) -> tuple[str, Any]:
    try:
        return ("value", parse(data))
    except SynapseError as exc:
        return ("refused", (exc.code, exc.message, exc.details))


def same(a: Any, b: Any) -> bool:
    """Equal, and of the same types all the way down."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def check(data: bytes) -> None:
    fast, reference = outcome(parse_i_json, data), outcome(parse_i_json_reference, data)
    assert fast[0] == reference[0], (data, fast, reference)
    if fast[0] == "value":
        assert same(fast[1], reference[1]), (data, fast, reference)
    else:
        assert fast == reference


@settings(max_examples=300, deadline=None)
@given(values, st.booleans())
@example([("a", 1), ("a", 2)], False)  # a repeated name
@example([("n", MAX + 1)], False)
@example([("n", 1.0), ("m", -0.0), ("k", 1e300)], False)
@example([("s", "\ud800")], True)  # a lone surrogate, escaped
@example([[[[[[[[[[[]]]]]]]]]]], False)
def test_the_fast_path_gives_what_the_reference_gives(value: Any, ensure_ascii: bool) -> None:
    try:
        text = render(value, ensure_ascii)
    except UnicodeEncodeError:
        return
    check(text.encode("utf-8", "surrogatepass"))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=40), st.binary(max_size=40), values)
def test_arbitrary_bytes_around_json_give_what_the_reference_gives(
    head: bytes, tail: bytes, value: Any
) -> None:
    check(head + render(value, True).encode() + tail)
    check(head + tail)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(st.sampled_from(["extra", "x", "version", "id", "payload"]), values, max_size=3)
)
def test_a_whole_message_decodes_as_the_reference_then_the_codec_would(
    extra: dict[str, Any],
) -> None:
    """The receive path (I-JSON pass, then typed decode) refuses or accepts alike either way."""
    message: dict[str, Any] = {
        "version": "1.0",
        "id": "msg-1",
        "type": "p2p:heartbeat",
        "from": {"agent_id": "a", "endpoint": "http://127.0.0.1:1/synapse/callback"},
        "to": {"agent_id": "b"},
        "timestamp": "2026-01-01T00:00:00Z",
        "payload": {"status": "ok", "active_tasks": 0},
    }
    try:
        body = (render(list({**message, **extra}.items()), False)).encode("utf-8", "surrogatepass")
    except (TypeError, UnicodeEncodeError):
        return
    check(body)
    reference = outcome(parse_i_json_reference, body)
    decoded = outcome(decode_message, body)
    if reference[0] == "refused":
        assert decoded == reference


# --- the fingerprint's fast encoder ---------------------------------------------------------


def holds_float(value: Any) -> bool:
    if isinstance(value, float):
        return True
    if isinstance(value, dict):
        return any(holds_float(v) for v in value.values())
    if isinstance(value, list):
        return any(holds_float(v) for v in value)
    return False


@settings(max_examples=300, deadline=None)
@given(values, st.booleans())
@example([("a", 1.0)], False)
@example([("a", [1, {"b": 1e16}])], False)
@example([("a", 1)], False)
@example([("n", 1e400)], False)  # rendered as Infinity: refused, counted or not
def test_noting_floats_tells_exactly_whether_the_value_holds_one(
    value: Any, ensure_ascii: bool
) -> None:
    try:
        data = render(value, ensure_ascii).encode("utf-8", "surrogatepass")
    except UnicodeEncodeError:
        return
    plain = outcome(parse_i_json, data)
    try:
        parsed, floats = parse_i_json_noting_floats(data)
    except SynapseError as exc:
        assert plain == ("refused", (exc.code, exc.message, exc.details))
        return
    assert plain[0] == "value" and same(parsed, plain[1])
    assert floats == holds_float(parsed), (data, parsed)


def test_a_number_beyond_a_double_is_still_refused_on_the_fast_path() -> None:
    for data in (b'{"n":1e400}', b'{"n":-1E999}', b"[1.5e309]"):
        assert outcome(parse_i_json, data)[0] == "refused"
        assert outcome(parse_i_json, data) == outcome(parse_i_json_reference, data)


keys = st.text(max_size=6)
plain_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-MAX, max_value=MAX),
        st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=12),
        st.sampled_from(
            ["é", "\u2028", "\u2029", "\x7f", "\x00", "\x1f", "\\", '"', "/", "\U0001f600"]
        ),
    ),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=4)),
    max_leaves=25,
)


@settings(max_examples=500, deadline=None)
@given(st.dictionaries(keys, plain_values, max_size=6))
@example({"b": 1, "a": {"é": 1, "z": 2, "A": 3, "\uffff": 4, "\U0001f600": 5}})
@example({"id": "x", "timestamp": "t", "signature": "s", "payload": {"text": "a\nb\tc\x01"}})
def test_the_fast_fingerprint_is_the_reference_fingerprint_without_floats(
    value: dict[str, Any],
) -> None:
    """Byte for byte: a dedup record written by another release or another replica must
    still recognise a retry."""
    assert message_fingerprint(value, floats=False) == message_fingerprint(value, floats=True)


def test_a_value_the_fast_encoder_refuses_falls_back_to_the_reference() -> None:
    value = {"id": "x", "text": "lone \ud800 surrogate"}
    assert message_fingerprint(value, floats=False) == message_fingerprint(value)
