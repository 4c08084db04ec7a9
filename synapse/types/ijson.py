"""I-JSON (RFC 7493) parsing: the only JSON specs/protocol.md, 'Signatures' accepts, in either
signing mode.

Refused: invalid UTF-8, duplicate member names, lone surrogates, non-finite numbers and
integers beyond ±(2⁵³−1). The parsed value is what body-mode signatures and deduplication
fingerprints are computed on, so the transport parses once and reuses it.

Every message goes through here, twice per HTTP exchange, so the common case takes a fast
path: a document with no backslash escape, no run of 16 digits and little nesting is decoded
by msgspec in C, and a duplicate member name is caught by counting colons before and after a
re-encoding. Anything else, and anything msgspec refuses, goes through the reference parser
below, which decides (and words the error).
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

import msgspec

from synapse.types.errors import ErrorCode, RemoteProtocolError, SynapseException

MAX_SAFE_INTEGER = 2**53 - 1
#: Deepest nesting of arrays and objects accepted. Deeper documents are refused up front, so
#: that no recursive step after parsing (signature canonicalization, fingerprints, typed
#: decoding, encoding for the store) can ever run out of stack: a client error, never a
#: `RecursionError`.
MAX_DEPTH = 128
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


class _Violation(SynapseException, ValueError):
    pass


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _Violation(f"duplicate member name {key!r}")
            seen.add(key)
    return obj


def _int(text: str) -> int:
    # Judge the length first: Python refuses to convert very long digit strings at all, and
    # that ValueError would pass for "not JSON" instead of "not I-JSON".
    digits = len(text) - text.startswith("-")
    if digits > len(str(MAX_SAFE_INTEGER)):
        raise _Violation(f"integer {text[:40]} is beyond ±(2**53-1)")
    value = int(text)
    if not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
        raise _Violation(f"integer {text[:40]} is beyond ±(2**53-1)")
    return value


#: Counts every float either parser builds: a document holds a fraction or an exponent when
#: the count moved while it was parsed (`next` on a count is one atomic step, so a parse in
#: another thread can only make a document look like it holds floats, never the reverse).
_floats_built = itertools.count()


def _float(text: str) -> float:
    next(_floats_built)
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise _Violation(f"number {text[:40]} is not finite")
    return value


def _constant(text: str) -> Any:
    raise _Violation(f"{text} is not a JSON number")


def _refuse(reason: str) -> RemoteProtocolError:
    return RemoteProtocolError(
        ErrorCode.MESSAGE_FORMAT_INVALID, f"body is not I-JSON: {reason}", {"reason": reason}
    )


#: Digits become "0" and "[" a "{": one translation lets plain substring searches find a long
#: digit run and count the containers.
_SCREEN = bytes.maketrans(b"123456789[", b"000000000{")
#: 16 digits in a row: possibly an integer beyond ±(2**53-1) (15 digits never are).
_LONG_DIGITS = b"0" * 16
#: More containers than this: left to the reference parser, which owns the depth limit
#: (so at most `MAX_DEPTH` containers: the fast path never needs to measure the depth).
_MAX_CONTAINERS = MAX_DEPTH
_BACKSLASH, _COLON, _BRACE = ord("\\"), ord(":"), ord("{")
#: `_float` refuses what msgspec itself refuses ("Number out of range") with a `_Violation`,
#: which sends the document to the reference parser, as msgspec's refusal did.
_any_decoder = msgspec.json.Decoder(float_hook=_float)
_encoder = msgspec.json.Encoder()
_NOT_PLAIN: Any = object()


def _parse_plain(data: bytes) -> Any:
    """The value of `data` when it is plainly I-JSON, else `_NOT_PLAIN` (then the reference
    parser decides). When it returns a value, it is exactly the reference parser's."""
    if _BACKSLASH in data:  # an escape: maybe a lone surrogate, and strings may not round-trip
        return _NOT_PLAIN
    screened = data.translate(_SCREEN)
    if _LONG_DIGITS in screened or screened.count(_BRACE) > _MAX_CONTAINERS:
        return _NOT_PLAIN
    if not data.isascii():
        try:
            data.decode("utf-8")  # the reference's own notion of valid UTF-8
        except UnicodeDecodeError:
            return _NOT_PLAIN
    try:
        value = _any_decoder.decode(data)
    except (msgspec.DecodeError, _Violation):
        return _NOT_PLAIN
    # Without escapes every string re-encodes to the same bytes and numbers hold no colon, so
    # re-encoding keeps every colon but those of a repeated member name (and of its value),
    # of which msgspec kept only the last.
    if data.count(_COLON) != _encoder.encode(value).count(_COLON):
        return _NOT_PLAIN
    return value


def parse_i_json(data: bytes) -> Any:
    """Parse `data` as I-JSON and return the value; raise `RemoteProtocolError` (400) otherwise."""
    value = _parse_plain(data)
    if value is not _NOT_PLAIN:
        return value
    return _parse_reference(data)


def parse_i_json_noting_floats(data: bytes) -> tuple[Any, bool]:
    """`parse_i_json`, and whether the value holds a float (a number written with a fraction
    or an exponent): the encoders that fingerprint a value agree byte for byte on every
    value without one (`synapse.transport.inbound.message_fingerprint`)."""
    before = next(_floats_built)
    value = parse_i_json(data)
    return value, next(_floats_built) - before > 1


def _parse_reference(data: bytes) -> Any:
    """The reference parser (the stdlib's, with I-JSON's checks): decides every document."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise _refuse("invalid UTF-8") from None
    try:
        value = json.loads(
            text,
            object_pairs_hook=_pairs,
            parse_int=_int,
            parse_float=_float,
            parse_constant=_constant,
        )
    except _Violation as exc:
        raise _refuse(str(exc)) from None
    except RecursionError:
        raise _refuse("nested too deeply") from None
    except ValueError as exc:
        raise RemoteProtocolError(
            ErrorCode.MESSAGE_FORMAT_INVALID, f"body is not JSON: {exc}", {"reason": "not JSON"}
        ) from None
    if _deeper_than(value, MAX_DEPTH):
        raise _refuse("nested too deeply")
    # The stdlib parser lets lone surrogate escapes through; msgspec refuses them.
    if _SURROGATE_ESCAPE.search(text):
        try:
            msgspec.json.decode(data)
        except msgspec.DecodeError:
            raise _refuse("lone surrogate in a string") from None
    return value


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether arrays and objects nest more than `limit` deep in `value` (no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)] if isinstance(value, dict | list) else []
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return False
