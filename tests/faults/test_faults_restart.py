"""Crashes and outages between two real peers, each with its own SQLite store (issue 7 §4).

Two `peer_proc.py` processes on 127.0.0.1: `agent-r` requests demo tasks of `agent-e`. Both
run a fast `P2PConfig` (retries 0.05 s apart, two of them; heartbeats every 0.3 s), so that
an unreachable partner parks the outbox within a fraction of a second and its return is
noticed by the next heartbeat. A peer is stopped with SIGTERM (an orderly outage) or SIGKILL
(a crash: nothing drained, nothing flushed beyond what was committed) and started again on
the same port and the same store.

"Every callback delivered" is counted on the requester's history: the demo `slow` task with
`steps` = n sends n + 1 status updates (the engine's "executing", then one per step) and one
final callback; the requester records one transition per callback it applied, with the
message id, so a lost callback is a missing row and a callback applied twice a repeated id.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from faultkit import (
    PeerProcess,
    assert_applied_once,
    eventually,
    free_ports,
    status_updates,
    url,
)

pytestmark = pytest.mark.slow

E, R = "agent-e", "agent-r"
Spawn = Callable[..., PeerProcess]


async def pair(
    spawn: Spawn, *, e_options: tuple[str, ...] = ("--fast",)
) -> tuple[PeerProcess, PeerProcess]:
    pe, pr = free_ports(2)
    e = spawn(E, pe, {R: url(pr)}, options=e_options)
    r = spawn(R, pr, {E: url(pe)})
    await asyncio.gather(e.start(), r.start())
    return e, r


async def progressed(r: PeerProcess, ids: list[str], *, timeout: float = 10.0) -> None:
    """Wait until every task is executing at R with at least one progress update applied."""
    await r.wait_states(ids, lambda s: s == "executing", timeout=timeout)

    async def probe() -> bool:
        tasks = await r.tasks()
        return all(len(status_updates(tasks[i])) >= 2 for i in ids)

    await eventually(probe, timeout=timeout, what="a progress update on every task")


async def test_partner_down_during_callbacks_then_back(spawn: Spawn) -> None:
    e, r = await pair(spawn)
    steps = 8
    ids = await r.submit(E, "slow", {"steps": steps, "delay": 0.15}, count=4, prefix="down")
    await progressed(r, ids)

    await r.stop()  # the requester goes away in the middle of the callbacks
    # E finishes every task meanwhile; what R did not acknowledge waits in E's outbox.
    await e.wait_final(ids, timeout=15)
    assert (await e.stats())["pending_deliveries"] > 0

    await r.start()  # back on the same port and store: delivery resumes after a heartbeat
    finals = await r.wait_final(ids, timeout=20)
    assert set(finals.values()) == {"completed"}, finals

    tasks = await r.tasks()
    for task_id in ids:
        task = tasks[task_id]
        assert_applied_once(task)
        assert len(status_updates(task)) == steps + 1, task["history"]
        assert task["output"] == f"done after {steps} steps"
    assert (await e.stats())["pending_deliveries"] == 0
    assert e.log_events("delivery_parked"), "E never parked its outbox"
    assert e.executions() == {f"{R}/{i}": 1 for i in ids}
    assert not any(t["dead_letters"] for t in (await e.tasks()).values())


async def test_sigkill_executor_mid_task_fails_interrupted_by_restart(spawn: Spawn) -> None:
    e, r = await pair(spawn)
    ids = await r.submit(E, "slow", {"steps": 40, "delay": 0.1}, count=3, prefix="kill-e")
    await progressed(r, ids)

    await e.crash()  # returns once the process is gone
    await e.start()  # same store: the interrupted tasks fail, recoverably

    finals = await r.wait_final(ids, timeout=15)
    assert set(finals.values()) == {"failed"}, finals
    tasks = await r.tasks()
    for task_id in ids:
        task = tasks[task_id]
        assert task["error"] == {
            "code": "execution_failed",
            "message": "interrupted by restart",
            "recoverable": True,
        }
        assert_applied_once(task)
    # The executor agrees, and never ran a handler twice.
    e_tasks = await e.tasks()
    assert {e_tasks[i]["state"] for i in ids} == {"failed"}
    assert e.executions() == {f"{R}/{i}": 1 for i in ids}
    await eventually(lambda: _nothing_pending(e), timeout=10, what="the executor's outbox drained")


async def test_sigkill_executor_mid_task_resumes_a_resumable_handler(spawn: Spawn) -> None:
    e, r = await pair(spawn, e_options=("--fast", "--resumable"))
    steps = 15
    ids = await r.submit(E, "slow", {"steps": steps, "delay": 0.1}, count=3, prefix="resume")
    await progressed(r, ids)

    await e.crash()  # returns once the process is gone
    await e.start()  # the handler declares itself resumable: it starts over

    finals = await r.wait_final(ids, timeout=20)
    assert set(finals.values()) == {"completed"}, finals
    tasks = await r.tasks()
    for task_id in ids:
        assert_applied_once(tasks[task_id])
        assert tasks[task_id]["output"] == f"done after {steps} steps"
    # Once before the crash, once after: a resumed task, not a duplicate.
    assert e.executions() == {f"{R}/{i}": 2 for i in ids}


async def test_sigkill_requester_then_restart_still_gets_the_outcome(spawn: Spawn) -> None:
    e, r = await pair(spawn)
    steps = 10
    ids = await r.submit(E, "slow", {"steps": steps, "delay": 0.1}, count=3, prefix="kill-r")
    await progressed(r, ids)

    await r.crash()
    await e.wait_final(ids, timeout=15)  # E finishes; its callbacks wait in the outbox
    assert (await e.stats())["pending_deliveries"] > 0

    async def parked() -> bool:  # E's retries ran out: it waits for a heartbeat to answer
        return len(e.log_events("delivery_parked")) >= len(ids)

    await eventually(parked, timeout=15, what="E parked each task's outbox")

    await r.start()  # R restores its tasks and keeps waiting; E's outbox resends
    finals = await r.wait_final(ids, timeout=20)
    assert set(finals.values()) == {"completed"}, finals
    tasks = await r.tasks()
    for task_id in ids:
        task = tasks[task_id]
        assert_applied_once(task)
        assert len(status_updates(task)) == steps + 1, task["history"]
    assert e.log_events("delivery_parked"), "E never parked its outbox"
    assert e.executions() == {f"{R}/{i}": 1 for i in ids}


async def _nothing_pending(peer: PeerProcess) -> bool:
    return bool((await peer.stats())["pending_deliveries"] == 0)
