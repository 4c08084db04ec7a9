"""A deduplication table that survives restarts: memory for speed, the store for durability."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from synapse.p2p.aio import MemoryDedupStore
from synapse.p2p.dedup import DedupKey, StoredReply, is_storable
from synapse.store.base import DedupEntry, TaskStore


class DurableDedupStore(MemoryDedupStore):
    """Every stored reply is also written to `store` (committed with the request's effects)."""

    def __init__(self, window: float, store: TaskStore, entries: Iterable[DedupEntry] = ()) -> None:
        super().__init__(window)
        self._store = store
        self._staged: set[DedupKey] = set()
        now = datetime.now(UTC)
        for entry in entries:
            expires_at = datetime.fromtimestamp(entry.expires_at, UTC)
            if expires_at > now:
                self.restore(entry.key, entry.fingerprint, expires_at, entry.reply)

    def __bool__(self) -> bool:
        # An empty table (`__len__` 0) is still this table: `dedup or MemoryDedupStore(...)`
        # must never swap a fresh durable store for a memory one.
        return True

    def stage(self, key: DedupKey, reply: StoredReply) -> None:
        kept = self.expiry_of(key)
        if kept is not None and is_storable(reply.status):
            fingerprint, expires_at = kept
            self._store.put_dedup(DedupEntry(key, fingerprint, expires_at.timestamp(), reply))
            self._staged.add(key)

    def complete(self, key: DedupKey, reply: StoredReply) -> None:
        if key not in self._staged:
            self.stage(key, reply)  # written with the next commit
        self._staged.discard(key)
        super().complete(key, reply)

    def abandon(self, key: DedupKey) -> None:
        self._staged.discard(key)
        super().abandon(key)

    def expire_keys(self, now: datetime) -> list[DedupKey]:
        removed = super().expire_keys(now)
        self._store.delete_dedup(removed)
        return removed
