"""One admission table for both HTTP doors (`synapse.transport.admission`).

Two differential tests. In process, thousands of generated heads, mutated at every level
(line ends, methods, versions, header names and values, lengths around the limits, repeated
and conflicting framing headers), go to the lean door (`CallbackConnection`) and to the
aiohttp door (aiohttp's own parser with the table's limits, then the table's middleware
rules): what one refuses the other refuses with the same status, and what the lean door
serves itself aiohttp admits. Over real sockets, a curated corpus goes to a peer served by
the lean door and to one served by aiohttp alone: the same statuses and nack codes come
back, in the same order, and every refusal closes the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, cast

import aiohttp
import pytest
from aiohttp import http_parser, web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict
from rawpost import RawAgent

from synapse.p2p.config import P2PConfig
from synapse.p2p.dedup import StoredReply
from synapse.transport.admission import (
    MAX_FIELD,
    MAX_HEADERS,
    PARSER_LIMITS,
    PLAIN_FIELD,
    Head,
    check_head,
    check_request,
)
from synapse.transport.guard import ConnectionGuard, HttpLimits
from synapse.transport.http1_server import (
    CallbackConnection,
    CallbackRoute,
    _served_here,
    plain_callback_head,
)
from synapse.transport.partners import Partner
from synapse.transport.peer import Peer

PATH = "/synapse/callback"
MAX_BODY = 1024
#: More generated heads: `SYNAPSE_FUZZ_SCALE=20 pytest tests/transport/test_transport_admission.py`.
SCALE = float(os.environ.get("SYNAPSE_FUZZ_SCALE", "1"))

# --- in process: the two doors' decisions on generated heads -----------------------------------


class _NoProtocol:
    """What aiohttp's parser needs of its protocol when fed directly."""

    transport = None

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


@dataclass(frozen=True)
class Verdict:
    #: "refused" (with `status`), "served" (lean only), "admitted" or "handed over".
    outcome: str
    status: int | None = None


def _parse(raw: bytes, loop: asyncio.AbstractEventLoop) -> Any:
    parser = http_parser.HttpRequestParser(cast(Any, _NoProtocol()), loop, 2**16, **PARSER_LIMITS)
    messages, _, _ = parser.feed_data(raw)
    return messages


def aiohttp_door(raw: bytes, loop: asyncio.AbstractEventLoop) -> Verdict:
    """What the aiohttp door does with the first request of `raw`: its parser, then the
    table's expect handler and middleware."""
    try:
        messages = _parse(raw, loop)
    except Exception as exc:
        # What follows the first head (a body taken for the next request) may be what
        # failed: the first request is answered before that.
        end = raw.find(b"\r\n\r\n")
        try:
            messages = _parse(raw[: end + 4], loop) if end >= 0 else []
        except Exception:
            messages = []
        if not messages:
            status = exc.code if isinstance(exc, http_parser.BadHttpMessage) else 400
            return Verdict("refused", status)
    if not messages:
        return Verdict("incomplete")
    message = messages[0][0]
    request = _ParsedRequest(message)
    refused = check_request(cast(Any, request), MAX_BODY if message.path == PATH else None)
    if refused is not None:
        return Verdict("refused", refused.status)
    return Verdict("admitted")


class _ParsedRequest:
    """The part of `web.BaseRequest` the table's middleware reads, from a parsed message."""

    def __init__(self, message: Any) -> None:
        self.version = message.version
        self.headers = message.headers
        length = message.headers.get("Content-Length")
        self.content_length = int(length) if length is not None else None


class _Transport:
    def __init__(self) -> None:
        self.written = bytearray()
        self.closed = False
        self.protocol: Any = None

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def set_protocol(self, protocol: Any) -> None:
        self.protocol = protocol

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


class _Fallback(asyncio.Protocol):
    pass


def guard() -> ConnectionGuard:
    def refusal(status: int, message: str, details: dict[str, Any]) -> bytes:
        return json.dumps({"status": status}).encode()

    return ConnectionGuard(HttpLimits(), refusal)


async def lean_door(raw: bytes) -> Verdict:
    """What the lean door does with `raw`, on a connection of its own."""
    served: list[bytes] = []

    async def answer(body: bytes, headers: CIMultiDict[str], transport: Any) -> StoredReply:
        served.append(body)
        return StoredReply.of(200, b"{}", {})

    route = CallbackRoute(
        PATH,
        answer,
        max_body=MAX_BODY,
        limits=HttpLimits(),
        timeout_reply=lambda: StoredReply.of(408, b"{}", {}),
    )
    transport = _Transport()
    conn = CallbackConnection(route, guard(), _Fallback, asyncio.get_running_loop())
    conn.connection_made(cast(asyncio.Transport, transport))
    try:
        conn.data_received(raw)
        for _ in range(5):
            await asyncio.sleep(0)
        if transport.protocol is not None:
            return Verdict("handed over")
        if served:
            return Verdict("served")
        if transport.written:
            status = int(bytes(transport.written).split(b" ", 2)[1])
            return Verdict("refused", status)
        return Verdict("incomplete")
    finally:
        conn.connection_lost(None)


# Pieces of heads, valid and not: every level of a head is mutated somewhere.
METHODS = [b"POST", b"GET", b"PUT", b"post", b"FOO", b"", b"PO ST", b"P\x00ST", b"POST\t"]
TARGETS = [
    PATH.encode(),
    PATH.encode() + b"?x=1",
    b"/other",
    b"*",
    b"http://x" + PATH.encode(),
    b"",
    b"/a b",
    b"/\x7f",
    b"/\xc3\xa9",
    b"/" + b"a" * (MAX_FIELD - 1),
    b"/" + b"a" * MAX_FIELD,
]
VERSIONS = [
    b"HTTP/1.1",
    b"HTTP/1.0",
    b"HTTP/2.0",
    b"HTTP/1.2",
    b"HTTP/1",
    b"http/1.1",
    b"HTTP/01.1",
]
NAMES = [
    b"Host",
    b"Content-Length",
    b"Transfer-Encoding",
    b"Connection",
    b"Expect",
    b"Upgrade",
    b"Content-Type",
    b"Content-Encoding",
    b"X-Synapse-Signature",
    b"X-Any",
    b"Bad Name",
    b"X(y)",
    b"",
    b"X" * (MAX_FIELD - 4),
    b"X" * (MAX_FIELD + 1),
]
VALUES = [
    b"x",
    b"",
    b"2",
    b"0002",
    b"+2",
    b"2, 2",
    b"9" * 30,
    b"2000",
    b"chunked",
    b"gzip, chunked",
    b"identity",
    b"close",
    b"keep-alive",
    b"upgrade",
    b"Upgrade, HTTP2-Settings",
    b"h2c",
    b"100-continue",
    b"200-ok",
    b"application/json",
    b"text/plain",
    b"a\tb",
    b"caf\xc3\xa9",
    b"a\x00b",
    b"a\x7fb",
    b"v" * (MAX_FIELD - 1),
    b"v" * (MAX_FIELD + 1),
]
ENDINGS = [b"\r\n"] * 12 + [b"\n", b"\r", b"\r\r\n", b" \r\n"]


@st.composite
def heads(draw: st.DrawFn) -> bytes:
    method = draw(st.sampled_from(METHODS))
    target = draw(st.sampled_from(TARGETS))
    version = draw(st.sampled_from(VERSIONS))
    lines = [method + b" " + target + b" " + version]
    if draw(st.booleans()):
        lines.append(b"Host: x")
    count = draw(st.sampled_from([0, 1, 2, 3, 5, MAX_HEADERS - 1, MAX_HEADERS]))
    fields = draw(
        st.lists(
            st.tuples(st.sampled_from(NAMES), st.sampled_from(VALUES), st.booleans()),
            min_size=min(count, 5),
            max_size=min(count, 5),
        )
    )
    for name, value, spaced in fields:
        lines.append(name + (b": " if spaced else b":") + value)
    lines += [b"X-Pad-%d: p" % i for i in range(max(0, count - len(fields)))]
    raw = b""
    for line in lines:
        raw += line + draw(st.sampled_from(ENDINGS))
    raw = draw(st.sampled_from([b"", b"\r\n"])) + raw + b"\r\n"
    return raw + b"{}"


@st.composite
def plain_heads(draw: st.DrawFn) -> bytes:
    """A plain callback POST, then a mutation or two: the heads near the lean door's own."""
    lines = [
        b"POST " + PATH.encode() + b" HTTP/1.1",
        b"Host: 127.0.0.1:8001",
        b"Content-Type: application/json",
        b"X-Synapse-Signature: sha256=" + b"0" * 64,
        b"Content-Length: 2",
    ]
    for _ in range(draw(st.integers(min_value=0, max_value=2))):
        where = draw(st.integers(min_value=1, max_value=len(lines)))
        mutation = draw(st.sampled_from(["add", "drop", "repeat", "case", "bytes"]))
        if mutation == "add":
            name, value = draw(st.sampled_from(NAMES)), draw(st.sampled_from(VALUES))
            lines.insert(where, name + b": " + value)
        elif mutation == "drop" and where < len(lines):
            del lines[where]
        elif mutation == "repeat" and where < len(lines):
            lines.insert(where, lines[where])
        elif mutation == "case" and where < len(lines):
            lines[where] = lines[where].swapcase()
        elif mutation == "bytes" and where < len(lines):
            at = draw(st.integers(min_value=0, max_value=len(lines[where])))
            noise = draw(st.binary(min_size=1, max_size=3))
            lines[where] = lines[where][:at] + noise + lines[where][at:]
    return b"\r\n".join(lines) + b"\r\n\r\n{}"


def agree(lean: Verdict, aio: Verdict) -> bool:
    if lean.outcome == "refused":
        return aio == lean
    if lean.outcome == "served":
        return aio.outcome == "admitted"
    return True  # handed over (aiohttp decides) or waiting for more


@settings(
    max_examples=int(1500 * SCALE), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(st.one_of(heads(), plain_heads()))
def test_the_lean_door_refuses_and_serves_what_aiohttp_would(raw: bytes) -> None:
    async def both() -> tuple[Verdict, Verdict]:
        return await lean_door(raw), aiohttp_door(raw, asyncio.get_running_loop())

    lean, aio = asyncio.run(both())
    assert agree(lean, aio), (lean, aio, raw[:300])


def head_and_route(raw: bytes) -> tuple[bytes, CallbackRoute]:
    """The head of `raw` (up to its blank line), and the callback route it is read for."""
    head = raw[: raw.find(b"\r\n\r\n")] if b"\r\n\r\n" in raw else raw
    route = CallbackRoute(
        PATH,
        lambda *a: None,  # type: ignore[arg-type, return-value]
        max_body=MAX_BODY,
        limits=HttpLimits(),
        timeout_reply=lambda: StoredReply.of(408, b"{}", {}),
    )
    return head, route


@settings(
    max_examples=int(1500 * SCALE), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(st.one_of(heads(), plain_heads()))
def test_the_plain_callback_fast_path_judges_as_the_table(raw: bytes) -> None:
    """What the lean door serves in one pass, the whole table admits and serves alike."""
    head, route = head_and_route(raw)
    fast = plain_callback_head(head, route)
    if fast is None:
        return
    full = check_head(head, max_body=MAX_BODY)
    assert isinstance(full, Head), (full, head)
    headers = _served_here(full, PATH.encode())
    assert headers is not None, head
    assert list(headers.items()) == list(fast.headers.items())
    assert (fast.length, fast.close) == (full.content_length, b"close" in full.connection)


def line_by_line(
    raw: bytes, route: CallbackRoute
) -> tuple[list[tuple[str, str]], int, bool] | None:
    """The plain callback head read one line at a time, every check on every line: the
    reference the one-pass reading (`plain_callback_head`) must agree with exactly."""
    if not raw.startswith(route.plain_request_line) or raw.translate(None, PLAIN_HEAD_BYTES):
        return None
    lines = raw.split(b"\r\n")
    breaks = len(lines) - 1
    if breaks > MAX_HEADERS or raw.count(b"\r") != breaks or raw.count(b"\n") != breaks:
        return None
    pairs, seen, length, close, hosts = [], set(), -1, False, 0
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        key = name.lower()
        if (
            not colon
            or not name
            or name.translate(None, TOKEN_BYTES)
            or key in seen
            or key in {b"transfer-encoding", b"content-encoding", b"expect", b"upgrade"}
            or len(line) > PLAIN_FIELD
        ):
            return None
        seen.add(key)
        value = value.strip(b" \t")
        if key == b"content-length":
            if not value.isdigit() or len(value) > 18:
                return None
            length = int(value)
        elif key == b"host":
            hosts += 1
        elif key == b"connection":
            options = {option.strip().lower() for option in value.split(b",")}
            if not options <= {b"close", b"keep-alive"}:
                return None
            close = b"close" in options
        elif key == b"content-type":
            media = value.partition(b";")[0].strip().lower()
            if media != b"application/json" and not media.endswith(b"+json"):
                return None
        pairs.append((name.decode("ascii"), value.decode("ascii")))
    if hosts != 1 or length < 0 or length > route.max_body:
        return None
    return pairs, length, close


PLAIN_HEAD_BYTES = bytes(range(0x20, 0x7F)) + b"\t\r\n"
TOKEN_BYTES = b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


@settings(
    max_examples=int(1500 * SCALE), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(st.one_of(heads(), plain_heads()))
def test_the_plain_callback_fast_path_reads_every_head_as_line_by_line(raw: bytes) -> None:
    """The one-pass reading serves exactly the heads a line-by-line reading serves, with the
    same headers, length and `close`; and the usual callback head is one of them."""
    head, route = head_and_route(raw)
    fast = plain_callback_head(head, route)
    want = line_by_line(head, route)
    got = None if fast is None else (list(fast.headers.items()), fast.length, fast.close)
    assert got == want, head
    usual = f"POST {PATH} HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nConnection: close"
    assert plain_callback_head(usual.encode(), route) is not None


# --- over real sockets: one corpus, two peers ----------------------------------------------------

E, R = "agent-e", "agent-r"
SECRET = "admission-secret-0123456789abcde"
LIMITS = HttpLimits(header_timeout=1.0, body_timeout=1.0, keepalive_timeout=0.5)


@web.middleware
async def passthrough(request: web.Request, handler: Any) -> web.StreamResponse:
    """A middleware that does not say the callback route may skip it: aiohttp serves all."""
    return cast(web.StreamResponse, await handler(request))


@dataclass
class Doors:
    lean: Peer
    aiohttp: Peer
    agent: RawAgent


@pytest.fixture
async def doors() -> AsyncIterator[Doors]:
    def peer() -> Peer:
        return Peer(
            E,
            partners=[Partner(R, "http://127.0.0.1:9/cb", (SECRET,))],
            config=P2PConfig(heartbeat_interval=1000.0, max_body_size=MAX_BODY),
            http_limits=LIMITS,
        )

    lean, alone = peer(), peer()
    alone.app_hooks.append(lambda app: app.middlewares.append(passthrough))
    async with aiohttp.ClientSession() as session, lean, alone:
        assert lean._site is not None and lean._site.callbacks is not None
        assert alone._site is not None and alone._site.callbacks is None
        agent = RawAgent(session, R, "http://127.0.0.1:9/cb", SECRET, lean.endpoint, E)
        yield Doors(lean, alone, agent)


async def responses(port: int, raw: bytes) -> tuple[list[tuple[int, str | None]], bool]:
    """Every response `raw` gets on a new connection: (status, nack code), and whether the
    server closed the connection (within the keep-alive time)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    got: list[tuple[int, str | None]] = []
    closed = False
    try:
        writer.write(raw)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        while True:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 3)
            except asyncio.IncompleteReadError as eof:
                closed = eof.partial == b""
                break
            except (TimeoutError, ConnectionError):
                break
            status_line, *lines = head.decode("latin-1").split("\r\n")
            status = int(status_line.split()[1])
            length = 0
            for line in lines:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            body = await asyncio.wait_for(reader.readexactly(length), 3) if length else b""
            code = None
            if body.startswith(b"{"):
                code = json.loads(body).get("payload", {}).get("code")
            got.append((status, code))
    finally:
        writer.close()
    return got, closed


def post(body: bytes, *extra: bytes, version: bytes = b"HTTP/1.1", host: bool = True) -> bytes:
    head = b"POST " + PATH.encode() + b" " + version + b"\r\n"
    head += (b"Host: x\r\n" if host else b"") + b"Content-Length: %d\r\n" % len(body)
    return head + b"".join(h + b"\r\n" for h in extra) + b"\r\n" + body


def corpus(agent: RawAgent) -> dict[str, bytes]:
    value = agent.envelope("heartbeat", {"status": "ok", "active_tasks": 0})
    body, headers = agent.sign(value)
    signed = post(body, *(f"{k}: {v}".encode() for k, v in headers.items()))
    valid = post(b"{}")
    return {
        "valid, unsigned": valid,
        "valid, signed": signed,
        "no Host": post(b"{}", host=False),
        "two Hosts": post(b"{}", b"Host: y"),
        "empty Host": post(b"{}").replace(b"Host: x", b"Host:"),
        "a 9,000-byte header line": post(b"{}", b"X-A: " + b"a" * 9000),
        "a value of the limit": post(b"{}", b"X-A: " + b"a" * MAX_FIELD),
        "a value past the limit": post(b"{}", b"X-A: " + b"a" * (MAX_FIELD + 1)),
        "128 headers": post(b"{}", *(b"X-%d: a" % i for i in range(MAX_HEADERS - 2))),
        "129 headers": post(b"{}", *(b"X-%d: a" % i for i in range(MAX_HEADERS - 1))),
        "a TLS ClientHello": bytes.fromhex("16030100a5010000a10303") + b"\x00" * 64,
        "an HTTP/2 preface": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        "bare LF": valid.replace(b"\r\n", b"\n"),
        "CR CR LF": valid.replace(b"\r\n", b"\r\r\n", 1),
        "a Content-Length of 5,000 digits": valid.replace(b"Length: 2", b"Length: " + b"1" * 5000),
        "that, pipelined behind a valid request": signed
        + valid.replace(b"Length: 2", b"Length: " + b"1" * 5000),
        "Content-Length +2": valid.replace(b"Length: 2", b"Length: +2"),
        "Content-Length 0002": valid.replace(b"Length: 2", b"Length: 0002"),
        "two Content-Lengths": post(b"{}", b"Content-Length: 2"),
        "Content-Length and Transfer-Encoding": post(b"{}", b"Transfer-Encoding: chunked"),
        "HTTP/1.0, chunked, keep-alive, then another": (
            b"POST " + PATH.encode() + b" HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n" + valid
        ),
        "an upgrade to h2c, then another": post(
            b"{}", b"Connection: Upgrade, HTTP2-Settings", b"Upgrade: h2c", b"HTTP2-Settings: AA"
        )
        + valid,
        "Expect: 100-continue over the limit": valid.replace(
            b"Length: 2", b"Length: %d" % (MAX_BODY + 1)
        ).replace(b"Host: x", b"Host: x\r\nExpect: 100-continue")[:-2],
        "Expect: 100-continue within the limit": post(b"{}", b"Expect: 100-continue"),
        "Expect: something else": post(b"{}", b"Expect: 200-ok"),
        "over the limit": post(b"x" * (MAX_BODY + 1)),
        "obsolete line folding": post(b"{}", b"X-F: a", b" b"),
        "whitespace before the colon": post(b"{}", b"X-F : a"),
        "a NUL in a value": post(b"{}", b"X-A: a\x00b"),
        "a bad header name": post(b"{}", b"Bad Name: x"),
        "garbage": b"GARBAGE\r\n\r\n",
        "a lower-case method": valid.replace(b"POST", b"post", 1),
        "an unknown method": valid.replace(b"POST", b"BREW", 1),
        "an absolute target": valid.replace(PATH.encode(), b"http://x" + PATH.encode(), 1),
        "HTTP/1.2": valid.replace(b"HTTP/1.1", b"HTTP/1.2", 1),
        "HTTP/9.9": valid.replace(b"HTTP/1.1", b"HTTP/9.9", 1),
        "a leading empty line": b"\r\n" + valid,
        "GET on the callback path": b"GET " + PATH.encode() + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        "a latin-1 value": post(b"{}", b"X-L: caf\xe9"),
        "Content-Encoding: gzip": post(b"{}", b"Content-Encoding: gzip"),
        "Transfer-Encoding: gzip, chunked": (
            b"POST " + PATH.encode() + b" HTTP/1.1\r\nHost: x\r\n"
            b"Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n"
        ),
        "a head past 16 KiB": post(b"{}", *(b"X-%d: " % i + b"v" * 1000 for i in range(20))),
    }


#: aiohttp's parser drops a request read together with a malformed one behind it, and
#: answers the malformed one alone; the lean door answers both, in order.
ALIKE_BUT_AIOHTTP_DROPS_THE_FIRST = {"that, pipelined behind a valid request"}


def refused(answers: list[tuple[int, str | None]]) -> bool:
    return bool(answers) and answers[-1][0] >= 400


async def test_both_doors_answer_one_corpus_alike(doors: Doors) -> None:
    seen: dict[str, Any] = {}
    for name, raw in corpus(doors.agent).items():
        lean, aio = await asyncio.gather(
            responses(doors.lean.port, raw), responses(doors.aiohttp.port, raw)
        )
        seen[name] = (lean, aio)
        if name in ALIKE_BUT_AIOHTTP_DROPS_THE_FIRST:
            assert lean[0][1:] == aio[0], (name, lean, aio)
            continue
        assert lean[0] == aio[0], (name, lean, aio)
        if refused(lean[0]) and lean[0][-1][0] != 408:
            assert lean[1] and aio[1], (name, lean, aio)  # a refusal closes the connection
    # The cases the table exists for, answered as specified.
    assert seen["no Host"][0][0] == [(400, "message_format_invalid")]
    assert seen["a 9,000-byte header line"][0][0] == [(400, "message_format_invalid")]
    assert seen["129 headers"][0][0] == [(400, "message_format_invalid")]
    assert seen["a TLS ClientHello"][0][0] == [(400, "message_format_invalid")]
    assert seen["bare LF"][0][0] == [(400, "message_format_invalid")]
    assert seen["CR CR LF"][0][0] == [(400, "message_format_invalid")]
    assert seen["that, pipelined behind a valid request"][0][0] == [
        (200, None),
        (400, "message_format_invalid"),
    ]
    assert seen["HTTP/1.0, chunked, keep-alive, then another"][0][0] == [
        (400, "message_format_invalid")
    ]
    assert seen["an upgrade to h2c, then another"][0][0] == [(400, "message_format_invalid")]
    # No 100 Continue for a body that would be refused: the 413 comes first and alone.
    assert seen["Expect: 100-continue over the limit"][0][0] == [(413, "message_format_invalid")]
    assert seen["Expect: 100-continue within the limit"][0][0][0] == (100, None)


async def test_refusals_at_the_lean_door_are_fast(doors: Doors) -> None:
    """A head its first bytes rule out is refused without waiting for the head timeout."""
    loop = asyncio.get_running_loop()
    for raw in (
        bytes.fromhex("16030100a5010000a10303"),
        b"POST " + PATH.encode() + b" HTTP/1.1\nHost: x\n",
        b"POST " + PATH.encode() + b" HTTP/1.1\r\r\n",
    ):
        started = loop.time()
        answers, closed = await responses(doors.lean.port, raw)
        assert answers == [(400, "message_format_invalid")] and closed
        assert loop.time() - started < LIMITS.header_timeout


# --- the limits, as specs/protocol.md states them ------------------------------------------------


def test_the_specification_states_the_limits_the_code_applies() -> None:
    from pathlib import Path

    from synapse.a2a.server.push import MAX_PUSH_URL
    from synapse.transport.http1_server import MAX_PIPELINED
    from synapse.types.ijson import MAX_DEPTH
    from synapse.types.signing import MAX_HEADER_SIGNATURES

    spec = (Path(__file__).parents[2] / "specs" / "protocol.md").read_text()
    section = spec[spec.index("### 7.1 HTTP framing and limits") : spec.index("## 8.")]
    limits = HttpLimits()

    def stated(text: str) -> None:
        assert text in section, text

    stated(f"longer than {MAX_FIELD:,} bytes")
    stated(f"more than {MAX_HEADERS} header lines")
    stated(f"| JSON nesting | {MAX_DEPTH} levels |")
    stated(f"the first {MAX_HEADER_SIGNATURES} |")
    stated(f"| A2A push notification URL | {MAX_PUSH_URL:,} characters |")
    stated(f"| {MAX_PIPELINED}, and at most a body and a head's worth of bytes |")
    stated(f"| {limits.max_buffered // 2**20} MiB (`HttpLimits.max_buffered`) |")
    stated(f"| {limits.max_connections:,} (`max_connections`) |")
    stated(f"| {limits.keepalive_timeout:g} s (`keepalive_timeout`) |")
    stated(f"the head timeout ({limits.header_timeout:g} s)")
    stated(f"the body timeout ({limits.body_timeout:g} s)")
    assert P2PConfig().max_body_size == 2**20
    stated("| body | 1 MiB (`max_body_size`) |")
