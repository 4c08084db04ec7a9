"""What a task store keeps, the interface its backends implement, and the in-memory one.

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

from synapse.p2p.dedup import DedupKey, StoredReply
from synapse.p2p.engine import TaskKey, TaskRecord, Transition


@dataclass(frozen=True, slots=True)
class OutboxItem:
    """A message we must POST, kept until the partner answers it."""

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


@dataclass(slots=True)
class Snapshot:
    """Everything a store holds, as loaded at start-up."""

    tasks: list[TaskRecord] = field(default_factory=list)
    outbox: list[OutboxItem] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    dedup: list[DedupEntry] = field(default_factory=list)


class StoreUnavailable(Exception):
    """A commit failed (the database is locked, the disk full, a file unwritable).

    Nothing of the failed batch was written. Its writes stay buffered and the next `commit`
    tries them again, in order, except those the caller asked to drop (see `commit`).
    """


class TaskStore(Protocol):
    """A durable (or not) home for tasks, the outbox and the deduplication table."""

    #: True if what is committed survives a restart.
    durable: bool

    def load(self) -> Snapshot:
        """Everything stored (called once, at start-up, before any write)."""
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


class MemoryStore:
    """Nothing survives a restart: tasks live in the engine; this lists the outbox."""

    durable = False

    def __init__(self) -> None:
        self._seq = 0
        self.outbox: dict[str, OutboxItem] = {}
        self.dead_letters: dict[str, DeadLetter] = {}
        #: Outbox entries added since the last commit, for `discard`.
        self._since_commit: list[str] = []

    def load(self) -> Snapshot:
        return Snapshot()

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def put_task(self, record: TaskRecord, transitions: Sequence[Transition]) -> None:
        pass

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
