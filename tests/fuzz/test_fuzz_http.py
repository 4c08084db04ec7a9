"""Hypothesis against the live HTTP endpoint of a running peer.

Random bytes, random JSON, truncated and byte-mutated signed messages, structurally mutated
messages (re-signed, so they pass the signature and reach the deeper checks), huge numbers,
deep nesting, wrong types, valid signatures over garbage, odd headers. Every answer must be an
envelope: 200 with a signed reply for a message the peer accepts, else a `nack` with a 4xx
status matching its code — never a 5xx — and a refused message must change nothing: the
peer's tasks, their states and histories are compared before and after each refusal.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from fuzzkit import (
    ALL_TYPES,
    COUNTS,
    POSTABLE,
    SECRET,
    TASK_IDS,
    Answer,
    LivePeer,
    byte_mutated,
    check_answer,
    encode,
    json_values,
    mutated,
    sign,
)
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from synapse.types import SIGNATURE_HEADER, header_signature

pytestmark = pytest.mark.slow

SCALE = float(os.environ.get("SYNAPSE_FUZZ_SCALE", "1"))
HTTP = settings(
    max_examples=int(400 * SCALE),
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
MIB = 1024 * 1024


def judged(
    live: LivePeer,
    name: str,
    body: bytes,
    headers: dict[str, str] | None,
    *,
    sent_id: Any = None,
) -> Answer:
    """POST, check the answer, and check that a refusal changed nothing."""
    COUNTS[f"live HTTP: {name}"] += 1
    before = live.snapshot()
    answer = live.post(body, headers)
    value = check_answer(answer, sent_id=sent_id if isinstance(sent_id, str) else None)
    if answer.status == 200:
        event(f"200 {value['type']}")
    else:
        reason = str((value["payload"].get("details") or {}).get("reason", "")).split(" ")[0]
        event(f"{answer.status} {value['payload']['code']} {reason}")
        after = live.snapshot()
        assert after == before, (answer, body[:300])
    return answer


def template(
    live: LivePeer, data: st.DataObject, names: tuple[str, ...] = POSTABLE
) -> dict[str, Any]:
    return live.template(data.draw(st.sampled_from(names)), data.draw(st.sampled_from(TASK_IDS)))


@HTTP
@given(data=st.binary(max_size=800), signed=st.booleans())
def test_random_bytes(live: LivePeer, data: bytes, signed: bool) -> None:
    answer = judged(live, "random bytes", data, sign(data) if signed else None)
    assert answer.status != 200


@HTTP
@given(value=json_values, signed=st.booleans())
def test_random_json(live: LivePeer, value: Any, signed: bool) -> None:
    body = encode(value)
    answer = judged(live, "random JSON values", body, sign(body) if signed else None)
    assert answer.status != 200


@HTTP
@given(data=st.data())
def test_truncated_signed_messages(live: LivePeer, data: st.DataObject) -> None:
    body = encode(template(live, data))
    cut = data.draw(st.integers(0, len(body) - 1))
    resign = data.draw(st.booleans())  # a valid signature over the stub, or the original's
    headers = sign(body[:cut]) if resign else sign(body)
    answer = judged(live, "truncated signed messages", body[:cut], headers)
    assert answer.status != 200


@HTTP
@given(data=st.data())
def test_byte_mutated_signed_messages(live: LivePeer, data: st.DataObject) -> None:
    value = template(live, data)
    body = data.draw(byte_mutated(encode(value)))
    headers = sign(body) if data.draw(st.booleans()) else sign(encode(value))
    judged(live, "byte-mutated signed messages", body, headers)


@HTTP
@given(data=st.data())
def test_mutated_messages_signed_again(live: LivePeer, data: st.DataObject) -> None:
    value = template(live, data, tuple(ALL_TYPES))
    if data.draw(st.booleans()):  # the payload only: more reach the engine's checks
        value["payload"] = data.draw(mutated(value["payload"]))
    else:
        value = data.draw(mutated(value))
    body = encode(value)
    judged(live, "mutated messages, signed again", body, sign(body), sent_id=value.get("id"))


@HTTP
@given(data=st.data())
def test_wrong_types_everywhere(live: LivePeer, data: st.DataObject) -> None:
    value = template(live, data)
    wrong: Any = data.draw(
        st.sampled_from([None, True, 0, -1, 2**53, 1.5, "", "x", [], {}, [1, 2], {"a": {}}])
    )
    field_path = data.draw(st.sampled_from(_leaf_paths(value)))
    parent = value
    for step in field_path[:-1]:
        parent = parent[step]
    parent[field_path[-1]] = wrong
    body = encode(value)
    judged(live, "wrong types", body, sign(body), sent_id=value.get("id"))


NUMBERS = st.one_of(
    st.integers(min_value=2**53, max_value=10**30).map(str),
    st.integers(min_value=-(10**30), max_value=-(2**53)).map(str),
    st.integers(min_value=17, max_value=10_000).map(lambda k: "9" * k),
    st.sampled_from(["1e400", "-1e400", "1e-400", "-0", "1E+2", "NaN", "Infinity", "-Infinity"]),
)


@HTTP
@given(data=st.data(), literal=NUMBERS)
def test_huge_numbers(live: LivePeer, data: st.DataObject, literal: str) -> None:
    value = template(live, data)
    path = data.draw(st.sampled_from(_leaf_paths(value)))
    parent = value
    for step in path[:-1]:
        parent = parent[step]
    parent[path[-1]] = "@@number@@"
    body = encode(value).replace(b'"@@number@@"', literal.encode(), 1)
    judged(live, "huge numbers", body, sign(body), sent_id=value["id"])


@HTTP
@given(data=st.data(), depth=st.integers(1, 100_000), opener=st.sampled_from([b"[", b'{"a":']))
def test_deep_nesting(live: LivePeer, data: st.DataObject, depth: int, opener: bytes) -> None:
    value = template(live, data)
    closer = b"]" if opener == b"[" else b"}"
    nest = opener * depth + b"1" + closer * depth
    value["payload"]["deep"] = "@@nest@@"
    body = encode(value).replace(b'"@@nest@@"', nest, 1)
    judged(live, "deep nesting", body, sign(body), sent_id=value["id"])


@HTTP
@given(garbage=st.binary(min_size=0, max_size=2000))
def test_valid_signatures_over_garbage(live: LivePeer, garbage: bytes) -> None:
    headers = {
        "Content-Type": "application/json",
        SIGNATURE_HEADER: header_signature(SECRET, garbage),
    }
    answer = judged(live, "valid signatures over garbage", garbage, headers)
    assert answer.status == 400


@HTTP
@given(data=st.data())
def test_odd_headers(live: LivePeer, data: st.DataObject) -> None:
    value = template(live, data)
    body = encode(value)
    headers = sign(body)
    header_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=60)
    for name in ("Content-Type", "Content-Encoding", SIGNATURE_HEADER):
        if data.draw(st.booleans()):
            headers[name] = data.draw(header_text)
    judged(live, "odd headers", body, headers, sent_id=value["id"])


@settings(HTTP, max_examples=max(3, int(10 * SCALE)))
@given(extra=st.integers(1, 4096))
def test_bodies_over_the_limit(live: LivePeer, extra: int) -> None:
    body = b"x" * (MIB + extra)
    answer = judged(live, "bodies over 1 MiB", body, sign(body))
    assert answer.status == 413


def test_the_seeded_tasks_are_there(live: LivePeer) -> None:
    states = {key.split("/", 1)[1]: state for key, state, _ in live.snapshot()}
    assert states["fz-cancelled"] == "cancelled"
    assert {"fz-exec", "fz-info"} <= set(states)


def _leaf_paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found: list[tuple[Any, ...]] = []
    if isinstance(value, dict):
        for key, child in value.items():
            found += _leaf_paths(child, (*prefix, key)) or [(*prefix, key)]
    elif isinstance(value, list) and value:
        for index, child in enumerate(value):
            found += _leaf_paths(child, (*prefix, index)) or [(*prefix, index)]
    else:
        return [prefix] if prefix else []
    return found
