"""A lean HTTP/1.1 server for the callback route, in front of aiohttp's.

Nearly every request a peer receives is one small signed POST to its callback path, sent by
a partner on a kept-alive connection. aiohttp's server spends much of such an exchange on
what a callback never uses (its `Request` and `Response` objects, routing, middlewares, a
streaming payload reader, signals). `CallbackConnection` reads those POSTs itself and hands
their body to `SynapseServer.answer`, which applies every check of the aiohttp path (it is
the same code); anything else on the connection goes to aiohttp, for the rest of the
connection's life:

- served here: `POST <callback path> HTTP/1.1` with one `Content-Length` within the body
  limit, no `Transfer-Encoding`, `Content-Encoding`, `Expect` or `Upgrade`, a JSON
  `Content-Type` (or none), header lines of plain visible ASCII, no header given twice;
- handed over, with every byte received so far: anything else (another path or method,
  HTTP/1.0, chunked bodies, an oversized or unparsable head, a body over the limit), so that
  its answer is aiohttp's with the guard's envelope refusals, exactly as without this server;
- the guard's limits hold on both sides: the connection counts against `max_connections`
  (and may be evicted while it waits for a head), a head must be complete within
  `header_timeout` of its first byte, a body within `body_timeout` of its head (else 408
  with an unsigned nack, and the connection closes), an idle connection closes after
  `keepalive_timeout`;
- requests are answered in order, one at a time; pipelined ones wait in the buffer, and
  reading pauses while more than a body's worth is waiting or the client does not read
  its replies;
- a reply carries `Content-Type`, `Content-Length`, `Date` and the stored reply's headers
  (its signature), and `Connection: close` when the client asked for it.

It is used by `Peer` for plain-`http` serving when every middleware of the app says the
callback route may skip it (`LEAN_CALLBACKS`: the metrics middleware does, and takes its
observation from here instead), and while the `SynapseServer` is not overridden
(`SynapseServer.serves_callbacks_itself`). TLS, tracing middlewares and applications that
mount `SynapseServer.add_routes` into their own server keep aiohttp for every request.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import socket
import time
from collections.abc import Awaitable, Callable
from email.utils import formatdate
from typing import Any, Protocol, cast

from multidict import CIMultiDict

from synapse.p2p.dedup import StoredReply
from synapse.p2p.logs import get_logger

log = get_logger("synapse.transport")

#: The attribute a middleware carries when the callback route may skip it: None (it does
#: nothing there) or a callable `(method, path, status, seconds)` to call after each
#: callback served without aiohttp.
LEAN_CALLBACKS = "synapse_lean_callbacks"
#: The longest request head read here; a longer one goes to aiohttp (which refuses it).
MAX_HEAD = 16 * 1024
_END_OF_HEAD = b"\r\n\r\n"
_TOKEN_CHARS = frozenset(
    b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
)
#: Header values served here: visible ASCII, space and tab (obs-text goes to aiohttp).
_VALUE_CHARS = frozenset(range(0x20, 0x7F)) | {0x09}
#: Request headers whose presence sends the request to aiohttp.
_NOT_HERE = frozenset({"transfer-encoding", "content-encoding", "expect", "upgrade"})
_PHRASES = {status.value: status.phrase for status in http.HTTPStatus}


def _phrase(status: int) -> str:
    return _PHRASES.get(status, "Unknown")


class _Clock:
    """The `Date` header, formatted once a second."""

    __slots__ = ("line", "second")

    def __init__(self) -> None:
        self.second = -1
        self.line = b""

    def date_line(self) -> bytes:
        now = int(time.time())
        if now != self.second:
            self.second = now
            self.line = b"Date: " + formatdate(now, usegmt=True).encode("ascii") + b"\r\n"
        return self.line


_CLOCK = _Clock()


class Timeouts(Protocol):
    """The seconds a connection is given (`synapse.transport.guard.HttpLimits`)."""

    @property
    def header_timeout(self) -> float: ...
    @property
    def body_timeout(self) -> float: ...
    @property
    def keepalive_timeout(self) -> float: ...


class CallbackRoute:
    """What `CallbackConnection` serves: `path` answered by `answer`, with the limits of
    `limits` and `max_body` bytes per body; `observers` see every reply (metrics)."""

    def __init__(
        self,
        path: str,
        answer: Callable[[bytes, CIMultiDict[str], asyncio.BaseTransport], Awaitable[StoredReply]],
        *,
        max_body: int,
        limits: Timeouts,
        timeout_reply: Callable[[], StoredReply],
        enabled: Callable[[], bool] = lambda: True,
    ) -> None:
        self.path = path
        self.target = path.encode("ascii")
        self.answer = answer
        self.max_body = max_body
        self.limits = limits
        #: The reply (an unsigned nack) to a body that does not arrive within the limit.
        self.timeout_reply = timeout_reply
        #: Checked on every head: False sends the connection to aiohttp.
        self.enabled = enabled
        self.observers: list[Callable[[str, str, int, float], None]] = []
        #: Requests served here and connections handed over (tests and benchmarks read them).
        self.served = 0
        self.handed_over = 0


class _Head:
    __slots__ = ("close", "headers", "length")

    def __init__(self, headers: CIMultiDict[str], length: int, close: bool) -> None:
        self.headers = headers
        self.length = length
        self.close = close


class CallbackConnection(asyncio.Protocol):
    """One connection: callback POSTs served here, anything else handed to aiohttp."""

    def __init__(
        self,
        route: CallbackRoute,
        guard: Any,
        fallback: Callable[[], asyncio.Protocol],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.route = route
        self.guard = guard
        self.fallback = fallback
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        #: True while no request head is complete (the guard evicts such connections first).
        self.awaiting_head = True
        self._buffer = bytearray()
        self._head: _Head | None = None
        #: The head or body timer, armed only while a head or a body is incomplete.
        self._timer: asyncio.TimerHandle | None = None
        #: The keep-alive timer: armed once, it re-arms itself while the connection is used.
        self._idle_timer: asyncio.TimerHandle | None = None
        self._idle_since = 0.0
        self._task: asyncio.Task[None] | None = None
        self._reading_paused = False
        self._writing_paused = False
        self._eof = False
        self._closed = False

    # --- the connection ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not `asyncio.Transport` subclasses, only alike.
        transport = cast(asyncio.Transport, transport)
        self.transport = transport
        if not self.guard.admit(self):
            self._closed = True
            turn_away(transport, self.guard.refusal)
            return
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # The first head must come within the head timeout of the connection opening.
        self._arm(self.route.limits.header_timeout, self._head_stalled)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._stop_timers()
        self._closed = True
        self.guard.gone(self)
        # A request being answered goes on (its effects may be committed); its reply is lost
        # with the connection, and the sender's retry finds it in the dedup table.

    def eof_received(self) -> bool:
        self._eof = True
        if self._task is None and not self._buffer and self._head is None:
            self._stop_timers()
            self._closed = True
            self.guard.gone(self)
            return False  # nothing in progress: the transport closes
        if self._task is None:
            self._advance()
        return True  # answer what came, then close

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        if self._task is None and not self._closed:
            self._resume_reading()
            self._advance()

    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        self._buffer += data
        if self._task is not None or self._writing_paused:
            # The next request waits for this one's reply; stop reading once more than a
            # body's worth is queued.
            if len(self._buffer) > self.route.max_body + MAX_HEAD:
                self._pause_reading()
            return
        self._advance()

    # --- requests ---------------------------------------------------------------------------

    def _advance(self) -> None:
        """Start on the next request in the buffer if it is complete, else arm its timer."""
        if self._writing_paused or self._closed:
            return
        head = self._head
        if head is None:
            end = self._buffer.find(_END_OF_HEAD, 0, MAX_HEAD + 4)
            if end < 0:
                if len(self._buffer) > MAX_HEAD or (self._eof and self._buffer):
                    self._hand_over()  # aiohttp refuses it as it would without us
                elif self._eof:
                    self._close()
                elif self._buffer and self._timer is None:
                    # Its first bytes: the head must be complete within the head timeout.
                    self._arm(self.route.limits.header_timeout, self._head_stalled)
                return
            parsed = self._parse_head(bytes(self._buffer[:end]))
            if parsed is None:
                self._hand_over()
                return
            del self._buffer[: end + 4]
            head = self._head = parsed
            self.awaiting_head = False
            self._disarm()
        if len(self._buffer) < head.length:
            if self._eof:
                self._close()  # the body will never come
            elif self._timer is None:
                self._arm(self.route.limits.body_timeout, self._body_stalled)
            return
        self._disarm()
        body = bytes(self._buffer[: head.length])
        del self._buffer[: head.length]
        self._head = None
        self._task = self.loop.create_task(self._serve(body, head))

    def _parse_head(self, raw: bytes) -> _Head | None:
        """The head of a callback POST served here, or None: aiohttp's to answer."""
        route = self.route
        if not route.enabled():
            return None
        lines = raw.split(b"\r\n")
        method, _, rest = lines[0].partition(b" ")
        target, _, version = rest.partition(b" ")
        if method != b"POST" or target != route.target or version != b"HTTP/1.1":
            return None
        headers: CIMultiDict[str] = CIMultiDict()
        length = -1
        close = False
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon or not name or not _TOKEN_CHARS.issuperset(name):
                return None
            value = value.strip(b" \t")
            if not _VALUE_CHARS.issuperset(value):
                return None
            key = name.decode("ascii").lower()
            if key in headers or key in _NOT_HERE:  # given twice, or not served here
                return None
            text = value.decode("ascii")
            if key == "content-length":
                if not text.isdigit():
                    return None
                length = int(text)
            elif key == "connection":
                tokens = {t.strip().lower() for t in text.split(",")}
                if not tokens <= {"close", "keep-alive"}:
                    return None
                close = "close" in tokens
            elif key == "content-type":
                media = text.partition(";")[0].strip().lower()
                if media != "application/json" and not media.endswith("+json"):
                    return None
            headers.add(name.decode("ascii"), text)
        if length < 0 or length > route.max_body:
            return None
        return _Head(headers, length, close)

    async def _serve(self, body: bytes, head: _Head) -> None:
        route = self.route
        transport = self.transport
        assert transport is not None
        started = time.perf_counter()
        try:
            reply: StoredReply = await route.answer(body, head.headers, transport)
        except Exception as exc:  # `answer` answers every failure: a bug of ours
            log.exception("internal_error", error=repr(exc))
            self._close()
            return
        finally:
            self._task = None
        route.served += 1
        # A client that half-closed after its requests gets all their replies, then EOF.
        close = head.close or (self._eof and not self._buffer)
        self._write(reply, close)
        elapsed = time.perf_counter() - started
        for observer in route.observers:
            observer("POST", route.path, reply.status, elapsed)
        if close:
            self._close()
            return
        if self._closed:
            return
        self.awaiting_head = True
        self._idle_since = self.loop.time()
        if self._idle_timer is None:
            self._idle_timer = self.loop.call_later(self.route.limits.keepalive_timeout, self._idle)
        self._resume_reading()
        if self._buffer:
            self._advance()

    def _write(self, reply: StoredReply, close: bool) -> None:
        transport = self.transport
        if transport is None or self._closed or transport.is_closing():
            return
        parts = [
            b"HTTP/1.1 %d %s\r\n" % (reply.status, _phrase(reply.status).encode("ascii")),
            _CLOCK.date_line(),
            b"Content-Length: %d\r\n" % len(reply.body),
        ]
        for name, value in reply.headers:
            parts.append(f"{name}: {value}\r\n".encode("latin-1"))
        if close:
            parts.append(b"Connection: close\r\n")
        parts.append(b"\r\n")
        parts.append(reply.body)
        transport.write(b"".join(parts))

    # --- handing over -----------------------------------------------------------------------

    def _hand_over(self) -> None:
        """Give the connection, with every byte received, to aiohttp for the rest of its life."""
        transport = self.transport
        assert transport is not None and self._task is None
        self._stop_timers()
        self.guard.gone(self)
        self.route.handed_over += 1
        self._closed = True  # nothing more arrives here
        handler = self.fallback()
        transport.set_protocol(handler)
        handler.connection_made(transport)
        self._resume_reading()
        if self._buffer:
            handler.data_received(bytes(self._buffer))
            self._buffer.clear()
        if self._eof:
            handler.eof_received()

    # --- timers -----------------------------------------------------------------------------

    def _arm(self, delay: float, callback: Callable[[], None]) -> None:
        self._disarm()
        self._timer = self.loop.call_later(delay, callback)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _stop_timers(self) -> None:
        self._disarm()
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def _head_stalled(self) -> None:
        self._timer = None
        if self.awaiting_head and self._task is None and not self._closed:
            self.guard.stalled += 1
            self.close_stalled(408, "Request Timeout", "request head not received in time")

    def _body_stalled(self) -> None:
        self._timer = None
        if self._head is not None and self._task is None and not self._closed:
            log.info("message_refused", status=408, code="message_format_invalid")
            self._head = None
            self._write(self.route.timeout_reply(), close=True)
            self._close()

    def _idle(self) -> None:
        """The keep-alive timer: close a connection idle for `keepalive_timeout`."""
        self._idle_timer = None
        if self._closed:
            return
        keepalive = self.route.limits.keepalive_timeout
        left = self._idle_since + keepalive - self.loop.time()
        if self._task is not None or self._buffer or self._head is not None or left > 0:
            # In use since it was armed: look again when it could next have been idle long
            # enough (a head or body in progress has its own timer).
            self._idle_timer = self.loop.call_later(max(left, 0.0) or keepalive, self._idle)
            return
        self._close()

    def close_stalled(self, status: int, phrase: str, reason: str) -> None:
        """Answer a connection that has no request in progress, and close it (the guard)."""
        transport = self.transport
        if transport is not None and not transport.is_closing() and not self._closed:
            with contextlib.suppress(Exception):
                transport.write(raw_response(status, phrase, self.guard.refusal(status, reason)))
        self._close()

    def _pause_reading(self) -> None:
        if not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            with contextlib.suppress(Exception):
                self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if self._reading_paused and self.transport is not None:
            self._reading_paused = False
            with contextlib.suppress(Exception):
                self.transport.resume_reading()

    def _close(self) -> None:
        self._stop_timers()
        self.guard.gone(self)
        self._closed = True
        if self.transport is not None:
            self.transport.close()

    # --- stopping ---------------------------------------------------------------------------

    async def shutdown(self, timeout: float) -> None:
        """Let the request being answered finish (up to `timeout` s), then close."""
        task = self._task
        if task is not None:
            await asyncio.wait([task], timeout=timeout)
        if not self._closed:
            self._close()


def turn_away(transport: asyncio.BaseTransport, refusal: Callable[[int, str], bytes]) -> None:
    """Answer a connection the guard has no room for with a 503 nack, and close it."""
    body = refusal(503, "too many connections; retry later")
    with contextlib.suppress(Exception):
        cast(asyncio.Transport, transport).write(raw_response(503, "Service Unavailable", body))
    transport.close()


def raw_response(status: int, phrase: str, body: bytes) -> bytes:
    """A whole JSON response that closes the connection."""
    head = (
        f"HTTP/1.1 {status} {phrase}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


__all__ = ["LEAN_CALLBACKS", "CallbackConnection", "CallbackRoute", "raw_response", "turn_away"]
