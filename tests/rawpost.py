"""Raw envelopes for end-to-end tests: build, sign, POST, and judge the reply.

`RawAgent` speaks as one registered partner with hand-made JSON (so a test can send what no
well-behaved peer would); `CallbackSink` is that partner's callback endpoint, a tiny aiohttp
server that records what the peer under test POSTs to it and acknowledges it, signed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
from aiohttp import web

from synapse.types import (
    SIGNATURE_HEADER,
    body_signature,
    format_timestamp,
    header_signature,
    new_message_id,
    utc_now,
    verify_header_signature,
)

#: How a raw request is signed: in the header, in the body's `signature` member, or not at all.
Mode = Literal["header", "body", "none"]
TIMEOUT = aiohttp.ClientTimeout(total=10)


def mtype(name: str) -> str:
    """`task_request` → `p2p:task_request` (a full name passes through)."""
    return name if ":" in name else f"p2p:{name}"


def encode(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def sign(
    value: dict[str, Any], secret: str | None, mode: Mode = "header"
) -> tuple[bytes, dict[str, str]]:
    """The body and headers of `value` signed with `secret` in `mode`."""
    headers = {"Content-Type": "application/json"}
    if mode == "none" or secret is None:
        return encode(value), headers
    if mode == "body":
        unsigned = {k: v for k, v in value.items() if k != "signature"}
        return encode({**unsigned, "signature": body_signature(secret, unsigned)}), headers
    body = encode(value)
    headers[SIGNATURE_HEADER] = header_signature(secret, body)
    return body, headers


@dataclass(frozen=True)
class RawReply:
    """What came back from one POST."""

    status: int
    body: bytes
    headers: Mapping[str, str]

    @property
    def value(self) -> dict[str, Any]:
        value = json.loads(self.body)
        assert isinstance(value, dict), self.body
        return value

    @property
    def type(self) -> str:
        return str(self.value["type"])

    @property
    def payload(self) -> dict[str, Any]:
        payload = self.value["payload"]
        assert isinstance(payload, dict)
        return payload

    @property
    def code(self) -> str | None:
        """The nack's `code` (None for any other reply)."""
        return self.payload.get("code") if self.type == "p2p:nack" else None

    @property
    def details(self) -> dict[str, Any]:
        details = self.payload.get("details") or {}
        assert isinstance(details, dict)
        return details

    @property
    def signature(self) -> str | None:
        return self.headers.get(SIGNATURE_HEADER)

    @property
    def signed(self) -> bool:
        return SIGNATURE_HEADER in self.headers

    def signed_with(self, secret: str) -> bool:
        return self.signature is not None and verify_header_signature(
            [secret], self.body, self.signature
        )

    def __repr__(self) -> str:
        return f"RawReply({self.status}, {self.body[:400]!r})"


def check_nack(
    reply: RawReply,
    status: int,
    code: str,
    *,
    signed: bool,
    secret: str | None = None,
    reply_to: str | None = None,
) -> dict[str, Any]:
    """Assert `reply` is a nack with `status` and `code`, signed (with `secret`) or not at
    all, answering `reply_to` when given; return its `details`."""
    assert reply.status == status, reply
    assert reply.headers.get("Content-Type", "").startswith("application/json"), reply.headers
    assert reply.type == "p2p:nack", reply
    assert reply.code == code, reply
    assert isinstance(reply.payload.get("message"), str)
    if signed:
        assert secret is not None
        assert reply.signed_with(secret), f"nack not signed: {reply}"
    else:
        assert reply.signature is None, f"nack signed but must not be: {reply}"
        assert reply.value.get("signature") is None
    if reply_to is not None:
        assert reply.value.get("reply_to") == reply_to, reply
    return reply.details


@dataclass
class RawAgent:
    """A registered partner of the peer at `url`, sending hand-made envelopes."""

    session: aiohttp.ClientSession
    agent_id: str
    endpoint: str
    secret: str
    url: str
    to: str

    def envelope(
        self,
        type_: str,
        payload: Mapping[str, Any] | None = None,
        *,
        message_id: str | None = None,
        **changes: Any,
    ) -> dict[str, Any]:
        """A fresh envelope from us to the peer; `changes` replace (or add) top-level members."""
        value: dict[str, Any] = {
            "version": "1.0",
            "id": message_id or new_message_id(),
            "type": mtype(type_),
            "from": {"agent_id": self.agent_id, "endpoint": self.endpoint},
            "to": {"agent_id": self.to},
            "timestamp": format_timestamp(utc_now()),
            "payload": dict(payload or {}),
        }
        value.update(changes)
        return value

    def task_request(
        self,
        task_id: str,
        task_type: str,
        payload: Mapping[str, Any] | None = None,
        **changes: Any,
    ) -> dict[str, Any]:
        task = {"id": task_id, "type": task_type, "priority": "normal", "payload": payload or {}}
        return self.envelope("task_request", {"task": task}, **changes)

    def sign(self, value: dict[str, Any], mode: Mode = "header") -> tuple[bytes, dict[str, str]]:
        return sign(value, self.secret, mode)

    async def post_bytes(self, body: Any, headers: Mapping[str, str] | None = None) -> RawReply:
        headers = dict(headers if headers is not None else {"Content-Type": "application/json"})
        async with self.session.post(
            self.url, data=body, headers=headers, timeout=TIMEOUT
        ) as response:
            return RawReply(response.status, await response.read(), dict(response.headers))

    async def post(self, value: dict[str, Any], mode: Mode = "header") -> RawReply:
        return await self.post_bytes(*self.sign(value, mode))

    async def send(
        self, type_: str, payload: Mapping[str, Any] | None = None, mode: Mode = "header", **kw: Any
    ) -> RawReply:
        """Build, sign and POST one envelope."""
        return await self.post(self.envelope(type_, payload, **kw), mode)


#: What `CallbackSink.answer` returns: (type, payload) or (type, payload, HTTP status).
Answer = tuple[str, dict[str, Any]] | tuple[str, dict[str, Any], int]
_ACKED_BY_TASK_ACK = {"p2p:task_complete", "p2p:task_failed"}


@dataclass
class CallbackSink:
    """The callback endpoint of a raw partner: records every POST and acknowledges it, signed.

    A status update, need_info or need_human gets `ack`; complete and failed get `task_ack`;
    a heartbeat gets a heartbeat. `answer`, when set, may decide instead: it gets the message
    and returns the reply's type and payload, and optionally its HTTP status (None: the default
    answer).
    """

    agent_id: str
    secret: str
    received: list[dict[str, Any]] = field(default_factory=list)
    #: POSTs whose signature did not verify (answered 403, as a peer would).
    forged: int = 0
    endpoint: str = ""
    answer: Callable[[dict[str, Any]], Awaitable[Answer | None]] | None = None
    _runner: web.AppRunner | None = None
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/synapse/callback", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.endpoint = f"http://127.0.0.1:{port}/synapse/callback"

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        header = request.headers.get(SIGNATURE_HEADER)
        if header is None or not verify_header_signature([self.secret], body, header):
            self.forged += 1
            return web.Response(status=403)
        message = json.loads(body)
        self.received.append(message)
        self._changed.set()
        kind = message["type"]
        answer = await self.answer(message) if self.answer is not None else None
        status = 200
        if answer is not None:
            reply_type, payload = mtype(answer[0]), answer[1]
            status = answer[2] if len(answer) == 3 else 200
        elif kind in _ACKED_BY_TASK_ACK:
            reply_type = "p2p:task_ack"
            state = "completed" if kind == "p2p:task_complete" else "failed"
            payload: dict[str, Any] = {"task_id": message["payload"]["task_id"], "state": state}
        elif kind == "p2p:heartbeat":
            reply_type, payload = kind, {"status": "ok", "active_tasks": 0}
        else:
            reply_type, payload = "p2p:ack", {}
        reply = {
            "version": "1.0",
            "id": new_message_id(),
            "type": reply_type,
            "from": {"agent_id": self.agent_id, "endpoint": self.endpoint},
            "to": {"agent_id": message["from"]["agent_id"]},
            "timestamp": format_timestamp(utc_now()),
            "reply_to": message["id"],
            "payload": payload,
        }
        out, headers = sign(reply, self.secret)
        return web.Response(status=status, body=out, headers=headers)

    def about(self, task_id: str) -> list[dict[str, Any]]:
        """The callbacks received about `task_id`, in order."""
        return [m for m in self.received if m["payload"].get("task_id") == task_id]

    async def wait_for(
        self, predicate: Callable[[list[dict[str, Any]]], bool], timeout: float = 5.0
    ) -> None:
        """Wait until `predicate(received)` holds."""

        async def until() -> None:
            while not predicate(self.received):
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(until(), timeout)


async def eventually(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll `predicate` until it holds (or fail after `timeout` s)."""

    async def until() -> None:
        # The state lives in other tasks' objects; a short poll is the plain way to watch it.
        while not predicate():  # noqa: ASYNC110
            await asyncio.sleep(0.01)

    await asyncio.wait_for(until(), timeout)
