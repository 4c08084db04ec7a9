"""1,000 concurrent tasks between two real peers: all final, none lost, none run twice.

`agent-r` submits 1,000 `echo` tasks to `agent-e` at once (one control call); both run in
their own process with an SQLite store, so every accepted request, callback and dedup entry
is committed before it is acknowledged. The test reports the count and the wall time from
the first submission to the last final state.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from faultkit import PeerProcess, assert_applied_once, eventually, free_ports, url

pytestmark = pytest.mark.slow

E, R = "agent-e", "agent-r"
TASKS = 1000


async def test_a_thousand_concurrent_tasks(
    spawn: Callable[..., PeerProcess], report: Callable[[str], None]
) -> None:
    pe, pr = free_ports(2)
    options = ("--fast", "--max-concurrent-tasks", str(2 * TASKS), "--heartbeat-interval", "1")
    e = spawn(E, pe, {R: url(pr)}, options=options)
    r = spawn(R, pr, {E: url(pe)}, options=options)
    await e.start()
    await r.start()

    started = time.perf_counter()
    ids = await r.submit(E, "echo", {"text": "load"}, count=TASKS, prefix="load")
    assert len(set(ids)) == TASKS
    summary: dict[str, int] = {}

    async def all_final() -> bool:
        nonlocal summary
        summary = await r.summary()
        return sum(summary.get(s, 0) for s in ("completed", "failed", "rejected")) == TASKS

    await eventually(all_final, timeout=150, every=0.25, what=f"{TASKS} final tasks")
    elapsed = time.perf_counter() - started

    assert summary == {"completed": TASKS}, summary
    tasks = await r.tasks()
    assert set(tasks) == set(ids)  # none lost, none invented
    for task in tasks.values():
        assert task["output"] == "load"
        assert_applied_once(task)
    e_tasks = await e.tasks(history=False)
    assert set(e_tasks) == set(ids) and {t["state"] for t in e_tasks.values()} == {"completed"}
    executions = (await e.stats())["executions"]
    assert len(executions) == TASKS and set(executions.values()) == {1}  # none run twice
    assert e.executions() == executions

    line = (
        f"{TASKS} concurrent echo tasks between two peer processes (SQLite stores): "
        f"{summary.get('completed', 0)} completed, 0 lost, 0 run twice, in {elapsed:.1f} s "
        f"({TASKS / elapsed:.0f} tasks/s)"
    )
    print(line)
    report(line)
