"""Bytes ⇄ typed messages, and one-call builders.

`decode_message` goes from bytes to the typed envelope with its typed payload in one msgspec
pass (the tag `type` picks the payload struct). Errors name the JSON path of the bad field and
map to `message_format_invalid` (the envelope) or `invalid_params` (the payload).

The transport needs the checks in the order of specs/protocol.md, 'Order of checks' (the envelope is
judged before the sender
is authenticated, the payload after), so `decode_head` decodes the envelope alone, leaving the
payload as raw bytes.
"""

from __future__ import annotations

import os
import re
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

import msgspec

from synapse.types.enums import MessageType
from synapse.types.errors import ErrorCode, RemoteProtocolError
from synapse.types.ijson import parse_i_json
from synapse.types.messages import (
    PROTOCOL_VERSION,
    SUPPORTED_MAJOR,
    Envelope,
    Message,
    MessageId,
    Recipient,
    Sender,
    Version,
)
from synapse.types.payloads import Timestamp


class EnvelopeHead(msgspec.Struct, frozen=True, kw_only=True):
    """The envelope with its payload left undecoded (specs/protocol.md, 'Order of checks')."""

    version: Version
    id: MessageId
    type: MessageType
    from_: Sender = msgspec.field(name="from")
    to: Recipient
    timestamp: Timestamp
    reply_to: MessageId | None = None
    payload: msgspec.Raw
    signature: str | None = None


_message_decoder = msgspec.json.Decoder(Message)
_head_decoder = msgspec.json.Decoder(EnvelopeHead)
_encoder = msgspec.json.Encoder()
_PATH = re.compile(r" - at `(\$[^`]*)`$")

SUPPORTED_VERSIONS = [f"{SUPPORTED_MAJOR}.x"]
_MAJOR_PREFIX = f"{SUPPORTED_MAJOR}."

M = TypeVar("M", bound=Envelope[Any])


def _error(
    code: ErrorCode, exc: msgspec.ValidationError | msgspec.DecodeError
) -> RemoteProtocolError:
    text = str(exc)
    match = _PATH.search(text)
    # msgspec names no path for the document itself (not an object, a missing top-level field).
    path = "$"
    if match:
        path = match.group(1)
        text = text[: match.start()]
    return RemoteProtocolError(code, text, {"path": path})


class _VersionOnly(msgspec.Struct):
    version: str


_version_decoder = msgspec.json.Decoder(_VersionOnly)


def check_version(version: str) -> None:
    """Refuse another major version: never a silent downgrade."""
    major = version.split(".", 1)[0]
    if major != str(SUPPORTED_MAJOR):
        raise RemoteProtocolError(
            ErrorCode.MESSAGE_FORMAT_INVALID,
            f"unsupported protocol version {version}",
            {"supported_versions": SUPPORTED_VERSIONS, "path": "$.version"},
        )


def decode_head(data: bytes) -> EnvelopeHead:
    """Decode and check the envelope (shape and version), not the payload."""
    try:
        head = _head_decoder.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        # A newer major may change the envelope itself (a new `type`, say): its sender still
        # deserves `supported_versions` rather than a complaint about some field.
        try:
            version = _version_decoder.decode(data).version
        except (msgspec.ValidationError, msgspec.DecodeError):
            version = None
        if version is not None:
            check_version(version)
        raise _error(ErrorCode.MESSAGE_FORMAT_INVALID, exc) from None
    check_version(head.version)
    if bytes(head.payload)[:1] != b"{":
        raise RemoteProtocolError(
            ErrorCode.MESSAGE_FORMAT_INVALID,
            "Expected `object`",
            {"path": "$.payload"},
        )
    return head


def decode_envelope(data: bytes) -> tuple[EnvelopeHead | Message, Message | None]:
    """The envelope to check before authentication, and the typed message when all of it
    decodes: nearly always, and then the head is the message itself, so that the body is
    decoded once rather than as a head now and as a message after authentication. A body
    whose payload does not decode gets `decode_head`'s head alone (and its errors, in its
    order); its payload is judged by `decode_typed` after authentication, as before."""
    try:
        message = _message_decoder.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return decode_head(data), None
    # What `decode_head` checks of a head that decodes: its major version (the `Version`
    # pattern made it MAJOR.MINOR) and an object for the payload (every payload type is one).
    if not message.version.startswith(_MAJOR_PREFIX):
        check_version(message.version)
    return message, message


def decode_typed(data: bytes) -> Message:
    """Decode bytes into the typed message without the I-JSON pass (see `decode_message`)."""
    try:
        message = _message_decoder.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        # Was it the envelope or the payload? Judge the envelope first.
        decode_head(data)
        raise _error(ErrorCode.INVALID_PARAMS, exc) from None
    # The `Version` pattern already made it MAJOR.MINOR: "1." is exactly major 1.
    if not message.version.startswith(_MAJOR_PREFIX):
        check_version(message.version)
    return message


def decode_message(data: bytes) -> Message:
    """Decode `data` (one JSON envelope) into its typed message class.

    Raises `RemoteProtocolError` with `message_format_invalid` (not I-JSON, not an envelope, unknown
    type, unsupported major version) or `invalid_params` (the payload fails its type); the
    details carry the JSON `path` of the bad field where there is one.
    """
    parse_i_json(data)
    return decode_typed(data)


def encode_message(message: Envelope[Any]) -> bytes:
    """The JSON bytes of `message`."""
    return _encoder.encode(message)


# --- builders -----------------------------------------------------------------------------


def utc_now() -> datetime:
    return datetime.now(UTC)


#: 32 hex digits each (128 random bits, from the OS), popped one at a time: a message id per
#: message costs one system call per 256 ids instead of one each (`uuid.uuid4()`). `pop` is
#: atomic under the GIL; a forked child starts with an empty pool, never with its parent's.
_RANDOM_HEX: list[str] = []
_POOL_BYTES = 16 * 256
os.register_at_fork(after_in_child=_RANDOM_HEX.clear)


def _random_hex() -> str:
    try:
        return _RANDOM_HEX.pop()
    except IndexError:
        text = os.urandom(_POOL_BYTES).hex()
        _RANDOM_HEX.extend(text[i : i + 32] for i in range(32, len(text), 32))
        return text[:32]


def new_message_id() -> str:
    return f"msg-{_random_hex()}"


def new_task_id() -> str:
    return f"task-{_random_hex()}"


class IdFactory(Protocol):
    """Where an engine gets the ids it mints: message ids and task ids, unique per sender."""

    def message_id(self) -> str: ...

    def task_id(self) -> str: ...


class RandomIds:
    """The default `IdFactory`: `msg-…` / `task-…` with 128 random bits (pooled urandom)."""

    def message_id(self) -> str:
        return new_message_id()

    def task_id(self) -> str:
        return new_task_id()


class CountingIds:
    """A deterministic `IdFactory` for tests and replays: `msg-{prefix}1`, `task-{prefix}1`, …"""

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix
        self._messages = 0
        self._tasks = 0

    def message_id(self) -> str:
        self._messages += 1
        return f"msg-{self.prefix}{self._messages}"

    def task_id(self) -> str:
        self._tasks += 1
        return f"task-{self.prefix}{self._tasks}"


def build_message(
    cls: type[M],
    payload: Any,
    *,
    sender: Sender,
    to: str,
    timestamp: datetime,
    reply_to: str | None = None,
    message_id: str | None = None,
) -> M:
    """A message of class `cls` with `version`, `id` and the given `timestamp`.

    The timestamp is required: the sans-IO engine writes only the `now` it was given. Code at
    the edges that means "now" says so, with `build_message_now`. Without `message_id` a random
    one is drawn.
    """
    return cls(
        version=PROTOCOL_VERSION,
        id=message_id or new_message_id(),
        from_=sender,
        to=Recipient(agent_id=to),
        timestamp=timestamp,
        reply_to=reply_to,
        payload=payload,
    )


def build_reply(
    cls: type[M],
    payload: Any,
    *,
    request: Envelope[Any],
    sender: Sender,
    timestamp: datetime,
    message_id: str | None = None,
) -> M:
    """A reply of class `cls` to `request` (`reply_to` = its id, `to` = its sender)."""
    return build_message(
        cls,
        payload,
        sender=sender,
        to=request.from_.agent_id,
        reply_to=request.id,
        timestamp=timestamp,
        message_id=message_id,
    )


def build_message_now(
    cls: type[M],
    payload: Any,
    *,
    sender: Sender,
    to: str,
    reply_to: str | None = None,
    message_id: str | None = None,
    timestamp: datetime | None = None,
) -> M:
    """`build_message` stamped with the wall clock unless `timestamp` is given (for the edges:
    transports, tools and tests, never the engine)."""
    return build_message(
        cls,
        payload,
        sender=sender,
        to=to,
        reply_to=reply_to,
        message_id=message_id,
        timestamp=timestamp or utc_now(),
    )


def build_reply_now(cls: type[M], payload: Any, *, request: Envelope[Any], sender: Sender) -> M:
    """`build_reply` stamped with the wall clock (for the edges, never the engine)."""
    return build_reply(cls, payload, request=request, sender=sender, timestamp=utc_now())


def refreshed(message: M, timestamp: datetime | None = None) -> M:
    """The same message (same `id`) with a new `timestamp`, for a retry."""
    return msgspec.structs.replace(message, timestamp=timestamp or utc_now(), signature=None)


def format_timestamp(value: datetime) -> str:
    """RFC 3339 UTC with `Z`, as on the wire."""
    text: str = msgspec.json.decode(_encoder.encode(value.astimezone(UTC)))
    return text
