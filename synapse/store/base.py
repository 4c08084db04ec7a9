"""What a task store keeps and the interface its backends implement (`memory`, `sqlite`,
`postgres`); the runtime above drives it.

A store keeps tasks with their state history, the outbox of messages not yet acknowledged
(with its dead letters) and the deduplication table. Writes are buffered by the synchronous
`put_*` calls and made durable by `await commit()`: the runtime commits before it answers a
message that depends on them, and before it POSTs a message it queued, so that an
acknowledged message is never lost and a POSTed one is never forgotten.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import msgspec

from synapse.p2p.dedup import DedupKey, StoredReply
from synapse.p2p.engine import TaskKey, TaskRecord, Transition
from synapse.types import TaskState
from synapse.types.errors import SynapseException


class OutboxItem(msgspec.Struct, frozen=True, gc=False):
    """A message we must POST, kept until the partner answers it (a frozen msgspec struct:
    built in C, one per callback)."""

    seq: int
    message_id: str
    partner: str
    key: TaskKey | None
    #: The encoded message (its `timestamp` and signature are refreshed at each attempt).
    body: bytes
    created_at: float


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """An outbox message given up on: it stays listed until retried or dropped by a person."""

    item: OutboxItem
    reason: str
    at: float


@dataclass(frozen=True, slots=True)
class DedupEntry:
    key: DedupKey
    fingerprint: bytes
    expires_at: float
    reply: StoredReply


@dataclass(frozen=True, slots=True)
class TaskRow:
    """One line of a task listing."""

    key: TaskKey
    role: str
    state: TaskState
    updated_at: float

    @property
    def cursor(self) -> ListCursor:
        return (self.updated_at, self.key.requester, self.key.task_id)


#: Where a listing page starts: (updated_at, requester, task_id) of the row before it.
ListCursor = tuple[float, str, str]


@dataclass(frozen=True, slots=True)
class TaskFilter:
    """Which tasks a listing wants (every field unset: all)."""

    requester: str | None = None
    states: frozenset[TaskState] | None = None
    #: Only tasks updated at or after this time (epoch seconds).
    updated_after: float | None = None
    #: Only tasks of this context (`task_request.context.session_id`; an A2A `contextId`).
    context_id: str | None = None
    #: Only tasks with this `task.id` (whoever requested them).
    task_id: str | None = None

    def matches(self, row: TaskRow, context_id: str | None = None) -> bool:
        """Whether `row` (of a task whose context is `context_id`) is wanted."""
        return (
            (self.requester is None or row.key.requester == self.requester)
            and (self.states is None or row.state in self.states)
            and (self.updated_after is None or row.updated_at >= self.updated_after)
            and (self.context_id is None or context_id == self.context_id)
            and (self.task_id is None or row.key.task_id == self.task_id)
        )


@dataclass(slots=True)
class Snapshot:
    """What a store holds that a restart needs, as loaded at start-up: the tasks not final
    yet (finished ones stay in the store, see `TaskStore.get_task`), the outbox and its
    dead letters. `dedup` is empty for stores that answer `get_dedup` themselves."""

    tasks: list[TaskRecord] = field(default_factory=list)
    outbox: list[OutboxItem] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    dedup: list[DedupEntry] = field(default_factory=list)


class StoreUnavailable(SynapseException):
    """A commit failed (the database is locked, the disk full, a file unwritable).

    Nothing of the failed batch was written. Its writes stay buffered and the next `commit`
    tries them again, in order, except those the caller asked to drop (see `commit`).
    """


class FencedOut(StoreUnavailable):
    """The commit's own writes touch tasks this process no longer owns (replicas sharing a
    store: another one took their lease over). Nothing of them was written, and they are not
    tried again; the writes of other tasks in the batch were. `keys`: the tasks lost."""

    def __init__(self, message: str, keys: frozenset[TaskKey]) -> None:
        super().__init__(message)
        self.keys = keys


class TaskStore(Protocol):
    """A durable (or not) home for tasks, the outbox and the deduplication table: what every
    backend implements (the store kit, `synapse.store.kit`, checks it). What replicas sharing
    a store add is `synapse.store.shared.SharedStore`."""

    #: True if what is committed survives a restart.
    durable: bool

    def hold(self) -> None:
        """Make this process the one that serves the store, or raise
        `synapse.store.holding.StoreInUse` naming the one that does (a peer calls it as it
        starts, before `load`; tools that only read or repair a store do not). Replicas of
        one agent share a store that can take them, each holding it alongside the others.
        Let go by `close`, or when the process ends. Idempotent."""
        ...

    def load(self) -> Snapshot:
        """The live tasks and the outbox (once, at start-up, before any write; may be
        called in a worker thread)."""
        ...

    def get_task(self, key: TaskKey) -> TaskRecord | None:
        """A stored task (a finished one the engine let go of), or None. A point lookup,
        fast enough for the event loop; the record returned is not to be modified. Raises
        `StoreUnavailable` when the store cannot be read now (the runtime answers the
        message that needed it 503, to be retried)."""
        ...

    def get_dedup(self, key: DedupKey) -> DedupEntry | None:
        """The committed dedup entry of `key`, or None (expired entries may be returned);
        `StoreUnavailable` when the store cannot be read now."""
        ...

    def list_tasks(
        self, *, limit: int, before: ListCursor | None = None, where: TaskFilter | None = None
    ) -> list[TaskRow]:
        """A page of stored tasks, newest `updated_at` first, strictly after `before` (the
        last row of the previous page) in that order, that match `where`. Served by an
        index: a page costs the same however many tasks are kept."""
        ...

    def count_tasks(self, where: TaskFilter | None = None) -> int:
        """How many stored tasks match `where`."""
        ...

    def count_finished(self) -> dict[tuple[str, TaskState], int]:
        """Stored final tasks by (role, state), from an index (for gauges)."""
        ...

    async def purge(self, *, finished_before: float, now: float, limit: int) -> int:
        """Delete up to `limit` rows of each kind: final tasks last updated before
        `finished_before` with their history, dead letters given up before it, and dedup
        entries expired at `now`; give the space back. Off the event loop. Returns the rows
        deleted (call again while it returns `limit` or more)."""
        ...

    def next_seq(self) -> int:
        """A new outbox sequence number (increasing)."""
        ...

    def put_task(self, record: TaskRecord, transitions: Sequence[Transition]) -> None:
        """Save `record` and append its new `transitions` to its history."""
        ...

    def add_outbox(self, item: OutboxItem) -> None: ...

    def remove_outbox(self, message_id: str) -> None:
        """The partner answered the message: forget it."""
        ...

    def dead_letter(self, message_id: str, reason: str, at: float) -> None:
        """Give up on delivering `message_id`; keep it listed."""
        ...

    def put_dedup(self, entry: DedupEntry) -> None: ...

    def delete_dedup(self, keys: Iterable[DedupKey]) -> None: ...

    def mark(self) -> int:
        """A position in the buffered writes, for `commit(discard_after=...)`."""
        ...

    def discard(self, mark: int) -> None:
        """Drop the writes buffered since `mark` (none of them committed yet)."""
        ...

    async def commit(self, *, discard_after: int | None = None) -> None:
        """Make every write so far durable, or raise `StoreUnavailable` and write none.

        On failure the buffered writes are kept and retried, in order, by the next commit;
        those buffered after `discard_after` (a `mark()` taken earlier) are dropped instead:
        their caller rolls back what they recorded and refuses the message.
        """
        ...

    async def close(self) -> None: ...
