"""The lean callback server (`synapse.transport.http1_server`) in front of aiohttp's.

End to end, real peers on 127.0.0.1 and raw sockets: callback POSTs are served by the lean
server, anything else on a connection is handed to aiohttp with every byte received, and
what an operator or an extension sees (metrics, middlewares, an overridden handler) is the
same as with aiohttp alone. Directly, a connection with a scripted transport: framing split
at any byte, pipelining, flow control, the body timer and stopping. The hostile-HTTP suite
(`test_transport_http_guard.py`) runs against both servers.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

import aiohttp
import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict
from rawhttp import PATH, parse, request
from rawpost import RawAgent

from synapse.ops import enable_metrics
from synapse.p2p.config import P2PConfig
from synapse.p2p.dedup import StoredReply
from synapse.transport.guard import ConnectionGuard, HttpLimits
from synapse.transport.http1_server import (
    MAX_HEAD,
    MAX_PIPELINED,
    CallbackConnection,
    CallbackRoute,
)
from synapse.transport.partners import Partner
from synapse.transport.peer import Peer
from synapse.types import SIGNATURE_HEADER, verify_header_signature

E, R = "agent-e", "agent-r"
SECRET = "lean-server-secret-0123456789abc"
LIMITS = HttpLimits(header_timeout=2.0, body_timeout=0.3, keepalive_timeout=5.0)


def make_peer() -> Peer:
    return Peer(
        E,
        partners=[Partner(R, "http://127.0.0.1:9/cb", (SECRET,))],
        config=P2PConfig(heartbeat_interval=1000.0),
        http_limits=LIMITS,
    )


def route_of(peer: Peer) -> CallbackRoute:
    assert peer._site is not None and peer._site.callbacks is not None
    return peer._site.callbacks


def agent(session: aiohttp.ClientSession, peer: Peer) -> RawAgent:
    return RawAgent(session, R, "http://127.0.0.1:9/cb", SECRET, peer.endpoint, E)


def heartbeat(r: RawAgent) -> tuple[dict[str, Any], bytes]:
    value = r.envelope("heartbeat", {"status": "ok", "active_tasks": 0})
    body, headers = r.sign(value)
    return value, request(body, list(headers.items()))


class Conn:
    """A raw keep-alive connection that reads one response at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> Conn:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def send(self, raw: bytes) -> None:
        self.writer.write(raw)
        await self.writer.drain()

    async def response(self) -> tuple[int, dict[str, str], bytes]:
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 5)
        status, headers, _ = parse(head)
        body = await asyncio.wait_for(
            self.reader.readexactly(int(headers.get("content-length", "0"))), 5
        )
        return status, headers, body

    async def heartbeat(self, r: RawAgent) -> None:
        """One signed heartbeat, answered 200 by a heartbeat replying to it."""
        value, raw = heartbeat(r)
        await self.send(raw)
        status, _, body = await self.response()
        assert status == 200 and answers(body, value)

    def close(self) -> None:
        self.writer.close()


@pytest.fixture
async def served() -> AsyncIterator[tuple[Peer, RawAgent]]:
    peer = make_peer()
    async with aiohttp.ClientSession() as session, peer:
        yield peer, agent(session, peer)


def answers(body: bytes, value: dict[str, Any]) -> bool:
    reply = json.loads(body)
    return bool(reply["reply_to"] == value["id"] and reply["type"] == "p2p:heartbeat")


# --- end to end --------------------------------------------------------------------------------


async def test_callbacks_are_served_lean_and_anything_else_goes_to_aiohttp_with_its_bytes(
    served: tuple[Peer, RawAgent],
) -> None:
    peer, r = served
    route = route_of(peer)
    conn = await Conn.open(peer.port)
    try:
        value, raw = heartbeat(r)
        await conn.send(raw)
        status, headers, body = await conn.response()
        assert status == 200 and answers(body, value)
        assert verify_header_signature([SECRET], body, headers[SIGNATURE_HEADER.lower()])
        assert headers["content-type"] == "application/json" and "date" in headers
        assert (route.served, route.handed_over) == (1, 0)
        # Another route on the same connection: aiohttp answers it, and everything after.
        await conn.send(b"GET /no-such-route HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await conn.response())[0] == 404
        assert route.handed_over == 1
        await conn.heartbeat(r)
        assert route.served == 1
    finally:
        conn.close()


async def test_a_request_handed_over_mid_stream_is_answered_with_the_ones_before_it(
    served: tuple[Peer, RawAgent],
) -> None:
    """A callback and a chunked callback in one write: the first is served lean, the second
    (with whatever of it had arrived) by aiohttp, in order."""
    peer, r = served
    first, raw_first = heartbeat(r)
    second = r.envelope("heartbeat", {"status": "ok", "active_tasks": 0})
    body, headers = r.sign(second)
    head = f"POST {PATH} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    chunked = (head + "\r\n").encode() + b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n"
    conn = await Conn.open(peer.port)
    try:
        await conn.send(raw_first + chunked)
        assert answers((await conn.response())[2], first)
        status, _, reply = await conn.response()
        assert status == 200 and answers(reply, second)
        assert (route_of(peer).served, route_of(peer).handed_over) == (1, 1)
    finally:
        conn.close()


async def test_pipelined_callbacks_are_answered_in_order(served: tuple[Peer, RawAgent]) -> None:
    peer, r = served
    sent = [heartbeat(r) for _ in range(5)]
    conn = await Conn.open(peer.port)
    try:
        await conn.send(b"".join(raw for _, raw in sent))
        for value, _ in sent:
            status, _, body = await conn.response()
            assert status == 200 and answers(body, value)
    finally:
        conn.close()
    assert route_of(peer).served == 5


async def test_connection_close_is_honoured(served: tuple[Peer, RawAgent]) -> None:
    peer, r = served
    value = r.envelope("heartbeat", {"status": "ok", "active_tasks": 0})
    body, headers = r.sign(value)
    raw = request(body, [*headers.items(), ("Connection", "close")])
    conn = await Conn.open(peer.port)
    try:
        await conn.send(raw)
        status, reply_headers, reply = await conn.response()
        assert status == 200 and answers(reply, value)
        assert reply_headers["connection"] == "close"
        assert await asyncio.wait_for(conn.reader.read(), 5) == b""
    finally:
        conn.close()


async def test_lean_callbacks_are_counted_in_the_metrics_like_aiohttp_ones() -> None:
    peer = make_peer()
    metrics = enable_metrics(peer)
    async with aiohttp.ClientSession() as session, peer:
        r = agent(session, peer)
        for _ in range(3):
            assert (await r.send("heartbeat", {"status": "ok", "active_tasks": 0})).status == 200
        assert route_of(peer).served == 3
        count = metrics.registry.get_sample_value(
            "synapse_http_request_duration_seconds_count",
            {"method": "POST", "route": PATH, "status": "200"},
        )
        assert count == 3


async def test_a_middleware_that_must_see_every_request_sees_callbacks() -> None:
    seen: list[str] = []

    @web.middleware
    async def recording(request: web.Request, handler: Any) -> web.StreamResponse:
        seen.append(request.path)
        return cast(web.StreamResponse, await handler(request))

    peer = make_peer()
    peer.app_hooks.append(lambda app: app.middlewares.append(recording))
    async with aiohttp.ClientSession() as session, peer:
        assert peer._site is not None and peer._site.callbacks is None
        reply = await agent(session, peer).send("heartbeat", {"status": "ok", "active_tasks": 0})
        assert reply.status == 200
    assert seen == [PATH]


async def test_an_overridden_handler_sees_callbacks_even_on_a_lean_connection(
    served: tuple[Peer, RawAgent],
) -> None:
    peer, r = served
    conn = await Conn.open(peer.port)
    try:
        await conn.heartbeat(r)
        original = peer.server.handle
        calls: list[str] = []

        async def wrapped(request: web.Request) -> web.Response:
            calls.append(request.path)
            return await original(request)

        peer.server.handle = wrapped  # type: ignore[method-assign]
        await conn.heartbeat(r)
        assert calls == [PATH] and route_of(peer).served == 1
    finally:
        conn.close()


async def test_closing_the_peer_closes_idle_lean_connections(served: tuple[Peer, RawAgent]) -> None:
    peer, r = served
    conn = await Conn.open(peer.port)
    try:
        await conn.heartbeat(r)
        await peer.close()
        assert await asyncio.wait_for(conn.reader.read(), 5) == b""
    finally:
        conn.close()


# --- one connection, scripted ------------------------------------------------------------------


class ScriptedTransport:
    """What `CallbackConnection` needs of a transport, recording what it is told."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.closed = False
        self.reading = True
        self.protocol: Any = None

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def set_protocol(self, protocol: Any) -> None:
        self.protocol = protocol

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


def open_guard(limits: HttpLimits = LIMITS) -> ConnectionGuard:
    """A guard with room for every connection, whose refusals are plain JSON."""

    def refusal(status: int, message: str, details: dict[str, Any]) -> bytes:
        return json.dumps({"status": status, "message": message, **details}).encode()

    return ConnectionGuard(limits, refusal)


class Fallback(asyncio.Protocol):
    def __init__(self) -> None:
        self.received = bytearray()

    def data_received(self, data: bytes) -> None:
        self.received += data


Answer = Callable[[bytes, CIMultiDict[str], asyncio.BaseTransport], Awaitable[StoredReply]]


async def echo(body: bytes, headers: CIMultiDict[str], transport: Any) -> StoredReply:
    return StoredReply.of(200, body, {"Content-Type": "application/json"})


def connection(
    answer: Answer = echo,
    *,
    max_body: int = 1024,
    limits: HttpLimits = LIMITS,
    guard: ConnectionGuard | None = None,
) -> tuple[CallbackConnection, ScriptedTransport, list[Fallback]]:
    fallbacks: list[Fallback] = []

    def fallback() -> Fallback:
        fallbacks.append(Fallback())
        return fallbacks[-1]

    route = CallbackRoute(
        PATH,
        answer,
        max_body=max_body,
        limits=limits,
        timeout_reply=lambda: StoredReply.of(408, b'{"late":true}', {}),
    )
    guard = guard or open_guard(limits)
    conn = CallbackConnection(route, guard, fallback, asyncio.get_running_loop())
    transport = ScriptedTransport()
    conn.connection_made(cast(asyncio.Transport, transport))
    return conn, transport, fallbacks


def post(body: bytes, *extra: str) -> bytes:
    head = f"POST {PATH} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
    return (head + "".join(f"{h}\r\n" for h in extra) + "\r\n").encode() + body


def bodies(written: bytes) -> list[bytes]:
    out = []
    rest = written
    while rest:
        head, _, rest = rest.partition(b"\r\n\r\n")
        length = int(parse(head + b"\r\n\r\n")[1]["content-length"])
        out.append(rest[:length])
        rest = rest[length:]
    return out


async def settle() -> None:
    """Let every callback that can run, run (each request takes a few loop iterations)."""
    for _ in range(50):
        await asyncio.sleep(0)


BODIES = [b'{"n":1}', b'{"n":22}', b"{}", b'{"s":"' + b"x" * 300 + b'"}']


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=len(b"".join(post(b) for b in BODIES)))))
def test_any_split_of_pipelined_requests_is_answered_alike(cuts: list[int]) -> None:
    stream = b"".join(post(b) for b in BODIES)

    async def scenario() -> list[bytes]:
        conn, transport, fallbacks = connection()
        points = sorted({0, len(stream), *cuts})
        for start, end in itertools.pairwise(points):
            conn.data_received(stream[start:end])
            await settle()
        await settle()
        assert not fallbacks and not transport.closed
        return bodies(bytes(transport.written))

    assert asyncio.run(scenario()) == BODIES


@pytest.mark.parametrize(
    "raw",
    [
        b"POST /synapse/callback HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"2\r\n{}\r\n0\r\n\r\n",
        post(b"{}", "Content-Encoding: gzip"),
        post(b"{}", "Expect: 100-continue"),
        post(b"{}", "Content-Type: text/plain"),
        post(b"{}", "X-Twice: a", "X-Twice: b"),
        post(b"{}", "Upgrade: h2c"),  # not a request to upgrade without Connection: upgrade
        post(b"{}", "X-Latin: café"),
        b"POST /synapse/callback?x=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
        b"POST /synapse/callback HTTP/1.0\r\nContent-Length: 2\r\n\r\n{}",
        b"PUT /synapse/callback HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
        post(b"{}", *(f"X-Long-{i}: {'v' * 1000}" for i in range(20))),  # past MAX_HEAD
    ],
)
async def test_what_the_lean_server_does_not_serve_goes_to_aiohttp_byte_for_byte(
    raw: bytes,
) -> None:
    answered: list[bytes] = []

    async def answer(body: bytes, headers: CIMultiDict[str], transport: Any) -> StoredReply:
        answered.append(body)
        return await echo(body, headers, transport)

    conn, transport, fallbacks = connection(answer)
    conn.data_received(raw)
    await settle()
    assert answered == [] and transport.written == b""
    assert len(fallbacks) == 1 and bytes(fallbacks[0].received) == raw
    assert transport.protocol is fallbacks[0]


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (post(b"{}", "Transfer-Encoding: chunked"), 400),  # with a Content-Length
        (post(b"{}", "Content-Length: 2"), 400),  # given twice
        (post(b"{}", "Connection: upgrade", "Upgrade: h2c"), 400),
        (post(b"{}", "X-Folded: a\r\n b"), 400),
        (b"POST /synapse/callback HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}", 400),  # no Host
        (b"POST /synapse/callback HTTP/1.1\r\nHost: x\r\nContent-Length: 2000\r\n\r\n{}", 413),
        (b"POST /synapse/callback HTTP/1.1\r\nHost: x\r\nContent-Length: +2\r\n\r\n{}", 400),
        (
            b"POST /synapse/callback HTTP/1.1\r\nHost: x\r\nContent-Length: "
            + b"9" * 5000
            + b"\r\n\r\n",
            400,
        ),
        (b"GARBAGE\r\n\r\n", 400),
        (b"X" * (20 * 1024), 400),
        (b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03", 400),  # a TLS ClientHello
        (b"POST /synapse/callback HTTP/1.1\nHost: x\n", 400),  # bare LF, head incomplete
    ],
)
async def test_what_the_admission_table_refuses_is_answered_at_once_and_closed(
    raw: bytes, status: int
) -> None:
    conn, transport, fallbacks = connection()
    conn.data_received(raw)
    await settle()
    assert not fallbacks
    got, headers, body = parse(bytes(transport.written))
    assert (got, headers["connection"]) == (status, "close")
    assert json.loads(body)["status"] == status
    assert not conn.idle or transport.closed  # lingering for the client to stop, or closed


async def test_the_next_request_waits_while_the_client_does_not_read_replies() -> None:
    conn, transport, _ = connection(max_body=64)
    conn.pause_writing()
    conn.data_received(post(b'{"a":1}') * 3)
    await settle()
    assert transport.written == b"" and transport.reading
    # More pipelined requests than a connection may have waiting: stop reading.
    conn.data_received(post(b'{"a":1}') * MAX_PIPELINED)
    assert not transport.reading
    conn.resume_writing()
    await settle()
    assert bodies(bytes(transport.written)) == [b'{"a":1}'] * (MAX_PIPELINED + 3)
    assert transport.reading


async def test_reading_pauses_past_a_bodys_worth_and_resumes_only_below_half() -> None:
    conn, transport, _ = connection(max_body=64)
    conn.pause_writing()
    conn.data_received(post(b'{"a":1}') * MAX_PIPELINED)
    assert not transport.reading  # the requests waiting are at their bound
    # Bytes behind them stay unparsed, within a body and a head's worth.
    conn.data_received(post(b'{"a":1}') * 10)
    assert conn.held <= 64 + MAX_HEAD and not transport.reading
    conn.resume_writing()
    await settle()
    assert len(bodies(bytes(transport.written))) == MAX_PIPELINED + 10
    assert transport.reading and conn.held == 0


async def test_connections_together_hold_at_most_max_buffered() -> None:
    limits = HttpLimits(max_buffered=200_000)
    guard = open_guard(limits)
    big = post(b"x" * 60_000)
    first, first_transport, _ = connection(max_body=300_000, limits=limits, guard=guard)
    second, second_transport, _ = connection(max_body=300_000, limits=limits, guard=guard)
    for conn in (first, second):
        conn.pause_writing()  # nothing is answered: what arrives is held
    first.data_received(big * 4)  # 240 KB: within its own bound, past the shared one
    assert guard.held > limits.max_buffered and not first_transport.reading
    second.data_received(big * 2)  # 120 KB, counted too: the bound is shared, it waits
    assert not second_transport.reading
    assert guard.shed == 0  # whole requests waiting for their answers are never shed
    first.resume_writing()  # its requests are answered: the bound holds, each within its share
    await settle()
    assert first.held == 0 and first_transport.reading and second_transport.reading
    second.resume_writing()
    await settle()
    assert guard.held == 0 and first_transport.reading and second_transport.reading
    assert len(bodies(bytes(first_transport.written))) == 4


async def test_half_sent_bodies_give_way_to_a_connection_within_its_share() -> None:
    """Connections holding half-sent bodies fill the shared bound; one more connection
    within its share (a partner's callback arriving in several reads) reads on at once, and
    room is made for it by shedding the largest partial body beyond its share (503,
    retryable), never a connection with a request being answered."""
    limits = HttpLimits(max_buffered=1_000_000)
    guard = open_guard(limits)
    busy, busy_transport, _ = connection(max_body=400_000, limits=limits, guard=guard)
    busy.pause_writing()  # its request is whole and waits to be answered: never shed
    busy.data_received(post(b"y" * 200_000))
    hoarders = []
    for size in (300_000, 250_000, 240_000, 230_000):
        conn, transport, _ = connection(max_body=400_000, limits=limits, guard=guard)
        conn.data_received(post(b"x" * 400_000)[:size])  # the head and part of the body
        hoarders.append((conn, transport))
    # The last one took the bytes past the bound, beyond its share: it waits, nobody is shed.
    assert guard.held > limits.max_buffered and not hoarders[-1][1].reading
    assert guard.shed == 0
    callback = post(b'{"c":"' + b"z" * 150_000 + b'"}')
    partner, partner_transport, _ = connection(max_body=400_000, limits=limits, guard=guard)
    before = guard.held
    for start in range(0, len(callback), 40_000):  # several reads, each let in
        partner.data_received(callback[start : start + 40_000])
        assert partner_transport.reading and guard.held <= before + 40_000
    await settle()
    assert guard.held <= limits.max_buffered  # room was made, not memory added
    assert bodies(bytes(partner_transport.written)) == [callback.partition(b"\r\n\r\n")[2]]
    shed = [t for _, t in hoarders if t.written]
    assert shed and shed[0] is hoarders[0][1]  # the largest first
    for transport in shed:
        status, _, body = parse(bytes(transport.written))
        assert status == 503 and json.loads(body)["reason"] == "http"
    assert not busy_transport.written and not busy_transport.closed
    assert guard.shed == len(shed) < len(hoarders)  # only as many as room was needed for


async def test_a_connection_beyond_its_share_waits_and_sheds_nobody() -> None:
    limits = HttpLimits(max_buffered=400_000)
    guard = open_guard(limits)
    first, first_transport, _ = connection(max_body=400_000, limits=limits, guard=guard)
    first.data_received(post(b"x" * 390_000)[:300_000])
    second, second_transport, _ = connection(max_body=400_000, limits=limits, guard=guard)
    second.data_received(post(b"x" * 390_000)[:250_000])  # past the bound and its share
    assert not second_transport.reading
    assert guard.shed == 0 and not first_transport.written and not second_transport.written
    first.close_stalled("test")  # the other goes: the waiting one reads on
    assert second_transport.reading


async def test_a_body_that_does_not_come_in_time_is_answered_408_and_closed() -> None:
    conn, transport, _ = connection(limits=HttpLimits(body_timeout=0.05))
    raw = post(b'{"a":1}')
    conn.data_received(raw[:-3])
    await settle()
    assert transport.written == b"" and not transport.closed
    await asyncio.sleep(0.2)  # past the body timeout: the loop's timer fires
    status, headers, body = parse(bytes(transport.written))
    assert (status, body, headers["connection"]) == (408, b'{"late":true}', "close")
    assert transport.closed


async def test_stopping_lets_the_request_being_answered_finish() -> None:
    release = asyncio.Event()

    async def slow(body: bytes, headers: CIMultiDict[str], transport: Any) -> StoredReply:
        await release.wait()
        return await echo(body, headers, transport)

    conn, transport, _ = connection(slow)
    conn.data_received(post(b'{"a":1}'))
    await settle()
    stopping = asyncio.create_task(conn.shutdown(5.0))
    await settle()
    assert not stopping.done() and not transport.closed
    release.set()
    await stopping
    assert bodies(bytes(transport.written)) == [b'{"a":1}'] and transport.closed


async def test_a_half_closed_client_gets_its_replies_then_the_connection_closes() -> None:
    conn, transport, _ = connection()
    conn.data_received(post(b'{"a":1}') + post(b'{"b":2}'))
    assert conn.eof_received() is True  # keep the transport open to write the replies
    await settle()
    assert bodies(bytes(transport.written)) == [b'{"a":1}', b'{"b":2}'] and transport.closed
