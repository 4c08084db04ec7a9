"""Replicas behind nginx serve one agent: tasks complete whichever replica gets each message."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import psycopg
from clusterkit import SECRET, ClusterFactory, E, R, finals
from rawpost import RawAgent

from synapse.types import TaskState


async def test_echo_tasks_through_two_replicas_complete_once(make_cluster: ClusterFactory) -> None:
    cluster = await make_cluster(2)
    peer = cluster.requester.peer
    handles = [await peer.submit(E, "echo", {"text": f"hi {n}"}) for n in range(30)]
    outcomes = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 60)
    assert all(o.state is TaskState.COMPLETED for o in outcomes)
    for handle in handles:
        seen = cluster.requester.inbound[handle.task_id]
        assert finals(seen) == ["p2p:task_complete"]
        assert seen[-1] == "p2p:task_complete"  # nothing after the final callback
    # What a failure report shows of each replica (SIGUSR1): it answers, and goes on.
    for replica in cluster.replicas:
        dump = await replica.state_dump()
        assert "commits: started" in dump and "asyncio tasks:" in dump, replica.tail()
    more = await peer.submit(E, "echo", {"text": "after the dumps"})
    assert (await asyncio.wait_for(more.result(), 30)).ok


async def test_a_duplicate_posted_to_two_replicas_at_once_is_processed_once(
    make_cluster: ClusterFactory,
) -> None:
    cluster = await make_cluster(2)
    first, second = cluster.replicas
    async with aiohttp.ClientSession() as session:
        for n in range(10):  # several rounds: the race must hold every time, not once
            agent = RawAgent(session, R, cluster.requester.url, SECRET, first.url, E)
            task_id = f"dup-{n}"
            body, headers = agent.sign(agent.task_request(task_id, "echo", {"text": "once"}))

            async def post(url: str, body: bytes = body, headers: dict[str, str] = headers) -> Any:
                async with session.post(url, data=body, headers=headers) as response:
                    return response.status, await response.read()

            one, two = await asyncio.gather(post(first.url), post(second.url))
            assert one[0] == 200, one
            assert one == two  # the same bytes from both replicas
            with psycopg.connect(cluster.store) as conn:
                requests = conn.execute(
                    "SELECT count(*) FROM transitions WHERE task_id = %s AND from_state = 'idle'",
                    (task_id,),
                ).fetchone()
            assert requests is not None and requests[0] == 1  # applied once


async def test_a_partner_outage_while_replicas_run(make_cluster: ClusterFactory) -> None:
    """The requester goes away mid-run: callbacks wait in the shared outbox, then arrive."""
    cluster = await make_cluster(2)
    requester = cluster.requester
    peer = requester.peer
    handles = [await peer.submit(E, "slow", {"steps": 3, "delay": 0.3}) for _ in range(6)]
    await requester.pause()  # the requester's port refuses connections now
    with psycopg.connect(cluster.store) as conn:
        while True:
            row = conn.execute("SELECT count(*) FROM outbox WHERE dead_reason IS NULL").fetchone()
            if row is not None and row[0] >= 1:
                break
            await asyncio.sleep(0.1)  # polling another process's database
    await requester.resume()
    outcomes = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 60)
    assert [o.state for o in outcomes] == [TaskState.COMPLETED] * 6
    for handle in handles:
        assert finals(requester.inbound[handle.task_id]) == ["p2p:task_complete"]
