"""The lean HTTP/1.1 client against scripted servers on loopback: framing, reuse, limits.

Each server here is a raw asyncio TCP server writing exactly the bytes a case needs, so the
client meets responses aiohttp's server would never send (chunk extensions, trailers,
close-delimited bodies, interim 1xx, a keep-alive connection closed under it).
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import itertools
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from synapse.transport.http1 import (
    BodyTooLarge,
    ConnectFailed,
    ConnectionDropped,
    Http1Pool,
    HttpResponse,
    MalformedResponse,
    _Connection,
)

#: Answer(request number, request) → bytes to write; b"" hangs up at once, None never answers.
Script = Callable[[int, bytes], bytes | None]


@dataclass
class Scripted:
    url: str
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    open_now: int = 0
    most_open: int = 0
    #: Close the connection after each answer (without saying so).
    close_after: bool = False
    release: asyncio.Event = field(default_factory=asyncio.Event)


def ok(body: bytes, *extra: str) -> bytes:
    head = ["HTTP/1.1 200 OK", f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


@contextlib.asynccontextmanager
async def open_pool(**options: Any) -> AsyncIterator[Http1Pool]:
    """An `Http1Pool` closed at the end, whatever the test asserted."""
    pool = Http1Pool(**options)
    try:
        yield pool
    finally:
        await pool.close()


@contextlib.asynccontextmanager
async def scripted(script: Script, *, close_after: bool = False) -> AsyncIterator[Scripted]:
    state = Scripted(url="", close_after=close_after)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        state.connections += 1
        state.open_now += 1
        state.most_open = max(state.most_open, state.open_now)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await reader.readexactly(length)
                state.requests.append(head + body)
                answer = script(len(state.requests), head + body)
                if answer is None:
                    await state.release.wait()
                    return
                if answer == b"":  # hang up on this request without a word
                    return
                writer.write(answer)
                await writer.drain()
                if state.close_after:
                    return
        finally:
            state.open_now -= 1
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    state.url = f"http://127.0.0.1:{port}/synapse/callback"
    try:
        yield state
    finally:
        state.release.set()
        server.close()
        await server.wait_closed()


async def post(
    pool: Http1Pool, url: str, *, timeout: float = 5.0, max_body: int = 1 << 20
) -> HttpResponse:
    return await pool.post(
        url, b'{"x": 1}', {"Content-Type": "application/json"}, timeout=timeout, max_body=max_body
    )


async def test_a_kept_alive_connection_serves_many_posts_and_the_request_is_well_formed() -> None:
    async with (
        scripted(lambda n, _: ok(b'{"n": %d}' % n, "X-Synapse-Signature: sha256=ab")) as s,
        open_pool(default_headers={"User-Agent": "synapse-test"}) as pool,
    ):
        for n in (1, 2, 3):
            response = await post(pool, s.url)
            assert response.status == 200
            assert response.body == b'{"n": %d}' % n
            assert response.headers["x-synapse-signature"] == "sha256=ab"
    assert s.connections == 1
    first = s.requests[0]
    assert first.startswith(b"POST /synapse/callback HTTP/1.1\r\n")
    assert f"Host: {s.url.split('/')[2]}\r\n".encode() in first
    assert b"User-Agent: synapse-test\r\n" in first
    assert b"Content-Length: 8\r\n" in first
    assert first.endswith(b'\r\n\r\n{"x": 1}')


async def test_a_chunked_reply_with_extensions_and_trailers_is_joined() -> None:
    reply = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b'4;name=value\r\n{"a"\r\n3\r\n: 1\r\n1\r\n}\r\n0\r\nX-Trailer: t\r\n\r\n'
    )
    async with scripted(lambda n, _: reply) as s, open_pool() as pool:
        assert (await post(pool, s.url)).body == b'{"a": 1}'
        assert (await post(pool, s.url)).body == b'{"a": 1}'
    assert s.connections == 1


async def test_a_body_without_length_is_read_until_close_and_the_connection_not_reused() -> None:
    async with (
        scripted(lambda n, _: b'HTTP/1.1 200 OK\r\n\r\n{"until": "close"}', close_after=True) as s,
        open_pool() as pool,
    ):
        assert (await post(pool, s.url)).body == b'{"until": "close"}'
        assert (await post(pool, s.url)).body == b'{"until": "close"}'
    assert s.connections == 2


async def test_interim_responses_are_skipped_and_connection_close_is_obeyed() -> None:
    reply = b"HTTP/1.1 100 Continue\r\n\r\n" + ok(b"{}", "Connection: close")
    async with scripted(lambda n, _: reply) as s, open_pool() as pool:
        assert (await post(pool, s.url)).body == b"{}"
        assert (await post(pool, s.url)).body == b"{}"
    assert s.connections == 2


async def test_a_gzip_body_is_inflated_within_the_body_limit() -> None:
    packed = gzip.compress(b'{"zipped": true}')
    bomb = gzip.compress(b" " * 100_000)
    async with (
        scripted(lambda n, _: ok(packed if n == 1 else bomb, "Content-Encoding: gzip")) as s,
        open_pool() as pool,
    ):
        assert (await post(pool, s.url, max_body=1000)).body == b'{"zipped": true}'
        with pytest.raises(BodyTooLarge):
            await post(pool, s.url, max_body=1000)


@pytest.mark.parametrize(
    "reply",
    [
        ok(b"x" * 2000),
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n400\r\n" + b"x" * 1024 + b"\r\n"
        b"400\r\n" + b"x" * 1024 + b"\r\n0\r\n\r\n",
    ],
    ids=["declared", "chunked"],
)
async def test_a_body_over_the_limit_is_refused_with_its_status(reply: bytes) -> None:
    async with scripted(lambda n, _: reply) as s, open_pool() as pool:
        with pytest.raises(BodyTooLarge) as info:
            await post(pool, s.url, max_body=1500)
        assert info.value.status == 200
        assert pool.open_connections() == 0


@pytest.mark.parametrize(
    "reply",
    [
        b"HTTP/2 200 OK\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 2000 OK\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nBad Header: x\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nNo colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nNoColon\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n: nameless\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nX-\xe9t\xe9: 1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nX-Fine: 1\r\nX(bad): 1\r\n\r\n",
    ],
    ids=[
        "version",
        "status",
        "header-name",
        "two-lengths",
        "negative",
        "te",
        "chunk",
        "101",
        "no-colon",
        "no-colon-token",
        "empty-name",
        "latin-1-name",
        "late-bad-name",
    ],
)
async def test_framing_that_cannot_be_trusted_is_refused(reply: bytes) -> None:
    async with scripted(lambda n, _: reply) as s, open_pool() as pool:
        with pytest.raises(MalformedResponse):
            await post(pool, s.url)
        assert pool.open_connections() == 0


async def test_a_kept_alive_connection_closed_by_the_server_is_retried_once_anew() -> None:
    # The server closes after each answer without saying so: the second POST meets a dead
    # connection and goes out again at once on a new one.
    async with scripted(lambda n, _: ok(b"{}"), close_after=True) as s, open_pool() as pool:
        await post(pool, s.url)
        # Let the server's FIN arrive only after our next POST was written: no wait here.
        await post(pool, s.url)
        await post(pool, s.url)
    assert len(s.requests) == 3
    assert s.connections == 3


async def test_a_reused_connection_hung_up_before_any_reply_byte_is_retried_at_once() -> None:
    async with (
        scripted(lambda n, _: b"" if n == 2 else ok(b'{"n": %d}' % n)) as s,
        open_pool() as pool,
    ):
        assert (await post(pool, s.url)).body == b'{"n": 1}'
        # Request 2 reaches the server on the kept-alive connection, which hangs up:
        # the same bytes go out again on a new connection and are answered.
        assert (await post(pool, s.url)).body == b'{"n": 3}'
    assert s.requests[1] == s.requests[2]
    assert s.connections == 2


async def test_a_fresh_connection_closed_before_the_reply_is_not_retried() -> None:
    async with (
        scripted(
            lambda n, _: b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{", close_after=True
        ) as s,
        open_pool() as pool,
    ):
        with pytest.raises(ConnectionDropped):
            await post(pool, s.url)
    assert len(s.requests) == 1


async def test_no_reply_within_the_timeout_is_a_timeout_and_the_connection_goes() -> None:
    async with scripted(lambda n, _: None) as s, open_pool() as pool:
        with pytest.raises(TimeoutError):
            await post(pool, s.url, timeout=0.2)
        assert pool.open_connections() == 0


async def test_a_refused_connection_is_connect_failed() -> None:
    async with scripted(lambda n, _: ok(b"{}")) as s:
        url = s.url
    async with open_pool() as pool:
        with pytest.raises(ConnectFailed) as info:
            await post(pool, url)
        assert isinstance(info.value.__cause__, ConnectionRefusedError)


async def test_at_most_limit_connections_are_in_use_and_the_rest_wait() -> None:
    async with scripted(lambda n, _: ok(b"{}")) as s, open_pool(limit=2) as pool:
        replies = await asyncio.gather(*(post(pool, s.url) for _ in range(10)))
    assert [r.status for r in replies] == [200] * 10
    assert s.most_open <= 2
    assert len(s.requests) == 10


def test_only_plain_http_ascii_urls_without_credentials_are_served() -> None:
    pool = Http1Pool()
    assert pool.supports("http://127.0.0.1:8080/synapse/callback")
    assert pool.supports("http://[::1]:8080/cb?x=1")
    assert not pool.supports("https://127.0.0.1/cb")
    assert not pool.supports("http://user:pw@127.0.0.1/cb")
    assert not pool.supports("http://exämple.org/cb")
    assert not pool.supports("http://127.0.0.1/a b")
    assert not pool.supports("http://127.0.0.1:99999/cb")


@pytest.mark.parametrize(
    ("headers", "error"),
    [
        ({"X": "a\r\nEvil: 1"}, "invalid value"),
        ({"X": "a\nEvil: 1"}, "invalid value"),
        ({"X": "a\rb"}, "invalid value"),
        ({"X": "a\x00b"}, "invalid value"),
        ({"Fine": "1", "X": "ok\r\n"}, "invalid value"),
        ({"": "x"}, "invalid HTTP header name"),
        ({"Bad Name": "x"}, "invalid HTTP header name"),
        ({"Bad:Name": "x"}, "invalid HTTP header name"),
        ({"X-\u00e9": "x"}, "invalid HTTP header name"),
        ({"X-\u20ac": "x"}, "invalid HTTP header name"),
    ],
)
def test_a_header_cannot_inject_lines_or_bad_names(headers: dict[str, str], error: str) -> None:
    pool = Http1Pool()

    async def go() -> None:
        with pytest.raises(ValueError, match=error):
            await pool.post("http://127.0.0.1:9/cb", b"", headers, timeout=1, max_body=10)

    asyncio.run(go())


class _FakeTransport:
    def __init__(self) -> None:
        self.written = b""
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True


RESPONSES = [
    ok(b'{"type": "p2p:ack"}', "X-Synapse-Signature: sha256=00"),
    b"HTTP/1.1 100 Continue\r\n\r\n" + ok(b"{}"),
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
    b"HTTP/1.1 204 No Content\r\n\r\n",
    ok(gzip.compress(b"inflated"), "Content-Encoding: gzip"),
]


@settings(max_examples=200, deadline=None)
@given(which=st.sampled_from(range(len(RESPONSES))), cuts=st.lists(st.integers(1, 400), max_size=8))
def test_a_response_parses_the_same_however_it_is_split_into_reads(
    which: int, cuts: list[int]
) -> None:
    raw = RESPONSES[which]

    async def parse(pieces: list[bytes]) -> HttpResponse:
        pool = Http1Pool()
        connection = _Connection(pool, ("127.0.0.1", 1))
        connection.connection_made(_FakeTransport())  # type: ignore[arg-type]
        waiter = connection.send(b"", 1 << 20)
        for piece in pieces:
            connection.data_received(piece)
        return await asyncio.wait_for(waiter, 1)

    positions = sorted({min(c, len(raw)) for c in cuts} | {0, len(raw)})
    pieces = [raw[a:b] for a, b in itertools.pairwise(positions) if b > a]
    whole, split = asyncio.run(parse([raw])), asyncio.run(parse(pieces))
    assert split == whole
    assert whole.status in (200, 204)
