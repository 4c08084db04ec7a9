"""`/healthz` and `/readyz` while a peer starts, drains, and while its store cannot write."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from opskit import WAIT, E, base_url, peer_pair

from synapse.ops.health import enable_health
from synapse.store import SqliteStore
from synapse.store.memory import MemoryStore
from synapse.transport.peer import Peer


async def get(url: str) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.json()


async def test_not_ready_while_starting_then_ready() -> None:
    """A peer attached to an app that already serves: ready only once `start()` ran."""
    peer = Peer("agent-a")
    enable_health(peer)
    app = web.Application()
    peer.attach(app, "http://127.0.0.1:0/synapse/callback")
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        assert await get(url + "/healthz") == (200, {"status": "alive"})
        status, body = await get(url + "/readyz")
        assert (status, body["status"], body["checks"]["started"]) == (503, "not_ready", False)
        await peer.start()
        status, body = await get(url + "/readyz")
        assert (status, body) == (
            200,
            {"status": "ready", "checks": {"started": True, "draining": False, "store": "ok"}},
        )
        await peer.close()
        status, body = await get(url + "/readyz")
        assert (status, body["checks"]["started"]) == (503, False)
        assert (await get(url + "/healthz"))[0] == 200
    finally:
        await runner.cleanup()


async def test_not_ready_while_draining() -> None:
    async with peer_pair(setup_e=enable_health) as pair:
        url = base_url(pair.e) + "/readyz"
        assert (await get(url))[0] == 200
        assert await pair.e.protocol.drain(timeout=WAIT)  # refuses new tasks from now on
        status, body = await get(url)
        assert (status, body["checks"]["draining"], body["checks"]["started"]) == (503, True, True)
        assert (await get(base_url(pair.e) + "/healthz"))[0] == 200


async def test_not_ready_while_the_sqlite_store_cannot_write(tmp_path: Path) -> None:
    """Another process holds the database's write lock: not ready until it lets go."""
    path = tmp_path / "e.db"
    peer = Peer("agent-a", store=SqliteStore(path))
    enable_health(peer, probe_cache=0.0)
    async with peer:
        url = base_url(peer) + "/readyz"
        assert (await get(url))[0] == 200
        other = sqlite3.connect(str(path), isolation_level=None)
        other.execute("BEGIN EXCLUSIVE")
        try:
            status, body = await get(url)
            assert status == 503
            assert "locked" in body["checks"]["store"]
            assert (await get(base_url(peer) + "/healthz"))[0] == 200
        finally:
            other.execute("ROLLBACK")
            other.close()
        assert (await get(url))[0] == 200


class FailingStore(MemoryStore):
    """Commits fail while `failing` is set (a full disk, a lost database)."""

    def __init__(self) -> None:
        super().__init__()
        self.failing = False

    async def commit(self) -> None:
        if self.failing:
            raise OSError(28, "No space left on device")


async def test_not_ready_after_a_failed_commit_until_commits_work_again() -> None:
    store = FailingStore()
    async with peer_pair(setup_r=enable_health, r_store=store) as pair:
        url = base_url(pair.r) + "/readyz"
        store.failing = True
        # `submit` returns once the task is durable: it waits for the store meanwhile.
        submitting = asyncio.create_task(pair.r.submit(E, "echo", {"text": "x"}))
        status, body = await get(url)  # the check's own commit fails
        assert status == 503 and "No space left" in body["checks"]["store"]
        assert not submitting.done()
        store.failing = False
        status, body = await get(url)  # the check commits again, and that works now
        assert (status, body["checks"]["store"]) == (200, "ok")
        with_failure = await submitting
        await with_failure.cancel()
