"""Running for months, over real loopback HTTP: per-partner rate limit (429 + Retry-After),
a per-partner share of capacity, questions that end after `input_timeout`, and requests
answered 503 `agent_not_ready` until recovery is done."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from rawpost import CallbackSink, RawAgent, check_nack, eventually

from synapse.demo.handler import DemoHandler
from synapse.p2p.config import P2PConfig
from synapse.store import SqliteStore
from synapse.store.base import Snapshot
from synapse.transport.partners import Partner
from synapse.transport.peer import Peer

E = "agent-e"
R, SECRET_R = "agent-r", "secret-of-r"
X, SECRET_X = "agent-x", "secret-of-x"
FAST: dict[str, Any] = {
    "max_retries": 1,
    "retry_base_delay": 0.01,
    "retry_max_delay": 0.05,
    "request_timeout": 5,
}


@dataclass
class World:
    peer: Peer
    r: RawAgent
    x: RawAgent
    sink_r: CallbackSink


@asynccontextmanager
async def world(store: Any = None, *, start: bool = True, **config: Any) -> AsyncIterator[World]:
    sink_r, sink_x = CallbackSink(R, SECRET_R), CallbackSink(X, SECRET_X)
    await sink_r.start()
    await sink_x.start()
    peer = Peer(
        E,
        partners=[
            Partner(R, sink_r.endpoint, (SECRET_R,)),
            Partner(X, sink_x.endpoint, (SECRET_X,)),
        ],
        handler=DemoHandler(),
        config=P2PConfig(**{**FAST, **config}),
        store=store,
    )
    session = aiohttp.ClientSession()
    try:
        if start:
            await peer.start()
            url = peer.endpoint
        else:
            url = ""
        yield World(
            peer,
            RawAgent(session, R, sink_r.endpoint, SECRET_R, url, E),
            RawAgent(session, X, sink_x.endpoint, SECRET_X, url, E),
            sink_r,
        )
    finally:
        await session.close()
        await peer.close(drain_timeout=0)
        await sink_r.close()
        await sink_x.close()


async def test_a_partner_over_its_rate_gets_429_with_retry_after() -> None:
    async with world(rate_limit=0.5, rate_burst=2) as w:
        first = [await w.r.send("heartbeat", {"status": "ok", "active_tasks": 0}) for _ in range(2)]
        assert [reply.status for reply in first] == [200, 200]
        limited = await w.r.send("heartbeat", {"status": "ok", "active_tasks": 0})
        details = check_nack(limited, 429, "rate_limited", signed=True, secret=SECRET_R)
        assert details["retry_after"] > 0
        assert int(limited.headers["Retry-After"]) >= 1
        # Per partner: another one is not limited by R's rate.
        other = await w.x.send("heartbeat", {"status": "ok", "active_tasks": 0})
        assert other.status == 200


async def test_one_partner_cannot_take_every_slot() -> None:
    async with world(max_concurrent_tasks=3, max_tasks_per_partner=2) as w:
        slow = {"steps": 1, "delay": 10}
        for n in range(2):
            reply = await w.r.post(w.r.task_request(f"r-{n}", "slow", slow))
            assert reply.type == "p2p:task_confirm", reply
        refused = await w.r.post(w.r.task_request("r-2", "slow", slow))
        assert refused.type == "p2p:task_reject", refused
        assert refused.payload["reason"]["code"] == "rate_limited"
        assert refused.payload["alternatives"]["retry_after"] > 0
        welcome = await w.x.post(w.x.task_request("x-0", "slow", slow))
        assert welcome.type == "p2p:task_confirm", welcome


async def test_a_question_nobody_answers_ends_and_frees_capacity() -> None:
    async with world(input_timeout=0.3, max_concurrent_tasks=1) as w:
        asked = await w.r.post(w.r.task_request("t-1", "text_generation", {"prompt": "p"}))
        assert asked.type == "p2p:task_need_info", asked
        full = await w.x.post(w.x.task_request("x-1", "echo", {"text": "hi"}))
        assert full.type == "p2p:task_reject"  # the unanswered question holds the one slot

        def failed() -> list[dict[str, Any]]:
            return [m for m in w.sink_r.about("t-1") if m["type"] == "p2p:task_failed"]

        await w.sink_r.wait_for(lambda _got: bool(failed()))
        [message] = failed()
        assert message["payload"]["error"]["code"] == "execution_timeout"
        assert "input_timeout" in message["payload"]["error"]["message"]
        await eventually(lambda: w.peer.protocol.engine.active_executor_tasks() == 0)
        freed = await w.x.post(w.x.task_request("x-2", "echo", {"text": "hi"}))
        assert freed.type == "p2p:task_confirm", freed


class SlowLoadingStore(SqliteStore):
    """A store whose start-up read waits for the test (a very large file, say)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.loading = threading.Event()
        self.release = threading.Event()

    def load(self) -> Snapshot:
        self.loading.set()
        self.release.wait(10)
        return super().load()


async def test_requests_get_503_until_recovery_is_done(tmp_path: Path) -> None:
    store = SlowLoadingStore(tmp_path / "e.sqlite")
    async with world(store, start=False) as w:
        starting = asyncio.create_task(w.peer.start())
        await eventually(store.loading.is_set)
        url = w.peer.endpoint  # bound: the port answers while the store is read
        w.r.url = url
        reply = await w.r.post(w.r.task_request("t-1", "echo", {"text": "hi"}))
        details = check_nack(reply, 503, "agent_not_ready", signed=True, secret=SECRET_R)
        assert details["reason"] == "starting"
        assert not starting.done()  # the loop was free to answer: the read is off the loop
        store.release.set()
        await starting
        again = await w.r.post(w.r.task_request("t-1", "echo", {"text": "hi"}))
        assert again.type == "p2p:task_confirm", again
