"""A deduplication table that survives restarts.

Answered messages live in the store (`TaskStore.put_dedup`, committed with the message's
effects, and `get_dedup`, a point lookup). A store that can tell from memory that a key is
surely absent (`dedup_known_absent(key, now)`: the SQLite store, which indexes a hash of each
key it wrote) spares a new message the lookup; a key it is unsure of is looked up, so a
duplicate is recognised the same way before and after a restart. A store kept in a database
server (`fetch_dedup`, PostgreSQL) is asked before `begin`, off the event loop (`prefetch`),
and `begin` uses its answer unless the key was answered here meanwhile. Besides that index, memory
holds the messages being processed right now, so that a retry arriving meanwhile waits for
the original's reply. Expired entries are removed by the store's retention purge
(`TaskStore.purge`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from synapse.p2p.dedup import Begin, DedupKey, DedupOutcome, StoredReply, is_storable
from synapse.store.base import DedupEntry, TaskStore


@dataclass(slots=True)
class _InProgress:
    fingerprint: bytes
    expires_at: datetime
    staged: bool = False
    waiters: list[asyncio.Future[StoredReply | None]] = field(default_factory=list)


class DurableDedupStore:
    """`DedupStore` over a `TaskStore`: in progress in memory, answered in the store."""

    def __init__(self, window: float, store: TaskStore, entries: Iterable[DedupEntry] = ()) -> None:
        """`entries` is accepted for compatibility and ignored: they are in `store`."""
        if window <= 0:
            raise ValueError("the deduplication window must be positive")
        self._window = timedelta(seconds=window)
        self._store = store
        self._known_absent: Callable[[DedupKey, float], bool] | None = getattr(
            store, "dedup_known_absent", None
        )
        self._fetch: Callable[[DedupKey], Awaitable[DedupEntry | None]] | None = getattr(
            store, "fetch_dedup", None
        )
        self._in_progress: dict[DedupKey, _InProgress] = {}
        #: Keys being looked up by `prefetch` (each with a token of its lookup), and what the
        #: lookups found, for the next `begin` of each key. Answering a key here (`_finish`)
        #: voids a lookup: what it read may be older than what was just answered.
        self._fetching: dict[DedupKey, object] = {}
        self._fetched: dict[DedupKey, DedupEntry | None] = {}

    def __len__(self) -> int:
        return len(self._in_progress)

    def __bool__(self) -> bool:
        # An empty table (`__len__` 0) is still this table: `dedup or MemoryDedupStore(...)`
        # must never swap a durable store for a memory one.
        return True

    async def prefetch(self, key: DedupKey, now: datetime) -> None:
        fetch = self._fetch
        if fetch is None or key in self._in_progress or key in self._fetching:
            return
        absent = self._known_absent
        if absent is not None and absent(key, now.timestamp()):
            return
        token = self._fetching[key] = object()
        try:
            entry = await fetch(key)
        finally:
            current = self._fetching.pop(key, None)
        if current is token:  # nothing answered the key meanwhile
            self._fetched[key] = entry

    def begin(
        self, key: DedupKey, fingerprint: bytes, *, now: datetime, timestamp: datetime
    ) -> Begin:
        pending = self._in_progress.get(key)
        if pending is not None:
            if pending.fingerprint != fingerprint:
                return Begin(DedupOutcome.REUSED)
            waiter: asyncio.Future[StoredReply | None] = asyncio.get_running_loop().create_future()
            pending.waiters.append(waiter)
            return Begin(DedupOutcome.IN_PROGRESS, waiter=waiter)
        absent = self._known_absent
        if key in self._fetched:
            stored = self._fetched.pop(key)
        elif absent is not None and absent(key, now.timestamp()):
            stored = None
        else:
            stored = self._store.get_dedup(key)
        if stored is not None and datetime.fromtimestamp(stored.expires_at, UTC) > now:
            if stored.fingerprint != fingerprint:
                return Begin(DedupOutcome.REUSED)
            return Begin(DedupOutcome.DUPLICATE, reply=stored.reply)
        expires_at = max(now, timestamp) + self._window
        self._in_progress[key] = _InProgress(fingerprint, expires_at)
        return Begin(DedupOutcome.NEW)

    def stage(self, key: DedupKey, reply: StoredReply) -> None:
        pending = self._in_progress.get(key)
        if pending is not None and is_storable(reply.status):
            entry = DedupEntry(key, pending.fingerprint, pending.expires_at.timestamp(), reply)
            self._store.put_dedup(entry)
            pending.staged = True

    def _finish(self, key: DedupKey, reply: StoredReply | None) -> _InProgress:
        self._fetching.pop(key, None)
        self._fetched.pop(key, None)
        pending = self._in_progress.pop(key, None)
        if pending is None:
            raise KeyError(f"{key!r} is not in progress")
        for waiter in pending.waiters:
            if not waiter.done():
                waiter.set_result(reply)
        return pending

    def complete(self, key: DedupKey, reply: StoredReply) -> None:
        pending = self._in_progress.get(key)
        if pending is not None and not pending.staged:
            self.stage(key, reply)  # written with the next commit
        self._finish(key, reply)

    def abandon(self, key: DedupKey) -> None:
        self._finish(key, None)

    def expire(self, now: datetime) -> int:
        """Nothing to do here: the store's purge removes expired entries."""
        return 0


async def read_dedup(store: TaskStore, key: DedupKey) -> DedupEntry | None:
    """`store`'s entry of `key`, looked up off the event loop where the store can (one kept
    in a database server: `fetch_dedup`)."""
    fetch: Callable[[DedupKey], Awaitable[DedupEntry | None]] | None = getattr(
        store, "fetch_dedup", None
    )
    return await fetch(key) if fetch is not None else store.get_dedup(key)


__all__ = ["DurableDedupStore", "read_dedup"]
