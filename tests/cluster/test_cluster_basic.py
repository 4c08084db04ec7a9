"""Replicas behind nginx serve one agent: tasks complete whichever replica gets each message."""

from __future__ import annotations

import asyncio

from clusterkit import ClusterFactory, E, finals

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
