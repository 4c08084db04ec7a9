"""The HTTP server side of a peer under attack: slow clients cannot starve it.

aiohttp waits for a request's head as long as a client cares to dribble it, keeps at most
its keep-alive timer on a connection that says nothing, accepts connections until the process
runs out of descriptors, and answers framing it cannot parse with plain text. `GuardedSite`
serves a peer's app with

- a head timeout: a request's head (request line and headers) must be complete within
  `header_timeout` of its first byte (or of the connection opening); a stalled connection is
  answered 408 with an envelope nack and closed;
- a keep-alive idle timeout (`keepalive_timeout`) between requests;
- a cap on open connections (`max_connections`, at most the descriptor limit less a margin):
  at the cap, the oldest idle connection makes room, closed without a word (a partner's
  POST may be crossing it: nothing said about a connection may be read as an answer to a
  message), else the oldest one with part of a request head (408), or, if none does, the
  new one is answered 503 `agent_not_ready` (retryable) and closed;
- a bound on the bytes all connections of the lean callback server hold together
  (`max_buffered`), shared fairly: past it, a connection holding no more than its share
  (the bound divided among the connections holding bytes) reads on, and room is made for
  it by shedding the largest partial requests held beyond their share, on which nothing is
  being answered (503 `agent_not_ready`, retryable); the others stop reading until half of
  the bound is free, or until they hold less than their share again. A client opening many
  connections to hold half-sent bodies cannot make a partner's callback wait;
- the admission table of `synapse.transport.admission`: aiohttp's parser gets its limits,
  and what it refuses (malformed HTTP framing) is answered with an unsigned envelope nack
  (400 `message_format_invalid`), not aiohttp's plain text;
- no automatic decompression: a body is never inflated before the handler refuses its
  `Content-Encoding`;
- one log line at most every `ACCEPT_LOG_EVERY` seconds when `accept()` fails (out of
  descriptors), with the count, instead of one per failure.

The body timeout (`body_timeout`) is enforced where the body is read (`SynapseServer`, or
`synapse.transport.http1_server` for the callback POSTs it reads in front of aiohttp: its
connections count against the same cap and keep the same timeouts).
`Peer` serves through this site; an application that mounts `SynapseServer.add_routes` into
its own aiohttp server keeps that server's own limits (pass `auto_decompress=False` and a
`keepalive_timeout` to its runner, and serve it through `GuardedSite`, to get these).
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import StreamResponse

from synapse.logs import get_logger
from synapse.transport.admission import PARSER_LIMITS, NotAdmitted
from synapse.transport.http1_server import (
    CallbackConnection,
    CallbackRoute,
    raw_response,
    turn_away,
)

log = get_logger("synapse.transport")

#: (HTTP status, message, `details`) → the JSON body of an unsigned nack saying so.
Refusal = Callable[[int, str, dict[str, Any]], bytes]

#: Seconds between two log lines about failing `accept()` calls.
ACCEPT_LOG_EVERY = 10.0
#: Descriptors kept free below the process limit for the store, the client and logs.
FD_MARGIN = 64


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """Timeouts (seconds) and the connection cap of a peer's HTTP server."""

    header_timeout: float = 10.0
    body_timeout: float = 30.0
    keepalive_timeout: float = 75.0
    max_connections: int = 1024
    #: Bytes the lean callback server's connections may hold together (read ahead, not yet
    #: answered), counting those that hold more than 64 KiB; each holds at most a body and a
    #: head's worth on its own.
    max_buffered: int = 64 * 1024 * 1024

    def effective_max_connections(self) -> int:
        """`max_connections`, lowered to stay under the process's descriptor limit."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return self.max_connections
        return max(8, min(self.max_connections, soft - FD_MARGIN))

    def runner_kwargs(self) -> dict[str, Any]:
        """What `web.AppRunner` passes to every connection's handler."""
        return {
            "keepalive_timeout": self.keepalive_timeout,
            "auto_decompress": False,
            # After a refusal aiohttp reads what is left of the body before closing, for up
            # to this long (10 s by default): a slow client must not hold it that long.
            "lingering_time": min(1.0, self.body_timeout),
            # The admission table's limits, enforced by aiohttp's own parser.
            **PARSER_LIMITS,
        }


class ConnectionGuard:
    """The open connections of one site, oldest first, and the bytes they hold."""

    def __init__(self, limits: HttpLimits, refusal: Refusal) -> None:
        self.limits = limits
        self.refusal = refusal
        self.cap = limits.effective_max_connections()
        self.open: dict[GuardedHandler | CallbackConnection, None] = {}
        self.stalled = 0
        self.evicted = 0
        self.refused = 0
        #: Partial requests shed to make room for connections within their share.
        self.shed = 0
        #: Bytes held by the lean server's connections (those that count), in all and by
        #: connection, and the connections waiting for room.
        self.held = 0
        self._holding: dict[CallbackConnection, int] = {}
        self._starved: dict[CallbackConnection, None] = {}
        self._shedding = False

    def admit(self, handler: GuardedHandler | CallbackConnection) -> bool:
        if len(self.open) >= self.cap:
            victim = next((h for h in self.open if h.idle), None)
            if victim is None:
                victim = next((h for h in self.open if h.awaiting_head), None)
            if victim is None:
                self.refused += 1
                return False
            self.evicted += 1
            victim.close_stalled("connection cap reached")
        self.open[handler] = None
        return True

    def gone(self, handler: GuardedHandler | CallbackConnection) -> None:
        self.open.pop(handler, None)
        if isinstance(handler, CallbackConnection):
            self._starved.pop(handler, None)

    # --- the bytes held across connections --------------------------------------------------

    def hold(self, connection: CallbackConnection, size: int) -> None:
        """`connection` holds `size` more bytes (fewer, if negative) that count against the
        shared bound."""
        self.held += size
        counted = self._holding.get(connection, 0) + size
        if counted > 0:
            self._holding[connection] = counted
        else:
            self._holding.pop(connection, None)
        if size < 0 and self._starved and not self._shedding:
            self._wake()

    def share(self) -> int:
        """The bytes each connection holding any may hold when all of them are at the bound."""
        return self.limits.max_buffered // max(1, len(self._holding))

    def over(self, connection: CallbackConnection) -> bool:
        """Whether `connection` must stop reading: all connections together hold more than
        allowed, and it holds more than its share or no room can be made for it."""
        bound = self.limits.max_buffered
        if self.held <= bound:
            return False
        if self._holding.get(connection, 0) <= self.share():
            self._make_room(connection)
            if self.held <= bound:
                self._starved.pop(connection, None)
                return False
        self._starved[connection] = None
        return True

    def room(self, connection: CallbackConnection) -> bool:
        """Whether `connection`, waiting, may read again: the connections together hold
        little, or it holds less than its share and the bound is not passed."""
        held, bound = self.held, self.limits.max_buffered
        if held <= bound // 2:
            return True
        return held <= bound and self._holding.get(connection, 0) < self.share()

    def _make_room(self, connection: CallbackConnection) -> None:
        """Shed partial requests held beyond their share, the largest first, until the
        bound holds again or none is left: a client's half-sent bodies give way to a
        connection within its share. A connection answering a request is never shed."""
        self._shedding = True
        try:
            while self.held > self.limits.max_buffered:
                share = self.share()
                victim = max(
                    (
                        other
                        for other, counted in self._holding.items()
                        if counted > share and other is not connection and other.partial
                    ),
                    key=self._holding.__getitem__,
                    default=None,
                )
                if victim is None:
                    break
                self.shed += 1
                victim.shed(share)
        finally:
            self._shedding = False
        if self._starved:
            self._wake()

    def _wake(self) -> None:
        """Let the waiting connections that may read again do so."""
        waking = [waiting for waiting in self._starved if self.room(waiting)]
        for waiting in waking:
            self._starved.pop(waiting, None)
        for waiting in waking:
            waiting.read_on()


class GuardedHandler(RequestHandler):
    """aiohttp's connection handler with a head timeout, a cap and envelope refusals."""

    guard: ConnectionGuard

    def __init__(self, manager: Any, *, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self.guard = guard
        #: True while no request head is complete (at first, and after each response).
        self.awaiting_head = True
        #: True while not a byte of the next request has arrived.
        self.idle = True
        self._head_timer: asyncio.TimerHandle | None = None

    # --- the connection ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self.guard.admit(self):
            turn_away(transport, self.guard.refusal)
            return
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm_head_timer()
        self.guard.gone(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.awaiting_head and data and self._head_timer is None:
            self._arm_head_timer()  # the first byte of the next request on a kept-alive one
        if data:
            self.idle = False
        before = self._request_count
        super().data_received(data)
        if self._request_count != before:
            self.awaiting_head = False
            self._disarm_head_timer()

    async def finish_response(
        self, request: BaseRequest, resp: StreamResponse, start_time: float | None
    ) -> tuple[StreamResponse, bool]:
        try:
            return await super().finish_response(request, resp, start_time)
        finally:
            # Idle now: the keep-alive timer runs until a byte comes.
            self.awaiting_head = self.idle = True

    # --- the head timeout -------------------------------------------------------------------

    def _arm_head_timer(self) -> None:
        self._disarm_head_timer()
        self._head_timer = self._loop.call_later(self.guard.limits.header_timeout, self._stalled)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _stalled(self) -> None:
        self._head_timer = None
        if self.awaiting_head:
            self.guard.stalled += 1
            self.close_stalled("request head not received in time")

    def close_stalled(self, reason: str) -> None:
        """End a connection with no request in progress: an idle one without a word, one
        with part of a request head with a 408 (see `CallbackConnection.close_stalled`)."""
        self._disarm_head_timer()
        self.guard.gone(self)
        transport = self.transport
        if not self.idle and transport is not None and not transport.is_closing():
            refused = NotAdmitted("head_timeout", reason)
            body = self.guard.refusal(refused.status, refused.message, refused.details)
            with contextlib.suppress(Exception):
                transport.write(raw_response(refused.status, "Request Timeout", body))
        self.force_close()

    # --- malformed framing ------------------------------------------------------------------

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> StreamResponse:
        if status >= 500 or request.writer.output_size > 0:
            return super().handle_error(request, status, exc, message)
        log.info("http_refused", status=status, reason=message or repr(exc))
        body = self.guard.refusal(
            status, f"malformed HTTP request: {message or exc}", {"reason": "http"}
        )
        response = web.Response(status=status, body=body, content_type="application/json")
        response.force_close()
        return response


class GuardedSite(web.TCPSite):
    """`web.TCPSite` whose connections get `GuardedHandler` (see the module docstring)."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        *,
        limits: HttpLimits,
        refusal: Refusal,
        reuse_address: bool = True,
        ssl_context: ssl.SSLContext | None = None,
        callbacks: CallbackRoute | None = None,
    ) -> None:
        super().__init__(runner, host, port, reuse_address=reuse_address, ssl_context=ssl_context)
        self.guard = ConnectionGuard(limits, refusal)
        #: The callback route served by `synapse.transport.http1_server` in front of aiohttp
        #: (plain HTTP only), or None: aiohttp serves every request.
        self.callbacks = callbacks if ssl_context is None else None

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None
        kwargs: dict[str, Any] = dict(getattr(server, "_kwargs", {}))
        guard = self.guard

        def aiohttp_handler() -> GuardedHandler:
            return GuardedHandler(server, loop=loop, guard=guard, **kwargs)

        callbacks = self.callbacks

        def handler() -> asyncio.Protocol:
            if callbacks is None:
                return aiohttp_handler()
            return CallbackConnection(callbacks, guard, aiohttp_handler, loop)

        _rate_limit_accept_errors(loop)
        self._server = await loop.create_server(
            handler,
            self._host,
            self._port,
            reuse_address=self._reuse_address,
            reuse_port=self._reuse_port,
            backlog=self._backlog,
            ssl=self._ssl_context,
        )

    async def stop(self) -> None:
        await super().stop()
        # aiohttp's runner closes its own connections; those served by the callback server
        # finish the request they are answering (as aiohttp's do), then close.
        lean = [c for c in self.guard.open if isinstance(c, CallbackConnection)]
        if lean:
            await asyncio.gather(*(c.shutdown(SHUTDOWN_TIMEOUT) for c in lean))


#: Seconds a connection of the callback server may take to finish its request at stop.
SHUTDOWN_TIMEOUT = 60.0

_ACCEPT_MESSAGE = "socket.accept() out of system resource"


def _rate_limit_accept_errors(loop: asyncio.AbstractEventLoop) -> None:
    """Replace asyncio's one log record per failed `accept()` by one line now and then."""
    previous = loop.get_exception_handler()
    if getattr(previous, "synapse_accept_limiter", False):
        return
    state = {"count": 0, "last": 0.0}

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") == _ACCEPT_MESSAGE:
            state["count"] += 1
            now = time.monotonic()
            if now - state["last"] >= ACCEPT_LOG_EVERY:
                log.error(
                    "accept_failed",
                    error=repr(context.get("exception")),
                    failures=int(state["count"]),
                    every_s=ACCEPT_LOG_EVERY,
                )
                state["count"], state["last"] = 0, now
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    handler.synapse_accept_limiter = True  # type: ignore[attr-defined]
    loop.set_exception_handler(handler)


__all__ = ["GuardedHandler", "GuardedSite", "HttpLimits"]
