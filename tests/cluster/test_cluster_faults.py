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
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest
from clusterkit import Cluster, ClusterFactory, E, finals

from synapse.runtime.protocol import Outcome, TaskHandle
from synapse.types import TaskState

pytestmark = pytest.mark.slow

#: Bounded so that the run stays well under two minutes on a loaded two-core machine.
TASKS = int(os.environ.get("SYNAPSE_CLUSTER_TASKS", "1000"))
LEASE_TTL = 2.0
IN_FLIGHT = 40


def kind_of(n: int) -> str:
    return ["slow", "need_info", "need_human", "cancel", "echo", "echo", "echo", "echo"][n % 8]


async def drive(handle: TaskHandle, kind: str) -> Outcome:
    if kind in ("need_info", "need_human", "cancel"):
        async for event in handle:
            if event.kind == "p2p:task_need_info":
                await handle.provide_info({"style": "现代"})
            elif event.kind == "p2p:task_need_human":
                await handle.approve()
            elif kind == "cancel" and event.kind == "p2p:task_status_update":
                await handle.cancel("changed my mind")
    return await handle.result()


def request_of(kind: str, n: int) -> tuple[str, dict[str, Any]]:
    if kind == "slow":
        return "slow", {"steps": 2, "delay": 0.2}
    if kind == "need_info":
        return "text_generation", {"prompt": f"p{n}"}
    if kind == "need_human":
        return "portrait", {"subject": f"s{n}"}
    if kind == "cancel":
        return "slow", {"steps": 10, "delay": 0.3}
    return "echo", {"text": f"t{n}"}


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

    await run_mixed(cluster, TASKS, chaos, "one replica killed and one frozen")


async def test_two_replicas_one_killed_mid_run_and_restarted(make_cluster: ClusterFactory) -> None:
    """Two replicas on one database behind nginx, one SIGKILLed mid-run and started again."""
    cluster = await make_cluster(2, lease_ttl=LEASE_TTL, read_timeout=3.0)
    killed, _ = cluster.replicas

    async def chaos() -> None:
        await killed.kill()
        await killed.start()  # at once: its tasks are taken over once the lease runs out

    await run_mixed(cluster, TASKS // 2, chaos, "one of two replicas killed and restarted")


async def run_mixed(
    cluster: Cluster, tasks: int, chaos: Callable[[], Awaitable[None]], what: str
) -> None:
    """Run `tasks` mixed tasks through the cluster, `chaos()` once a quarter are done, and
    check every task's outcome on both sides."""
    requester = cluster.requester
    peer = requester.peer
    gate = asyncio.Semaphore(IN_FLIGHT)
    outcomes: dict[str, tuple[str, Outcome]] = {}
    quarter = asyncio.Event()

    async def one(n: int) -> None:
        kind = kind_of(n)
        async with gate:
            task_type, payload = request_of(kind, n)
            handle = await peer.submit(E, task_type, payload, task_id=f"task-{n:05d}")
            outcomes[handle.task_id] = (kind, await drive(handle, kind))
        if len(outcomes) >= tasks // 4:
            quarter.set()

    async def after_a_quarter() -> None:
        await quarter.wait()
        await chaos()

    started = time.monotonic()
    chaos_task = asyncio.create_task(after_a_quarter())
    runs = [asyncio.create_task(one(n)) for n in range(tasks)]
    _, pending = await asyncio.wait(runs, timeout=100)
    for run in pending:
        run.cancel()
    if pending:
        with psycopg.connect(cluster.store) as conn:
            rows = dict(conn.execute("SELECT task_id, state FROM tasks").fetchall())
            # What the undelivered messages wait on (claims, leases), for the failure report.
            waiting = conn.execute(
                "SELECT o.task_id, o.claimed_by, o.claimed_until, l.holder, l.epoch, "
                "l.expires_at FROM outbox o LEFT JOIN leases l ON l.requester = o.requester "
                "AND l.task_id = o.task_id ORDER BY o.ord LIMIT 10"
            ).fetchall()
            # Sessions inside a transaction or waiting on a lock: what a hung commit waits on.
            sessions = conn.execute(
                "SELECT pid, state, wait_event_type, wait_event, "
                "round(extract(epoch FROM now() - xact_start)::numeric, 1), "
                "pg_blocking_pids(pid), left(query, 120) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                "AND (state <> 'idle' OR wait_event_type = 'Lock')"
            ).fetchall()
        stuck = {
            f"task-{n:05d}": (requester.inbound[f"task-{n:05d}"], rows.get(f"task-{n:05d}"))
            for n in range(tasks)
            if f"task-{n:05d}" not in outcomes
        }
        dumps = [f"{r.name}:\n{await r.state_dump()}" for r in cluster.replicas]
        raise AssertionError(
            f"{len(stuck)} tasks never ended: {list(stuck.items())[:5]}; outbox: {waiting}; "
            f"sessions: {sessions}; what each replica waits on:\n" + "\n".join(dumps)
        )
    for run in runs:
        run.result()
    await asyncio.wait_for(chaos_task, 30)
    elapsed = time.monotonic() - started

    # Exactly one outcome per task on the requester's side, of the kind the task allows.
    assert len(outcomes) == tasks
    states = Counter((kind, o.state.value) for kind, o in outcomes.values())
    for (kind, state), _count in states.items():
        allowed = {"completed", "failed"} | ({"cancelled"} if kind == "cancel" else set())
        assert state in allowed, (kind, state, states)
    for task_id, (_kind, outcome) in outcomes.items():
        if outcome.state is TaskState.FAILED:
            # Only a handler a dead replica was running, failed on takeover.
            assert outcome.error is not None and outcome.error.code == "execution_failed", task_id
            assert outcome.error.recoverable is True
    assert sum(1 for _, o in outcomes.values() if o.ok) >= tasks // 2, states

    # Each task's callbacks: exactly one final one, and it is the last. (A cancellation is
    # answered in the reply to task_cancel: no final callback need follow it.)
    for task_id, (_kind, outcome) in outcomes.items():
        seen = requester.inbound[task_id]
        ends = finals(seen)
        if outcome.state is TaskState.CANCELLED:
            assert len(ends) <= 1, (task_id, seen)
        else:
            assert len(ends) == 1, (task_id, seen)
        if ends:
            assert seen[-1] == ends[0], (task_id, seen)  # nothing after the final callback
        # Per-task order: progress never goes back (a callback may arrive twice, never early).
        progress = requester.progress[task_id]
        assert progress == sorted(progress), (task_id, progress)

    # The executor's side, in the shared database: the same final state, nothing left over.
    async def settled() -> bool:
        with psycopg.connect(cluster.store) as conn:
            pending = conn.execute("SELECT count(*) FROM outbox WHERE dead_reason IS NULL")
            row = pending.fetchone()
            return row is not None and row[0] == 0

    deadline = time.monotonic() + 30
    while not await settled():
        assert time.monotonic() < deadline, "outbox not drained"
        await asyncio.sleep(0.2)  # polling another process's database: no event to wait on
    with psycopg.connect(cluster.store) as conn:
        rows = dict(conn.execute("SELECT task_id, state FROM tasks").fetchall())
        dead = conn.execute("SELECT count(*) FROM outbox").fetchone()
    assert dead is not None and dead[0] == 0
    assert len(rows) == tasks
    mismatched = {t: (rows.get(t), o.state.value) for t, (_, o) in outcomes.items()}
    mismatched = {t: v for t, v in mismatched.items() if v[0] != v[1]}
    assert mismatched == {}
    print(f"\n{tasks} tasks in {elapsed:.1f} s with {what}: {states}")
