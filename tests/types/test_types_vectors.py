"""specs/signature-vectors.json recomputes and verifies with our signing functions."""

from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path
from typing import Any

import pytest

from synapse.types import (
    canonical_form,
    decode_message,
    header_signature,
    parse_i_json,
    verify_body_signature,
    verify_header_signature,
)
from synapse.types import vectors as vectors_module
from synapse.types.signing import body_signature

SPECS = Path(__file__).resolve().parents[2] / "specs"
VECTORS = SPECS / "signature-vectors.json"


def _cases() -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = json.loads(VECTORS.read_bytes())
    return cases


def test_checked_in_vectors_are_current(tmp_path: Path) -> None:
    assert vectors_module.main(["--check", "--out", str(VECTORS)]) == 0
    stale = tmp_path / "vectors.json"
    stale.write_text("[]\n")
    assert vectors_module.main(["--check", "--out", str(stale)]) == 1


def test_vectors_cover_what_implementations_get_wrong() -> None:
    cases = {c["name"]: c for c in _cases()}
    bodies = "".join(c["body"] for c in cases.values())
    assert "写一首诗" in bodies and "\\u5199" in bodies  # raw and escaped non-ASCII
    assert "1.0" in cases["floats"]["body"] and "2.5e-7" in cases["floats"]["body"]
    assert "x_trace" in cases["unknown_members"]["canonical"]
    assert any(len(c.get("secrets", [])) > 1 for c in cases.values())
    assert any(" " in c["header_signature"] for c in cases.values())
    for case in cases.values():
        assert set(case) >= {"name", "secret", "body", "header_signature", "envelope"}
        assert "body_signature" in case


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c["name"])
def test_vector_recomputes_and_verifies(case: dict[str, Any]) -> None:
    secret: str = case["secret"]
    held: list[str] = case.get("secrets", [secret])
    body = case["body"].encode("utf-8")
    envelope = parse_i_json(body)
    assert envelope == case["envelope"]
    decode_message(body)  # every vector is a valid message
    # Header mode: over the exact body bytes.
    ours = header_signature(secret, body)
    assert ours == "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    assert ours in case["header_signature"].split(" ")
    assert verify_header_signature(held, body, case["header_signature"])
    # Body mode: over JCS of the envelope without `signature`.
    assert canonical_form(envelope) == case["canonical"].encode("utf-8")
    assert body_signature(secret, envelope) == case["body_signature"] == envelope["signature"]
    assert verify_body_signature(held, envelope)
    assert verify_body_signature(held, case["envelope"])


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c["name"])
def test_vector_tampering_fails(case: dict[str, Any]) -> None:
    held: list[str] = case.get("secrets", [case["secret"]])
    body = case["body"].encode("utf-8")
    header = case["header_signature"]
    envelope = case["envelope"]
    for position in range(0, len(body), max(1, len(body) // 40)):
        tampered = bytearray(body)
        tampered[position] ^= 0x01
        assert not verify_header_signature(held, bytes(tampered), header)
    for sig in header.split(" "):
        last = sig[-1]
        assert not verify_header_signature(held, body, sig[:-1] + ("0" if last != "0" else "1"))
    assert not verify_header_signature(["not-the-secret"], body, header)
    signature = envelope["signature"]
    flipped = signature[:-1] + ("0" if signature[-1] != "0" else "1")
    assert not verify_body_signature(held, {**envelope, "signature": flipped})
    assert not verify_body_signature(held, {**envelope, "id": envelope["id"] + "x"})
    assert not verify_body_signature(held, {**envelope, "x_added": 1})
    assert not verify_body_signature(["not-the-secret"], envelope)
