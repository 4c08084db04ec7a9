"""Two replicas behind nginx, one of them stopped mid-task: its tasks' timers fire once, on
whichever replica owns the task when they are due, and a resumable handler's task goes on
elsewhere and completes once.

Every process runs on 127.0.0.1 and is stopped by its PID (tests/cluster/conftest.py).
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections import Counter
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from clusterkit import Cluster, ClusterFactory, E, Replica, finals
from rawpost import eventually

from synapse.runtime.protocol import TaskHandle
from synapse.types import TaskState

pytestmark = pytest.mark.slow

LEASE_TTL = 2.0


def leased(cluster: Cluster, task_ids: list[str]) -> dict[str, list[str]]:
    """Which of `task_ids` each replica (by name) holds the lease of."""
    by_url = {replica.url: replica.name for replica in cluster.replicas}
    found: dict[str, list[str]] = {replica.name: [] for replica in cluster.replicas}
    with psycopg.connect(cluster.store) as conn:
        rows = conn.execute(
            "SELECT r.url, l.task_id FROM leases l JOIN replicas r ON r.replica_id = l.holder "
            "WHERE l.task_id = ANY(%s)",
            (task_ids,),
        ).fetchall()
    for url, task_id in rows:
        found[by_url[str(url)]].append(str(task_id))
    return found


def busiest(cluster: Cluster, task_ids: list[str]) -> Replica:
    held = leased(cluster, task_ids)
    name = max(held, key=lambda name: len(held[name]))
    return next(replica for replica in cluster.replicas if replica.name == name)


def taken_over(replica: Replica) -> set[str]:
    """The tasks `replica` logged taking over."""
    taken: set[str] = set()
    for line in replica.log.read_text(errors="replace").splitlines():
        if not line.startswith("{"):
            continue
        event = json.loads(line)
        if event.get("event") == "task_taken_over":
            taken.add(event["task_id"])
        elif event.get("event") == "tasks_taken_over":
            taken.update(event["tasks"])
    return taken


def history(cluster: Cluster, to_state: str) -> Counter[str]:
    """Transitions into `to_state` per task, in the shared database."""
    with psycopg.connect(cluster.store) as conn:
        rows = conn.execute(
            "SELECT task_id FROM transitions WHERE to_state = %s AND role = 'executor'",
            (to_state,),
        ).fetchall()
    return Counter(str(task_id) for (task_id,) in rows)


async def started(cluster: Cluster, handles: list[TaskHandle], callbacks: int = 1) -> None:
    inbound = cluster.requester.inbound
    await eventually(lambda: all(len(inbound[h.task_id]) >= callbacks for h in handles), 30)


async def test_deadlines_and_input_timeouts_fire_once_across_replicas(
    make_cluster: ClusterFactory,
) -> None:
    """The owner freezes past its lease with timers armed; the other replica takes the tasks
    over and arms them again; the frozen one wakes after they were due. Each task fails once
    (`execution_timeout`), on one replica, with one `task_failed`."""
    cluster = await make_cluster(
        2,
        lease_ttl=LEASE_TTL,
        config_lines="input_timeout = 5\n",
        handler="resumable:ResumableDemo",
    )
    peer = cluster.requester.peer
    # Questions nobody answers (text_generation without a style asks for one) ...
    asking = [await peer.submit(E, "text_generation", {"prompt": f"p{n}"}) for n in range(10)]
    # ... and tasks longer than their deadline (resumed, not failed, when taken over).
    deadline = datetime.now(UTC) + timedelta(seconds=5)
    late = [
        await peer.submit(E, "slow", {"steps": 100, "delay": 0.2}, deadline=deadline)
        for _ in range(10)
    ]
    handles = asking + late
    await started(cluster, late)  # each is running (its first status update arrived)
    frozen = busiest(cluster, [h.task_id for h in handles])
    frozen.signal(signal.SIGSTOP)
    # Past the lease and past the timers: a deliberate pause, not a synchronisation.
    await asyncio.sleep(max(0.0, deadline.timestamp() - time.time()) + LEASE_TTL)
    frozen.signal(signal.SIGCONT)
    outcomes = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 60)

    for handle, outcome in zip(handles, outcomes, strict=True):
        assert outcome.state is TaskState.FAILED, (handle.task_id, outcome)
        assert outcome.error is not None and outcome.error.code == "execution_timeout"
        seen = cluster.requester.inbound[handle.task_id]
        assert finals(seen) == ["p2p:task_failed"], (handle.task_id, seen)
        assert seen[-1] == "p2p:task_failed"
    failed = history(cluster, "failed")
    assert {h.task_id: failed[h.task_id] for h in handles} == {h.task_id: 1 for h in handles}


async def test_a_resumable_task_of_a_killed_replica_resumes_elsewhere_and_completes_once(
    make_cluster: ClusterFactory,
) -> None:
    cluster = await make_cluster(2, lease_ttl=LEASE_TTL, handler="resumable:ResumableDemo")
    peer = cluster.requester.peer
    handles = [await peer.submit(E, "slow", {"steps": 8, "delay": 0.5}) for _ in range(10)]
    await started(cluster, handles, callbacks=2)  # running: a progress update arrived
    task_ids = [h.task_id for h in handles]
    victim = busiest(cluster, task_ids)
    on_victim = set(leased(cluster, task_ids)[victim.name])
    assert on_victim
    await victim.kill()
    outcomes = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 60)

    assert [o.state for o in outcomes] == [TaskState.COMPLETED] * len(handles)  # none failed
    assert all(o.result is not None and o.result.output == "done after 8 steps" for o in outcomes)
    for handle in handles:
        seen = cluster.requester.inbound[handle.task_id]
        assert finals(seen) == ["p2p:task_complete"], (handle.task_id, seen)
        assert seen[-1] == "p2p:task_complete"
    completed = history(cluster, "completed")
    assert {t: completed[t] for t in task_ids} == {t: 1 for t in task_ids}
    # The survivor took the victim's tasks over, ran their handlers again and completed them.
    survivor = next(r for r in cluster.replicas if r is not victim)
    assert on_victim <= taken_over(survivor)
