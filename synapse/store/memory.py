"""The in-memory store: nothing survives a restart.

Live tasks are the engine's; this store keeps the finished ones (up to the retention and
`max_finished`), packed into bytes, with the outbox, its dead letters and the deduplication
table: what a peer without a database needs to answer queries and retries.
"""

from __future__ import annotations

import dataclasses
import heapq
import sys
from collections import OrderedDict
from collections.abc import Iterable, Sequence

from synapse.p2p.dedup import DedupKey
from synapse.p2p.engine import TaskKey, TaskRecord, Transition
from synapse.p2p.packed import record_packer
from synapse.store.base import (
    DeadLetter,
    DedupEntry,
    ListCursor,
    OutboxItem,
    Snapshot,
    TaskFilter,
    TaskRow,
)
from synapse.types import TaskState

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

    def hold(self) -> None:
        pass  # nothing outlives the process: nobody else can serve it

    async def close(self) -> None:
        pass


__all__ = ["MemoryStore"]
