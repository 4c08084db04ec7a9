"""HMAC-SHA256 signatures in header and body mode (specs/protocol.md, 'Signatures')."""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from synapse.types import (
    SIGNATURE_HEADER,
    body_signature,
    canonical_form,
    header_signature,
    parse_i_json,
    verify_body_signature,
    verify_header_signature,
)
from synapse.types.signing import MAX_HEADER_SIGNATURES, hmac_signature

BODY = (
    '{"version":"1.0","id":"msg-1","type":"p2p:task_status_update",'
    '"from":{"agent_id":"agent-bob","endpoint":"https://bob.example.com/synapse/callback"},'
    '"to":{"agent_id":"agent-alice"},"timestamp":"2026-01-01T00:01:00Z",'
    '"payload":{"task_id":"task-1","status":"executing","progress":50,"message":"正在生成内容"}}'
).encode()
NEW, OLD = "secret-2026", "secret-2025"


def test_header_name() -> None:
    assert SIGNATURE_HEADER == "X-Synapse-Signature"


def test_header_signature_is_sha256_hex_of_the_exact_body() -> None:
    signature = header_signature(NEW, BODY)
    assert re.fullmatch(r"sha256=[0-9a-f]{64}", signature)
    assert signature == "sha256=" + hmac.new(NEW.encode(), BODY, hashlib.sha256).hexdigest()
    assert header_signature(NEW.encode(), BODY) == signature
    assert verify_header_signature([NEW], BODY, signature)


def test_several_signatures_in_one_header_one_match_is_enough() -> None:
    good = header_signature(NEW, BODY)
    other = header_signature("someone-else", BODY)
    assert verify_header_signature([NEW], BODY, f"{other} {good}")
    assert verify_header_signature([NEW], BODY, f"{good} {other}")
    assert verify_header_signature([NEW], BODY, f"sha256=junk {other} {good}")
    assert not verify_header_signature([NEW], BODY, f"{other} sha256=junk")


def test_only_the_first_signatures_of_a_header_are_tried() -> None:
    junk = " ".join(["sha256=" + "0" * 64] * MAX_HEADER_SIGNATURES)
    good = header_signature(NEW, BODY)
    assert not verify_header_signature([NEW], BODY, f"{junk} {good}")


def test_rotation_any_held_secret_verifies() -> None:
    held = [NEW, OLD]
    assert verify_header_signature(held, BODY, header_signature(NEW, BODY))
    assert verify_header_signature(held, BODY, header_signature(OLD, BODY))
    assert not verify_header_signature(held, BODY, header_signature("retired-2024", BODY))
    assert not verify_header_signature([], BODY, header_signature(NEW, BODY))
    # A sender mid-rotation may send both; a receiver holding only the old secret accepts.
    both = f"{header_signature(NEW, BODY)} {header_signature(OLD, BODY)}"
    assert verify_header_signature([OLD], BODY, both)


@pytest.mark.parametrize(
    "header",
    ["", " ", "sha256=", "sha256", "md5=abc", "sha256=\ud800", "sha256=é" * 3, "SHA256=00"],
)
def test_garbage_headers_fail_without_raising(header: str) -> None:
    assert not verify_header_signature([NEW], BODY, header)


def test_uppercase_prefix_or_hex_is_not_the_contracts_form() -> None:
    signature = header_signature(NEW, BODY)
    assert not verify_header_signature([NEW], BODY, signature.upper())


@settings(max_examples=100, deadline=None)
@given(position=st.integers(0, len(BODY) - 1), flip=st.integers(1, 255))
def test_a_one_byte_change_to_the_body_fails(position: int, flip: int) -> None:
    signature = header_signature(NEW, BODY)
    tampered = bytearray(BODY)
    tampered[position] ^= flip
    assert not verify_header_signature([NEW], bytes(tampered), signature)


@pytest.mark.parametrize("position", range(len("sha256="), len("sha256=") + 64, 7))
def test_a_one_character_change_to_the_signature_fails(position: int) -> None:
    signature = header_signature(NEW, BODY)
    digit = "1" if signature[position] != "1" else "2"
    tampered = signature[:position] + digit + signature[position + 1 :]
    assert not verify_header_signature([NEW], BODY, tampered)
    assert not verify_header_signature([NEW], BODY, signature[:-1])
    assert not verify_header_signature([NEW], BODY, signature + "0")


# --- body mode -------------------------------------------------------------------------------


def test_canonical_form_is_jcs_without_the_signature() -> None:
    envelope = parse_i_json(
        b'{"z": 1.0, "a": [2.5e-7, 1e21, -0.0, 100], "\xc3\xa9": "\\u00e9\\n",'
        b' "signature": "sha256=ignored", "x_unknown": {"b": true, "a": null}}'
    )
    assert (
        canonical_form(envelope)
        == ('{"a":[2.5e-7,1e+21,0,100],"x_unknown":{"a":null,"b":true},"z":1,"é":"é\\n"}').encode()
    )
    assert "signature" in envelope  # the caller's value is left untouched


def test_canonical_form_sorts_by_utf16_code_units() -> None:
    # U+1F600 is a surrogate pair (D83D DE00) and so sorts before U+FF5A, unlike by code point.
    envelope = {"\uff5a": 1, "\U0001f600": 2, "a": 3}
    assert canonical_form(envelope) == '{"a":3,"😀":2,"ｚ":1}'.encode()


def test_body_signature_covers_the_canonical_form_unknown_members_included() -> None:
    envelope = parse_i_json(BODY)
    envelope["x_trace"] = {"hops": 2}
    signature = body_signature(NEW, envelope)
    assert (
        signature
        == "sha256=" + hmac.new(NEW.encode(), canonical_form(envelope), hashlib.sha256).hexdigest()
    )
    signed = {**envelope, "signature": signature}
    assert verify_body_signature([NEW], signed)
    assert verify_body_signature([OLD, NEW], signed)
    assert not verify_body_signature([OLD], signed)
    # Unknown members are covered: changing or dropping one breaks the signature.
    assert not verify_body_signature([NEW], {**signed, "x_trace": {"hops": 3}})
    assert not verify_body_signature([NEW], {k: v for k, v in signed.items() if k != "x_trace"})
    assert not verify_body_signature([NEW], {**signed, "x_new": None})


def test_body_signature_does_not_depend_on_the_text_form() -> None:
    compact = b'{"b":1,"a":"\xe5\x86\x99","f":1.0}'
    spaced = b'{\n  "a": "\\u5199",\n  "f": 1,\n  "b": 1.0\n}'
    left, right = parse_i_json(compact), parse_i_json(spaced)
    assert body_signature(NEW, left) == body_signature(NEW, right)
    assert header_signature(NEW, compact) != header_signature(NEW, spaced)


def test_body_signature_tampering_fails() -> None:
    envelope = parse_i_json(BODY)
    signed = {**envelope, "signature": body_signature(NEW, envelope)}
    payload = {**signed["payload"], "progress": 51}
    assert not verify_body_signature([NEW], {**signed, "payload": payload})
    sig = signed["signature"]
    flipped = sig[:-1] + ("0" if sig[-1] != "0" else "1")
    assert not verify_body_signature([NEW], {**signed, "signature": flipped})
    assert not verify_body_signature([NEW], envelope)  # no signature member
    assert not verify_body_signature([NEW], {**envelope, "signature": 7})
    assert not verify_body_signature([NEW], {**envelope, "signature": None})


# --- constant time ---------------------------------------------------------------------------


@pytest.fixture
def compare_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[bytes, bytes]]:
    calls: list[tuple[bytes, bytes]] = []
    real: Callable[[Any, Any], bool] = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    return calls


def test_header_comparison_is_constant_time_and_does_not_stop_early(
    compare_calls: list[tuple[bytes, bytes]],
) -> None:
    good = header_signature(NEW, BODY)
    assert verify_header_signature([NEW, OLD, "third"], BODY, f"{good} sha256=00")
    # Every candidate against every secret, even after the first match.
    assert len(compare_calls) == 2 * 3
    assert all(isinstance(a, bytes) and isinstance(b, bytes) for a, b in compare_calls)


def test_body_comparison_is_constant_time(compare_calls: list[tuple[bytes, bytes]]) -> None:
    envelope = parse_i_json(BODY)
    signed = {**envelope, "signature": body_signature(OLD, envelope)}
    assert verify_body_signature([NEW, OLD], signed)
    assert len(compare_calls) == 2


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=200), st.text(max_size=80)), st.binary(max_size=600))
def test_the_precomputed_key_states_give_rfc_2104_hmac(secret: str | bytes, data: bytes) -> None:
    """Keys shorter than, equal to and longer than SHA-256's 64-byte block, str or bytes, and
    the same key again (its states come from the cache the second time)."""
    key = secret.encode() if isinstance(secret, str) else secret
    want = "sha256=" + hmac.new(key, data, hashlib.sha256).hexdigest()
    assert hmac_signature(secret, data) == want
    assert hmac_signature(secret, data) == want


def test_a_signature_does_not_leak_state_into_the_next() -> None:
    first = hmac_signature("k", b"one")
    hmac_signature("k", b"two" * 100)
    assert hmac_signature("k", b"one") == first
    assert (
        hmac_signature("k" * 64, b"x")
        == "sha256=" + hmac.new(b"k" * 64, b"x", "sha256").hexdigest()
    )
    assert (
        hmac_signature("k" * 65, b"x")
        == "sha256=" + hmac.new(b"k" * 65, b"x", "sha256").hexdigest()
    )


def test_many_secrets_sign_as_hmac_does_and_the_keyed_table_stays_bounded() -> None:
    """The keyed SHA-256 states are kept per secret as configured (`str` and `bytes` apart,
    long keys hashed first): each signature is still HMAC-SHA256's, past the table's size."""
    from synapse.types import signing

    secrets: list[str | bytes] = [f"secret-{n}" for n in range(signing._KEYED_MAX + 44)]
    secrets += [b"bytes-secret", "k" * 200, b"\xff" * 64, ""]
    for secret in secrets * 2:
        key = secret.encode() if isinstance(secret, str) else secret
        want = "sha256=" + hmac.new(key, BODY, hashlib.sha256).hexdigest()
        assert hmac_signature(secret, BODY) == want
        assert len(signing._keyed_states) <= signing._KEYED_MAX
    assert verify_header_signature(["k" * 200], BODY, hmac_signature("k" * 200, BODY))
    assert not verify_header_signature(["k" * 199], BODY, hmac_signature("k" * 200, BODY))
