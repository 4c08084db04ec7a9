"""Deduplication of incoming messages by (`from.agent_id`, `id`) (specs/protocol.md,
'Deduplication').

A message is recorded only once authenticated. What comes next with the same key is:

- a retry (same content apart from `timestamp` and signature): it gets the stored reply again,
  byte for byte, or, while the original is still being processed, waits for that reply;
- another message reusing the id: 400 `invalid_params`, `details.reason = "id_reused"`.

Entries live until the later of receipt and `timestamp`, plus `dedup_window` (at least twice
the replay window, so a message can never be stale-accepted again after its entry is gone).
429 and 5xx replies are not stored: the sender will retry, and the retry is processed anew.

The table is sans-IO: "now" is always passed in, and the waiters it hands out come from the
factory it is given (the runtime's asyncio futures: `synapse.p2p.aio.MemoryDedupStore`).
"""

from __future__ import annotations

import heapq
from collections.abc import Awaitable, Callable, Generator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum
from typing import Any, Protocol

import msgspec

#: (`from.agent_id`, `id`).
DedupKey = tuple[str, str]


def is_storable(status: int) -> bool:
    """Replies worth replaying to a retry: not 429 (rate limited) nor 5xx (try again)."""
    return status != 429 and status < 500


@dataclass(frozen=True, slots=True)
class StoredReply:
    """A reply exactly as sent: status, body bytes and the headers needed to resend it."""

    status: int
    body: bytes
    #: e.g. (("Content-Type", "application/json"), ("X-Synapse-Signature", "sha256=…")).
    headers: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, status: int, body: bytes, headers: Mapping[str, str] | None = None) -> StoredReply:
        return cls(status, bytes(body), tuple((headers or {}).items()))

    @property
    def header_dict(self) -> dict[str, str]:
        return dict(self.headers)


class DedupOutcome(Enum):
    """What `begin` found for a key."""

    NEW = "new"
    """Not seen: process it, then `complete` (or `abandon`) the key."""
    DUPLICATE = "duplicate"
    """A retry of a processed message: send `Begin.reply` again."""
    IN_PROGRESS = "in_progress"
    """A retry of a message being processed: await `Begin.waiter` for its reply."""
    REUSED = "reused"
    """Another message with the same key: answer 400 `invalid_params` (`id_reused`)."""


class Begin(msgspec.Struct, frozen=True):
    """The result of `DedupStore.begin` (a frozen msgspec struct: built in C, one per
    message received)."""

    outcome: DedupOutcome
    #: The stored reply (DUPLICATE only).
    reply: StoredReply | None = None
    #: Resolves to the original's reply once it completes, or to None if it was abandoned
    #: without one, in which case begin again (IN_PROGRESS only).
    waiter: Awaitable[StoredReply | None] | None = None


class DedupStore(Protocol):
    """A deduplication table; the in-memory one below, a durable one later."""

    def begin(
        self, key: DedupKey, fingerprint: bytes, *, now: datetime, timestamp: datetime
    ) -> Begin:
        """Look up `key`; record it as in progress if it is NEW."""
        ...

    def stage(self, key: DedupKey, reply: StoredReply) -> None:
        """`reply` will answer the NEW message of `key`: write it with the message's effects
        (before `complete`, and before the commit that makes both durable)."""
        ...

    def complete(self, key: DedupKey, reply: StoredReply) -> None:
        """The NEW message of `key` was answered with `reply`: wake waiters, store if storable."""
        ...

    def abandon(self, key: DedupKey) -> None:
        """The NEW message of `key` was not answered: forget it; waiters must begin again."""
        ...

    def expire(self, now: datetime) -> int:
        """Forget entries whose time has passed; return how many."""
        ...


class Waiter(Protocol):
    """What a retry waits on: resolved with the original's reply (or None), once."""

    def done(self) -> bool: ...

    def set_result(self, result: StoredReply | None, /) -> None: ...

    def __await__(self) -> Generator[Any, None, StoredReply | None]: ...


@dataclass(slots=True)
class _Entry:
    fingerprint: bytes
    expires_at: datetime
    reply: StoredReply | None = None
    #: Futures of the retries waiting for the reply (in progress only).
    waiters: list[Waiter] = field(default_factory=list)
    #: Whether (expires_at, key) is in the expiry heap.
    queued: bool = True

    @property
    def in_progress(self) -> bool:
        return self.reply is None


class DedupTable:
    """`DedupStore` in memory, sans-IO: a dict of entries and a heap ordered by expiry.

    The runtime's `synapse.p2p.aio.MemoryDedupStore` is this table with asyncio futures as
    waiters.
    """

    def __init__(self, window: float, *, new_waiter: Callable[[], Waiter]) -> None:
        """`window`: seconds an entry outlives the later of receipt and `timestamp`
        (`P2PConfig.dedup_window`); `new_waiter` makes the waiter of a retry in progress."""
        if window <= 0:
            raise ValueError("the deduplication window must be positive")
        self._window = timedelta(seconds=window)
        self._entries: dict[DedupKey, _Entry] = {}
        self._heap: list[tuple[datetime, DedupKey]] = []
        self._new_waiter = new_waiter

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def begin(
        self, key: DedupKey, fingerprint: bytes, *, now: datetime, timestamp: datetime
    ) -> Begin:
        entry = self._entries.get(key)
        if entry is not None and entry.expires_at <= now and not entry.in_progress:
            del self._entries[key]  # expired but not yet purged
            entry = None
        if entry is None:
            expires_at = max(now, timestamp) + self._window
            self._entries[key] = _Entry(fingerprint, expires_at)
            heapq.heappush(self._heap, (expires_at, key))
            return Begin(DedupOutcome.NEW)
        if entry.fingerprint != fingerprint:
            return Begin(DedupOutcome.REUSED)
        if entry.reply is not None:
            return Begin(DedupOutcome.DUPLICATE, reply=entry.reply)
        # One future per waiter: a waiter cancelled while waiting cancels only its own.
        waiter = self._new_waiter()
        entry.waiters.append(waiter)
        return Begin(DedupOutcome.IN_PROGRESS, waiter=waiter)

    def _finish(self, key: DedupKey, reply: StoredReply | None) -> _Entry:
        entry = self._entries.get(key)
        if entry is None or not entry.in_progress:
            raise KeyError(f"{key!r} is not in progress")
        waiters, entry.waiters = entry.waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(reply)
        return entry

    def stage(self, key: DedupKey, reply: StoredReply) -> None:
        """Nothing to write ahead in memory."""

    def complete(self, key: DedupKey, reply: StoredReply) -> None:
        entry = self._finish(key, reply)
        if not is_storable(reply.status):
            del self._entries[key]
            return
        entry.reply = reply
        if not entry.queued:  # `expire` passed it over while it was in progress
            entry.queued = True
            heapq.heappush(self._heap, (entry.expires_at, key))

    def abandon(self, key: DedupKey) -> None:
        self._finish(key, None)
        del self._entries[key]

    def expire(self, now: datetime) -> int:
        return len(self.expire_keys(now))

    def expire_keys(self, now: datetime) -> list[DedupKey]:
        """Like `expire`, returning the keys forgotten."""
        removed: list[DedupKey] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            expires_at, key = heapq.heappop(heap)
            entry = self._entries.get(key)
            if entry is None or entry.expires_at != expires_at:
                continue  # left behind by an entry since removed or replaced
            if entry.in_progress:
                entry.queued = False  # requeued by `complete`
                continue
            del self._entries[key]
            removed.append(key)
        return removed

    def restore(
        self, key: DedupKey, fingerprint: bytes, expires_at: datetime, reply: StoredReply
    ) -> None:
        """Put back an entry a durable store kept (at start-up)."""
        self._entries[key] = _Entry(fingerprint, expires_at, reply)
        heapq.heappush(self._heap, (expires_at, key))

    def expiry_of(self, key: DedupKey) -> tuple[bytes, datetime] | None:
        """The fingerprint and expiry of `key`, for a durable store to save with its reply."""
        entry = self._entries.get(key)
        return (entry.fingerprint, entry.expires_at) if entry is not None else None
