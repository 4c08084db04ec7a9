"""Hypothesis against the decoder and the authentication checks, in-process.

`decode_message` either returns a typed message or raises `SynapseError` with a 400 code
(`message_format_invalid` or `invalid_params`) — never another exception, whatever the bytes.
A message it accepts encodes back to bytes it decodes to the same message. `authenticate`
either returns an `Inbound` or raises `Refused` with 400, 403 or 413; a 403, and every refusal
before the signature verified, is never signed.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

from fuzzkit import (
    ALL_TYPES,
    COUNTS,
    POSTABLE,
    SECRET,
    TASK_IDS,
    E,
    R,
    addressed,
    byte_mutated,
    encode,
    example,
    json_values,
    mutated,
)
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from synapse.p2p.config import P2PConfig
from synapse.transport.inbound import Inbound, Refused, authenticate
from synapse.transport.partners import Partner, PartnerRegistry
from synapse.types import (
    ErrorCode,
    Message,
    SynapseError,
    decode_message,
    encode_message,
    header_signature,
    utc_now,
)

#: Multiply every example budget (e.g. SYNAPSE_FUZZ_SCALE=10 for a long run).
SCALE = float(os.environ.get("SYNAPSE_FUZZ_SCALE", "1"))
FAST = settings(
    max_examples=int(1000 * SCALE),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
R_URL = "http://127.0.0.1:9/synapse/callback"
PARTNERS = PartnerRegistry([Partner(R, R_URL, (SECRET,))])
CONFIG = P2PConfig()


def decoded(data: bytes) -> Message | None:
    """The message, or None if refused as specs/protocol.md, 'Error codes' says; anything else fails
    the test."""
    try:
        message = decode_message(data)
    except SynapseError as exc:
        assert exc.code in (ErrorCode.MESSAGE_FORMAT_INVALID, ErrorCode.INVALID_PARAMS), exc
        assert exc.http_status == 400
        _event(f"refused {exc.code.value}")
        return None
    _event("decoded")
    again = decode_message(encode_message(message))
    assert again == message
    return message


def authenticated(data: bytes, header: str | None) -> Inbound | None:
    try:
        return authenticate(
            data, header, partners=PARTNERS, agent_id=E, now=utc_now(), config=CONFIG
        )
    except Refused as refused:
        assert refused.http_status in (400, 403, 413), refused
        if refused.http_status == 403:
            assert refused.sign_with is None
        reason = str((refused.error.details or {}).get("reason", "")).split(" ")[0]
        _event(f"refused {refused.http_status} {reason}")
        return None


def _event(label: str) -> None:
    """Label the example for `--hypothesis-show-statistics` (outside a given test: nothing)."""
    with contextlib.suppress(InvalidArgument):
        event(label)


def texts(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode()


@FAST
@given(st.binary(max_size=600))
def test_random_bytes(data: bytes) -> None:
    COUNTS["decoder: random bytes"] += 1
    assert decoded(data) is None or data.lstrip()[:1] == b"{"


@FAST
@given(json_values)
def test_random_json_values(value: Any) -> None:
    COUNTS["decoder: random JSON values"] += 1
    decoded(texts(value))


@FAST
@given(st.sampled_from(ALL_TYPES).flatmap(lambda name: mutated(example(name))))
def test_mutated_examples(value: dict[str, Any]) -> None:
    COUNTS["decoder: mutated examples"] += 1
    decoded(texts(value))


@FAST
@given(st.sampled_from(ALL_TYPES).flatmap(lambda name: byte_mutated(encode(example(name)))))
def test_byte_mutated_examples(data: bytes) -> None:
    COUNTS["decoder: truncated and byte-mutated examples"] += 1
    decoded(data)


@FAST
@given(
    st.integers(min_value=1, max_value=200_000),
    st.sampled_from(["[", '{"a":', '{"payload":']),
    st.booleans(),
)
def test_deep_nesting(depth: int, opener: str, inside: bool) -> None:
    COUNTS["decoder: deep nesting"] += 1
    closer = "]" if opener == "[" else "}"
    nest = opener * depth + "0" + closer * depth
    if inside:  # as the value of a field of a valid message
        text = (
            encode(example("heartbeat")).decode().replace('"active_tasks":', f'"x":{nest},"a":', 1)
        )
    else:
        text = nest
    message = decoded(text.encode())
    assert message is None or inside


NUMBERS = st.one_of(
    st.integers(min_value=2**53 - 2, max_value=10**40).map(str),
    st.integers(min_value=-(10**40), max_value=-(2**53) + 2).map(str),
    st.integers(min_value=1, max_value=20_000).map(lambda k: "9" * k),
    st.sampled_from(
        ["1e400", "-1e400", "1e-400", "0.0", "-0", "1E+2", "2.5e15", "NaN", "Infinity"]
    ),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
)


@FAST
@given(st.sampled_from(["heartbeat", "task_status_update", "task_request"]), NUMBERS)
def test_huge_numbers(name: str, literal: str) -> None:
    COUNTS["decoder: huge numbers"] += 1
    value = example(name)
    value["payload"]["n"] = "@@"
    text = encode(value).decode().replace('"@@"', literal, 1)
    message = decoded(text.encode())
    digits = literal.lstrip("-")
    if digits.isdigit() and (len(digits) > 16 or int(digits) > 2**53 - 1):
        assert message is None  # I-JSON: integers beyond ±(2**53-1) are refused


@st.composite
def requests(draw: st.DrawFn) -> tuple[bytes, str | None]:
    """Bytes and a signature header: fresh valid messages, mutated ones, garbage; signed
    properly, with a wrong secret, badly, or not at all."""
    name = draw(st.sampled_from(ALL_TYPES))
    value = addressed(name, draw(st.sampled_from(TASK_IDS)), R_URL)
    kind = draw(st.sampled_from(["valid", "mutated", "bytes", "garbage"]))
    if kind == "mutated":
        data = texts(draw(mutated(value)))
    elif kind == "bytes":
        data = draw(byte_mutated(encode(value)))
    elif kind == "garbage":
        data = draw(st.binary(max_size=300))
    else:
        data = encode(value)
    signing = draw(st.sampled_from(["ours", "original", "wrong", "junk", "none"]))
    header: str | None
    if signing == "ours":  # a valid signature over whatever the bytes are
        header = header_signature(SECRET, data)
    elif signing == "original":
        header = header_signature(SECRET, encode(value))
    elif signing == "wrong":
        header = header_signature("not-the-secret", data)
    elif signing == "junk":
        header = draw(st.text(max_size=80))
    else:
        header = None
    return data, header


@FAST
@given(requests())
def test_authenticate(request: tuple[bytes, str | None]) -> None:
    COUNTS["authenticate: signed, mutated and garbage requests"] += 1
    data, header = request
    inbound = authenticated(data, header)
    if inbound is not None:
        _event("authenticated")
        assert inbound.head.from_.agent_id == R and inbound.head.to.agent_id == E
        assert inbound.head.type.value[4:] in POSTABLE
        assert inbound.head.reply_to is None
        assert inbound.signed_by == "header"


def test_every_valid_postable_example_authenticates() -> None:
    for name in POSTABLE:
        data = encode(addressed(name, "t-1", R_URL))
        inbound = authenticated(data, header_signature(SECRET, data))
        assert inbound is not None, name
        assert decoded(data) is not None, name
