"""A lean HTTP/1.1 client for the POSTs a peer makes to plain-`http` partners.

A Synapse callback is one small POST with a JSON body, answered by one small JSON reply on
a kept-alive connection. aiohttp's client spends most of such an exchange on what a callback
never uses (cookies, redirects, proxies, request signals, payload writers, a streaming
reader, per-request timer objects); measured end to end, its request path was the largest
single cost of an executor. `Http1Pool` does only what a callback needs:

- one request at a time per connection, connections kept alive and reused most recently
  used first, idle ones closed after `keepalive_timeout`, at most `limit` in use at once
  (a POST beyond waits for one to be released, as aiohttp's connector does);
- the response framing of RFC 9112: `Content-Length`, `chunked`, or read until the server
  closes; interim 1xx responses skipped; `gzip` / `deflate` bodies inflated (we never ask
  for them) within the same size limit as the body;
- a body larger than `max_body` is refused as soon as its length is known or exceeded;
- a whole-exchange timeout (connect included), one timer per POST;
- a kept-alive connection the server had already closed (its FIN crossing our POST) is
  retried once at once on a new connection, before any response byte was seen; a
  re-sent message keeps its id, which the receiver's deduplication recognizes.

Anything else stays with aiohttp: `https`, URLs with credentials, non-ASCII hosts or paths
(`supports` says which), and every POST while aiohttp trace configs are installed (tracing
injects its headers through them).

Errors: `ConnectFailed` (no connection was made: nothing was delivered), `ConnectionDropped`
(the connection ended before the whole response), `TimeoutError`, `BodyTooLarge`, and
`MalformedResponse` (not HTTP/1.x framing we can trust).
"""

from __future__ import annotations

import asyncio
import collections
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

import msgspec

from synapse.types.errors import SynapseException

#: The longest response head (status line and headers) accepted.
MAX_HEAD = 64 * 1024
_CRLF = b"\r\n"
_END_OF_HEAD = b"\r\n\r\n"
_NO_BODY_STATUSES = frozenset({204, 304})
#: The bytes of an HTTP token (as `synapse.transport.admission.TOKEN_BYTES`, which this client
#: does not import: the admission table loads aiohttp's server).
_TOKEN_BYTES = b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
_TOKEN_CHARS = frozenset(_TOKEN_BYTES)


class MalformedResponse(SynapseException):
    """The server's answer is not HTTP/1.x framing this client can trust."""


class BodyTooLarge(SynapseException):
    """The response body is larger than allowed."""

    def __init__(self, limit: int, status: int) -> None:
        super().__init__(f"reply body exceeds {limit} bytes")
        self.limit = limit
        self.status = status


class ConnectFailed(SynapseException, ConnectionError):
    """No connection to the partner could be made: nothing was sent."""


class ConnectionDropped(SynapseException, ConnectionError):
    """The connection ended before the whole response was read."""


class HttpResponse(msgspec.Struct, frozen=True, gc=False):
    """A response read whole (a Struct: two a task, initialised in C)."""

    status: int
    #: Header names lower-cased; a repeated header's values joined with ", ".
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True, slots=True)
class _Target:
    host: str
    port: int
    #: `POST <target> HTTP/1.1\r\nHost: <host>\r\n`, encoded once per endpoint.
    head: bytes


def _target(url: str) -> _Target | None:
    """Where and how to POST `url`, or None if it is not a URL this client serves."""
    if not url.isascii() or any(c in url for c in " \t\r\n\x00"):
        return None
    try:
        parts = urlsplit(url)
        port = parts.port or 80
    except ValueError:
        return None
    host = parts.hostname
    if (
        parts.scheme != "http"
        or not host
        or parts.username is not None
        or parts.password is not None
    ):
        return None
    if parts.fragment:
        return None
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    authority = f"[{host}]" if ":" in host else host
    if port != 80:
        authority += f":{port}"
    head = f"POST {path} HTTP/1.1\r\nHost: {authority}\r\n".encode("ascii")
    return _Target(host, port, head)


def _header_lines(headers: Mapping[str, str]) -> bytes:
    # Checked all at once (a POST's few headers are nearly always fine): every name a token,
    # and no CR, LF or NUL but the line ends written here. Anything else is looked at header
    # by header, for the error that names it.
    text = "".join([f"{name}: {value}\r\n" for name, value in headers.items()])
    names = "".join(headers).encode("latin-1", "replace")
    if (
        "" not in headers
        and not names.translate(None, _TOKEN_BYTES)
        and text.count("\r") == len(headers)
        and text.count("\n") == len(headers)
        and "\x00" not in text
    ):
        return text.encode("latin-1")
    for name, value in headers.items():
        if not name or not name.isascii() or not _TOKEN_CHARS.issuperset(name.encode()):
            raise ValueError(f"invalid HTTP header name {name!r}")
        if "\r" in value or "\n" in value or "\x00" in value:
            raise ValueError(f"invalid value for HTTP header {name!r}")
    return text.encode("latin-1")


def _response_headers(fields: bytes) -> dict[str, str]:
    """The header lines of a response head (after its status line) by lower-cased name; a
    repeated header's values joined with ", "."""
    headers: dict[str, str] = {}
    names = []
    # One decoding for the whole head (Latin-1 maps every byte to one character), one check
    # of every name; a line a name cannot be read from is found again below for the error.
    for line in fields.decode("latin-1").split("\r\n") if fields else ():
        name, colon, value = line.partition(":")
        if not colon or not name:
            break
        names.append(name)
        key = name.lower()
        text = value.strip(" \t")
        if key in headers:
            if key == "content-length":
                if headers[key] != text:
                    raise MalformedResponse("conflicting Content-Length headers")
                continue
            headers[key] = f"{headers[key]}, {text}"
        else:
            headers[key] = text
    else:
        if not "".join(names).encode("latin-1").translate(None, _TOKEN_BYTES):
            return headers
    for raw_line in fields.split(_CRLF):
        raw_name, raw_colon, _ = raw_line.partition(b":")
        if not raw_colon or not raw_name or not _TOKEN_CHARS.issuperset(raw_name):
            raise MalformedResponse(f"bad header line {raw_line[:80]!r}")
    raise AssertionError("unreachable: a line was found wrong above")


class _Connection(asyncio.Protocol):
    """One TCP connection and the response being read on it."""

    def __init__(self, pool: Http1Pool, key: tuple[str, int]) -> None:
        self.pool = pool
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.closed = False
        #: Requests answered on this connection so far.
        self.served = 0
        self.idle_since = 0.0
        self._buffer = bytearray()
        self._waiter: asyncio.Future[HttpResponse] | None = None
        self._max_body = 0
        self._received = False
        # The response being parsed.
        self._status = 0
        self._headers: dict[str, str] = {}
        self._keep_alive = True
        #: "head", "length", "chunked", "close" (until EOF), "trailers"
        self._stage = "head"
        self._remaining = 0
        self._chunks: list[bytes] = []
        self._size = 0

    # --- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not subclasses of asyncio.Transport: no isinstance here.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():
            # Bytes nobody asked for: this connection can no longer be trusted to frame the
            # next response.
            self.close()
            return
        self._received = True
        self._buffer += data
        self._framed(self._parse)

    def eof_received(self) -> bool:
        return False  # close the transport: one request at a time, nothing more to send

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.lost(self)
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        if self._stage == "close":  # the body ends where the connection does
            body = b"".join(self._chunks) + bytes(self._buffer)
            self._framed(lambda: self._finish(body, keep_alive=False))
            return
        reason = f": {exc}" if exc is not None else ""
        dropped = ConnectionDropped(f"server closed the connection before the response{reason}")
        dropped.__cause__ = exc
        self._fail(dropped)

    def _framed(self, step: Callable[[], None]) -> None:
        """Run a framing step; what it finds wrong fails the response being read."""
        try:
            step()
        except (MalformedResponse, BodyTooLarge) as exc:
            self._fail(exc)
        except (ValueError, zlib.error) as exc:  # a bad number, a broken deflate stream
            self._fail(MalformedResponse(str(exc)))

    # --- one exchange -----------------------------------------------------------------------

    def send(self, data: bytes, max_body: int) -> asyncio.Future[HttpResponse]:
        assert self.transport is not None
        self._waiter = self.pool.loop.create_future()
        self._max_body = max_body
        self._received = False
        self._stage = "head"
        self._status = 0
        self._headers = {}
        self._chunks = []
        self._size = 0
        self._buffer.clear()
        self.transport.write(data)
        return self._waiter

    @property
    def received_any(self) -> bool:
        return self._received

    def timed_out(self) -> None:
        self._fail(TimeoutError("no complete response within the request timeout"))
        self.abort()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        self.closed = True
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.cancel()  # its POST was cancelled or failed: nobody reads this response
        if self.transport is not None:
            self.transport.abort()

    def _fail(self, exc: BaseException) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        self._waiter = None
        self.close()

    def _finish(self, body: bytes, *, keep_alive: bool) -> None:
        encoding = self._headers.get("content-encoding", "").strip().lower()
        if encoding in ("gzip", "x-gzip", "deflate"):
            body = self._inflate(body, encoding)
        waiter = self._waiter
        self._waiter = None
        self._stage = "head"
        self._keep_alive = keep_alive and not self._buffer
        self.served += 1
        if waiter is not None and not waiter.done():
            waiter.set_result(HttpResponse(self._status, self._headers, body))

    def _inflate(self, body: bytes, encoding: str) -> bytes:
        # gzip, or zlib-wrapped deflate; a raw deflate stream as a last resort (some
        # servers send one for "deflate").
        wbits = 31 if "gzip" in encoding else (15 if body[:1] in (b"\x78", b"\x58") else -15)
        inflater = zlib.decompressobj(wbits)
        out = inflater.decompress(body, self._max_body + 1)
        if len(out) > self._max_body:
            raise BodyTooLarge(self._max_body, self._status)
        return out

    @property
    def reusable(self) -> bool:
        return not self.closed and self._keep_alive and self._waiter is None

    # --- framing ----------------------------------------------------------------------------

    def _parse(self) -> None:
        buffer = self._buffer
        while True:
            stage = self._stage
            if stage == "head":
                end = buffer.find(_END_OF_HEAD)
                if end < 0:
                    if len(buffer) > MAX_HEAD:
                        raise MalformedResponse("response head too long")
                    return
                if end > MAX_HEAD:
                    raise MalformedResponse("response head too long")
                head = bytes(buffer[:end])
                del buffer[: end + 4]
                if self._start(head):
                    continue  # an interim 1xx response: the real one follows
                if self._stage == "head":  # no body
                    self._finish(b"", keep_alive=self._keep_alive)
                    return
            elif stage == "length":
                if len(buffer) < self._remaining:
                    return
                body = bytes(buffer[: self._remaining])
                del buffer[: self._remaining]
                self._finish(body, keep_alive=self._keep_alive)
                return
            elif stage == "close":
                self._size += len(buffer)
                if self._size > self._max_body:
                    raise BodyTooLarge(self._max_body, self._status)
                self._chunks.append(bytes(buffer))
                buffer.clear()
                return
            elif stage == "chunked":
                if self._remaining == 0:
                    line_end = buffer.find(_CRLF)
                    if line_end < 0:
                        if len(buffer) > 1024:
                            raise MalformedResponse("chunk size line too long")
                        return
                    size_text = bytes(buffer[:line_end]).split(b";", 1)[0].strip()
                    if not size_text or not all(c in b"0123456789abcdefABCDEF" for c in size_text):
                        raise MalformedResponse(f"bad chunk size {size_text[:20]!r}")
                    size = int(size_text, 16)
                    del buffer[: line_end + 2]
                    if size == 0:
                        self._stage = "trailers"
                        continue
                    self._size += size
                    if self._size > self._max_body:
                        raise BodyTooLarge(self._max_body, self._status)
                    self._remaining = size + 2  # the chunk and its CRLF
                if len(buffer) < self._remaining:
                    return
                if buffer[self._remaining - 2 : self._remaining] != _CRLF:
                    raise MalformedResponse("chunk not followed by CRLF")
                self._chunks.append(bytes(buffer[: self._remaining - 2]))
                del buffer[: self._remaining]
                self._remaining = 0
            else:  # trailers: lines up to an empty one, ignored
                line_end = buffer.find(_CRLF)
                if line_end < 0:
                    if len(buffer) > MAX_HEAD:
                        raise MalformedResponse("trailers too long")
                    return
                del buffer[: line_end + 2]
                if line_end == 0:
                    self._finish(b"".join(self._chunks), keep_alive=self._keep_alive)
                    return

    def _start(self, head: bytes) -> bool:
        """Read a response head; True if it was an interim (1xx) response."""
        status_line, _, fields = head.partition(_CRLF)
        version, _, rest = status_line.partition(b" ")
        code, _, _reason = rest.partition(b" ")
        if version not in (b"HTTP/1.1", b"HTTP/1.0") or len(code) != 3 or not code.isdigit():
            raise MalformedResponse(f"bad status line {status_line[:80]!r}")
        status = int(code)
        if status < 100:
            raise MalformedResponse(f"bad status {status}")
        headers = _response_headers(fields)
        if 100 <= status < 200:
            if status == 101:
                raise MalformedResponse("unexpected 101 Switching Protocols")
            return True
        self._status = status
        self._headers = headers
        tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
        if version == b"HTTP/1.1":
            self._keep_alive = "close" not in tokens
        else:
            self._keep_alive = "keep-alive" in tokens
        if status in _NO_BODY_STATUSES:
            self._stage = "head"
            return False
        coding = headers.get("transfer-encoding")
        if coding is not None:
            if coding.split(",")[-1].strip().lower() != "chunked":
                raise MalformedResponse(f"unsupported Transfer-Encoding {coding!r}")
            self._stage, self._remaining = "chunked", 0
            return False
        length = headers.get("content-length")
        if length is not None:
            if not length.isdigit():
                raise MalformedResponse(f"bad Content-Length {length!r}")
            self._remaining = int(length)
            if self._remaining > self._max_body:
                raise BodyTooLarge(self._max_body, status)
            self._stage = "length"
            return False
        self._stage, self._keep_alive = "close", False
        return False


class Http1Pool:
    """Kept-alive HTTP/1.1 connections to plain-http partners (see the module docstring)."""

    def __init__(
        self,
        *,
        limit: int = 100,
        keepalive_timeout: float = 30.0,
        default_headers: Mapping[str, str] | None = None,
    ) -> None:
        self.limit = limit
        self.keepalive_timeout = keepalive_timeout
        self._default_headers = _header_lines(default_headers or {})
        self._targets: dict[str, _Target | None] = {}
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._active: set[_Connection] = set()
        self._connecting = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._sweeper: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.closed = False

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def supports(self, url: str) -> bool:
        """True if `url` is one this client POSTs to (plain http, ASCII, no credentials)."""
        target = self._targets.get(url, False)
        if target is False:
            if len(self._targets) > 10_000:
                self._targets.clear()
            target = self._targets[url] = _target(url)
        return target is not None

    async def post(
        self,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        *,
        timeout: float | None,
        max_body: int,
    ) -> HttpResponse:
        """POST `body` to `url` and read the whole response (its body at most `max_body`)."""
        if not self.supports(url):
            raise ValueError(f"not a URL for the lean client: {url!r}")
        target = self._targets[url]
        assert target is not None
        data = b"".join(
            (
                target.head,
                self._default_headers,
                _header_lines(headers),
                b"Content-Length: %d\r\n\r\n" % len(body),
                body,
            )
        )
        loop = self.loop
        deadline = None if timeout is None else loop.time() + timeout
        for fresh_retry in (False, True):
            connection = await self._acquire(target, deadline, fresh=fresh_retry)
            try:
                response = await self._exchange(connection, data, deadline, max_body)
            except ConnectionDropped:
                self._release(connection)
                if fresh_retry or connection.served == 0 or connection.received_any:
                    raise
                continue  # a kept-alive connection the server had closed: once more, anew
            except BaseException:
                connection.abort()
                self._release(connection)
                raise
            self._release(connection)
            return response
        raise AssertionError("unreachable")

    async def _exchange(
        self, connection: _Connection, data: bytes, deadline: float | None, max_body: int
    ) -> HttpResponse:
        waiter = connection.send(data, max_body)
        if deadline is None:
            return await waiter
        timer = self.loop.call_at(deadline, connection.timed_out)
        try:
            return await waiter
        finally:
            timer.cancel()

    async def _acquire(
        self, target: _Target, deadline: float | None, *, fresh: bool
    ) -> _Connection:
        key = (target.host, target.port)
        while True:
            if self.closed:
                raise ConnectionDropped("client closed")
            idle = self._idle.get(key)
            now = time.monotonic()
            while idle and not fresh:
                connection = idle.pop()
                if connection.reusable and now - connection.idle_since < self.keepalive_timeout:
                    self._active.add(connection)
                    return connection
                connection.close()
            if len(self._active) + self._connecting < self.limit:
                break
            waiter = self.loop.create_future()
            self._waiters.append(waiter)
            try:
                async with asyncio.timeout_at(deadline):  # None: no deadline
                    await waiter
            finally:
                if waiter in self._waiters:  # timed out or cancelled before its turn
                    self._waiters.remove(waiter)
        self._connecting += 1
        try:
            try:
                async with asyncio.timeout_at(deadline):
                    _, protocol = await self.loop.create_connection(
                        lambda: _Connection(self, key), target.host, target.port
                    )
            except TimeoutError:  # an OSError too, but not a refused connection
                raise
            except OSError as exc:
                raise ConnectFailed(
                    f"cannot connect to {target.host}:{target.port}: {exc}"
                ) from exc
        finally:
            self._connecting -= 1
            self._wake_one()
        connection = protocol
        self._active.add(connection)
        return connection

    def _release(self, connection: _Connection) -> None:
        self._active.discard(connection)
        if connection.reusable and not self.closed:
            connection.idle_since = time.monotonic()
            self._idle.setdefault(connection.key, []).append(connection)
            if self._sweeper is None:
                self._sweeper = self.loop.call_later(self.keepalive_timeout, self._sweep)
        else:
            connection.close()
        self._wake_one()

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def lost(self, connection: _Connection) -> None:
        idle = self._idle.get(connection.key)
        if idle and connection in idle:
            idle.remove(connection)
            if not idle:
                del self._idle[connection.key]

    def _sweep(self) -> None:
        self._sweeper = None
        now = time.monotonic()
        for key, idle in list(self._idle.items()):
            keep = [c for c in idle if c.reusable and now - c.idle_since < self.keepalive_timeout]
            for connection in idle:
                if connection not in keep:
                    connection.close()
            if keep:
                self._idle[key] = keep
            else:
                del self._idle[key]
        if self._idle and not self.closed:
            self._sweeper = self.loop.call_later(self.keepalive_timeout, self._sweep)

    def open_connections(self) -> int:
        """Connections open now, in use or idle."""
        return len(self._active) + sum(len(idle) for idle in self._idle.values())

    async def close(self) -> None:
        """Close every connection; POSTs in flight fail with `ConnectionDropped`."""
        self.closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for idle in list(self._idle.values()):
            for connection in idle:
                connection.close()
        self._idle.clear()
        for connection in list(self._active):
            connection.abort()
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
