"""Handles of tasks another replica took over: settled from the shared store.

Between replicas sharing a store (`synapse.store.leases`), a task requested through one
replica may end on another: the first let it go (`release`) when the second took its lease
over. The person or program holding the task's `TaskHandle` at the first replica must still
learn how the task ended. `HandleFollower` reads each such task from the store every
`interval` seconds until its stored record is final, then settles the handle from that
record: what the store keeps is committed, so the outcome told is the durable one (announced
means durable, across replicas too). A task taken back by this replica meanwhile is settled
here as any other, and no longer followed. Events between the takeover and the end (progress,
questions) are not streamed to the handle: they were announced where the task was.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from synapse.p2p.engine import TaskKey
from synapse.store.base import StoreUnavailable

if TYPE_CHECKING:
    from synapse.runtime.runtime_base import RuntimeBase, TaskHandle


class HandleFollower:
    """The unsettled handles of tasks this runtime let go, followed in the store."""

    def __init__(self, runtime: RuntimeBase, handles: dict[TaskKey, TaskHandle]) -> None:
        self._runtime = runtime
        self._handles = handles
        self._followed: set[TaskKey] = set()
        self._task: asyncio.Task[None] | None = None

    @property
    def followed(self) -> frozenset[TaskKey]:
        return frozenset(self._followed)

    def let_go(self, key: TaskKey, interval: float) -> None:
        """Task `key` was let go: follow its handle, if it has one still waiting."""
        handle = self._handles.get(key)
        if handle is None or handle.settled:
            return
        self._followed.add(key)
        if self._task is None:
            self._task = asyncio.create_task(self._follow(interval), name="synapse-follow")

    def settle_ended(self) -> None:
        """Settle the followed handles whose task the store records as ended."""
        engine = self._runtime.engine
        for key in list(self._followed):
            handle = self._handles.get(key)
            if handle is None or handle.settled or key in engine.tasks:
                self._followed.discard(key)  # gone, settled, or held here again
                continue
            with contextlib.suppress(StoreUnavailable):  # read again next time
                rec = engine.get(key)
                if rec is not None and rec.is_final:
                    self._followed.discard(key)
                    del self._handles[key]
                    handle.settle()

    async def _follow(self, interval: float) -> None:
        try:
            while self._followed:
                await asyncio.sleep(interval)
                self.settle_ended()
        finally:
            self._task = None

    async def close(self) -> None:
        task = self._task
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


__all__ = ["HandleFollower"]
