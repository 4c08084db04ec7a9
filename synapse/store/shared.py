"""What replicas add to a store: the interface of a store that several processes of one agent
share (`synapse.store.base.TaskStore` is what every backend implements; this is more).

Replicas of one agent (docs/deploy.md) share one database. Each task is written by one replica
at a time, the holder of its lease (`synapse.store.leases`), and the store fences every write
of a task with the epoch its writer holds the lease at, in the commit's own round trip: a
replica that lost a lease (paused past its TTL, cut off) cannot write the task any more. The
partners' liveness is shared through the same database (`synapse.store.partners`).

A backend that implements `SharedStore` can run replicas; the command line and
`synapse.transport.replicas` ask for this interface, not for a particular backend. The
PostgreSQL store is the one shipped. Its statements are SQL, and so are those of
`synapse.store.leases` and `synapse.store.partners` that run through `read_rows` and
`execute`: another shared backend speaks PostgreSQL's dialect, or brings its own leases.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from synapse.p2p.dedup import DedupKey
from synapse.p2p.engine import TaskKey
from synapse.store.base import Snapshot, TaskStore

#: The lease a buffered write is made under: the task, and the epoch its writer holds it at
#: (0: the first write of a new task, which takes the lease if nobody has it).
Tag = tuple[TaskKey, int]


class Fence(Protocol):
    """What fences the writes of replicas sharing the database (`synapse.store.leases`)."""

    #: This replica's id: the holder named in the leases it holds.
    replica_id: str

    def epoch_for(self, key: TaskKey, *, create: bool) -> int:
        """The epoch this replica holds `key`'s lease at (0 to take the lease of a new task
        when `create`; -1 if it holds none: the write is dropped)."""
        ...

    def claim_until(self) -> float:
        """When a lease taken by a write expires."""
        ...

    def fenced_out(self, tags: frozenset[Tag]) -> frozenset[TaskKey]:
        """Writes made under these leases were dropped: another replica holds them now.
        Returns the tasks thereby lost (a tag older than the lease held now loses none)."""
        ...

    def preclaim(self, message_id: str, key: TaskKey) -> float | None:
        """Until when the outbox row `message_id`, written under `key`'s lease, is claimed
        by this replica (None: not claimed)."""
        ...

    def unstored(self, key: TaskKey) -> bool:
        """Whether `key` is known not to be stored: this replica claimed its lease for a task
        not stored then, and nobody may write it but the lease holder."""
        ...


@runtime_checkable
class SharedStore(TaskStore, Protocol):
    """A `TaskStore` that replicas of one agent can share: fenced writes, statements of
    their own for leases and liveness, and a task loaded alone (a takeover)."""

    #: Set by this replica's `Ownership` (`synapse.store.leases`): every write of a task
    #: is fenced by it. None: a single process, nothing fenced.
    fence: Fence | None
    #: Set by `Ownership`: what `load` returns instead of every live task (a replica starts
    #: with the tasks nobody owns, taken over, not with its siblings').
    load_override: Callable[[], Snapshot] | None

    def read_rows(
        self, query: str, params: Sequence[Any] | Mapping[str, Any] = ()
    ) -> list[tuple[Any, ...]]:
        """One statement in its own transaction, fast enough for the event loop (a point
        lookup or an indexed update); its rows, if it returns any."""
        ...

    async def execute(self, query: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """One statement in its own transaction, off the event loop (it may wait for a row
        lock); its rows, if it returns any."""
        ...

    def task_snapshot(self, key: TaskKey) -> Snapshot:
        """One task with its history and its pending outbox rows (a takeover)."""
        ...

    def remember_dedup(self, key: DedupKey, row: Sequence[Any]) -> None:
        """The dedup entry of `key` as a statement of the lease claim read it (a
        `synapse.store.sql.DEDUP_COLUMNS` row, all None if there is none): the next
        `get_dedup(key)` is answered from it without a round trip."""
        ...

    def give_back_lease(self, key: TaskKey, holder: str, epoch: int) -> None:
        """Delete `holder`'s lease of `key` at `epoch` with the next commit (nothing if it
        moved meanwhile: another replica's lease stays)."""
        ...


__all__ = ["Fence", "SharedStore", "Tag"]
