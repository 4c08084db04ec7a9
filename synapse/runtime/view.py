"""`RuntimeView`: what the layers above the runtime (A2A, the router, metrics, the console,
health checks, the demo) may read of a peer's tasks, without reaching into its engine.

Reads only: what changes a task goes through the runtime (`P2PProtocol`), which commits it.
The records it returns are the live ones; treat them as read-only.
"""

from __future__ import annotations

from synapse.p2p.engine import Engine, TaskKey, TaskRecord
from synapse.types import Sender


class RuntimeView:
    """A read-only window on one runtime's engine (`P2PProtocol.view`)."""

    __slots__ = ("_engine",)

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    @property
    def agent_id(self) -> str:
        return self._engine.agent_id

    @property
    def endpoint(self) -> str:
        """The callback URL the peer gives its partners."""
        return self._engine.endpoint

    @property
    def sender(self) -> Sender:
        """The `sender` of every message the peer makes."""
        return self._engine.sender

    @property
    def ready(self) -> bool:
        """False while new tasks are answered `agent_not_ready` (recovery not done, say)."""
        return self._engine.ready

    @property
    def draining(self) -> bool:
        """True once the peer takes no new task (it finishes those it has)."""
        return self._engine.draining

    def get(self, key: TaskKey) -> TaskRecord | None:
        """The task's record: in memory, or (if it finished) the store's."""
        return self._engine.get(key)

    def holds(self, key: TaskKey) -> bool:
        """Whether task `key` is in memory here (in flight, or finished and not let go yet);
        between replicas, False for one another replica works on."""
        return key in self._engine.tasks

    def records(self) -> list[TaskRecord]:
        """The records held in memory (the live tasks, and finished ones not yet evicted),
        as a list taken now: the runtime may change its tasks while the caller reads."""
        return list(self._engine.tasks.values())


__all__ = ["RuntimeView"]
