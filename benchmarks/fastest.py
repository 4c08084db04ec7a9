"""The fastest floor: the least an executor of the Synapse wire can do per `echo` task on the
fastest honest Python stack, the anchor `synapse serve` is measured against.

It does what the floor of `benchmarks.floor` does, and nothing else: verify the signed
`task_request`, answer a signed `task_confirm`, then POST `task_status_update{executing}` and
`task_complete` to the requester in order, checking each reply's signature, type and
`reply_to`. What makes it the fastest:

- raw asyncio `Protocol`s on both sides, with httptools parsing requests and responses (the
  parser uvicorn uses), keep-alive both ways (a pool of idle client connections per origin);
- msgspec for JSON, into and out of plain dicts;
- HMAC-SHA256 from a pre-keyed `hmac` object `.copy()`d per message (the key's pads are
  hashed once, not per message);
- cheap message ids (a random prefix and a counter) and the timestamp formatted once a
  second;
- uvloop when started with `--uvloop` (as `benchmarks.e2e` and `benchmarks.instructions` do
  when it is installed).

Like the aiohttp floor, it checks no replay window, no I-JSON, keeps no deduplication table,
no state, no store and logs nothing: everything `synapse serve` spends above it is the price
of those guarantees and of its own code. The independent requester (`benchmarks.floor`'s
`Requester`, aiohttp) drives both alike and checks every task.

Run by `benchmarks._worker` (role `fastest-executor`); needs `httptools` (the `bench` extra).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import itertools
import os
import time
from collections.abc import Callable
from typing import Any, cast

import httptools
import msgspec

from benchmarks._common import HOST, answer, commands, cpu_now

PATH = b"/synapse/callback"
SIGNATURE = b"x-synapse-signature"

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


class Signer:
    """HMAC-SHA256 in header mode (`sha256=<hex>`), keyed once."""

    def __init__(self, secret: bytes) -> None:
        self._keyed = hmac.new(secret, digestmod=hashlib.sha256)

    def sign(self, body: bytes) -> bytes:
        mac = self._keyed.copy()
        mac.update(body)
        return b"sha256=" + mac.hexdigest().encode()

    def verified(self, body: bytes, header: bytes | None) -> bool:
        return header is not None and hmac.compare_digest(header, self.sign(body))


class Stamps:
    """Message ids and timestamps at the least cost: a random prefix and a counter; the
    RFC 3339 time formatted once a second."""

    def __init__(self) -> None:
        self._prefix = os.urandom(8).hex()
        self._counter = itertools.count()
        self._second = -1
        self._text = ""

    def message_id(self) -> str:
        return f"{self._prefix}{next(self._counter):08x}"

    def timestamp(self) -> str:
        second = int(time.time())
        if second != self._second:
            self._second = second
            self._text = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(second))
        return self._text


def _response(status: bytes, body: bytes, signature: bytes | None) -> bytes:
    head = b"HTTP/1.1 " + status + b"\r\nContent-Length: " + str(len(body)).encode()
    if signature is not None:
        head += b"\r\nContent-Type: application/json\r\nX-Synapse-Signature: " + signature
    return head + b"\r\n\r\n" + body


class _ServerConnection(asyncio.Protocol):
    """One inbound keep-alive connection: httptools' callbacks fill one request at a time."""

    def __init__(self, handle: Callable[[bytes, bytes | None], bytes]) -> None:
        self._handle = handle
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._url = b""
        self._signature: bytes | None = None
        self._body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            assert self._transport is not None
            self._transport.write(_response(b"400 Bad Request", b"", None))
            self._transport.close()

    def on_url(self, url: bytes) -> None:
        self._url = url

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == SIGNATURE:
            self._signature = value

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        assert self._transport is not None
        body = b"".join(self._body)
        self._body.clear()
        signature, self._signature = self._signature, None
        if self._url != PATH or self._parser.get_method() != b"POST":
            out = _response(b"404 Not Found", b"", None)
        else:
            out = self._handle(body, signature)
        self._transport.write(out)
        if not self._parser.should_keep_alive():
            self._transport.close()


class _ClientConnection(asyncio.Protocol):
    """One outbound keep-alive connection: one request in flight at a time."""

    def __init__(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self._reply: asyncio.Future[tuple[int, bytes | None, bytes]] | None = None
        self._signature: bytes | None = None
        self._body: list[bytes] = []
        self.open = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.open = True

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        if self._reply is not None and not self._reply.done():
            self._reply.set_exception(ConnectionError("connection closed"))

    def data_received(self, data: bytes) -> None:
        self._parser.feed_data(data)

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == SIGNATURE:
            self._signature = value

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        body = b"".join(self._body)
        self._body.clear()
        signature, self._signature = self._signature, None
        assert self._reply is not None
        if not self._parser.should_keep_alive():
            self.open = False
        self._reply.set_result((self._parser.get_status_code(), signature, body))

    def post(self, request: bytes) -> asyncio.Future[tuple[int, bytes | None, bytes]]:
        assert self.transport is not None
        self._reply = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return self._reply


class _Pool:
    """Idle keep-alive connections per (host, port)."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, int], list[_ClientConnection]] = {}
        self._origins: dict[str, tuple[str, int, bytes, bytes]] = {}

    def origin(self, url: str) -> tuple[str, int, bytes, bytes]:
        """(host, port, path, Host header) of `url`, parsed once."""
        found = self._origins.get(url)
        if found is None:
            parsed = httptools.parse_url(url.encode())
            host = parsed.host.decode()
            port = parsed.port or 80
            found = (host, port, parsed.path or b"/", f"{host}:{port}".encode())
            self._origins[url] = found
        return found

    async def post(
        self, url: str, body: bytes, signature: bytes
    ) -> tuple[int, bytes | None, bytes]:
        host, port, path, host_header = self.origin(url)
        idle = self._idle.setdefault((host, port), [])
        while idle:
            conn = idle.pop()
            if conn.open:
                break
        else:
            _, conn = await asyncio.get_running_loop().create_connection(
                _ClientConnection, host, port
            )
        request = (
            b"POST " + path + b" HTTP/1.1\r\nHost: " + host_header
            + b"\r\nContent-Type: application/json\r\nContent-Length: " + str(len(body)).encode()
            + b"\r\nX-Synapse-Signature: " + signature + b"\r\n\r\n" + body
        )  # fmt: skip
        reply = await conn.post(request)
        if conn.open:
            idle.append(conn)
        elif conn.transport is not None:
            conn.transport.close()
        return reply

    def close(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                if conn.transport is not None:
                    conn.transport.close()
        self._idle.clear()


class FastestExecutor:
    """The echo exchange and nothing else (see the module's docstring)."""

    def __init__(self, secret: bytes, agent_id: str, endpoint: str) -> None:
        self.signer = Signer(secret)
        self.stamps = Stamps()
        self.me = agent_id
        self.sender = {"agent_id": agent_id, "endpoint": endpoint}
        self.pool = _Pool()
        self.running: set[asyncio.Task[None]] = set()
        self.counts = {"served": 0, "completed": 0, "errors": 0}

    def envelope(
        self, kind: str, payload: dict[str, Any], to: str, reply_to: str | None = None
    ) -> dict[str, Any]:
        message = {
            "version": "1.0",
            "id": self.stamps.message_id(),
            "type": kind,
            "from": self.sender,
            "to": {"agent_id": to},
            "timestamp": self.stamps.timestamp(),
            "payload": payload,
        }
        if reply_to is not None:
            message["reply_to"] = reply_to
        return message

    def handle(self, body: bytes, signature: bytes | None) -> bytes:
        """The reply to one POST: 403 unsigned, 400 not a task_request to us, else the
        signed task_confirm (and the task starts)."""
        if not self.signer.verified(body, signature):
            return _response(b"403 Forbidden", b"", None)
        try:
            message = _decode(body)
            if message["type"] != "p2p:task_request" or message["to"]["agent_id"] != self.me:
                raise ValueError(message["type"])
            task_id = message["payload"]["task"]["id"]
        except (msgspec.DecodeError, KeyError, TypeError, ValueError):
            return _response(b"400 Bad Request", b"", None)
        self.counts["served"] += 1
        confirm = self.envelope(
            "p2p:task_confirm",
            {"task_id": task_id, "confirmed": True},
            message["from"]["agent_id"],
            message["id"],
        )
        out = _encode(confirm)
        job = asyncio.ensure_future(self.execute(message))
        self.running.add(job)
        job.add_done_callback(self.running.discard)
        return _response(b"200 OK", out, self.signer.sign(out))

    async def post(self, url: str, message: dict[str, Any], expect: str) -> None:
        body = _encode(message)
        status, signature, reply_body = await self.pool.post(url, body, self.signer.sign(body))
        if status != 200 or not self.signer.verified(reply_body, signature):
            raise RuntimeError(f"callback refused: HTTP {status}")
        reply = _decode(reply_body)
        if reply["type"] != expect or reply["reply_to"] != message["id"]:
            raise RuntimeError(f"unexpected reply {reply['type']}")

    async def execute(self, request: dict[str, Any]) -> None:
        requester = request["from"]
        task = request["payload"]["task"]
        url, to = requester["endpoint"], requester["agent_id"]
        try:
            update = {"task_id": task["id"], "status": "executing"}
            await self.post(url, self.envelope("p2p:task_status_update", update, to), "p2p:ack")
            complete = {
                "task_id": task["id"],
                "result": {"output_type": "text", "output": task["payload"]["text"]},
            }
            await self.post(url, self.envelope("p2p:task_complete", complete, to), "p2p:task_ack")
            self.counts["completed"] += 1
        except Exception:
            self.counts["errors"] += 1


async def fastest_executor(args: argparse.Namespace) -> None:
    endpoint = f"http://{HOST}:{args.port}{PATH.decode()}"
    executor = FastestExecutor(args.secret.encode(), args.agent_id, endpoint)
    server = await asyncio.get_running_loop().create_server(
        lambda: _ServerConnection(executor.handle), HOST, args.port, reuse_address=True
    )
    answer({"url": endpoint})
    async for _command in commands(cpu=False):
        answer({**cpu_now(), **executor.counts})
    server.close()
    executor.pool.close()
