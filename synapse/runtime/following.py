"""Tasks another replica holds, followed in the shared store: `StoreFollower` polls what
was committed about them; `HandleFollower` settles the handles of tasks this replica let go
(`synapse.a2a.server.elsewhere` keeps A2A views in step the same way).

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
from typing import TYPE_CHECKING, Generic, TypeVar

from synapse.p2p.engine import TaskKey
from synapse.store.base import StoreUnavailable

if TYPE_CHECKING:
    from synapse.runtime.runtime_base import RuntimeBase, TaskHandle

Followed = TypeVar("Followed")


class StoreFollower(Generic[Followed]):
    """Reads, every `interval` seconds, what other replicas committed about the tasks
    followed (`refresh`: what a read does is the subclass's), each with what follows it here
    (a handle, a view); the polling task starts with the first one followed and ends with
    the last."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._followed: dict[TaskKey, Followed] = {}
        self._task: asyncio.Task[None] | None = None

    @property
    def followed(self) -> frozenset[TaskKey]:
        return frozenset(self._followed)

    def refresh(self) -> None:
        raise NotImplementedError

    def _follow_one(self, key: TaskKey, what: Followed) -> None:
        self._followed[key] = what
        if self._task is None:
            with contextlib.suppress(RuntimeError):  # no loop running: nothing to follow
                self._task = asyncio.get_running_loop().create_task(
                    self._follow(), name=f"synapse-{type(self).__name__}"
                )

    async def _follow(self) -> None:
        try:
            while self._followed:
                await asyncio.sleep(self.interval)
                self.refresh()
        finally:
            self._task = None

    async def close(self) -> None:
        task = self._task
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


class HandleFollower(StoreFollower["TaskHandle"]):
    """The unsettled handles of tasks this runtime let go, followed in the store."""

    def __init__(
        self, runtime: RuntimeBase, handles: dict[TaskKey, TaskHandle], interval: float
    ) -> None:
        super().__init__(interval)
        self._runtime = runtime
        self._handles = handles

    def let_go(self, key: TaskKey) -> None:
        """Task `key` was let go: follow its handle, if it has one still waiting."""
        handle = self._handles.get(key)
        if handle is not None and not handle.settled:
            self._follow_one(key, handle)

    def refresh(self) -> None:
        """Settle the followed handles whose task the store records as ended."""
        engine = self._runtime.engine
        for key, handle in list(self._followed.items()):
            if handle.settled or self._handles.get(key) is not handle or key in engine.tasks:
                del self._followed[key]  # settled, gone, or held here again
                continue
            with contextlib.suppress(StoreUnavailable):  # read again next time
                rec = engine.get(key)
                if rec is not None and rec.is_final:
                    del self._followed[key]
                    del self._handles[key]
                    handle.settle()


__all__ = ["HandleFollower", "StoreFollower"]
