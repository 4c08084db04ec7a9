"""The graceful stop of a peer (SIGTERM or SIGINT to `synapse serve`).

1. **Drain.** The engine refuses new `task_request`s with 503 `agent_not_ready`
   (`details.reason = "draining"`) and its heartbeats say `draining`; everything else is
   still served, so running tasks can finish and their partners can answer them.
2. **Running tasks get `drain_timeout` seconds** to reach a final state.
3. **What is still running then fails** with `task_failed` (`execution_failed`,
   `recoverable: true`, "agent shutting down") — except, on a durable store, tasks a restart
   will pick up again: those of a resumable handler (`is_resumable(task_type)`) and those
   still waiting for a synchronous `task_need_info` answer. They are left as they are.
4. **The outbox gets `outbox_grace` seconds** to deliver what is queued (the failures above
   included); what is left stays in a durable outbox for the next start.

A second signal (`now` set) skips whatever remains of steps 2 and 4.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from synapse.logs import get_logger
from synapse.p2p.commands import Fail
from synapse.p2p.states import Role
from synapse.types import ErrorCode, TaskError

#: The runtime (`synapse.runtime.protocol.P2PProtocol`), which imports this module: not imported
#: back, so that the import graph has no cycle.
P2PProtocol = Any

log = get_logger("synapse.p2p")

SHUTTING_DOWN = "agent shutting down"


async def _wait_until(
    done: asyncio.Future[object] | None, deadline: float, now: asyncio.Event | None
) -> None:
    waits: set[asyncio.Future[object]] = set()
    stop = asyncio.ensure_future(now.wait()) if now is not None else None
    if stop is not None:
        waits.add(stop)  # type: ignore[arg-type]
    if done is not None:
        waits.add(done)
    try:
        await asyncio.wait(
            waits or {asyncio.ensure_future(asyncio.sleep(0))},
            timeout=max(0.0, deadline - time.monotonic()),
            return_when=asyncio.FIRST_COMPLETED,
        )
    finally:
        if stop is not None:
            stop.cancel()


def _left_for_recovery(protocol: P2PProtocol, task_type: str, handler_started: bool) -> bool:
    if not protocol.store.durable:
        return False
    if not handler_started:
        return True  # waiting on a synchronous task_need_info: restored as it is
    resumable = getattr(protocol.handler, "is_resumable", None)
    return bool(resumable(task_type)) if callable(resumable) else False


async def graceful_shutdown(
    protocol: P2PProtocol,
    drain_timeout: float,
    outbox_grace: float,
    now: asyncio.Event | None = None,
) -> bool:
    engine = protocol.engine
    engine.draining = True
    started = time.monotonic()
    live = [r for r in engine.tasks.values() if r.role is Role.EXECUTOR and not r.is_final]
    log.info("draining", executing=len(live), drain_timeout=drain_timeout)
    deadline = started + drain_timeout
    # Step 2: until every executor task is final, the time is up, or a second signal.
    while not (now is not None and now.is_set()) and time.monotonic() < deadline:
        running = [r for r in engine.tasks.values() if r.role is Role.EXECUTOR and not r.is_final]
        if not running:
            break
        handlers = protocol.running_handlers()
        # Handlers end, or a partner's message moves a task (e.g. a cancel): poll that
        # second kind of progress at a modest pace.
        change: asyncio.Future[object] = asyncio.ensure_future(
            asyncio.wait(handlers, return_when=asyncio.FIRST_COMPLETED)
            if handlers
            else asyncio.sleep(0.05)
        )
        try:
            await _wait_until(change, min(deadline, time.monotonic() + 0.05), now)
        finally:
            change.cancel()
    if now is not None and now.is_set():
        log.warning("stopping_now", reason="second signal")
        return False
    # Step 3.
    failed = kept = 0
    error = TaskError(
        code=ErrorCode.EXECUTION_FAILED.value, message=SHUTTING_DOWN, recoverable=True
    )
    for rec in list(engine.tasks.values()):
        if rec.role is not Role.EXECUTOR or rec.is_final:
            continue
        if _left_for_recovery(protocol, rec.task.type, rec.handler_started):
            kept += 1
            continue
        await protocol.settled(rec.key)  # a message about it being committed: its verdict first
        if engine.get(rec.key) is not rec or rec.is_final:
            continue
        protocol.apply(engine.handle(Fail(rec.key, error), protocol.clock()))
        failed += 1
    if failed or kept:
        log.warning("drain_timeout_passed", failed=failed, left_for_recovery=kept)
    await protocol.commit()
    # Step 4.
    grace_end = time.monotonic() + outbox_grace
    while protocol.delivery_workers() and time.monotonic() < grace_end:
        if now is not None and now.is_set():
            log.warning("stopping_now", reason="second signal")
            return False
        pending: asyncio.Future[object] = asyncio.ensure_future(
            asyncio.wait(protocol.delivery_workers(), return_when=asyncio.FIRST_COMPLETED)
        )
        try:
            await _wait_until(pending, grace_end, now)
        finally:
            pending.cancel()
    log.info(
        "drained",
        seconds=round(time.monotonic() - started, 3),
        undelivered=protocol.pending_deliveries,
    )
    return True


__all__ = ["SHUTTING_DOWN", "graceful_shutdown"]
