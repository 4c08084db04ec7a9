"""Three replicas behind nginx while replicas die and freeze: nothing lost, nothing twice.

The requester (in this process) runs a bounded number of mixed tasks (echo, slow ones with
progress, need_info answered, need_human approved, some cancelled) through nginx. Mid-run
one replica is SIGKILLed (and started again later) and another is SIGSTOPped for longer than
the lease TTL, then resumed. Every task must reach exactly one final outcome on both sides
(the requester's handle and the executor's row in PostgreSQL), each task's callbacks must
arrive in an order its state machine accepts with nothing after the final one, and no
outbox row may be left behind.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import psycopg
import pytest
from clusterkit import Cluster, ClusterFactory
from workload import anomalies, executor_settled, run_mixed

pytestmark = pytest.mark.slow

#: Bounded so that the run stays well under two minutes on a loaded two-core machine.
TASKS = int(os.environ.get("SYNAPSE_CLUSTER_TASKS", "1000"))
LEASE_TTL = 2.0


def leases_of(cluster: Cluster, port: int) -> dict[tuple[str, str], float]:
    """(requester, task_id) → expiry of every lease the replica on `port` holds."""
    with psycopg.connect(cluster.store) as conn:
        rows = conn.execute(
            "SELECT l.requester, l.task_id, l.expires_at FROM leases l "
            "JOIN replicas r ON r.replica_id = l.holder WHERE r.url LIKE %s",
            (f"%:{port}/%",),
        ).fetchall()
    return {(str(r), str(t)): float(e) for r, t, e in rows}


async def test_kill_and_freeze_replicas_mid_run(make_cluster: ClusterFactory) -> None:
    cluster = await make_cluster(3, lease_ttl=LEASE_TTL, read_timeout=3.0)
    killed, frozen, _ = cluster.replicas

    async def chaos() -> None:
        await killed.kill()
        frozen.signal(signal.SIGSTOP)
        stopped_at = time.monotonic()
        # The freeze outlasts the lease: every lease the frozen replica holds has run out,
        # and another replica has taken over some of its tasks (not those locked by a
        # transaction the freeze caught open).
        held = leases_of(cluster, frozen.port)
        deadline = stopped_at + 30
        while True:
            now = leases_of(cluster, frozen.port)
            expired = all(expiry < time.time() for expiry in now.values())
            if expired and (not held or set(held) - set(now)):
                break
            assert time.monotonic() < deadline, "the frozen replica's leases were not taken over"
            await asyncio.sleep(0.1)  # polling another process's database: no event to wait on
        frozen.signal(signal.SIGCONT)
        await killed.start()

    run = await run_mixed(cluster, TASKS, chaos)
    await executor_settled(cluster)
    assert anomalies(cluster, run) == []
    assert sum(1 for _, o in run.outcomes.values() if o.ok) >= TASKS // 2, run.states()
    print(f"\n{TASKS} tasks in {run.elapsed:.1f} s, one replica killed, one frozen: {run.states()}")


async def test_two_replicas_one_killed_mid_run_and_restarted(make_cluster: ClusterFactory) -> None:
    """Two replicas on one database behind nginx, one SIGKILLed mid-run and started again."""
    cluster = await make_cluster(2, lease_ttl=LEASE_TTL, read_timeout=3.0)
    killed, _ = cluster.replicas

    async def chaos() -> None:
        await killed.kill()
        await killed.start()  # at once: its tasks are taken over once the lease runs out

    run = await run_mixed(cluster, TASKS // 2, chaos)
    await executor_settled(cluster)
    assert anomalies(cluster, run) == []
    assert sum(1 for _, o in run.outcomes.values() if o.ok) >= TASKS // 4, run.states()
