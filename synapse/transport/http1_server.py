"""A lean HTTP/1.1 server for the callback route, in front of aiohttp's.

Nearly every request a peer receives is one small signed POST to its callback path, sent by
a partner on a kept-alive connection. aiohttp's server spends much of such an exchange on
what a callback never uses (its `Request` and `Response` objects, routing, middlewares, a
streaming payload reader, signals). `CallbackConnection` reads every request head on its
connection itself, admits it by the table of `synapse.transport.admission`, serves callback
POSTs by handing their body to `SynapseServer.answer` (the same checks as the aiohttp path),
and gives anything else to aiohttp, for the rest of the connection's life:

- refused here, with an unsigned nack and a close: every head the admission table refuses
  (malformed framing, a line too long, too many headers, no `Host`, a TLS ClientHello, bare
  LF line ends, an upgrade, a `Content-Length` over the body limit, with or without
  `Expect: 100-continue`), at once, even before the head is complete when its first bytes
  already rule it out;
- served here: `POST <callback path> HTTP/1.1` with one `Content-Length` within the body
  limit, no `Transfer-Encoding`, `Content-Encoding`, `Expect` or `Upgrade`, a JSON
  `Content-Type` (or none), header values of plain ASCII, no header given twice;
- handed over, with every byte received so far: any other head that got in (another path or
  method, HTTP/1.0, a chunked body, a head longer than `MAX_HEAD`), so that its answer is
  aiohttp's, exactly as without this server;
- the guard's limits hold on both sides: the connection counts against `max_connections`
  (an idle one may be evicted for room, without a word), a head must be complete within
  `header_timeout` of its first byte, a body within `body_timeout` of its head (else 408
  with an unsigned nack, and the connection closes), an idle connection closes after
  `keepalive_timeout`, and so does one whose client leaves its replies unread that long;
- requests are answered in order, one at a time. Pipelined ones are read ahead within
  bounds: at most `MAX_PIPELINED` parsed requests and `max_body + MAX_HEAD` bytes per
  connection, and `HttpLimits.max_buffered` bytes across all of them; past a bound, reading
  pauses, and resumes only once the connection holds half as much;
- a reply carries `Content-Type`, `Content-Length`, `Date` and the stored reply's headers
  (its signature), and `Connection: close` when the client asked for it.

It is used by `Peer` for plain-`http` serving when every middleware of the app says the
callback route may skip it (`LEAN_CALLBACKS`: the metrics middleware does, and takes its
observation from here instead, as a listener's `on_http_request`), and while the
`SynapseServer` is not overridden (`SynapseServer.serves_callbacks_itself`). TLS, tracing
middlewares and applications that mount `SynapseServer.add_routes` into their own server keep
aiohttp for every request.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable
from email.utils import formatdate
from typing import Any, Final, Protocol, cast

from multidict import CIMultiDict

from synapse.logs import get_logger
from synapse.p2p.dedup import StoredReply
from synapse.runtime.listener import Listeners
from synapse.transport.admission import (
    MAX_HEADERS,
    PLAIN_FIELD,
    TOKEN_BYTES,
    Head,
    NotAdmitted,
    check_head,
    check_partial,
)

log = get_logger("synapse.transport")

#: The attribute a middleware carries when the callback route may skip it: None (it does
#: nothing there) or a callable `(method, path, status, seconds)` to call after each
#: callback served without aiohttp.
LEAN_CALLBACKS = "synapse_lean_callbacks"
#: The longest request head read here; a longer one goes to aiohttp (which judges it).
MAX_HEAD = 16 * 1024
#: The most parsed requests one connection may have waiting behind the one being answered.
MAX_PIPELINED = 32
#: Bytes a connection may hold without counting against `HttpLimits.max_buffered`: the
#: usual request or two, so that the shared count is touched only under load.
_UNCOUNTED = 64 * 1024
#: Seconds a refused client is given to stop sending before its connection closes.
LINGER = 1.0
_END_OF_HEAD = b"\r\n\r\n"
_LEAN_CONNECTION = frozenset({b"close", b"keep-alive"})
_LEAN_OPTIONS = frozenset({"close", "keep-alive"})
#: What the head of a plain callback POST is made of: visible ASCII, space, tab, CR LF.
_PLAIN_HEAD = bytes(range(0x20, 0x7F)) + b"\t\r\n"
#: Digits of a plain callback's `Content-Length` (the body limit has fewer).
_LENGTH_DIGITS = 18
#: Request headers whose presence sends the request to aiohttp.
_NOT_HERE = frozenset({b"transfer-encoding", b"content-encoding", b"expect", b"upgrade"})
_NOT_HERE_TEXT = frozenset(name.decode("ascii") for name in _NOT_HERE)
_PHRASES = {status.value: status.phrase for status in http.HTTPStatus}
#: What stops reading at the front of the buffer besides a refusal.
_HAND_OVER: Final = "hand over"
_BODY_TIMEOUT: Final = "body timeout"


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
    `limits` and `max_body` bytes per body; `listeners` are told of every reply (metrics)."""

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
        self._request_line = b"POST " + self.target + b" "
        #: The request line of every plain callback POST.
        self.plain_request_line = self._request_line + b"HTTP/1.1\r\n"
        self.answer = answer
        self.max_body = max_body
        self.limits = limits
        #: The reply (an unsigned nack) to a body that does not arrive within the limit.
        self.timeout_reply = timeout_reply
        #: Checked on every head: False sends the connection to aiohttp.
        self.enabled = enabled
        #: Told of each request answered here (`RuntimeListener.on_http_request`: the
        #: metrics a middleware would have taken); the peer's runtime listeners.
        self.listeners = Listeners()
        #: Requests served here, connections handed over and heads refused (tests and
        #: benchmarks read them).
        self.served = 0
        self.handed_over = 0
        self.refused = 0

    def targets(self, raw_head: bytes) -> bool:
        """Whether `raw_head` is a POST to this route (its body limit applies)."""
        return raw_head.startswith(self._request_line)


class _Head:
    """An admitted head of a callback POST served here, its body still to read."""

    __slots__ = ("close", "headers", "length")

    def __init__(self, headers: CIMultiDict[str], length: int, close: bool) -> None:
        self.headers = headers
        self.length = length
        self.close = close


def plain_callback_head(raw: bytes, route: CallbackRoute) -> _Head | None:
    """The head of the POST nearly every request is, read in one pass, or None.

    `POST <path> HTTP/1.1`, plain ASCII lines, each header once, a `Host`, one small
    `Content-Length` within the limit, no header that sends a request to aiohttp: what
    `check_head` admits and `_served_here` serves, found without building the whole table's
    view of it (a test holds the two to the same answer). Anything else is None: the
    admission table judges it.
    """
    if not raw.startswith(route.plain_request_line) or raw.translate(None, _PLAIN_HEAD):
        return None
    breaks = raw.count(b"\r")
    if breaks > MAX_HEADERS or raw.count(b"\n") != breaks or raw.count(b"\r\n") != breaks:
        return None  # a bare CR or LF
    # Plain ASCII (checked above): one decoding for the whole head. What each line needs is
    # taken apart here; what holds of all of them is checked once, after.
    lines = raw.decode("ascii").split("\r\n")
    del lines[0]
    pairs = []
    fields = {}
    for line in lines:
        name, colon, value = line.partition(":")
        if not colon:
            return None
        value = value.strip(" \t")
        fields[name.lower()] = value
        pairs.append((name, value))
    if (
        len(fields) != breaks  # a header given twice
        or "" in fields
        or "host" not in fields
        or not _NOT_HERE_TEXT.isdisjoint(fields)
        or "".join(fields).encode("ascii").translate(None, TOKEN_BYTES)  # a token in any case
        or max(map(len, lines)) > PLAIN_FIELD
    ):
        return None
    length = fields.get("content-length", "")
    if not length.isdigit() or len(length) > _LENGTH_DIGITS or int(length) > route.max_body:
        return None
    close = False
    connection = fields.get("connection")
    if connection is not None:
        options = {option.strip().lower() for option in connection.split(",")}
        if not options <= _LEAN_OPTIONS:
            return None
        close = "close" in options
    media = fields.get("content-type")
    if media is not None:
        media = media.partition(";")[0].strip().lower()
        if media != "application/json" and not media.endswith("+json"):
            return None
    return _Head(CIMultiDict(pairs), int(length), close)


class _Request:
    """A callback POST read whole, waiting for its turn."""

    __slots__ = ("body", "close", "headers")

    def __init__(self, headers: CIMultiDict[str], body: bytes, close: bool) -> None:
        self.headers = headers
        self.body = body
        self.close = close


def _served_here(head: Head, target: bytes) -> CIMultiDict[str] | None:
    """The headers of a callback POST this server answers itself, or None (aiohttp's)."""
    if (
        head.method != b"POST"
        or head.target != target
        or head.version != b"1.1"
        or head.content_length is None
        or not head.connection <= _LEAN_CONNECTION
        or len(set(head.keys)) != len(head.keys)  # a header given twice: aiohttp decides
        or not _NOT_HERE.isdisjoint(head.keys)
    ):
        return None
    pairs = []
    for (name, value), key in zip(head.headers, head.keys, strict=True):
        # Near the table's length limits, parsers count a few bytes differently: aiohttp
        # decides those (a callback's headers are far shorter).
        if not value.isascii() or len(name) + len(value) > PLAIN_FIELD:
            return None
        text = value.decode("ascii")
        if key == b"content-type":
            media = text.partition(";")[0].strip().lower()
            if media != "application/json" and not media.endswith("+json"):
                return None
        pairs.append((name.decode("ascii"), text))
    return CIMultiDict(pairs)


class CallbackConnection(asyncio.Protocol):
    """One connection: callback POSTs served here, anything else handed to aiohttp.

    Every state it can be in has a timer that ends it (or an answer in progress, which
    ends by itself): a new connection, the head timer; no request at all, the keep-alive
    timer; a head arriving, the head timer; a body arriving, the body timer; replies the
    client does not read, the reply timer.
    """

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
        #: Bytes received and not yet parsed into a request.
        self._buffer = bytearray()
        #: Requests read whole, waiting for the one being answered.
        self._pending: deque[_Request] = deque()
        #: Bytes this connection holds (its buffer and waiting bodies).
        self.held = 0
        #: What of it the guard counts against the bound shared by all connections.
        self._counted = 0
        #: A parsed head whose body is still arriving.
        self._head: _Head | None = None
        #: Why parsing stopped at the front of the buffer (a refusal, a hand-over, a body
        #: timeout): acted on once every request before it is answered.
        self._blocked: NotAdmitted | str | None = None
        #: The head or body timer, armed while a head or a body is incomplete.
        self._timer: asyncio.TimerHandle | None = None
        #: The reply timer, armed while the client does not read its replies.
        self._write_timer: asyncio.TimerHandle | None = None
        #: The keep-alive timer: armed once, it re-arms itself while the connection is used.
        self._idle_timer: asyncio.TimerHandle | None = None
        self._idle_since = 0.0
        self._task: asyncio.Task[None] | None = None
        self._reading_paused = False
        self._writing_paused = False
        self._eof = False
        self._closed = False
        #: Refused and half-closed: what still arrives is dropped until the close.
        self._lingering = False

    # --- what the guard reads -------------------------------------------------------------

    @property
    def idle(self) -> bool:
        """No byte of a request here and none being answered: closing it loses nothing."""
        return (
            not (self._buffer or self._pending or self._task or self._head or self._blocked)
            and not self._closed
        )

    @property
    def awaiting_head(self) -> bool:
        """Only a request head (or nothing) is arriving: evicting it interrupts no answer."""
        return self._task is None and not self._pending and self._head is None

    @property
    def partial(self) -> bool:
        """Part of a request is held and nothing is being answered: shedding it loses only
        bytes its client will send again."""
        return (
            self._task is None
            and not self._pending
            and (self._head is not None or bool(self._buffer))
            and not self._closed
            and not self._lingering
        )

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
        self._forget()
        # A request being answered goes on (its effects may be committed); its reply is lost
        # with the connection, and the sender's retry finds it in the dedup table.

    def eof_received(self) -> bool:
        self._eof = True
        if self._lingering:
            self._close()
            return False
        if self.idle:
            self._close()
            return False
        self._advance()
        return not self._closed  # answer what came, then close

    def pause_writing(self) -> None:
        self._writing_paused = True
        # A client that leaves its replies unread for the keep-alive time is let go.
        if self._write_timer is None and not self._closed:
            self._write_timer = self.loop.call_later(
                self.route.limits.keepalive_timeout, self._reader_stalled
            )

    def resume_writing(self) -> None:
        self._writing_paused = False
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None
        self._advance()

    def data_received(self, data: bytes) -> None:
        if self._closed or self._lingering:
            return
        self._buffer += data
        self.held += len(data)
        self._advance()

    # --- requests ---------------------------------------------------------------------------

    def _advance(self) -> None:
        """Parse what arrived, start on the next request, and read on within the bounds."""
        if self._closed or self._lingering:
            return
        self._parse()
        if self._task is None and not self._writing_paused:
            if self._pending:
                request = self._pending.popleft()
                self.held -= len(request.body)
                self._task = self.loop.create_task(self._serve(request))
            elif self._blocked is not None:
                self._unblock()
                return
            elif self._eof and self._head is None:
                self._close()
                return
        self._flow()

    def _parse(self) -> None:
        """Move the complete requests at the front of the buffer to `_pending` (at most
        `MAX_PIPELINED`); stop at a head that is refused or goes to aiohttp."""
        route = self.route
        buffer = self._buffer
        while self._blocked is None and len(self._pending) < MAX_PIPELINED:
            head = self._head
            if head is None:
                # RFC 9112 §2.2: empty lines before a request line are ignored.
                while buffer[:2] == b"\r\n":
                    del buffer[:2]
                    self.held -= 2
                if not buffer:
                    return
                end = buffer.find(_END_OF_HEAD, 0, MAX_HEAD + 4)
                if end < 0:
                    refused = check_partial(buffer[:MAX_HEAD])
                    if refused is not None:
                        self._blocked = refused
                    elif len(buffer) > MAX_HEAD or self._eof:
                        self._blocked = _HAND_OVER  # aiohttp judges it, as without us
                    elif self._timer is None:
                        # Its first bytes: the head must be complete within the head timeout.
                        self._arm(route.limits.header_timeout, self._head_stalled)
                    return
                raw = bytes(buffer[:end])
                head = plain_callback_head(raw, route) if route.enabled() else None
                if head is None:
                    # Anything but a plain callback POST: the whole admission table says
                    # whether it gets in, and whether it is served here.
                    verdict = check_head(
                        raw, max_body=route.max_body if route.targets(raw) else None
                    )
                    if isinstance(verdict, NotAdmitted):
                        self._blocked = verdict
                        return
                    headers = _served_here(verdict, route.target) if route.enabled() else None
                    if headers is None:
                        self._blocked = _HAND_OVER
                        return
                    length = verdict.content_length or 0
                    head = _Head(headers, length, b"close" in verdict.connection)
                del buffer[: end + 4]
                self.held -= end + 4
                self._head = head
                self._disarm()
            length = head.length
            if len(buffer) < length:
                if self._eof:
                    self._close()  # the body will never come
                elif self._timer is None:
                    self._arm(route.limits.body_timeout, self._body_stalled)
                return
            self._disarm()
            body = bytes(buffer[:length])
            del buffer[:length]
            self._head = None
            self._pending.append(_Request(head.headers, body, head.close))

    def read_on(self) -> None:
        """The connections together hold little again (the guard): read on if this one may."""
        self._flow()

    def _flow(self) -> None:
        """Read on only while this connection, and all of them together, hold little."""
        held = self.held
        if (
            held <= _UNCOUNTED
            and not self._counted
            and not self._reading_paused
            and self._blocked is None
            and len(self._pending) < MAX_PIPELINED
        ):
            return  # the usual case: a request or two, nothing to count or resume
        if self._closed:
            return
        # Only connections holding more than a little count against the shared bound.
        counted = held if held > _UNCOUNTED else 0
        if counted != self._counted:
            change, self._counted = counted - self._counted, counted
            self.guard.hold(self, change)  # may call `read_on` of waiting ones, this one too
        limit = self.route.max_body + MAX_HEAD
        if (
            self._blocked is not None  # what follows a refused head or a hand-over waits
            or len(self._pending) >= MAX_PIPELINED
            or held > limit
            or self.guard.over(self)
        ):
            self._pause_reading()
        elif (
            self._reading_paused
            and not self._lingering
            # Below half its own bound, or in the middle of a body (which fits in it: the
            # head was admitted): a body is never left waiting for bytes it may hold.
            and (held <= limit // 2 or self._head is not None)
            and len(self._pending) <= MAX_PIPELINED // 2
            and self.guard.room(self)
        ):
            self._resume_reading()

    def _unblock(self) -> None:
        """Every request before it answered: refuse the head at the front, or hand over."""
        blocked = self._blocked
        if blocked == _HAND_OVER:
            self._hand_over()
        elif blocked == _BODY_TIMEOUT:
            log.info("message_refused", status=408, code="message_format_invalid")
            self._head = None
            self._write(self.route.timeout_reply(), close=True)
            self._close()
        else:
            assert isinstance(blocked, NotAdmitted)
            self.route.refused += 1
            log.info(
                "message_refused",
                status=blocked.status,
                code="message_format_invalid",
                reason=blocked.message,
            )
            self.close_with(blocked.status, blocked.message, blocked.details)

    async def _serve(self, request: _Request) -> None:
        route = self.route
        transport = self.transport
        assert transport is not None
        started = time.perf_counter()
        try:
            reply: StoredReply = await route.answer(request.body, request.headers, transport)
        except Exception as exc:  # `answer` answers every failure: a bug of ours
            log.exception("internal_error", error=repr(exc))
            self._task = None
            self._close()
            return
        self._task = None
        route.served += 1
        # A client that half-closed after its requests gets all their replies, then EOF.
        close = request.close or (self._eof and self.idle)
        self._write(reply, close)
        if route.listeners:
            elapsed = time.perf_counter() - started
            route.listeners.on_http_request("POST", route.path, reply.status, elapsed)
        if close:
            self._close()
            return
        if self._closed:
            return
        self._idle_since = self.loop.time()
        if self._idle_timer is None:
            self._idle_timer = self.loop.call_later(self.route.limits.keepalive_timeout, self._idle)
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
        assert transport is not None and self._task is None and not self._pending
        buffered = bytes(self._buffer)
        eof = self._eof
        self._forget()
        self.route.handed_over += 1
        handler = self.fallback()
        transport.set_protocol(handler)
        handler.connection_made(transport)
        with contextlib.suppress(Exception):
            transport.resume_reading()
        if buffered:
            handler.data_received(buffered)
        if eof:
            handler.eof_received()

    # --- memory -----------------------------------------------------------------------------

    def _release_held(self) -> None:
        self.held = 0
        if self._counted:
            change, self._counted = -self._counted, 0
            self.guard.hold(self, change)

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
        for timer in (self._idle_timer, self._write_timer):
            if timer is not None:
                timer.cancel()
        self._idle_timer = self._write_timer = None

    def _head_stalled(self) -> None:
        self._timer = None
        if self._closed or self._head is not None or self._blocked is not None:
            return
        self.guard.stalled += 1
        if self._task is not None or self._pending:
            # Answer the requests before it, then refuse it (see `_unblock`).
            self._blocked = NotAdmitted("head_timeout")
            return
        self.close_stalled("request head not received in time")

    def _body_stalled(self) -> None:
        self._timer = None
        if self._closed or self._head is None or self._blocked is not None:
            return
        self._blocked = _BODY_TIMEOUT
        self._advance()

    def _reader_stalled(self) -> None:
        """The client left its replies unread for the keep-alive time."""
        self._write_timer = None
        if not self._closed and self._writing_paused:
            log.info("connection_closed", reason="replies not read")
            self._abort()

    def _idle(self) -> None:
        """The keep-alive timer: close a connection idle for `keepalive_timeout`."""
        self._idle_timer = None
        if self._closed:
            return
        keepalive = self.route.limits.keepalive_timeout
        left = self._idle_since + keepalive - self.loop.time()
        if not self.idle or left > 0:
            # In use since it was armed (a head, a body or an answer in progress has its own
            # timer): look again when it could next have been idle long enough.
            self._idle_timer = self.loop.call_later(max(left, 0.0) or keepalive, self._idle)
            return
        self._close()

    # --- closing ----------------------------------------------------------------------------

    def close_stalled(self, reason: str) -> None:
        """End a connection that has no answer in progress (the guard, the head timer): an
        idle one closes without a word (a partner's request may be crossing it: it must
        not read an answer about its connection as one about its message); one with part
        of a head gets a 408 first."""
        if self.idle:
            self._close()
        else:
            refused = NotAdmitted("head_timeout", reason)
            self.close_with(refused.status, refused.message, refused.details)

    def shed(self, share: int) -> None:
        """Make room for connections within their share (the guard): this one holds a
        partial request beyond its share. 503 `agent_not_ready`: a sender retries."""
        log.info("connection_shed", held=self.held, share=share)
        details = {"reason": "http", "held": self.held, "share": share}
        self.close_with(503, "too many bytes held for partial requests; retry later", details)

    def close_with(self, status: int, message: str, details: dict[str, Any]) -> None:
        """Answer `status` with an unsigned nack, stop writing, and close once the client
        stops sending (or after `LINGER` s): closing at once could lose the answer to a
        reset while the client still sends."""
        transport = self.transport
        if transport is None or self._closed or transport.is_closing():
            self._close()
            return
        body = self.guard.refusal(status, message, details)
        with contextlib.suppress(Exception):
            transport.write(raw_response(status, _phrase(status), body))
        self._lingering = True
        self.guard.gone(self)  # closing: it no longer takes a place
        self._buffer.clear()
        self._pending.clear()
        self._head = None
        self._release_held()
        self._stop_timers()
        self._resume_reading()  # read (and drop) what the client still sends
        can_half_close = False
        with contextlib.suppress(Exception):
            can_half_close = transport.can_write_eof()
        if not can_half_close or self._eof:
            self._close()
            return
        with contextlib.suppress(Exception):
            transport.write_eof()
        self._timer = self.loop.call_later(LINGER, self._close)

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

    def _forget(self) -> None:
        """Nothing more arrives here: timers, bytes held and the guard's count go."""
        self._stop_timers()
        self._closed = True
        self._buffer.clear()
        self._pending.clear()
        self._release_held()
        self.guard.gone(self)

    def _close(self) -> None:
        self._forget()
        if self.transport is not None:
            self.transport.close()

    def _abort(self) -> None:
        self._forget()
        if self.transport is not None:
            self.transport.abort()

    # --- stopping ---------------------------------------------------------------------------

    async def shutdown(self, timeout: float) -> None:
        """Let the request being answered finish (up to `timeout` s), then close."""
        task = self._task
        if task is not None:
            await asyncio.wait([task], timeout=timeout)
        if not self._closed:
            self._close()


def turn_away(
    transport: asyncio.BaseTransport, refusal: Callable[[int, str, dict[str, Any]], bytes]
) -> None:
    """Answer a connection the guard has no room for with a 503 nack, and close it."""
    body = refusal(503, "too many connections; retry later", {"reason": "http"})
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


__all__ = [
    "LEAN_CALLBACKS",
    "MAX_PIPELINED",
    "CallbackConnection",
    "CallbackRoute",
    "raw_response",
    "turn_away",
]
