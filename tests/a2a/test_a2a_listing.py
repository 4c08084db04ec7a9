"""A2A `ListTasks` over a durable store: read through the store's indexes, a page at a time,
after the tasks left memory and after a restart; filters and pagination as in memory."""

from __future__ import annotations

import asyncio
from pathlib import Path

from synapse.a2a import enable_a2a, wire
from synapse.a2a.client import A2AClient
from synapse.demo.handler import DemoHandler
from synapse.p2p.config import P2PConfig
from synapse.store import SqliteStore
from synapse.transport.peer import Peer
from synapse.types import TaskState

FAST = P2PConfig(max_retries=1, retry_base_delay=0.02, request_timeout=5)


async def serve(path: Path) -> tuple[Peer, str]:
    peer = Peer("agent-a", handler=DemoHandler(), config=FAST, store=SqliteStore(path))
    enable_a2a(peer, default_task_type="echo")
    await peer.start()
    return peer, f"http://127.0.0.1:{peer.port}"


async def test_list_tasks_pages_through_the_store(tmp_path: Path) -> None:
    peer, url = await serve(tmp_path / "a.sqlite")
    try:
        async with A2AClient(url) as client:
            done = [await client.send({"text": f"hi {n}"}) for n in range(7)]
            for handle in done:
                assert (await handle.result(10)).state is TaskState.COMPLETED
            slow = await client.send({"steps": 500, "delay": 0.02}, task_type="slow")
            async with asyncio.timeout(10):
                while slow.state != wire.WORKING:  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
            async with asyncio.timeout(10):  # the finished ones left memory
                while len(peer.protocol.engine.tasks) > 1:  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
            seen: list[str] = []
            token = ""
            while True:
                page = await client.list_tasks(page_size=3, page_token=token)
                assert page.total_size == 8 and page.page_size == 3
                seen += [t.id for t in page.tasks]
                token = page.next_page_token
                if not token:
                    break
            assert len(seen) == len(set(seen)) == 8  # every task once, newest first
            assert seen[0] == slow.task_id
            completed = await client.list_tasks(status=wire.COMPLETED)
            assert completed.total_size == 7
            assert {t.id for t in completed.tasks} == {h.task_id for h in done}
            assert all(t.status.state == wire.COMPLETED for t in completed.tasks)
            assert all(t.artifacts == [] for t in completed.tasks)  # not asked for
            with_art = await client.list_tasks(status=wire.COMPLETED, include_artifacts=True)
            assert all(t.artifacts for t in with_art.tasks)
            working = await client.list_tasks(status=wire.WORKING)
            assert [t.id for t in working.tasks] == [slow.task_id]
            await slow.cancel()
    finally:
        await peer.close(0)
    # After a restart, the same listing from the file.
    again, url = await serve(tmp_path / "a.sqlite")
    try:
        async with A2AClient(url) as client:
            listed = await client.list_tasks(page_size=100)
            assert listed.total_size == 8 and len(listed.tasks) == 8
            got = await client.get_task(done[0].task_id)
            assert got.status.state == wire.COMPLETED
    finally:
        await again.close(0)
