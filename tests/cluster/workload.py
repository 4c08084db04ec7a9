"""A bounded mixed workload through a cluster, and the history checker that judges it.

The requester (in this process) runs mixed tasks (echo, slow ones with progress, need_info
answered, need_human approved, some cancelled) through the balancer while `chaos()` injects
faults. Then `anomalies` reads both sides (the requester's outcomes and the callbacks it
received, the executor's rows in PostgreSQL, the handler executions the replicas logged) and
names every break of what the docs promise:

- every task reaches exactly one final outcome at the requester, of a kind the task allows;
- the executor's stored state is the same final state, and nothing is left to deliver;
- each task's callbacks: exactly one final one (none needed after a cancel), nothing after it,
  progress never going back;
- a handler runs at most once per task (none of these task types is resumable: a takeover
  fails a task whose handler a dead replica was running, it does not run it again).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from clusterkit import Cluster, E, finals

from synapse.runtime.protocol import Outcome, TaskHandle
from synapse.types import TaskState

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


@dataclass
class Run:
    """What one workload run produced, for the checker and the report."""

    tasks: int
    outcomes: dict[str, tuple[str, Outcome]] = field(default_factory=dict)
    elapsed: float = 0.0

    def states(self) -> Counter[tuple[str, str]]:
        return Counter((kind, o.state.value) for kind, o in self.outcomes.values())


async def run_mixed(
    cluster: Cluster,
    tasks: int,
    chaos: Callable[[], Awaitable[None]],
    *,
    timeout: float = 100.0,
    first: int = 0,
    spread: float = 0.0,
) -> Run:
    """Run `tasks` mixed tasks (ids `task-{first}`…) through the cluster, `chaos()` once a
    quarter are done; raise with what every replica waits on if some never end. `spread`:
    the seconds over which the tasks are submitted (evenly), so that they meet every fault
    of a long schedule; 0: as fast as `IN_FLIGHT` lets them."""
    requester = cluster.requester
    peer = requester.peer
    gate = asyncio.Semaphore(IN_FLIGHT)
    run = Run(tasks)
    quarter = asyncio.Event()
    ids = [f"task-{n:05d}" for n in range(first, first + tasks)]

    async def one(n: int, task_id: str) -> None:
        kind = kind_of(n)
        if spread:
            await asyncio.sleep(spread * (n - first) / tasks)  # its turn in the schedule
        async with gate:
            task_type, payload = request_of(kind, n)
            handle = await peer.submit(E, task_type, payload, task_id=task_id)
            run.outcomes[handle.task_id] = (kind, await drive(handle, kind))
        if len(run.outcomes) >= tasks // 4:
            quarter.set()

    async def after_a_quarter() -> None:
        await quarter.wait()
        await chaos()

    started = time.monotonic()
    chaos_task = asyncio.create_task(after_a_quarter())
    runs = [asyncio.create_task(one(first + i, task_id)) for i, task_id in enumerate(ids)]
    _, pending = await asyncio.wait(runs, timeout=timeout)
    for unfinished in pending:
        unfinished.cancel()
    if pending:
        await _report_stuck(cluster, [t for t in ids if t not in run.outcomes])
    for finished in runs:
        finished.result()
    await asyncio.wait_for(chaos_task, 60)
    run.elapsed = time.monotonic() - started
    return run


async def _report_stuck(cluster: Cluster, stuck_ids: list[str]) -> None:
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
    stuck = {t: (cluster.requester.inbound[t], rows.get(t)) for t in stuck_ids}
    dumps = [f"{r.name}:\n{await r.state_dump()}" for r in cluster.replicas]
    raise AssertionError(
        f"{len(stuck)} tasks never ended: {list(stuck.items())[:5]}; outbox: {waiting}; "
        f"sessions: {sessions}; what each replica waits on:\n" + "\n".join(dumps)
    )


async def executor_settled(cluster: Cluster, timeout: float = 30.0) -> None:
    """Wait until the executor has nothing left to deliver (its outbox, in PostgreSQL)."""
    deadline = time.monotonic() + timeout
    while True:
        with psycopg.connect(cluster.store) as conn:
            row = conn.execute("SELECT count(*) FROM outbox WHERE dead_reason IS NULL").fetchone()
        if row is not None and row[0] == 0:
            return
        assert time.monotonic() < deadline, "outbox not drained"
        await asyncio.sleep(0.2)  # polling another process's database: no event to wait on


def executions(log: Path | None) -> Counter[str]:
    """Task id → how many times a replica started its handler (see `counting.py`)."""
    if log is None or not log.exists():
        return Counter()
    return Counter(line.strip() for line in log.read_text().splitlines() if line.strip())


def anomalies(cluster: Cluster, run: Run, executions_log: Path | None = None) -> list[str]:
    """Every break of the promises in the module's docstring, one line each."""
    found: list[str] = []
    requester = cluster.requester
    if len(run.outcomes) != run.tasks:
        found.append(f"{run.tasks - len(run.outcomes)} tasks have no outcome")
    for task_id, (kind, outcome) in run.outcomes.items():
        allowed = {"completed", "failed"} | ({"cancelled"} if kind == "cancel" else set())
        if outcome.state.value not in allowed:
            found.append(f"{task_id} ({kind}) ended {outcome.state.value}")
        if outcome.state is TaskState.FAILED and not (
            # Only a handler a dead replica was running, failed on takeover.
            outcome.error is not None
            and outcome.error.code == "execution_failed"
            and outcome.error.recoverable
        ):
            found.append(f"{task_id} failed: {outcome.error}")
        seen = requester.inbound[task_id]
        ends = finals(seen)
        # A cancellation is answered in the reply to task_cancel: no final callback need follow.
        expected = (0, 1) if outcome.state is TaskState.CANCELLED else (1,)
        if len(ends) not in expected:
            found.append(f"{task_id}: {len(ends)} final callbacks: {seen}")
        if ends and seen[-1] != ends[0]:
            found.append(f"{task_id}: a callback after the final one: {seen}")
        progress = requester.progress[task_id]
        if progress != sorted(progress):
            found.append(f"{task_id}: progress went back: {progress}")
    with psycopg.connect(cluster.store) as conn:
        rows = dict(conn.execute("SELECT task_id, state FROM tasks").fetchall())
        row = conn.execute("SELECT count(*) FROM outbox").fetchone()
    left = row[0] if row is not None else 0
    if left:
        found.append(f"{left} messages left in the executor's outbox")
    for task_id, (_kind, outcome) in run.outcomes.items():
        if rows.get(task_id) != outcome.state.value:
            found.append(
                f"{task_id}: the requester says {outcome.state.value}, "
                f"the executor keeps {rows.get(task_id)}"
            )
    for task_id, count in executions(executions_log).items():
        if count > 1:
            found.append(f"{task_id}: its handler ran {count} times")
    return found
