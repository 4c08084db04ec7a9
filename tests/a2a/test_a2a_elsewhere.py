"""Replicas: an A2A stream opened at the replica that then lets its task go (another replica
took it over) follows the task in the shared store to its end, instead of waiting for ever
for callbacks that now reach the other replica. (Reads and streams at a replica that never
held the task: tests/cluster/test_cluster_a2a.py.)"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import httpx
from a2akit import fast_config

from synapse.a2a import enable_a2a
from synapse.demo.handler import DemoHandler
from synapse.p2p.engine import TaskKey
from synapse.store import SqliteStore
from synapse.transport.peer import Peer
from synapse.types import TaskState

V1 = {"A2A-Version": "1.0"}


def slow_message() -> dict[str, Any]:
    return {
        "messageId": "m-elsewhere",
        "role": "ROLE_USER",
        "parts": [{"data": {"steps": 1000, "delay": 0.05}}],
        "metadata": {"taskType": "slow"},
    }


async def test_a_stream_at_a_replica_that_lets_its_task_go_ends_with_the_task(
    tmp_path: Path,
) -> None:
    path = tmp_path / "shared.sqlite"
    # Followed every lease_ttl / 5: 20 ms here.
    peer = Peer(
        "agent-s",
        handler=DemoHandler(),
        config=fast_config(lease_ttl=0.1),
        store=SqliteStore(path),
    )
    server = enable_a2a(peer)
    other = SqliteStore(path)  # the replica that takes the task over
    await peer.start()
    try:
        body = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "SendStreamingMessage",
            "params": {"message": slow_message()},
        }
        states: list[str] = []
        async with (
            httpx.AsyncClient(timeout=30) as http,
            http.stream(
                "POST", f"http://127.0.0.1:{peer.port}/a2a", json=body, headers=V1
            ) as response,
        ):
            lines = response.aiter_lines()
            async for line in lines:
                if line.startswith("data: "):
                    first = json.loads(line[6:])["result"]
                    break
            task_id = first["task"]["id"]
            key: TaskKey = next(k for k in peer.protocol.engine.tasks if k.task_id == task_id)
            peer.protocol.release(key)  # its lease was found lost
            stored = other.get_task(key)
            assert stored is not None and not stored.is_final
            other.put_task(dataclasses.replace(stored, state=TaskState.COMPLETED), [])
            await other.commit()

            async def rest() -> None:
                async for line in lines:
                    if line.startswith("data: "):
                        event = json.loads(line[6:])["result"]
                        update = event.get("statusUpdate") or event.get("task") or {}
                        state = update.get("status", {}).get("state")
                        if state:
                            states.append(state)

            await asyncio.wait_for(rest(), 20)  # the stream ends by itself
        assert states[-1] == "TASK_STATE_COMPLETED", states
        assert server.service.elsewhere.followed == frozenset()
    finally:
        await other.close()
        await peer.close(drain_timeout=0.2)
