"""Hand-made envelopes over HTTP: build, sign (or mis-sign), POST, and judge what comes back.

The kit speaks raw JSON rather than through the engine, so that it can send what no
well-behaved peer would (bad signatures, stale timestamps, reply-only types, …) and judge the
target on its bytes alone. Every POST becomes an `Exchange`: what was sent, what came back, and
when (on the kit's event clock, see `Clock`), so that the rules of specs/protocol.md, 'Task states'
can order a
synchronous reply against the callbacks that crossed it.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

import aiohttp

from synapse.transport.partners import same_endpoint
from synapse.types import (
    SIGNATURE_HEADER,
    Message,
    RemoteProtocolError,
    body_signature,
    decode_message,
    format_timestamp,
    header_signature,
    new_message_id,
    utc_now,
    verify_body_signature,
    verify_header_signature,
)
from synapse.types.errors import SynapseException

#: How a request is signed: in the `X-Synapse-Signature` header, in the body's `signature`
#: member, or not at all.
Mode = Literal["header", "body", "none"]

#: Nack codes only issued before the request's signature verified, or as 403: never signed.
UNSIGNED_CODES = frozenset({"message_format_invalid", "permission_denied"})
#: Nack codes only issued after the request's signature verified: always signed.
SIGNED_CODES = frozenset({"invalid_params", "task_not_found", "task_already_completed"})


class CheckFailed(SynapseException):
    """The target did something specs/protocol.md forbids; the message is the reason shown."""


class TargetUnreachable(CheckFailed):
    """No answer from the target at all (connection refused, timeout): nothing could be
    checked, and the command line says so with exit status 2, as for any unreachable peer."""


class Skip(SynapseException):
    """The check cannot run (a prerequisite is missing); the message says why."""


class Clock:
    """A counter ordering every event the kit sees: POSTs sent, replies and callbacks received.

    Wall-clock times of two tasks' coroutines cannot be trusted to order events; a counter
    ticked as each one happens on the one event loop can.
    """

    def __init__(self) -> None:
        self._ticks = itertools.count(1)

    def tick(self) -> int:
        return next(self._ticks)


def encode(value: Any) -> bytes:
    """Compact UTF-8 JSON, as a peer would send it."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def sign(value: Mapping[str, Any], secret: str, mode: Mode) -> tuple[bytes, dict[str, str]]:
    """The body and headers of envelope `value` signed with `secret` in `mode`."""
    headers = {"Content-Type": "application/json"}
    unsigned = {k: v for k, v in value.items() if k != "signature"}
    if mode == "none":
        return encode(value), headers
    if mode == "body":
        return encode({**unsigned, "signature": body_signature(secret, unsigned)}), headers
    body = encode(value)
    headers[SIGNATURE_HEADER] = header_signature(secret, body)
    return body, headers


def fingerprint(value: Mapping[str, Any]) -> str:
    """An envelope's content apart from `timestamp` and `signature` (what a retry keeps)."""
    rest = {k: v for k, v in value.items() if k not in ("timestamp", "signature")}
    return json.dumps(rest, sort_keys=True, ensure_ascii=False)


def short(data: bytes | str, limit: int = 160) -> str:
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass
class Exchange:
    """One POST of the kit and the target's answer."""

    label: str
    sent: Any
    body: bytes
    headers: dict[str, str]
    sent_at: int
    received_at: int = 0
    status: int | None = None
    reply_body: bytes = b""
    reply_headers: dict[str, str] = field(default_factory=dict)
    #: The connection failed or timed out (no HTTP status).
    error: str | None = None
    #: The reply as a JSON value, if it was I-JSON.
    value: Any = None
    #: The reply as a typed envelope, if it was one.
    message: Message | None = None
    #: Why the reply is not an envelope (None if it is).
    malformed: str | None = None

    @property
    def sent_id(self) -> str | None:
        sent_id = self.sent.get("id") if isinstance(self.sent, dict) else None
        return sent_id if isinstance(sent_id, str) else None

    @property
    def type(self) -> str | None:
        return self.message.message_type.value if self.message is not None else None

    @property
    def payload(self) -> dict[str, Any]:
        payload = self.value.get("payload") if isinstance(self.value, dict) else None
        return payload if isinstance(payload, dict) else {}

    @property
    def code(self) -> str | None:
        """The nack's `code` (None for any other reply)."""
        if self.type != "p2p:nack":
            return None
        code = self.payload.get("code")
        return code if isinstance(code, str) else None

    @property
    def details(self) -> dict[str, Any]:
        details = self.payload.get("details")
        return details if isinstance(details, dict) else {}

    @property
    def signature(self) -> str | None:
        for name, value in self.reply_headers.items():
            if name.lower() == SIGNATURE_HEADER.lower():
                return value
        return None

    def describe(self) -> str:
        """What came back, in a few words (for failure reasons)."""
        if self.error is not None:
            return f"no reply ({self.error})"
        if self.malformed is not None:
            return f"HTTP {self.status} with a body that is no envelope ({self.malformed}): " + (
                repr(short(self.reply_body, 120))
            )
        text = f"HTTP {self.status} {self.type}"
        if self.code is not None:
            text += f" {self.code}"
            message = self.payload.get("message")
            if isinstance(message, str) and message:
                text += f" ({short(message, 100)})"
        elif self.type == "p2p:task_reject":
            reason = self.payload.get("reason")
            if isinstance(reason, dict):
                text += f" {reason.get('code')}"
        elif self.type == "p2p:task_ack":
            text += f" state={self.payload.get('state')}"
        return text


@dataclass(frozen=True)
class Identity:
    """Who the kit is, who it checks, and the secret they share."""

    kit_id: str
    kit_endpoint: str
    target_id: str
    target_url: str
    secret: str


class RawClient:
    """POSTs hand-made envelopes to the target as the kit, and judges each reply's envelope."""

    def __init__(self, identity: Identity, clock: Clock, *, timeout: float = 10.0) -> None:
        self.identity = identity
        self.clock = clock
        self.timeout = timeout
        self._session: aiohttp.ClientSession | None = None
        #: Every exchange so far, in the order they were sent.
        self.exchanges: list[Exchange] = []

    async def start(self) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout),
                headers={"User-Agent": "synapse-conformance/0.1"},
            )

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    # --- building -------------------------------------------------------------------------

    def envelope(
        self,
        type_: str,
        payload: Mapping[str, Any] | None = None,
        *,
        message_id: str | None = None,
        age: float = 0.0,
        **changes: Any,
    ) -> dict[str, Any]:
        """A fresh envelope from the kit to the target; `age` seconds in the past (negative:
        the future); `changes` replace or add top-level members."""
        me = self.identity
        value: dict[str, Any] = {
            "version": "1.0",
            "id": message_id or new_message_id(),
            "type": type_ if ":" in type_ else f"p2p:{type_}",
            "from": {"agent_id": me.kit_id, "endpoint": me.kit_endpoint},
            "to": {"agent_id": me.target_id},
            "timestamp": format_timestamp(utc_now() - timedelta(seconds=age)),
            "payload": dict(payload or {}),
        }
        value.update(changes)
        return value

    def task_request(
        self,
        task_id: str,
        task_type: str,
        payload: Mapping[str, Any] | None = None,
        **changes: Any,
    ) -> dict[str, Any]:
        task = {"id": task_id, "type": task_type, "priority": "normal", "payload": payload or {}}
        return self.envelope("task_request", {"task": task}, **changes)

    @staticmethod
    def refreshed(value: dict[str, Any], at: datetime | None = None) -> dict[str, Any]:
        """The same envelope with a new `timestamp` (a retry)."""
        return {**value, "timestamp": format_timestamp(at or utc_now())}

    # --- sending --------------------------------------------------------------------------

    async def post(
        self, value: dict[str, Any], mode: Mode = "header", *, label: str | None = None
    ) -> Exchange:
        """Sign `value` in `mode` with the shared secret and POST it."""
        body, headers = sign(value, self.identity.secret, mode)
        return await self.post_bytes(body, headers, sent=value, label=label)

    async def send(
        self,
        type_: str,
        payload: Mapping[str, Any] | None = None,
        mode: Mode = "header",
        **kw: Any,
    ) -> Exchange:
        """Build, sign and POST one envelope."""
        return await self.post(self.envelope(type_, payload, **kw), mode)

    async def post_bytes(
        self,
        body: bytes,
        headers: Mapping[str, str],
        *,
        sent: Any = None,
        label: str | None = None,
    ) -> Exchange:
        """POST exactly `body` with `headers`; never raises for what the target does."""
        await self.start()
        assert self._session is not None
        if label is None:
            kind = sent.get("type") if isinstance(sent, dict) else None
            label = str(kind).removeprefix("p2p:") if kind else "raw body"
        exchange = Exchange(label, sent, body, dict(headers), sent_at=self.clock.tick())
        self.exchanges.append(exchange)
        try:
            async with self._session.post(
                self.identity.target_url, data=body, headers=dict(headers), allow_redirects=False
            ) as response:
                exchange.status = response.status
                exchange.reply_headers = dict(response.headers)
                exchange.reply_body = await response.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            exchange.error = f"{type(exc).__name__}: {exc}".rstrip(": ")
        exchange.received_at = self.clock.tick()
        if exchange.error is None:
            self._parse(exchange)
        return exchange

    @staticmethod
    def _parse(exchange: Exchange) -> None:
        try:
            exchange.message = decode_message(exchange.reply_body)
            exchange.value = json.loads(exchange.reply_body)
        except RemoteProtocolError as exc:
            exchange.malformed = exc.message
        except ValueError as exc:  # pragma: no cover - decode_message judged it I-JSON
            exchange.malformed = str(exc)

    # --- judging --------------------------------------------------------------------------

    def reply_problems(self, exchange: Exchange) -> list[str]:
        """What is wrong with `exchange`'s reply whatever the check expected (specs/protocol.md,
        'Signatures' and 'Transport'):
        not an envelope; a 200 not answering us or not header-signed with the shared secret;
        a nack signed where it must not be, or unsigned where it must be signed."""
        if exchange.error is not None:
            return []
        if exchange.message is None:
            return [f"{exchange.label}: HTTP {exchange.status} reply is not an envelope"]
        problems: list[str] = []
        me = self.identity
        signature = exchange.signature
        verified = signature is not None and verify_header_signature(
            [me.secret], exchange.reply_body, signature
        )
        code = exchange.code
        if code is None or code in SIGNED_CODES:
            if not verified:
                what = "unsigned" if signature is None else "badly signed"
                problems.append(f"{exchange.label}: {exchange.describe()} reply is {what}")
            if exchange.message.reply_to != exchange.sent_id:
                problems.append(
                    f"{exchange.label}: reply_to {exchange.message.reply_to!r} is not "
                    f"{exchange.sent_id!r}"
                )
            if exchange.message.to.agent_id != me.kit_id:
                problems.append(
                    f"{exchange.label}: reply addressed to {exchange.message.to.agent_id!r}"
                )
            if exchange.message.from_.agent_id != me.target_id:
                problems.append(
                    f"{exchange.label}: reply sent by {exchange.message.from_.agent_id!r}"
                )
        if code is None and exchange.status != 200:
            problems.append(f"{exchange.label}: HTTP {exchange.status} with {exchange.type}")
        unsigned_expected = code in UNSIGNED_CODES or exchange.status == 403
        if unsigned_expected and (signature is not None or exchange.message.signature is not None):
            problems.append(
                f"{exchange.label}: {exchange.describe()} is signed; a nack issued before "
                "the signature verified, or a 403, never is"
            )
        return problems

    def expect(
        self,
        exchange: Exchange,
        type_: str,
        *,
        status: int = 200,
    ) -> Exchange:
        """Require a signed `type_` envelope answering `exchange` with `status`."""
        want = type_ if ":" in type_ else f"p2p:{type_}"
        if exchange.status != status or exchange.type != want:
            raise CheckFailed(
                f"{exchange.label}: expected HTTP {status} {want}, got {exchange.describe()}"
            )
        problems = self.reply_problems(exchange)
        if problems:
            raise CheckFailed("; ".join(problems))
        return exchange

    def expect_nack(
        self,
        exchange: Exchange,
        status: int,
        code: str,
        *,
        signed: bool,
        reason: str | None = None,
    ) -> dict[str, Any]:
        """Require a nack with `status` and `code`, signed or not as specs/protocol.md, 'Signatures'
        says;
        `reason`: the `details.reason` it must carry. Returns its `details`."""
        if exchange.status != status or exchange.code != code:
            raise CheckFailed(
                f"{exchange.label}: expected HTTP {status} nack {code}, got {exchange.describe()}"
            )
        assert exchange.message is not None
        signature = exchange.signature
        if signed:
            problems = self.reply_problems(exchange)
            if problems:
                raise CheckFailed("; ".join(problems))
        elif signature is not None or exchange.message.signature is not None:
            raise CheckFailed(
                f"{exchange.label}: the {status} {code} nack is signed; "
                "specs/protocol.md, 'Signatures' says a nack issued before the signature "
                "verified, or a 403, never is"
            )
        sent_id = exchange.sent_id
        reply_to = exchange.message.reply_to
        if signed and reply_to != sent_id:
            raise CheckFailed(f"{exchange.label}: nack reply_to {reply_to!r} is not {sent_id!r}")
        if not signed and reply_to not in (None, sent_id):
            raise CheckFailed(f"{exchange.label}: nack answers another message ({reply_to!r})")
        details = exchange.details
        if reason is not None and details.get("reason") != reason:
            raise CheckFailed(
                f"{exchange.label}: nack details.reason is {details.get('reason')!r}, "
                f"not {reason!r}"
            )
        return details


def verify_callback(
    identity: Identity, body: bytes, value: dict[str, Any], header: str | None
) -> str | None:
    """How a callback's signature verified ("header" or "body"), or None if it did not.

    The header decides when both are present (specs/protocol.md, 'Signatures').
    """
    secrets = [identity.secret]
    if header is not None and header.strip():
        return "header" if verify_header_signature(secrets, body, header.strip()) else None
    if value.get("signature") is not None:
        return "body" if verify_body_signature(secrets, value) else None
    return None


def is_target_endpoint(identity: Identity, url: Any) -> bool:
    return isinstance(url, str) and same_endpoint(url, identity.target_url)


__all__ = [
    "CheckFailed",
    "Clock",
    "Exchange",
    "Identity",
    "Mode",
    "RawClient",
    "Skip",
    "encode",
    "fingerprint",
    "is_target_endpoint",
    "sign",
    "verify_callback",
]
