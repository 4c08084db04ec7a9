"""A body is decoded once before authentication (`decode_envelope`): the head it gives, the
message and every refusal, in its order, are those of decoding the head and then, after
authentication, the message (`decode_head`, then `decode_typed`), body for body."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from fuzzkit import ALL_TYPES, byte_mutated, encode, example, json_values, mutated
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from synapse.types import RemoteProtocolError, decode_head
from synapse.types.codec import EnvelopeHead, decode_envelope, decode_typed
from synapse.types.messages import Message

SCALE = float(os.environ.get("SYNAPSE_FUZZ_SCALE", "1"))
FAST = settings(
    max_examples=int(500 * SCALE),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
EXAMPLES = Path(__file__).resolve().parents[2] / "specs" / "examples"


def _fields(head: EnvelopeHead | Message) -> tuple[Any, ...]:
    """What the checks before authentication read of a head."""
    return (head.version, head.id, head.type, head.from_, head.to, head.timestamp, head.reply_to)


def _refusal(stage: str, exc: RemoteProtocolError) -> tuple[Any, ...]:
    return (stage, exc.code, exc.message, exc.details, exc.http_status)


def apart(data: bytes) -> tuple[Any, ...]:
    """The head, then (after authentication) the message, as two decodes."""
    try:
        head = decode_head(data)
    except RemoteProtocolError as exc:
        return _refusal("envelope", exc)
    try:
        message = decode_typed(data)
    except RemoteProtocolError as exc:
        return (*_refusal("payload", exc), _fields(head))
    return ("decoded", _fields(head), message)


def once(data: bytes) -> tuple[Any, ...]:
    """The same through `decode_envelope`, decoding the message again only if it gave none."""
    try:
        head, message = decode_envelope(data)
    except RemoteProtocolError as exc:
        return _refusal("envelope", exc)
    if message is None:
        try:
            message = decode_typed(data)
        except RemoteProtocolError as exc:
            return (*_refusal("payload", exc), _fields(head))
    else:
        assert head is message
    return ("decoded", _fields(head), message)


def test_every_example_is_decoded_once_as_it_was_twice() -> None:
    for path in sorted(EXAMPLES.glob("*.json")):
        data = path.read_bytes()
        assert once(data) == apart(data)
        assert decode_envelope(data)[1] is not None  # decoded once: no second decode


def test_another_version_is_judged_as_it_was() -> None:
    for name in ALL_TYPES:
        for version in ("1.0", "1.7", "2.0", "0.9", "10.1", "1", "1.0.0"):
            data = encode({**example(name), "version": version})
            assert once(data) == apart(data), (name, version)


@FAST
@given(st.sampled_from(ALL_TYPES).flatmap(lambda name: mutated(example(name))))
def test_mutated_examples(value: dict[str, Any]) -> None:
    data = encode(value)
    assert once(data) == apart(data)


@FAST
@given(st.sampled_from(ALL_TYPES).flatmap(lambda name: byte_mutated(encode(example(name)))))
def test_byte_mutated_examples(data: bytes) -> None:
    assert once(data) == apart(data)


@FAST
@given(
    st.sampled_from(ALL_TYPES),
    st.sampled_from(["version", "id", "type", "from", "to", "timestamp", "reply_to"]),
    json_values,
)
def test_an_envelope_field_of_any_value(name: str, field: str, replacement: Any) -> None:
    value = example(name)
    value[field] = replacement
    data = encode(value)
    assert once(data) == apart(data)
