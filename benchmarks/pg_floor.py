"""The PostgreSQL floor: the least a durable executor of the Synapse wire, sharing one database
with other replicas, can do per `echo` task.

`benchmarks.floor`'s executor (aiohttp, the standard library's `json` and HMAC-SHA256, the
three exchanges of an echo task), made durable the way a replica must be, and nothing more:

- every received message and every reply is written before it is acknowledged, in the
  tables of Synapse's own schema, the same rows per message as a replica: the task, its
  transitions, the dedup entry of the `task_request`, the outbox row of each callback until
  its reply came, the task's lease;
- each write is fenced by the task's lease (taken by the first write of a new task, checked
  and share-locked by every later one: `synapse_fence_all`, in the same statement batch);
- one writer groups all writes waiting into one transaction sent as one pipelined round trip
  (BEGIN, fence, writes, COMMIT), so that concurrent messages share a commit; a task's lease
  is deleted once the task is finished.

No I-JSON checks, no state table, no dedup lookup, no retries, no logs, no takeover: what
Synapse spends above this is the price of its guarantees and of its own code.

Run by `benchmarks._worker` (role `pg-floor-executor`, `--store URL`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

from benchmarks._common import HOST, answer, commands, cpu_now
from benchmarks.floor import (
    HEADER,
    JSON,
    PATH,
    envelope,
    post_signed,
    serve_post,
    sign,
    task_request_of,
)

#: How long a lease is taken for (the floor never renews: its tasks take milliseconds).
LEASE_TTL = 60.0
HOLDER = "pg-floor"

Op = tuple[bytes, tuple[Any, ...]]


class Writer:
    """One connection, one transaction at a time, each carrying every write that waited."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        #: (task key, epoch 0 for a new task's lease or 1 after), its writes, its future.
        self.waiting: list[tuple[tuple[str, str], int, list[Op], asyncio.Future[None]]] = []
        self.wake = asyncio.Event()
        self.commits = 0
        self.closed = False

    def write(self, key: tuple[str, str], epoch: int, ops: list[Op]) -> asyncio.Future[None]:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting.append((key, epoch, ops, done))
        self.wake.set()
        return done

    async def run(self) -> None:
        while not self.closed:
            await self.wake.wait()
            self.wake.clear()
            batch, self.waiting = self.waiting, []
            if not batch:
                continue
            fenced = sorted({(key, epoch) for key, epoch, _ops, _done in batch})
            try:
                async with self.conn.pipeline(), self.conn.transaction():
                    cur = self.conn.cursor()
                    await cur.execute(
                        b"SELECT synapse_fence_all(%s, %s, %s, %s, %s)",
                        (
                            [k[0] for k, _ in fenced],
                            [k[1] for k, _ in fenced],
                            [e for _, e in fenced],
                            HOLDER,
                            time.time() + LEASE_TTL,
                        ),
                    )
                    for _key, _epoch, ops, _done in batch:
                        for query, params in ops:
                            await cur.execute(query, params)
            except Exception as exc:
                for *_rest, done in batch:
                    done.set_exception(exc)
                continue
            self.commits += 1
            for *_rest, done in batch:
                done.set_result(None)


def transition(requester: str, task_id: str, from_: str, to: str, event: str) -> Op:
    return (
        b"INSERT INTO transitions (requester, task_id, role, from_state, to_state, event, at) "
        b"VALUES (%s, %s, 'executor', %s, %s, %s, %s)",
        (requester, task_id, from_, to, event, time.time()),
    )


def task_row(requester: str, task_id: str, state: str, record: bytes) -> Op:
    return (
        b"INSERT INTO tasks (requester, task_id, role, state, updated_at, record) "
        b"VALUES (%s, %s, 'executor', %s, %s, %s) ON CONFLICT (requester, task_id) DO UPDATE "
        b"SET state = excluded.state, updated_at = excluded.updated_at, record = excluded.record",
        (requester, task_id, state, time.time(), record),
    )


def outbox_row(seq: int, message: dict[str, Any], body: bytes, key: tuple[str, str]) -> Op:
    return (
        b"INSERT INTO outbox (seq, message_id, partner, requester, task_id, body, created_at, "
        b"claimed_by, claimed_until) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (seq, message["id"], key[0], key[0], key[1], body, time.time(), HOLDER, time.time() + 60),
    )


def outbox_done(message_id: str) -> Op:
    return (b"DELETE FROM outbox WHERE message_id = %s", (message_id,))


async def pg_floor_executor(args: argparse.Namespace) -> None:
    import aiohttp
    import psycopg
    from aiohttp import web

    secret = args.secret.encode()
    me = args.agent_id
    endpoint = f"http://{HOST}:{args.port}{PATH}"
    conn = await psycopg.AsyncConnection.connect(args.store)
    writer = Writer(conn)
    writing = asyncio.ensure_future(writer.run())
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    running: set[asyncio.Task[None]] = set()
    counts = {"served": 0, "completed": 0, "errors": 0}
    seq = iter(range(int(time.time() * 1000) * 1000, 2**62))  # unique per run

    def record(task: dict[str, Any], state: str) -> bytes:
        return json.dumps({"task": task, "state": state}).encode()

    async def post(url: str, message: dict[str, Any], body: bytes, expect: str) -> None:
        await post_signed(session, secret, url, message, body, expect)

    async def execute(
        request: dict[str, Any], key: tuple[str, str], update: dict[str, Any], body: bytes
    ) -> None:
        requester = request["from"]
        task = request["payload"]["task"]
        url = requester["endpoint"]
        try:
            await post(url, update, body, "p2p:ack")
            complete = envelope(
                "p2p:task_complete",
                {
                    "task_id": task["id"],
                    "result": {"output_type": "text", "output": task["payload"]["text"]},
                },
                sender=me,
                endpoint=endpoint,
                to=requester["agent_id"],
            )
            complete_body = json.dumps(complete).encode()
            await writer.write(
                key,
                1,
                [
                    outbox_done(update["id"]),
                    task_row(*key, "completed", record(task, "completed")),
                    transition(*key, "executing", "completed", "task_complete"),
                    outbox_row(next(seq), complete, complete_body, key),
                ],
            )
            await post(url, complete, complete_body, "p2p:task_ack")
            await writer.write(
                key,
                1,
                [
                    outbox_done(complete["id"]),
                    (b"DELETE FROM leases WHERE requester = %s AND task_id = %s", key),
                ],
            )
            counts["completed"] += 1
        except Exception:
            counts["errors"] += 1

    async def handle(request: web.Request) -> web.Response:
        message = await task_request_of(request, secret, me)
        if isinstance(message, web.Response):
            return message
        body = await request.read()  # read once already: aiohttp keeps it
        counts["served"] += 1
        task = message["payload"]["task"]
        requester = message["from"]["agent_id"]
        key = (requester, task["id"])
        reply = envelope(
            "p2p:task_confirm",
            {"task_id": task["id"], "confirmed": True},
            sender=me,
            endpoint=endpoint,
            to=requester,
            reply_to=message["id"],
        )
        out = json.dumps(reply).encode()
        update = envelope(
            "p2p:task_status_update",
            {"task_id": task["id"], "status": "executing"},
            sender=me,
            endpoint=endpoint,
            to=requester,
        )
        update_body = json.dumps(update).encode()
        await writer.write(
            key,
            0,
            [
                task_row(*key, "executing", record(task, "executing")),
                transition(*key, "pending", "confirmed", "task_request"),
                transition(*key, "confirmed", "executing", "start"),
                (
                    b"INSERT INTO dedup (sender, message_id, fingerprint, expires_at, status, "
                    b"body, headers) VALUES (%s, %s, %s, %s, 200, %s, '')",
                    (requester, message["id"], sign(secret, body).encode(), time.time() + 600, out),
                ),
                outbox_row(next(seq), update, update_body, key),
            ],
        )
        job = asyncio.ensure_future(execute(message, key, update, update_body))
        running.add(job)
        job.add_done_callback(running.discard)
        return web.Response(body=out, headers={"Content-Type": JSON, HEADER: sign(secret, out)})

    runner = await serve_post(handle, args.port)
    answer({"url": endpoint})
    async for _command in commands(cpu=False):
        answer({**cpu_now(), **counts, "commits": writer.commits})
    writer.closed = True
    writer.wake.set()
    await writing
    await session.close()
    await runner.cleanup()
    await conn.close()
