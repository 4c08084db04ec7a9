"""The aiohttp side that receives: `POST /synapse/callback` → checks → engine → signed reply.

Every POST gets an envelope back: the synchronous reply of specs/protocol.md, 'Synchronous replies',
or a `nack` with the
HTTP status of specs/protocol.md, 'Error codes', signed or not as specs/protocol.md, 'Signatures'
says. Never a bare 500, never a
traceback: an unexpected failure inside is answered 503 `agent_not_ready` (the sender retries)
and logged.

The order of checks is that of specs/protocol.md, 'Order of checks': size → JSON / I-JSON → envelope
and version → partner →
signature → staleness → `to` → endpoint → reply-only type or `reply_to` (all in
`synapse.transport.inbound`) → rate limit → deduplication → payload shape → the engine (task
exists, party to it, final, allowed in its state, capacity).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from synapse.logs import get_logger
from synapse.p2p.dedup import DedupOutcome, DedupStore, StoredReply, is_storable
from synapse.runtime.aio import MemoryDedupStore
from synapse.runtime.protocol import P2PProtocol, Receipt
from synapse.store.base import StoreUnavailable
from synapse.transport.inbound import Inbound, Refused, authenticate, encode_reply, nack_for
from synapse.transport.partners import Partner, PartnerRegistry
from synapse.transport.tls import check_partner_certificate
from synapse.types import (
    ErrorCode,
    Message,
    NackError,
    NotReady,
    RemoteProtocolError,
    TaskState,
    decode_typed,
)

log = get_logger("synapse.transport")
_stdlib_log = logging.getLogger("synapse.transport")  # its level, asked per request

DEFAULT_PATH = "/synapse/callback"
#: What an unexpected failure inside is answered with: never a bare 500; the sender retries.
_INTERNAL = NotReady("internal error; retry later", {"reason": "internal"})
_STORE_UNAVAILABLE = NotReady(
    "cannot store the message; retry later", {"reason": "store_unavailable"}
)
_STARTING = NotReady("starting up: recovery is not done", {"reason": "starting"})


class _TokenBucket:
    """Requests per second allowed from one partner, with a burst."""

    __slots__ = ("burst", "rate", "stamp", "tokens")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate, self.burst, self.tokens, self.stamp = rate, burst, burst, now

    def take(self, now: float) -> float:
        """0 if a request may go at `now` (monotonic seconds), else the seconds until one may."""
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate


class SynapseServer:
    """Serves one peer's callback endpoint; mount it into any aiohttp app with `add_routes`."""

    def __init__(
        self,
        protocol: P2PProtocol,
        partners: PartnerRegistry,
        *,
        dedup: DedupStore | None = None,
        rate_limit: float | None = None,
        rate_burst: float | None = None,
        utcnow: Callable[[], datetime] = lambda: datetime.now(UTC),
        body_timeout: float = 30.0,
        rate_clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.protocol = protocol
        self.partners = partners
        self.config = protocol.config
        self.dedup: DedupStore = (
            dedup if dedup is not None else MemoryDedupStore(self.config.dedup_window)
        )
        # Per partner; the peer's settings (`P2PConfig.rate_limit`) unless given here.
        self.rate_limit = rate_limit if rate_limit is not None else self.config.rate_limit
        self.rate_burst = rate_burst if rate_burst is not None else self.config.rate_burst
        self.utcnow = utcnow
        #: Seconds to read a body once its head arrived; a slower one is answered 408.
        self.body_timeout = body_timeout
        #: The monotonic clock of the rate limit's token buckets and of the deduplication
        #: table's purges (a fake one in tests, the simulation's virtual one).
        self.rate_clock = rate_clock
        self._buckets: dict[str, _TokenBucket] = {}
        self._last_expiry = 0.0
        #: Replicas sharing a store (`synapse.transport.replicas`): given an authenticated
        #: message, a reply from the replica that owns its task, an error to answer, or None
        #: to handle it here.
        self.route: (
            Callable[[Inbound, Mapping[str, str]], Awaitable[StoredReply | NackError | None]] | None
        ) = None

    @property
    def agent_id(self) -> str:
        return self.protocol.agent_id

    @property
    def endpoint(self) -> str:
        return self.protocol.endpoint

    def add_routes(self, app: web.Application, path: str = DEFAULT_PATH) -> None:
        """Mount the callback endpoint into `app` (a user's own application, say)."""
        app.router.add_post(path, self.handle)

    # --- one POST ---------------------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.Response:
        try:
            return await self._handle(request)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # never a bare 500: log it, let the sender retry
            log.exception("internal_error", error=repr(exc))
            return self._nack(_INTERNAL, None, None, None)

    def _nack(
        self,
        error: NackError,
        request_id: str | None,
        to: str | None,
        sign_with: Partner | None,
        headers: dict[str, str] | None = None,
    ) -> web.Response:
        return _response(self._nack_reply(error, request_id, to, sign_with, headers))

    def _nack_reply(
        self,
        error: NackError,
        request_id: str | None,
        to: str | None,
        sign_with: Partner | None,
        headers: dict[str, str] | None = None,
    ) -> StoredReply:
        # Every refusal we answer with a nack (metrics count them by code).
        self.protocol.listeners.on_nack_sent(error)
        nack = nack_for(
            error,
            agent_id=self.agent_id,
            endpoint=self.endpoint,
            request_id=request_id,
            to=to,
        )
        # specs/protocol.md, 'Signatures': a 403 is never signed.
        body, reply_headers = encode_reply(nack, None if error.http_status == 403 else sign_with)
        reply_headers.update(headers or {})
        return StoredReply.of(error.http_status, body, reply_headers)

    async def _read_body(self, request: web.Request) -> bytes | RemoteProtocolError:
        limit = self.config.max_body_size

        def too_large() -> RemoteProtocolError:
            return RemoteProtocolError(
                ErrorCode.MESSAGE_FORMAT_INVALID,
                f"body exceeds the limit of {limit} bytes",
                {"reason": "too_large", "max_body_size": limit},
                http_status=413,
            )

        if request.content_length is not None and request.content_length > limit:
            return too_large()
        # Any Content-Encoding at all, each of several headers included ("identity" and
        # then "gzip" must not pass on the first one), and before anything inflates the body.
        encodings = request.headers.getall("Content-Encoding", [])
        transfer = [
            coding.strip().lower()
            for header in request.headers.getall("Transfer-Encoding", [])
            for coding in header.split(",")
        ]
        if encodings or any(coding != "chunked" for coding in transfer):
            encodings += [f"Transfer-Encoding {c}" for c in transfer if c != "chunked"]
            shown = ", ".join(e.strip() for e in encodings)
            return RemoteProtocolError(
                ErrorCode.MESSAGE_FORMAT_INVALID,
                f"Content-Encoding is not accepted (got {shown!r})",
                {"reason": "content_encoding"},
            )
        content_type = request.headers.get("Content-Type")
        if content_type is not None and not _is_json(request.content_type):
            return RemoteProtocolError(
                ErrorCode.MESSAGE_FORMAT_INVALID,
                f"Content-Type must be application/json, not {request.content_type!r}",
                {"reason": "content_type"},
            )
        if request.content_length is not None and request.content.is_eof():
            # The whole declared body came with the head (the usual small message): nothing
            # is left to wait for, so no body timer is armed.
            return await request.read()
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.body_timeout):
                if request.content_length is not None:
                    # Declared within the limit (checked above): aiohttp reads exactly that.
                    return await request.read()
                async for chunk in request.content.iter_chunked(65536):
                    size += len(chunk)
                    if size > limit:
                        return too_large()
                    chunks.append(chunk)
        except TimeoutError:
            return self._body_timeout_error()
        return b"".join(chunks)

    def _body_timeout_error(self) -> RemoteProtocolError:
        return RemoteProtocolError(
            ErrorCode.MESSAGE_FORMAT_INVALID,
            f"body not received within {self.body_timeout:g} s",
            {"reason": "body_timeout"},
            http_status=408,
        )

    def body_timeout_reply(self) -> StoredReply:
        """The unsigned 408 nack answering a body that did not arrive within `body_timeout`
        (the lean callback server's; aiohttp's path builds the same in `_read_body`)."""
        return self._nack_reply(self._body_timeout_error(), None, None, None)

    def framing_refusal(
        self, status: int, message: str, details: dict[str, Any] | None = None
    ) -> bytes:
        """The body of the unsigned nack answering what never became a request (malformed
        framing, a stalled head, no room for another connection): see `transport.guard`
        and `transport.admission`."""
        details = details or {"reason": "http"}
        error: NackError = (
            NotReady(message, details, http_status=status)  # no room: ours, not the sender's
            if status >= 500
            else RemoteProtocolError(
                ErrorCode.MESSAGE_FORMAT_INVALID, message, details, http_status=status
            )
        )
        return self._nack_reply(error, None, None, None).body

    async def _handle(self, request: web.Request) -> web.Response:
        body = await self._read_body(request)
        if isinstance(body, RemoteProtocolError):
            log.info("message_refused", status=body.http_status, code=body.code.value)
            response = self._nack(body, None, None, None)
            response.force_close()  # the rest of the body is not read
            return response
        return _response(await self.answer(body, request.headers, request.transport))

    @property
    def serves_callbacks_itself(self) -> bool:
        """True unless `handle`, `_handle` or `_read_body` is overridden (by a subclass or on
        the instance): then every POST goes through aiohttp and the override, and the lean
        callback server (`synapse.transport.http1_server`) steps aside."""
        cls = type(self)
        return (
            cls.handle is SynapseServer.handle
            and cls._handle is SynapseServer._handle
            and cls._read_body is SynapseServer._read_body
            and "handle" not in self.__dict__
        )

    async def answer(
        self, body: bytes, headers: Mapping[str, str], transport: object | None
    ) -> StoredReply:
        """The reply to one POST whose body was read within the limits: `headers` are the
        request's (case-insensitive), `transport` its connection (for mTLS). Never raises for
        a bad message: every refusal is a nack, an unexpected failure a 503."""
        try:
            return await self._answer(body, headers, transport)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # never a bare 500: log it, let the sender retry
            log.exception("internal_error", error=repr(exc))
            return self._nack_reply(_INTERNAL, None, None, None)

    async def _answer(
        self, body: bytes, headers: Mapping[str, str], transport: object | None
    ) -> StoredReply:
        now = self.utcnow()
        try:
            inbound = authenticate(
                body,
                headers.get("X-Synapse-Signature"),
                partners=self.partners,
                agent_id=self.agent_id,
                now=now,
                config=self.config,
            )
        except Refused as refused:
            log.info(
                "message_refused",
                message_id=refused.request_id,
                sender=refused.sender_id,
                status=refused.http_status,
                code=refused.error.code.value,
                reason=(refused.error.details or {}).get("reason", refused.error.message),
            )
            return self._nack_reply(
                refused.error, refused.request_id, refused.sender_id, refused.sign_with
            )
        head = inbound.head
        if not self.protocol.ready:
            # Recovery (loading the store) is not done: nothing can be judged yet.
            log.info("message_refused", message_id=head.id, code="agent_not_ready")
            return self._nack_reply(_STARTING, head.id, head.from_.agent_id, inbound.partner)
        # mTLS: a verified client certificate must name the partner the message claims to be.
        mismatch = check_partner_certificate(transport, head.from_.agent_id)
        if mismatch is not None:
            denied = RemoteProtocolError(
                ErrorCode.PERMISSION_DENIED, mismatch, {"reason": "certificate"}
            )
            log.info(
                "message_refused",
                message_id=head.id,
                sender=head.from_.agent_id,
                status=403,
                code=denied.code.value,
                reason="certificate",
            )
            return self._nack_reply(denied, head.id, head.from_.agent_id, None)
        wait = self._rate_wait(inbound.partner.agent_id)
        if wait:
            error = RemoteProtocolError(
                ErrorCode.RATE_LIMITED, "too many requests", {"retry_after": round(wait, 3)}
            )
            retry_after = str(max(1, round(wait + 0.5)))
            return self._nack_reply(
                error, head.id, head.from_.agent_id, inbound.partner, {"Retry-After": retry_after}
            )
        try:
            if self.route is not None:
                routed = await self.route(inbound, headers)
                if isinstance(routed, NackError):
                    return self._nack_reply(routed, head.id, head.from_.agent_id, inbound.partner)
                if routed is not None:
                    return routed
            self._expire(now)
            await self.dedup.prefetch(inbound.key, now)
            while True:
                begun = self.dedup.begin(
                    inbound.key, inbound.fingerprint, now=now, timestamp=head.timestamp
                )
                if begun.outcome is DedupOutcome.NEW:
                    break
                if begun.outcome is DedupOutcome.DUPLICATE:
                    assert begun.reply is not None
                    log.info("message_duplicate", message_id=head.id, sender=head.from_.agent_id)
                    return begun.reply
                if begun.outcome is DedupOutcome.REUSED:
                    error = RemoteProtocolError(
                        ErrorCode.INVALID_PARAMS,
                        f"message id {head.id!r} was already used for another message",
                        {"reason": "id_reused"},
                    )
                    return self._nack_reply(error, head.id, head.from_.agent_id, inbound.partner)
                assert begun.waiter is not None
                stored = await begun.waiter
                if stored is not None:
                    return stored
        except StoreUnavailable as exc:
            # Where the task is worked on, or whether the message came before, cannot be
            # read now (the database out of reach): nothing was begun; the sender retries.
            return self._store_unavailable(exc, inbound)
        try:
            reply = await self._process(inbound)
            storable = is_storable(reply.status)
            # A 200 was committed with the message's effects (`handle_message`); a refusal
            # changed nothing, and only its stored reply remains to be written.
            if storable and reply.status != 200:
                # A refusal: its stored reply is durable before anyone sees it, a duplicate
                # waiting for it included (the message's effects were, by `_process`).
                mark = self.protocol.store.mark()
                self.dedup.stage(inbound.key, reply)
                try:
                    await self.protocol.store.commit(discard_after=mark)
                except StoreUnavailable:
                    storable = False
                    reply = self._nack_reply(
                        _STORE_UNAVAILABLE, head.id, head.from_.agent_id, inbound.partner
                    )
        except StoreUnavailable as exc:  # a lookup of the message's task, say
            self.dedup.abandon(inbound.key)
            return self._store_unavailable(exc, inbound)
        except Exception as exc:
            # Our bug, but the sender is authenticated: its 503 is addressed and signed.
            self.dedup.abandon(inbound.key)
            log.exception("internal_error", message_id=head.id, error=repr(exc))
            return self._nack_reply(_INTERNAL, head.id, head.from_.agent_id, inbound.partner)
        except BaseException:
            self.dedup.abandon(inbound.key)
            raise
        if storable:
            self.dedup.complete(inbound.key, reply)
        else:
            self.dedup.abandon(inbound.key)
        return reply

    def _store_unavailable(self, exc: StoreUnavailable, inbound: Inbound) -> StoredReply:
        """The 503 to a message the store could not judge now (nothing of it applied)."""
        head = inbound.head
        log.warning("store_unavailable", message_id=head.id, error=str(exc))
        return self._nack_reply(_STORE_UNAVAILABLE, head.id, head.from_.agent_id, inbound.partner)

    async def _process(self, inbound: Inbound) -> StoredReply:
        """The reply to an authenticated message: a 200 is committed with the message's
        effects when this returns; a refusal (a nack) is not stored yet."""
        head = inbound.head
        started = time.perf_counter()
        staged: list[StoredReply] = []

        def stage(reply: Message) -> None:
            # The stored reply is committed with the message's effects, or dropped with them.
            body, headers = encode_reply(reply, inbound.partner)
            staged.append(StoredReply.of(200, body, headers))
            self.dedup.stage(inbound.key, staged[0])

        debug = _stdlib_log.isEnabledFor(logging.DEBUG)
        message = inbound.message
        try:
            if message is None:
                message = decode_typed(inbound.body)
        except RemoteProtocolError as malformed:
            receipt = Receipt(None, malformed, None, None, None)
        else:
            receipt = await self.protocol.receive_message(message, stage=stage, states=debug)
        refusal = receipt.error
        if refusal is not None:
            log.debug(
                "message_in",
                message_id=head.id,
                type=head.type.value,
                sender=head.from_.agent_id,
                task_id=receipt.task_id,
                from_state=_value(receipt.from_state),
                to_state=_value(receipt.to_state),  # a refused message changes nothing
                status=refusal.http_status,
                code=refusal.code.value,
                reason=refusal.message,
            )
            return self._nack_reply(refusal, head.id, head.from_.agent_id, inbound.partner)
        reply = receipt.reply
        assert reply is not None
        if debug:
            log.debug(
                "message_in",
                message_id=head.id,
                type=head.type.value,
                sender=head.from_.agent_id,
                task_id=receipt.task_id,
                from_state=_value(receipt.from_state),
                to_state=_value(receipt.to_state),
                reply=reply.message_type.value,
                status=200,
                signed_by=inbound.signed_by,
                ms=round((time.perf_counter() - started) * 1000, 3),
            )
        return staged[0]

    def _rate_wait(self, partner: str) -> float:
        if self.rate_limit is None:
            return 0.0
        bucket = self._buckets.get(partner)
        if bucket is None:
            bucket = _TokenBucket(self.rate_limit, self.rate_burst, self.rate_clock())
            self._buckets[partner] = bucket
        return bucket.take(self.rate_clock())

    def _expire(self, now: datetime) -> None:
        # Purging is cheap but need not run on every request.
        tick = self.rate_clock()
        if tick - self._last_expiry >= 1.0:
            self._last_expiry = tick
            self.dedup.expire(now)


def _value(state: TaskState | None) -> str | None:
    return state.value if state is not None else None


def _is_json(content_type: str) -> bool:
    return content_type == "application/json" or content_type.endswith("+json")


def _response(stored: StoredReply) -> web.Response:
    return web.Response(status=stored.status, body=stored.body, headers=stored.header_dict)


__all__ = ["DEFAULT_PATH", "SynapseServer"]
