"""Hostile HTTP against a real peer on 127.0.0.1, byte by byte (issue 12 §4 and §6).

Raw sockets, so that a test can send what no HTTP client library would: two
`Content-Encoding` headers, a `br` body without brotli installed, broken framing, half a
request head, half a body, hundreds of stalled connections at once. Every refusal is an
unsigned envelope nack; a stalled connection is answered 408 and closed; legitimate requests
are served while the attack goes on. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, cast

import aiohttp
import pytest
from aiohttp import web
from rawhttp import exchange, parse, request, unsigned_nack
from rawpost import RawAgent

from synapse.logs import capture_events
from synapse.p2p.config import P2PConfig
from synapse.transport.guard import HttpLimits, _rate_limit_accept_errors
from synapse.transport.partners import Partner
from synapse.transport.peer import Peer
from synapse.types import SIGNATURE_HEADER, header_signature

E, R = "agent-e", "agent-r"
SECRET = "guard-secret-0123456789abcdefghi"
PATH = "/synapse/callback"
LIMITS = HttpLimits(header_timeout=0.5, body_timeout=0.5, keepalive_timeout=1.0, max_connections=40)


@dataclass
class Target:
    peer: Peer
    r: RawAgent

    @property
    def port(self) -> int:
        return self.peer.port


@web.middleware
async def passthrough(request: web.Request, handler: Any) -> web.StreamResponse:
    """A middleware that does not say the callback route may skip it: aiohttp serves all."""
    return cast(web.StreamResponse, await handler(request))


@pytest.fixture(params=["lean server", "aiohttp"])
async def target(request: pytest.FixtureRequest) -> AsyncIterator[Target]:
    """A peer served by the lean callback server in front of aiohttp, and one served by
    aiohttp alone: every hostile input below must be answered alike by both."""
    peer = Peer(
        E,
        partners=[Partner(R, "http://127.0.0.1:9/cb", (SECRET,))],
        config=P2PConfig(heartbeat_interval=1000.0),
        http_limits=LIMITS,
    )
    if request.param == "aiohttp":
        peer.app_hooks.append(lambda app: app.middlewares.append(passthrough))
    async with aiohttp.ClientSession() as session, peer:
        assert peer._site is not None
        assert (peer._site.callbacks is None) == (request.param == "aiohttp")
        yield Target(peer, RawAgent(session, R, "http://127.0.0.1:9/cb", SECRET, peer.endpoint, E))


def heartbeat(agent: RawAgent) -> dict[str, Any]:
    return agent.envelope("heartbeat", {"status": "ok", "active_tasks": 0})


# --- §4: Content-Encoding, in every form -----------------------------------------------------


ENCODED = {
    "gzip": gzip.compress,
    "deflate": zlib.compress,
    "br": lambda b: b"\x8b\x00\x80" + b,  # not brotli: nothing may try to decode it
    "zstd": lambda b: b"\x28\xb5\x2f\xfd" + b,
    "identity": lambda b: b,
    "x-custom": lambda b: b,
}


@pytest.mark.parametrize(
    "encodings",
    [
        ["gzip"],
        ["GZip"],
        ["deflate"],
        ["br"],
        ["zstd"],
        ["identity"],
        ["x-custom"],
        ["identity", "gzip"],  # the first header must not decide
        ["gzip", "identity"],
        ["identity, gzip"],
        [""],
    ],
)
@pytest.mark.parametrize("signed_over", ["sent", "decoded"])
async def test_any_content_encoding_is_an_unsigned_400_before_decompression(
    target: Target, encodings: list[str], signed_over: str
) -> None:
    plain, _ = target.r.sign(heartbeat(target.r))
    last = encodings[-1].split(",")[-1].strip().lower()
    sent = ENCODED.get(last, lambda b: b)(plain)
    signature = header_signature(SECRET, sent if signed_over == "sent" else plain)
    headers = [("Content-Type", "application/json"), (SIGNATURE_HEADER, signature)]
    headers += [("Content-Encoding", e) for e in encodings]
    details = unsigned_nack(
        await exchange(target.port, request(sent, headers)), 400, "message_format_invalid"
    )
    assert details.get("reason") == "content_encoding", details
    assert target.peer.protocol.engine.partner_status() == {}  # no sign of life: no trace
    # A plain request on the same peer is served.
    ok = await target.r.post(heartbeat(target.r))
    assert ok.status == 200 and ok.type == "p2p:heartbeat", ok


@pytest.mark.parametrize(
    "raw",
    [
        b"POST /synapse/callback HTTP/1.1\r\nHost: a\r\nContent-Length: abc\r\n\r\n{}",
        b"POST /synapse/callback HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n"
        b"Content-Length: 3\r\n\r\n{}",
        b"POST /synapse/callback HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
        b"0\r\n\r\n",
        b"POST /synapse/callback HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"zz\r\n{}\r\n0\r\n\r\n",
        b"POST /synapse/callback HTTP/1.1\r\nBad Header Name: x\r\n\r\n",
        b"POST /synapse/callback HTTP/9.9\r\nHost: a\r\n\r\n",
    ],
)
async def test_malformed_framing_gets_an_envelope_nack(target: Target, raw: bytes) -> None:
    unsigned_nack(await exchange(target.port, raw), 400, "message_format_invalid")
    assert target.peer.protocol.engine.partner_status() == {}


# --- §6: slow clients -------------------------------------------------------------------------


async def open_stalled(
    port: int, count: int, partial: bytes, writers: list[asyncio.StreamWriter]
) -> list[asyncio.StreamReader]:
    readers = []
    for _ in range(count):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(partial)
        readers.append(reader)
        writers.append(writer)
    return readers


async def test_stalled_half_requests_are_closed_and_legitimate_ones_served(
    target: Target,
) -> None:
    cap = LIMITS.max_connections
    half_head = b"POST /synapse/callback HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
    writers: list[asyncio.StreamWriter] = []
    try:
        readers = await open_stalled(target.port, cap * 4, half_head, writers)
        guard = target.peer._site.guard  # type: ignore[union-attr]
        assert len(guard.open) <= cap
        # The attack is on; a legitimate request still gets through, several times.
        for _ in range(5):
            ok = await target.r.post(heartbeat(target.r))
            assert ok.status == 200 and ok.type == "p2p:heartbeat", ok
        assert len(guard.open) <= cap
        # Every stalled connection ends: evicted for room, or past the head timeout (408).
        answers = await asyncio.wait_for(asyncio.gather(*(r.read() for r in readers)), 10)
        answered = [a for a in answers if a]
        assert answered, "no stalled connection was answered"
        for answer in answered:
            status = parse(answer)[0]
            assert status in (408, 503), answer
            unsigned_nack(answer, status, json.loads(parse(answer)[2])["payload"]["code"])
        assert guard.stalled + guard.evicted + guard.refused >= cap * 4 - cap
    finally:
        for writer in writers:
            writer.close()


async def test_a_stalled_body_is_answered_408(target: Target) -> None:
    body, headers = target.r.sign(heartbeat(target.r))
    head = request(body, list(headers.items()))[: -len(body)]
    answer = await exchange(target.port, head + body[:10], timeout=5)
    details = unsigned_nack(answer, 408, "message_format_invalid")
    assert details.get("reason") == "body_timeout"


async def test_an_idle_kept_alive_connection_is_closed(target: Target) -> None:
    body, headers = target.r.sign(heartbeat(target.r))
    reader, writer = await asyncio.open_connection("127.0.0.1", target.port)
    try:
        writer.write(request(body, list(headers.items())))
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 200"), head
        # Then silence: the keep-alive timer (1 s here) closes the connection.
        rest = await asyncio.wait_for(reader.read(), 5)
        assert b"HTTP/1.1" not in rest
        assert reader.at_eof()
    finally:
        writer.close()


async def test_a_connection_that_says_nothing_is_closed_without_a_word(target: Target) -> None:
    # Nothing said about a connection may be read as an answer to a message crossing it.
    reader, writer = await asyncio.open_connection("127.0.0.1", target.port)
    try:
        answer = await asyncio.wait_for(reader.read(), 5)
        assert answer == b"" and reader.at_eof()
    finally:
        writer.close()


async def test_failing_accepts_are_logged_once_in_a_while() -> None:
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()
    try:
        with capture_events() as logs:
            _rate_limit_accept_errors(loop)
            _rate_limit_accept_errors(loop)  # installed once
            for _ in range(1000):
                loop.call_exception_handler(
                    {
                        "message": "socket.accept() out of system resource",
                        "exception": OSError(24, "Too many open files"),
                    }
                )
        assert [e["event"] for e in logs] == ["accept_failed"]
    finally:
        loop.set_exception_handler(previous)
