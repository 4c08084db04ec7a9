"""Authentication of an incoming POST, in specs/protocol.md's 'Order of checks', up to
deduplication.

Pure: bytes, the signature header and "now" in; an `Inbound` (authenticated, not yet
deduplicated, payload not yet decoded) or a `Refused` out. The first failing check answers:

    size → JSON / I-JSON → envelope shape and version → partner known → signature →
    staleness → `to` → endpoint → reply-only type or `reply_to`

specs/protocol.md, 'Signatures': every refusal before the signature verified, and every 403, is
answered with an
unsigned nack, so that a forger never obtains a signed envelope. Only the last check (a reply
replayed as a request) comes after verification and is not a 403: `Refused.sign_with` carries
the partner for it, and is None for every other refusal.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime
from typing import Any, Literal

import msgspec

from synapse.p2p.config import P2PConfig
from synapse.transport.partners import Partner, PartnerRegistry
from synapse.types import NackError
from synapse.types.codec import (
    EnvelopeHead,
    build_message_now,
    check_version,
    decode_envelope,
    encode_message,
    format_timestamp,
)
from synapse.types.enums import REPLY_ONLY_TYPES
from synapse.types.errors import ErrorCode, RemoteProtocolError, SynapseException
from synapse.types.ijson import parse_i_json_noting_floats
from synapse.types.messages import Envelope, Message, Nack, Sender
from synapse.types.payloads import NackPayload
from synapse.types.signing import (
    SIGNATURE_HEADER,
    header_signature,
    verify_body_signature,
    verify_header_signature,
)

#: How the request's signature was checked: header, body `signature`, or not at all (a
#: partner configured without secrets).
SignatureMode = Literal["header", "body", "none"]

#: `to.agent_id` of a nack whose request did not name a sender we could read.
UNKNOWN_RECIPIENT = "unknown"

_VERSION = re.compile(r"[0-9]+\.[0-9]+")  # fullmatch: "1.0\n" is not a version


class Inbound(msgspec.Struct, frozen=True):
    """An authenticated incoming message, ready for deduplication and payload decoding."""

    #: The envelope (the typed message itself when its payload decoded too).
    head: EnvelopeHead | Message
    #: The parsed I-JSON value of `body` (a JSON object), unknown members included.
    value: dict[str, Any]
    body: bytes
    partner: Partner
    signed_by: SignatureMode
    #: SHA-256 of the envelope's canonical form without `timestamp` and `signature`: equal for
    #: a retry of the same message, different for another message reusing its id.
    fingerprint: bytes
    #: The typed message, when the whole body decoded as one; None: `decode_typed` judges
    #: its payload (after authentication, in the order of checks).
    message: Message | None = None

    @property
    def key(self) -> tuple[str, str]:
        """The deduplication key (`from.agent_id`, `id`)."""
        return (self.head.from_.agent_id, self.head.id)


class Refused(SynapseException):
    """An incoming POST refused by one of the checks; answer with a nack built from `error`.

    `sign_with` is the partner whose secret signs that nack, or None when it must go
    unsigned. `request_id` and `sender_id` are what the request claimed, when readable.
    """

    def __init__(
        self,
        error: RemoteProtocolError,
        sign_with: Partner | None = None,
        *,
        request_id: str | None = None,
        sender_id: str | None = None,
    ) -> None:
        super().__init__(str(error))
        self.error = error
        self.sign_with = sign_with
        self.request_id = request_id
        self.sender_id = sender_id

    @property
    def http_status(self) -> int:
        return self.error.http_status

    def nack(self, *, agent_id: str, endpoint: str, now: datetime | None = None) -> Nack:
        """The nack answering the refused request."""
        return nack_for(
            self.error,
            agent_id=agent_id,
            endpoint=endpoint,
            request_id=self.request_id,
            to=self.sender_id,
            now=now,
        )

    def __repr__(self) -> str:
        return f"Refused({self.error!r}, sign_with={self.sign_with!r})"


def message_fingerprint(value: dict[str, Any], *, floats: bool = True) -> bytes:
    """Content hash of an envelope apart from `timestamp` and `signature` (specs/protocol.md,
    'Transport').

    Computed on the parsed value with sorted members, so member order, spacing and string
    escapes do not matter: SHA-256 of `json.dumps(rest, sort_keys=True, separators=(",",
    ":"), ensure_ascii=False)`. RFC 8785 is not used (pure Python, ~30 µs a message, on every
    request): the only difference is that `1` and `1.0` count as different content, which no
    retry of the same message produces.

    `floats=False` says the value holds no float (`parse_i_json_noting_floats`): then
    msgspec writes those very bytes, several times faster. The two encoders differ only in
    how they write a float's exponent, and the digest must not change across releases: a
    durable dedup record outlives the process that wrote it.
    """
    rest = dict(value)  # copied in C, not member by member
    rest.pop("timestamp", None)
    rest.pop("signature", None)
    if not floats:
        try:
            return hashlib.sha256(_SORTED_ENCODER.encode(rest)).digest()
        except (TypeError, ValueError, OverflowError):
            pass  # not a parsed JSON value after all: the reference encoder decides
    text = _FINGERPRINT_ENCODER.encode(rest)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


#: `json.dumps(..., sort_keys=True, separators=(",", ":"), ensure_ascii=False)`, built once.
_FINGERPRINT_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
#: The same bytes for a value without floats (members sorted by code point, the same escapes).
_SORTED_ENCODER = msgspec.json.Encoder(order="sorted")


def _denied(reason: str, message: str, **details: Any) -> RemoteProtocolError:
    return RemoteProtocolError(ErrorCode.PERMISSION_DENIED, message, {"reason": reason, **details})


def _claims(value: Any) -> tuple[str | None, str | None]:
    """The `id` and `from.agent_id` a request claims, if they can go into a nack as they are."""
    if not isinstance(value, dict):
        return None, None
    request_id = value.get("id")
    if not (isinstance(request_id, str) and 1 <= len(request_id) <= 128):
        request_id = None
    sender = value.get("from")
    sender_id = sender.get("agent_id") if isinstance(sender, dict) else None
    if not (isinstance(sender_id, str) and sender_id):
        sender_id = None
    return request_id, sender_id


def _check_signature(
    partner: Partner, body: bytes, value: dict[str, Any], header: str | None
) -> SignatureMode:
    if not partner.secrets:
        # Configured without a shared secret: unsigned by agreement; a signature is ignored.
        return "none"
    if header is not None and header.strip():
        if verify_header_signature(partner.secrets, body, header.strip()):
            return "header"
        raise _denied(
            "bad_signature",
            f"the {SIGNATURE_HEADER} header does not verify: the message was signed with a "
            f"secret other than the one we share with {partner.agent_id!r} (or changed on "
            "the way)",
        )
    if value.get("signature") is None:
        raise _denied("missing_signature", "the message is not signed")
    if verify_body_signature(partner.secrets, value):
        return "body"
    raise _denied(
        "bad_signature",
        "the body signature does not verify: the message was signed with a secret other than "
        f"the one we share with {partner.agent_id!r} (or changed on the way)",
    )


def authenticate(
    body: bytes,
    signature_header: str | None,
    *,
    partners: PartnerRegistry,
    agent_id: str,
    now: datetime,
    config: P2PConfig,
) -> Inbound:
    """Run the checks of an incoming POST, in order; raise `Refused` at the first failure.

    `signature_header` is the `X-Synapse-Signature` value (None when absent); `agent_id` is
    ours; `now` is our clock (timezone-aware).
    """
    if len(body) > config.max_body_size:
        raise Refused(
            RemoteProtocolError(
                ErrorCode.MESSAGE_FORMAT_INVALID,
                f"body of {len(body)} bytes exceeds the limit of {config.max_body_size}",
                {"reason": "too_large", "max_body_size": config.max_body_size},
                http_status=413,
            )
        )
    try:
        value, floats = parse_i_json_noting_floats(body)
    except RemoteProtocolError as exc:
        raise Refused(exc) from None
    request_id, sender_id = _claims(value)
    try:
        # Judge the major version before the shape: a 2.x envelope may be shaped otherwise,
        # and its sender must learn which versions we speak.
        version = value.get("version") if isinstance(value, dict) else None
        if isinstance(version, str) and _VERSION.fullmatch(version):
            check_version(version)
        head, message = decode_envelope(body)
    except RemoteProtocolError as exc:
        raise Refused(exc, request_id=request_id, sender_id=sender_id) from None
    assert isinstance(value, dict)  # decode_envelope accepted an object

    def refuse(error: RemoteProtocolError, sign_with: Partner | None = None) -> Refused:
        return Refused(error, sign_with, request_id=head.id, sender_id=head.from_.agent_id)

    partner = partners.get(head.from_.agent_id)
    if partner is None:
        raise refuse(_denied("unknown_partner", f"unknown partner {head.from_.agent_id!r}"))
    try:
        signed_by = _check_signature(partner, body, value, signature_header)
    except RemoteProtocolError as exc:
        raise refuse(exc) from None
    age = (now - head.timestamp).total_seconds()
    if abs(age) > config.replay_window:
        raise refuse(
            _denied(
                "stale",
                f"timestamp is {abs(age):.0f} s {'old' if age > 0 else 'ahead'}, "
                f"beyond the replay window of {config.replay_window:g} s",
                server_time=format_timestamp(now),
            )
        )
    if head.to.agent_id != agent_id:
        raise refuse(_denied("wrong_recipient", f"message is for {head.to.agent_id!r}"))
    if not partner.is_endpoint(head.from_.endpoint):
        raise refuse(
            _denied("endpoint_mismatch", "from.endpoint is not the partner's registered endpoint")
        )
    # Verified from here on: this refusal is signed (specs/protocol.md, 'Signatures').
    if head.type in REPLY_ONLY_TYPES:
        raise refuse(
            RemoteProtocolError(
                ErrorCode.INVALID_PARAMS,
                f"{head.type.value} is only ever a reply, never a request",
                {"reason": "reply_only_type", "path": "$.type"},
            ),
            partner,
        )
    if head.reply_to is not None:
        raise refuse(
            RemoteProtocolError(
                ErrorCode.INVALID_PARAMS,
                "a request never carries reply_to",
                {"reason": "reply_to_on_request", "path": "$.reply_to"},
            ),
            partner,
        )
    return Inbound(
        head=head,
        value=value,
        body=body,
        partner=partner,
        signed_by=signed_by,
        fingerprint=message_fingerprint(value, floats=floats),
        message=message,
    )


def nack_for(
    error: NackError,
    *,
    agent_id: str,
    endpoint: str,
    request_id: str | None,
    to: str | None,
    now: datetime | None = None,
) -> Nack:
    """The nack carrying `error`, from us (`agent_id`, `endpoint`) to the claimed sender.

    `reply_to` is the refused request's id when known; `to` is "unknown" when not.
    """
    return build_message_now(
        Nack,
        NackPayload(code=error.code.value, message=error.message, details=error.details),
        sender=Sender(agent_id=agent_id, endpoint=endpoint),
        to=to or UNKNOWN_RECIPIENT,
        reply_to=request_id,
        timestamp=now,
    )


def encode_reply(message: Envelope[Any], sign_with: Partner | None) -> tuple[bytes, dict[str, str]]:
    """The HTTP body and headers of a synchronous reply: header-mode signed with the
    partner's newest secret, or unsigned when `sign_with` is None (or shares no secret)."""
    body = encode_message(message)
    headers = {"Content-Type": "application/json"}
    secret = sign_with.signing_secret if sign_with is not None else None
    if secret is not None:
        headers[SIGNATURE_HEADER] = header_signature(secret, body)
    return body, headers
