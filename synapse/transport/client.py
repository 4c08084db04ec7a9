"""The HTTP client side: POST one message to a partner, with the retries of
specs/protocol.md, 'Transport', and judge
the envelope that comes back.

Every attempt keeps the message `id` but gets a fresh `timestamp` and a fresh signature, so a
long backoff never makes a message stale at the receiver, whose deduplication recognizes the
retry. Retried: connection errors (a connection closed before its response included), timeouts,
408, 429, 502, 503, 504, with exponential backoff from
`retry_base_delay` (2, 4, 8, … s, jittered, capped at `retry_max_delay`) or the `Retry-After`
the partner asked for (capped likewise). Anything else is final.

A reply must be an envelope answering our message. It is trusted only with a valid header
signature under a secret we share with the partner; the one exception is a `nack`, which
specs/protocol.md, 'Signatures' sends unsigned when the partner refused us before verifying our
signature (it
comes back with `Reply.verified` False and can never be mistaken for an acknowledgement).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from email.utils import parsedate_to_datetime
from types import TracebackType
from typing import Any, Literal, cast

import aiohttp
import msgspec

from synapse._distribution import NAME
from synapse.logs import get_logger
from synapse.p2p.config import P2PConfig
from synapse.runtime.listener import Listeners
from synapse.transport.http1 import BodyTooLarge, Http1Pool, MalformedResponse
from synapse.transport.partners import Partner
from synapse.transport.retry import RetriesExhausted, Transient, retrying_after
from synapse.transport.tls import TLSConfig
from synapse.types.codec import decode_typed, encode_message, refreshed, utc_now
from synapse.types.enums import REPLY_ONLY_TYPES
from synapse.types.errors import DeliveryError, LocalProtocolError, RemoteProtocolError
from synapse.types.ijson import parse_i_json
from synapse.types.messages import Envelope, Message, Nack
from synapse.types.signing import (
    SIGNATURE_HEADER,
    Secret,
    body_signature,
    header_signature,
    verify_header_signature,
)

log = get_logger(__name__)
_stdlib_log = logging.getLogger(__name__)

#: Where the signature of a request goes (specs/protocol.md, 'Signatures').
SenderMode = Literal["header", "body"]
#: HTTP statuses after which the same POST is tried again (specs/protocol.md, 'Transport').
#: 408 is about the connection (the server gave up waiting for a request), never about the
#: message: it was not read.
RETRYABLE_STATUSES: frozenset[int] = frozenset({408, 429, 502, 503, 504})
USER_AGENT = f"{NAME}/0.1"
_SIGNATURE_KEY = SIGNATURE_HEADER.lower()

Sleep = Callable[[float], Awaitable[None]]
Clock = Callable[[], datetime]
#: POSTs without sockets (`synapse.simulation`'s network): `(url, body, headers, timeout)` to
#: `(status, body, Retry-After, signature header)`, raising `ConnectionError` or
#: `TimeoutError` as a connection would.
Poster = Callable[
    [str, bytes, Mapping[str, str], float],
    Awaitable[tuple[int, bytes, str | None, str | None]],
]


class Reply(msgspec.Struct, frozen=True):
    """The envelope a partner answered one POST with."""

    status: int
    message: Message
    #: True if the reply's header signature matched a secret shared with the partner. False
    #: for an unsigned or badly signed `nack` (the only kind accepted so), and for every reply
    #: of a partner configured without secrets.
    verified: bool
    body: bytes
    #: Attempts it took, the first one included.
    attempts: int = 1

    @property
    def is_nack(self) -> bool:
        return isinstance(self.message, Nack)


def encode_request(
    message: Envelope[Any], secret: Secret | None, mode: SenderMode = "header"
) -> tuple[bytes, dict[str, str]]:
    """The HTTP body and headers of `message`, signed with `secret` in `mode` (unsigned if
    `secret` is None)."""
    headers = {"Content-Type": "application/json"}
    if secret is None:
        return encode_message(message), headers
    if mode == "header":
        body = encode_message(message)
        headers[SIGNATURE_HEADER] = header_signature(secret, body)
        return body, headers
    # Body mode signs the JSON value the receiver will parse from these very bytes.
    unsigned = msgspec.structs.replace(message, signature=None)
    value = msgspec.json.decode(encode_message(unsigned))
    signed = msgspec.structs.replace(message, signature=body_signature(secret, value))
    return encode_message(signed), headers


def parse_retry_after(value: str | None, now: datetime) -> float | None:
    """Seconds to wait from a `Retry-After` value (delta-seconds or HTTP-date), or None."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # an HTTP-date is always GMT
        return None
    return max(0.0, (when - now).total_seconds())


async def _read_limited(response: aiohttp.ClientResponse, limit: int) -> bytes:
    if response.content_length is not None and response.content_length <= limit:
        return await response.read()  # the usual reply: its declared length, in one read
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > limit:
            raise DeliveryError(
                f"reply body exceeds {limit} bytes", retryable=False, status=response.status
            )
        chunks.append(chunk)
    return b"".join(chunks)


def _log_attempt(
    sent: Envelope[Any],
    attempt: int,
    partner: Partner,
    *,
    status: int | None,
    error: str | None = None,
) -> None:
    """The debug line of one POST attempt (its fields built only when it is written: an
    attempt is two a task)."""
    if _stdlib_log.isEnabledFor(logging.DEBUG):
        fields: dict[str, Any] = {"status": status}
        if error is not None:
            fields["error"] = error
        log.debug(
            "post_attempt",
            message_id=sent.id,
            type=sent.type.value,
            attempt=attempt,
            partner=partner.agent_id,
            **fields,
        )


def judge_reply(
    partner: Partner,
    sent: Envelope[Any],
    status: int,
    body: bytes,
    signature: str | None,
    *,
    attempts: int = 1,
) -> Reply:
    """Decode and check the reply `body` to `sent`; raise `DeliveryError` if unacceptable."""

    def refuse(reason: str) -> DeliveryError:
        return DeliveryError(
            f"reply from {partner.agent_id} refused: {reason}",
            retryable=False,
            status=status,
            attempts=attempts,
        )

    try:
        parse_i_json(body)
        message = decode_typed(body)
    except RemoteProtocolError as exc:
        raise refuse(_not_an_envelope(status, body, exc)) from exc
    verified = bool(partner.secrets) and (
        signature is not None and verify_header_signature(partner.secrets, body, signature)
    )
    our_id = sent.from_.agent_id
    if isinstance(message, Nack):
        # Possibly unsigned (specs/protocol.md, 'Signatures'): the partner may not have read our id
        # or name.
        if message.reply_to not in (None, sent.id):
            raise refuse("nack answers another message")
        if message.to.agent_id not in (our_id, "unknown"):
            raise refuse("nack is for another agent")
    else:
        if partner.secrets and not verified:
            raise refuse("missing or bad signature" if signature else "unsigned")
        if message.reply_to != sent.id:
            raise refuse(f"reply_to {message.reply_to!r} is not {sent.id!r}")
        if message.to.agent_id != our_id:
            raise refuse(f"addressed to {message.to.agent_id!r}")
        if message.from_.agent_id != partner.agent_id:
            raise refuse(f"sent by {message.from_.agent_id!r}")
        if not 200 <= status < 300:
            raise refuse(f"HTTP {status} with a {message.type.value}, not a nack")
    return Reply(status=status, message=message, verified=verified, body=body, attempts=attempts)


def _not_an_envelope(status: int, body: bytes, error: RemoteProtocolError) -> str:
    """Why a reply is not a Synapse envelope, in terms a person recognizes (a 404 page is a
    wrong URL, not "Extra data")."""
    text = body.lstrip()[:200]
    if not text:
        what = "an empty body"
    elif text[:1] == b"<":
        what = "an HTML page" if b"html" in text.lower() else "XML"
    elif text[:1] in (b"{", b"["):
        return f"HTTP {status} with JSON that is not a Synapse envelope ({error.message})"
    else:
        shown = text[:60].decode("utf-8", "replace").splitlines()[0]
        what = f"text {shown!r}"
    return f"not a Synapse endpoint: HTTP {status} with {what}"


def _log_retry(message: Envelope[Any], attempt: int, delay: float | None) -> None:
    log.info(
        "post_retry", message_id=message.id, type=message.type.value, attempt=attempt, delay=delay
    )


#: aiohttp trace configs each of our HTTP client sessions is created with: tracing adds its
#: W3C `traceparent` injector here (`synapse.ops.tracing.instrument_http_clients`).
TRACE_CONFIGS: list[aiohttp.TraceConfig] = []


class HttpClient:
    """POSTs messages to partners over one shared, keep-alive `aiohttp.ClientSession`.

    Use as `async with HttpClient(config) as client:` or call `start()` / `close()`; the
    session is also created on first use. `sleep`, `clock` and `jitter` are injectable so that
    tests run retries in milliseconds; `post` replaces the connections themselves (an
    in-process network: `synapse.simulation`'s), all else left as it is.
    """

    def __init__(
        self,
        config: P2PConfig | None = None,
        *,
        connection_limit: int = 100,
        connection_limit_per_host: int = 0,
        keepalive_timeout: float = 30.0,
        sleep: Sleep = asyncio.sleep,
        clock: Clock = utc_now,
        jitter: Callable[[], float] = random.random,
        tls: TLSConfig | None = None,
        post: Poster | None = None,
    ) -> None:
        self.config = config or P2PConfig()
        self._post = post
        #: Verifies https partners (custom CA) and presents our client certificate.
        self._ssl = tls.client_context() if tls is not None else None
        self._connection_limit = connection_limit
        self._connection_limit_per_host = connection_limit_per_host
        self._keepalive_timeout = keepalive_timeout
        self._sleep = sleep
        self._clock = clock
        self._jitter = jitter
        self._session: aiohttp.ClientSession | None = None
        #: Plain-http partners are POSTed to by the lean client (see `synapse.transport.http1`).
        self._lean: Http1Pool | None = None
        #: Told of each retry (`RuntimeListener.on_retry`: metrics). A `Peer` shares its
        #: runtime's listeners with its client.
        self.listeners = Listeners()
        #: Extra HTTP headers for one message's POSTs (tracing's `traceparent`).
        self.header_hooks: list[Callable[[Envelope[Any]], Mapping[str, str]]] = []

    async def start(self) -> None:
        """Get ready to POST (idempotent). Connections, and aiohttp's session for the
        partners that need it, are opened on first use."""

    async def close(self) -> None:
        """Close the session and its connections (idempotent)."""
        session, self._session = self._session, None
        lean, self._lean = self._lean, None
        if lean is not None:
            await lean.close()
        if session is not None and not session.closed:
            await session.close()

    async def __aenter__(self) -> HttpClient:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def _ensure_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=self._connection_limit,
                limit_per_host=self._connection_limit_per_host,
                keepalive_timeout=self._keepalive_timeout,
                ssl=self._ssl if self._ssl is not None else True,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=self.config.request_timeout),
                headers={"User-Agent": USER_AGENT},
                trace_configs=list(TRACE_CONFIGS) or None,
            )
        return self._session

    async def exchange(
        self,
        partner: Partner,
        message: Envelope[Any],
        *,
        sender_mode: SenderMode = "header",
        retries: int | None = None,
    ) -> Reply:
        """POST `message` to `partner.endpoint`, retrying transient failures; return the reply.

        `retries` overrides `config.max_retries` for this call (0: one attempt only, for a
        caller such as a durable outbox that schedules its own retries).

        A final HTTP error answered with a nack (4xx, 500) is returned as a `Reply` too: the
        caller decides. Raises `DeliveryError` when retries run out (`retryable=True`) or the
        answer is unacceptable (`retryable=False`), and `LocalProtocolError` if `message` may
        not be POSTed to `partner` at all.
        """
        if message.to.agent_id != partner.agent_id:
            raise LocalProtocolError(
                f"message to {message.to.agent_id!r} cannot be POSTed to {partner.agent_id!r}"
            )
        if message.reply_to is not None or message.type in REPLY_ONLY_TYPES:
            raise LocalProtocolError(f"{message.type.value} is a reply, never POSTed")
        if retries is None:
            retries = self.config.max_retries
        if retries < 0:
            raise ValueError("retries must not be negative")

        try:
            return await self._attempt(partner, message, sender_mode, 1)
        except Transient as failure:
            first = failure

        def before_retry(attempt: int, delay: float) -> None:
            _log_retry(message, attempt, delay)
            self._notify_retry(message, attempt)

        try:
            return await retrying_after(
                first,
                lambda attempt: self._attempt(partner, message, sender_mode, attempt),
                retries=retries,
                config=self.config,
                sleep=self._sleep,
                jitter=self._jitter,
                before_retry=before_retry,
            )
        except RetriesExhausted as exhausted:
            last: Transient[Reply] = exhausted.last
            raise DeliveryError(
                f"no delivery to {partner.agent_id} after {exhausted.attempts} attempts: {last}",
                retryable=True,
                status=last.status,
                attempts=exhausted.attempts,
                reply=last.reply,
            ) from last.__cause__

    def _notify_retry(self, message: Envelope[Any], attempt: int) -> None:
        # Every envelope class is a member of `Message` (a class that is not fails at import).
        self.listeners.on_retry(cast(Message, message), attempt)

    def _lean_pool(self, url: str) -> Http1Pool | None:
        """The lean client if it POSTs to `url`: plain http, and no aiohttp tracing hooks."""
        if TRACE_CONFIGS:
            return None
        if self._lean is None:
            self._lean = Http1Pool(
                limit=self._connection_limit,
                keepalive_timeout=self._keepalive_timeout,
                default_headers={"User-Agent": USER_AGENT},
            )
        return self._lean if self._lean.supports(url) else None

    async def _attempt(
        self, partner: Partner, message: Envelope[Any], mode: SenderMode, attempt: int
    ) -> Reply:
        sent = refreshed(message, self._clock())
        body, headers = encode_request(sent, partner.signing_secret, mode)
        for hook in self.header_hooks:
            headers = {**headers, **hook(message)}
        lean = self._lean_pool(partner.endpoint) if self._post is None else None
        try:
            if self._post is not None:
                status, raw, retry_after, signature = await self._post(
                    partner.endpoint, body, headers, self.config.request_timeout
                )
            elif lean is not None:
                response = await lean.post(
                    partner.endpoint,
                    body,
                    headers,
                    timeout=self.config.request_timeout,
                    max_body=self.config.max_body_size,
                )
                status, raw = response.status, response.body
                retry_after = response.headers.get("retry-after")
                signature = response.headers.get(_SIGNATURE_KEY)
            else:
                status, raw, retry_after, signature = await self._post_aiohttp(
                    partner.endpoint, body, headers
                )
        except BodyTooLarge as exc:
            _log_attempt(sent, attempt, partner, status=exc.status, error=str(exc))
            raise DeliveryError(
                str(exc), retryable=False, status=exc.status, attempts=attempt
            ) from exc
        except MalformedResponse as exc:
            _log_attempt(sent, attempt, partner, status=None, error=repr(exc))
            raise DeliveryError(
                f"cannot POST to {partner.endpoint}: {exc!r}", retryable=False, attempts=attempt
            ) from exc
        except (ConnectionError, TimeoutError) as exc:
            error = f"{type(exc).__name__}: {exc}".rstrip(": ")
            _log_attempt(sent, attempt, partner, status=None, error=error)
            raise Transient(error) from exc
        except DeliveryError as exc:
            _log_attempt(sent, attempt, partner, status=exc.status, error=str(exc))
            exc.attempts = attempt
            raise
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            error = f"{type(exc).__name__}: {exc}".rstrip(": ")
            _log_attempt(sent, attempt, partner, status=None, error=error)
            raise Transient(error) from exc
        except aiohttp.ClientError as exc:
            _log_attempt(sent, attempt, partner, status=None, error=repr(exc))
            raise DeliveryError(
                f"cannot POST to {partner.endpoint}: {exc!r}", retryable=False, attempts=attempt
            ) from exc
        _log_attempt(sent, attempt, partner, status=status)
        if status in RETRYABLE_STATUSES:
            try:
                last: Reply | None = judge_reply(
                    partner, sent, status, raw, signature, attempts=attempt
                )
            except DeliveryError:
                last = None
            raise Transient(
                f"HTTP {status}",
                status=status,
                retry_after=parse_retry_after(retry_after, self._clock()),
                reply=last,
            )
        return judge_reply(partner, sent, status, raw, signature, attempts=attempt)

    async def _post_aiohttp(
        self, url: str, body: bytes, headers: Mapping[str, str]
    ) -> tuple[int, bytes, str | None, str | None]:
        """POST through aiohttp (https, tracing): status, body, Retry-After, signature."""
        session = self._ensure_session()
        async with session.post(url, data=body, headers=headers, allow_redirects=False) as response:
            raw = await _read_limited(response, self.config.max_body_size)
            return (
                response.status,
                raw,
                response.headers.get("Retry-After"),
                response.headers.get(SIGNATURE_HEADER),
            )
