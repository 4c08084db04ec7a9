"""What a task store keeps, the interface its backends implement, and the in-memory one.

A store keeps tasks with their state history, the outbox of messages not yet acknowledged
(with its dead letters) and the deduplication table. Writes are buffered by the synchronous
`put_*` calls and made durable by `await commit()`: the runtime commits before it answers a
message that depends on them, and before it POSTs a message it queued, so that an
acknowledged message is never lost and a POSTed one is never forgotten.
"""

from __future__ import annotations

import dataclasses
import heapq
import sys
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import msgspec

from synapse.p2p.dedup import DedupKey, StoredReply
from synapse.p2p.engine import TaskKey, TaskRecord, Transition
from synapse.p2p.packed import record_packer
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
    """A durable (or not) home for tasks, the outbox and the deduplication table."""

    #: True if what is committed survives a restart.
    durable: bool

    def load(self) -> Snapshot:
        """The live tasks and the outbox (once, at start-up, before any write; may be
        called in a worker thread)."""
        ...

    def get_task(self, key: TaskKey) -> TaskRecord | None:
        """A stored task (a finished one the engine let go of), or None. A point lookup,
        fast enough for the event loop; the record returned is not to be modified."""
        ...

    def get_dedup(self, key: DedupKey) -> DedupEntry | None:
        """The committed dedup entry of `key`, or None (expired entries may be returned)."""
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


#: A finished task as the memory store keeps it: (updated_at, role, state, context id, the
#: record encoded). A tuple of atoms and a bytes blob, which the garbage collector stops
#: tracking after its first pass: however many finished tasks are kept, a full collection has
#: nothing of theirs to scan (a `TaskRecord` with its history is a dozen tracked objects).
_Kept = tuple[float, str, str, str | None, bytes | TaskRecord]


def _pack(record: TaskRecord) -> bytes | TaskRecord:
    """The record packed into bytes (`synapse.p2p.packed`: about a sixth of the objects'
    memory, nothing for the collector to scan), or a copy when MessagePack cannot hold one
    of its values (an int beyond 64 bits)."""
    try:
        return record_packer().pack(record)
    except (TypeError, ValueError, OverflowError):
        return dataclasses.replace(record, history=list(record.history))


class MemoryStore:
    """Nothing survives a restart: live tasks are the engine's; this keeps the finished ones
    (up to the retention and `max_finished`, oldest out first), encoded, and lists the
    outbox. `get_task` decodes a fresh record each time."""

    durable = False

    def __init__(self, max_finished: int = 10_000) -> None:
        self._seq = 0
        self.max_finished = max_finished
        self.outbox: dict[str, OutboxItem] = {}
        self.dead_letters: dict[str, DeadLetter] = {}
        #: Outbox entries added since the last commit, for `discard`.
        self._since_commit: list[str] = []
        #: Final tasks by (requester, task_id), in the order they ended (re-ending moves one
        #: to the back).
        self._finished: OrderedDict[tuple[str, str], _Kept] = OrderedDict()

    @property
    def finished(self) -> list[TaskKey]:
        """The keys of the finished tasks kept, oldest first."""
        return [TaskKey(requester, task_id) for requester, task_id in self._finished]

    def forget_finished(self, key: TaskKey) -> None:
        """Drop a finished task (tests that replay a request from scratch)."""
        self._finished.pop((key.requester, key.task_id), None)

    def load(self) -> Snapshot:
        return Snapshot()

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def put_task(self, record: TaskRecord, transitions: Sequence[Transition]) -> None:
        if not record.is_final:
            return
        finished = self._finished
        # One requester string for all its tasks (a few partners, many tasks).
        key = (sys.intern(record.key.requester), record.key.task_id)
        finished[key] = (
            record.updated_at,
            record.role.value,
            record.state.value,
            record.context.session_id if record.context is not None else None,
            _pack(record),
        )
        finished.move_to_end(key)
        while len(finished) > self.max_finished:
            finished.popitem(last=False)

    def get_task(self, key: TaskKey) -> TaskRecord | None:
        kept = self._finished.get((key.requester, key.task_id))
        if kept is None:
            return None
        blob = kept[4]
        if isinstance(blob, bytes):
            return record_packer().unpack(blob)
        # A copy, as a durable store returns one: changing it changes the store only
        # through `put_task`.
        return dataclasses.replace(blob, history=list(blob.history))

    def get_dedup(self, key: DedupKey) -> DedupEntry | None:
        return None  # the memory dedup table keeps its entries itself

    def _matching(
        self, where: TaskFilter | None, before: ListCursor | None = None
    ) -> list[ListCursor]:
        """The cursors of the kept tasks `where` wants, strictly after `before`: one pass over
        plain tuples (no row objects), since this store has no index (it is capped)."""
        where = where or TaskFilter()
        requester, context_id, task_id = where.requester, where.context_id, where.task_id
        states = {s.value for s in where.states} if where.states is not None else None
        after = where.updated_after
        found = []
        for key, (updated_at, _role, state, context, _blob) in self._finished.items():
            if (
                (requester is None or key[0] == requester)
                and (task_id is None or key[1] == task_id)
                and (states is None or state in states)
                and (after is None or updated_at >= after)
                and (context_id is None or context == context_id)
            ):
                cursor = (updated_at, key[0], key[1])
                if before is None or cursor < before:
                    found.append(cursor)
        return found

    def list_tasks(
        self, *, limit: int, before: ListCursor | None = None, where: TaskFilter | None = None
    ) -> list[TaskRow]:
        rows = []
        for updated_at, requester, task_id in heapq.nlargest(limit, self._matching(where, before)):
            _, role, state, _, _ = self._finished[(requester, task_id)]
            rows.append(TaskRow(TaskKey(requester, task_id), role, TaskState(state), updated_at))
        return rows

    def count_tasks(self, where: TaskFilter | None = None) -> int:
        return len(self._matching(where))

    def count_finished(self) -> dict[tuple[str, TaskState], int]:
        counts: dict[tuple[str, TaskState], int] = {}
        for _updated_at, role, state, _context_id, _blob in self._finished.values():
            key = (role, TaskState(state))
            counts[key] = counts.get(key, 0) + 1
        return counts

    async def purge(self, *, finished_before: float, now: float, limit: int) -> int:
        removed = 0
        finished = self._finished
        while finished and removed < limit:
            key, kept = next(iter(finished.items()))
            if kept[0] >= finished_before:
                break
            del finished[key]
            removed += 1
        for message_id in [m for m, d in self.dead_letters.items() if d.at < finished_before][
            :limit
        ]:
            del self.dead_letters[message_id]
            removed += 1
        return removed

    def add_outbox(self, item: OutboxItem) -> None:
        self.outbox[item.message_id] = item
        self._since_commit.append(item.message_id)

    def remove_outbox(self, message_id: str) -> None:
        self.outbox.pop(message_id, None)

    def dead_letter(self, message_id: str, reason: str, at: float) -> None:
        item = self.outbox.pop(message_id, None)
        if item is not None:
            self.dead_letters[message_id] = DeadLetter(item, reason, at)

    def put_dedup(self, entry: DedupEntry) -> None:
        pass

    def delete_dedup(self, keys: Iterable[DedupKey]) -> None:
        pass

    def mark(self) -> int:
        return len(self._since_commit)

    def discard(self, mark: int) -> None:
        for message_id in self._since_commit[mark:]:
            self.outbox.pop(message_id, None)
        del self._since_commit[mark:]

    async def commit(self, *, discard_after: int | None = None) -> None:
        self._since_commit.clear()

    async def close(self) -> None:
        pass
