"""The floor: the least an executor of the Synapse wire can do per `echo` task, and the
independent requester that drives it and `synapse serve` alike.

Both speak the three exchanges of an echo task (specs/protocol.md, "HTTP transport") with
aiohttp server and client, the standard library's `json` and HMAC-SHA256 in header mode,
and nothing else: no I-JSON checks, no deduplication, no state table, no store, no logging.
That is the floor a protocol implementation is measured against: whatever Synapse spends
above it is the price of the protocol's guarantees and of its own code.

- `floor-executor`: answers a signed `task_request` with a signed `task_confirm`, then POSTs
  `task_status_update{executing}` and `task_complete` to the requester, one after the other,
  checking the signature of each reply.
- `floor-requester`: the load generator. POSTs signed `task_request`s to an executor (the
  floor's or `synapse serve`), checks the signed reply, serves the executor's callbacks on
  its own aiohttp server (checking their signatures, answering signed `ack` / `task_ack`),
  and counts a task once its `task_complete` arrived. It records the latency of each
  exchange as seen from outside (see `Requester.load`).

Run by `benchmarks._worker` (roles `floor-executor`, `floor-requester`).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import json
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from benchmarks._common import HOST, Backoff, answer, commands, cpu_now, drive, percentile

PATH = "/synapse/callback"
HEADER = "X-Synapse-Signature"
JSON = "application/json"


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def sign(secret: bytes, body: bytes) -> str:
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def verified(secret: bytes, body: bytes, header: str | None) -> bool:
    return header is not None and hmac.compare_digest(header, sign(secret, body))


def envelope(
    kind: str,
    payload: dict[str, Any],
    *,
    sender: str,
    endpoint: str,
    to: str,
    reply_to: str | None = None,
) -> dict[str, Any]:
    message: dict[str, Any] = {
        "version": "1.0",
        "id": uuid.uuid4().hex,
        "type": kind,
        "from": {"agent_id": sender, "endpoint": endpoint},
        "to": {"agent_id": to},
        "timestamp": now_rfc3339(),
        "payload": payload,
    }
    if reply_to is not None:
        message["reply_to"] = reply_to
    return message


# --- the floor executor ---------------------------------------------------------------------


async def post_signed(
    session: Any, secret: bytes, url: str, message: dict[str, Any], body: bytes, expect: str
) -> None:
    """POST `message` (encoded as `body`), signed; check that the signed reply is `expect`
    and answers it."""
    headers = {"Content-Type": JSON, HEADER: sign(secret, body)}
    async with session.post(url, data=body, headers=headers) as resp:
        reply_body = await resp.read()
        if resp.status != 200 or not verified(secret, reply_body, resp.headers.get(HEADER)):
            raise RuntimeError(f"callback refused: HTTP {resp.status}")
    reply = json.loads(reply_body)
    if reply["type"] != expect or reply["reply_to"] != message["id"]:
        raise RuntimeError(f"unexpected reply {reply['type']}")


async def serve_post(handle: Any, port: int) -> Any:
    """An aiohttp server on `port` answering POSTs to the callback path with `handle`; its
    runner (to clean up)."""
    from aiohttp import web

    app = web.Application()
    app.router.add_post(PATH, handle)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, HOST, port, reuse_address=True).start()
    return runner


async def task_request_of(request: Any, secret: bytes, me: str) -> Any:
    """The signed `task_request` to `me` a request carries (a dict), or the refusal to answer
    (an aiohttp response: 403 for a bad signature, 400 for anything else)."""
    from aiohttp import web

    body = await request.read()
    if not verified(secret, body, request.headers.get(HEADER)):
        return web.Response(status=403)
    message = json.loads(body)
    if message["type"] != "p2p:task_request" or message["to"]["agent_id"] != me:
        return web.Response(status=400)
    return message


async def floor_executor(args: argparse.Namespace) -> None:
    import aiohttp
    from aiohttp import web

    secret = args.secret.encode()
    me = args.agent_id
    endpoint = f"http://{HOST}:{args.port}{PATH}"
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    running: set[asyncio.Task[None]] = set()
    counts = {"served": 0, "completed": 0, "errors": 0}

    async def post(url: str, message: dict[str, Any], expect: str) -> None:
        await post_signed(session, secret, url, message, json.dumps(message).encode(), expect)

    async def execute(request: dict[str, Any]) -> None:
        requester = request["from"]
        task = request["payload"]["task"]
        url = requester["endpoint"]
        try:
            update = {"task_id": task["id"], "status": "executing"}
            await post(
                url,
                envelope(
                    "p2p:task_status_update",
                    update,
                    sender=me,
                    endpoint=endpoint,
                    to=requester["agent_id"],
                ),
                "p2p:ack",
            )
            complete = {
                "task_id": task["id"],
                "result": {"output_type": "text", "output": task["payload"]["text"]},
            }
            await post(
                url,
                envelope(
                    "p2p:task_complete",
                    complete,
                    sender=me,
                    endpoint=endpoint,
                    to=requester["agent_id"],
                ),
                "p2p:task_ack",
            )
            counts["completed"] += 1
        except Exception:
            counts["errors"] += 1

    async def handle(request: web.Request) -> web.Response:
        message = await task_request_of(request, secret, me)
        if isinstance(message, web.Response):
            return message
        counts["served"] += 1
        task_id = message["payload"]["task"]["id"]
        reply = envelope(
            "p2p:task_confirm",
            {"task_id": task_id, "confirmed": True},
            sender=me,
            endpoint=endpoint,
            to=message["from"]["agent_id"],
            reply_to=message["id"],
        )
        out = json.dumps(reply).encode()
        job = asyncio.ensure_future(execute(message))
        running.add(job)
        job.add_done_callback(running.discard)
        return web.Response(body=out, headers={"Content-Type": JSON, HEADER: sign(secret, out)})

    runner = await serve_post(handle, args.port)
    answer({"url": endpoint})
    async for _command in commands(cpu=False):
        answer({**cpu_now(), **counts})
    await session.close()
    await runner.cleanup()


# --- the requester ---------------------------------------------------------------------------


class Requester:
    """Drives echo tasks against one executor at a time and serves its callbacks.

    Latency of each exchange, as an outside observer sees it: `request` is the POST of the
    `task_request` until its reply is read; `executing` from that reply until the
    executor's `task_status_update` arrives; `complete` from our `ack` until its
    `task_complete` arrives. Each callback gap holds one exchange of the executor (its
    POST and our reply) plus its own scheduling between them.
    """

    def __init__(self, args: argparse.Namespace) -> None:
        import aiohttp

        self.secret = args.secret.encode()
        self.me = args.agent_id
        self.endpoint = f"http://{HOST}:{args.port}{PATH}"
        self.port = args.port
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=args.connections))
        #: task id → [future of its end, time the previous step ended]
        self.waiting: dict[str, list[Any]] = {}
        self.gaps: dict[str, list[float]] = {"request": [], "executing": [], "complete": []}
        self.recording = False
        self.rejected = 0

    async def start(self) -> Any:
        from aiohttp import web

        app = web.Application()
        app.router.add_post(PATH, self.callback)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        await web.TCPSite(runner, HOST, self.port, reuse_address=True).start()
        return runner

    def reply(self, message: dict[str, Any], kind: str, payload: dict[str, Any]) -> Any:
        from aiohttp import web

        out = json.dumps(
            envelope(
                kind,
                payload,
                sender=self.me,
                endpoint=self.endpoint,
                to=message["from"]["agent_id"],
                reply_to=message["id"],
            )
        ).encode()
        return web.Response(
            body=out, headers={"Content-Type": JSON, HEADER: sign(self.secret, out)}
        )

    async def callback(self, request: Any) -> Any:
        from aiohttp import web

        body = await request.read()
        if not verified(self.secret, body, request.headers.get(HEADER)):
            return web.Response(status=403)
        message = json.loads(body)
        kind = message["type"]
        if kind == "p2p:heartbeat":  # synapse serve checks on its partners now and then
            return self.reply(message, "p2p:heartbeat", {"status": "ok", "active_tasks": 0})
        task_id = message["payload"]["task_id"]
        entry = self.waiting.get(task_id)
        arrived = time.perf_counter()
        if kind == "p2p:task_status_update":
            if entry is not None:
                if self.recording:
                    self.gaps["executing"].append(arrived - entry[1])
                response = self.reply(message, "p2p:ack", {})
                entry[1] = time.perf_counter()
                return response
            return self.reply(message, "p2p:ack", {})
        if kind == "p2p:task_complete":
            response = self.reply(
                message, "p2p:task_ack", {"task_id": task_id, "state": "completed"}
            )
            if entry is not None:
                if self.recording:
                    self.gaps["complete"].append(arrived - entry[1])
                if not entry[0].done():
                    entry[0].set_result(message["payload"]["result"]["output"])
            return response
        return web.Response(status=400)

    async def one(self, url: str, executor: str) -> None:
        task_id = uuid.uuid4().hex
        message = envelope(
            "p2p:task_request",
            {"task": {"id": task_id, "type": "echo", "payload": {"text": "hello"}}},
            sender=self.me,
            endpoint=self.endpoint,
            to=executor,
        )
        body = json.dumps(message).encode()
        headers = {"Content-Type": JSON, HEADER: sign(self.secret, body)}
        done = asyncio.get_running_loop().create_future()
        entry = [done, 0.0]
        self.waiting[task_id] = entry
        try:
            t0 = time.perf_counter()
            async with self.session.post(url, data=body, headers=headers) as resp:
                reply_body = await resp.read()
                signature = resp.headers.get(HEADER)
                status = resp.status
            entry[1] = t1 = time.perf_counter()
            if self.recording:
                self.gaps["request"].append(t1 - t0)
            if status != 200 or not verified(self.secret, reply_body, signature):
                raise RuntimeError(f"task_request refused: HTTP {status} {reply_body[:200]!r}")
            reply = json.loads(reply_body)
            if reply["type"] == "p2p:task_reject":
                self.rejected += 1
                alternatives = reply["payload"].get("alternatives") or {}
                raise Rejected(float(alternatives.get("retry_after") or 0.01))
            if reply["type"] != "p2p:task_confirm":
                raise RuntimeError(f"not confirmed: {reply_body[:300]!r}")
            output = await asyncio.wait_for(done, 60)
            if output != "hello":
                raise RuntimeError(f"echo returned {output!r}")
        finally:
            del self.waiting[task_id]

    async def load(self, command: dict[str, Any]) -> dict[str, Any]:
        """`concurrency` workers, each running tasks back to back for warmup + seconds."""
        url, executor = command["url"], command["agent_id"]
        concurrency, seconds, warmup = command["concurrency"], command["seconds"], command["warmup"]
        for values in self.gaps.values():
            values.clear()
        self.rejected = 0

        async def one() -> None:
            await self.one(url, executor)

        def starting(measured: bool) -> None:
            self.recording = measured  # only exchanges of the measured window are kept

        result = await drive(
            one, concurrency=concurrency, seconds=seconds, warmup=warmup, starting=starting
        )
        self.recording = False
        return {
            **result,
            "rejected": self.rejected,
            "exchange_p50": {k: percentile(v, 50) for k, v in self.gaps.items()},
            "exchange_p99": {k: percentile(v, 99) for k, v in self.gaps.items()},
        }


class Rejected(Backoff):
    """The executor answered `task_reject` (at capacity): backpressure. The next attempt
    waits for its advisory `alternatives.retry_after` (`capacity_retry_after`), as a
    conforming requester's does."""


async def floor_requester(args: argparse.Namespace) -> None:
    requester = Requester(args)
    runner = await requester.start()
    answer({"endpoint": requester.endpoint})
    async for command in commands():
        if command["cmd"] == "load":
            answer(await requester.load(command))
        else:
            answer(cpu_now())
    await requester.session.close()
    await runner.cleanup()
