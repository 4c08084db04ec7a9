"""HMAC-SHA256 signing primitives of specs/protocol.md, 'Signatures' (pure functions, no I/O).

Header mode signs the raw HTTP body; body mode signs the RFC 8785 (JCS) canonical form of the
envelope as received, without its `signature` member. Several secrets may be valid for one
partner (rotation): sign with the newest, accept any. Every comparison is constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import rfc8785

SIGNATURE_HEADER = "X-Synapse-Signature"
SIGNATURE_PREFIX = "sha256="
#: More candidate signatures than this in one header are ignored (bounds the work per request).
MAX_HEADER_SIGNATURES = 8

Secret = str | bytes
#: The secrets shared with one partner, newest first: a tuple or a list of them, never one
#: string (a `str` is a sequence too: it would be taken for one secret a character).
Secrets = tuple[Secret, ...] | list[str] | list[bytes] | list[Secret]


def secrets_of(value: Iterable[Secret], owner: str = "a partner") -> tuple[Secret, ...]:
    """`value` as a tuple of secrets; `TypeError` for a lone `str` or `bytes` (the message
    never holds the secret itself)."""
    if isinstance(value, str | bytes | bytearray):
        raise TypeError(
            f"the secrets of {owner} are a collection of secrets, newest first, not one "
            f"{type(value).__name__}: give (secret,) for a single one"
        )
    return tuple(value)


def secret_bytes(secret: Secret) -> bytes:
    return secret.encode("utf-8") if isinstance(secret, str) else secret


_BLOCK = 64  # SHA-256's block size, in bytes
_INNER_PAD = bytes(x ^ 0x36 for x in range(256))
_OUTER_PAD = bytes(x ^ 0x5C for x in range(256))


#: SHA-256 states keyed per secret (`_keyed`), by the secret as configured (`str` or
#: `bytes`): a partner has one or two; past this many the table starts again.
_KEYED_MAX = 256
_keyed_states: dict[Secret, tuple[Any, Any]] = {}


def _keyed(secret: Secret) -> tuple[Any, Any]:
    """SHA-256 states that have absorbed the key XOR ipad and the key XOR opad (RFC 2104).

    Every message is signed or verified under one of a few configured secrets, six times an
    echo task: copying these two states costs less than half of `hmac.new`, which sets the
    key up again each time (OpenSSL 3 fetches and keys a new context per call)."""
    key = secret_bytes(secret)
    if len(key) > _BLOCK:
        key = hashlib.sha256(key).digest()
    key = key.ljust(_BLOCK, b"\0")
    states = (
        hashlib.sha256(key.translate(_INNER_PAD)),
        hashlib.sha256(key.translate(_OUTER_PAD)),
    )
    if len(_keyed_states) >= _KEYED_MAX:
        _keyed_states.clear()
    _keyed_states[secret] = states
    return states


def hmac_signature(secret: Secret, data: bytes) -> str:
    """`sha256=<lowercase hex HMAC-SHA256 of data>`."""
    inner_state, outer_state = _keyed_states.get(secret) or _keyed(secret)
    inner = inner_state.copy()
    inner.update(data)
    outer = outer_state.copy()
    outer.update(inner.digest())
    digest: str = outer.hexdigest()
    return SIGNATURE_PREFIX + digest


def _matches(candidates: Sequence[str], secrets: Secrets, data: bytes) -> bool:
    if isinstance(secrets, str | bytes):
        secrets_of(secrets, "the verifier")  # raises: one string is not a list of secrets
    if len(secrets) == 1 and len(candidates) == 1:  # the usual case, with no loop to run
        given = candidates[0].encode("utf-8", "backslashreplace")
        return hmac.compare_digest(given, hmac_signature(secrets[0], data).encode("ascii"))
    expected = [hmac_signature(s, data).encode("ascii") for s in secrets]
    found = False
    for candidate in candidates:
        # A header may hold any text; what cannot be encoded cannot match a hex digest either.
        given = candidate.encode("utf-8", "backslashreplace")
        for want in expected:
            # No early exit: the time taken does not tell which candidate matched.
            found |= hmac.compare_digest(given, want)
    return found


# --- header mode ----------------------------------------------------------------------------


def header_signature(secret: Secret, body: bytes) -> str:
    """The `X-Synapse-Signature` value for `body`."""
    return hmac_signature(secret, body)


def verify_header_signature(secrets: Secrets, body: bytes, header: str) -> bool:
    """True if one of the space-separated signatures in `header` matches one secret."""
    candidates = header.split(" ")[:MAX_HEADER_SIGNATURES]
    return _matches(candidates, secrets, body)


# --- body mode ------------------------------------------------------------------------------


def canonical_form(envelope: Mapping[str, Any]) -> bytes:
    """RFC 8785 canonical bytes of `envelope` without its `signature` member."""
    unsigned = {k: v for k, v in envelope.items() if k != "signature"}
    canonical: bytes = rfc8785.dumps(unsigned)
    return canonical


def body_signature(secret: Secret, envelope: Mapping[str, Any]) -> str:
    """The `signature` member value for `envelope` (a parsed JSON object)."""
    return hmac_signature(secret, canonical_form(envelope))


def verify_body_signature(secrets: Secrets, envelope: Mapping[str, Any]) -> bool:
    """True if `envelope["signature"]` matches the canonical form under one secret."""
    signature = envelope.get("signature")
    if not isinstance(signature, str):
        return False
    return _matches([signature], secrets, canonical_form(envelope))
