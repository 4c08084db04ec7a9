"""A2A `ListTasks` over a durable store: read through the store's indexes, a page at a time,
after the tasks left memory and after a restart; filters and pagination as in memory."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from synapse.a2a import enable_a2a, wire
from synapse.a2a.client.core import A2AClient
from synapse.a2a.server.app import A2AServer
from synapse.demo.handler import DemoHandler
from synapse.p2p.config import P2PConfig
from synapse.store import SqliteStore, open_store
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


# --- every store: finished A2A tasks leave memory; listings read the store ------------------


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store_spec(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "memory":
        return "memory"
    if request.param == "sqlite":
        return str(tmp_path / "a.sqlite")
    url: str = request.getfixturevalue("pg_url")
    return url


async def serve_on(spec: str) -> tuple[Peer, A2AServer, str]:
    peer = Peer("agent-a", handler=DemoHandler(), config=FAST, store=open_store(spec))
    a2a = enable_a2a(peer, default_task_type="echo")
    await peer.start()
    return peer, a2a, f"http://127.0.0.1:{peer.port}"


async def until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(10):
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0.01)


async def test_a_finished_a2a_task_leaves_memory_and_is_still_listed(store_spec: str) -> None:
    peer, a2a, url = await serve_on(store_spec)
    try:
        async with A2AClient(url) as client:
            first = await client.send({"text": "first"})
            assert (await first.result(10)).state is TaskState.COMPLETED
            # Its Synapse task and its A2A view both leave memory once its last callback is in.
            await until(lambda: not peer.protocol.engine.tasks and not a2a.tasks)
            got = await client.get_task(first.task_id)
            assert got.id == first.task_id and got.status.state == wire.COMPLETED
            assert [p.text for p in got.artifacts[0].parts] == ["first"]
            again = await client.get_task(first.task_id)  # rebuilt alike each time
            assert again.artifacts[0].artifact_id == got.artifacts[0].artifact_id
            assert got.context_id == first.context_id
            listed = await client.list_tasks(include_artifacts=True)
            assert [t.id for t in listed.tasks] == [first.task_id]
            assert listed.tasks[0].artifacts == got.artifacts
            assert not a2a.tasks  # reading it did not bring it back to memory
    finally:
        await peer.close(0)


async def test_list_tasks_of_one_context_pages_through_the_store(store_spec: str) -> None:
    peer, a2a, url = await serve_on(store_spec)
    try:
        async with A2AClient(url) as client:
            ours = [await client.send({"text": f"ours {n}"}, context_id="ctx-1") for n in range(5)]
            theirs = [await client.send({"text": f"other {n}"}) for n in range(3)]
            for handle in [*ours, *theirs]:
                assert (await handle.result(10)).state is TaskState.COMPLETED
            live = await client.send(
                {"steps": 500, "delay": 0.02}, task_type="slow", context_id="ctx-1"
            )
            await until(lambda: live.state == wire.WORKING)
            await until(lambda: len(peer.protocol.engine.tasks) == 1 and len(a2a.tasks) == 1)
            seen: list[str] = []
            token = ""
            while True:
                page = await client.list_tasks(context_id="ctx-1", page_size=2, page_token=token)
                assert page.total_size == 6 and len(page.tasks) <= 2
                assert all(t.context_id == "ctx-1" for t in page.tasks)
                seen += [t.id for t in page.tasks]
                token = page.next_page_token
                if not token:
                    break
            # Every task of the context once, newest first: the one in flight, then the rest.
            assert seen == [live.task_id, *[h.task_id for h in reversed(ours)]]
            done = await client.list_tasks(context_id="ctx-1", status=wire.COMPLETED)
            assert {t.id for t in done.tasks} == {h.task_id for h in ours}
            assert (await client.list_tasks(context_id="no-such")).tasks == []
            await live.cancel()
    finally:
        await peer.close(0)
