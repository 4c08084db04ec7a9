"""Delivered is delivered: an answered message leaves the stored outbox at once (issue 12 §8).

`agent-e` runs in its own process on an SQLite file. Once its partner has answered a task's
last callback, the outbox row is deleted in a commit of its own, not whenever something else
happens to commit next: another connection sees an empty outbox while the peer sits idle, and
a SIGKILL then resends nothing.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
from faultkit import PeerProcess, RawPartner, Sink, eventually, free_ports

pytestmark = pytest.mark.slow

E, R = "agent-e", "agent-r"
Spawn = Callable[..., PeerProcess]


def stored_outbox(db: Path) -> list[str]:
    conn = sqlite3.connect(db)
    try:
        return [row[0] for row in conn.execute("SELECT message_id FROM outbox")]
    finally:
        conn.close()


async def test_an_answered_message_leaves_the_stored_outbox_promptly(
    spawn: Spawn, tmp_path: Path
) -> None:
    db = tmp_path / "e.sqlite"
    pe, ps = free_ports(2)
    sink = Sink(R, ps)
    await sink.start()
    peer = spawn(E, pe, {R: sink.endpoint}, store=str(db))
    await peer.start()
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as session:
            raw = RawPartner(R, sink.endpoint, E, peer.endpoint, session)
            ids = [f"once-{i}" for i in range(3)]
            for task_id in ids:
                reply = await raw.post(raw.task_request(task_id, "echo", {"text": "x"}))
                assert reply.status == 200, reply

            async def all_completed() -> bool:
                return len(sink.of_type("task_complete")) == len(ids)

            await eventually(all_completed, timeout=10, what="every task_complete")

            async def outbox_empty() -> bool:
                return stored_outbox(db) == []

            # Nothing else happens at the peer now: the deletes must be committed by themselves.
            await eventually(outbox_empty, timeout=5, what="an empty stored outbox")
            await peer.crash()
            assert stored_outbox(db) == []  # so nothing can be resent
            await peer.start()
            await peer.wait_final(ids, timeout=10)
            assert len(sink.of_type("task_complete")) == len(ids)
    finally:
        await peer.close()
        await sink.close()
