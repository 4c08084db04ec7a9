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
factory it is given (the runtime's asyncio futures: `synapse.runtime.aio.MemoryDedupStore`).
"""

from __future__ import annotations

import math
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


class StoredReply(msgspec.Struct, frozen=True, gc=False):
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

    async def prefetch(self, key: DedupKey, now: datetime) -> None:
        """Read what `begin` will need to know of `key` from wherever it is kept, without
        blocking the caller's loop (a table kept in a database server looks the key up
        there); `begin`, called next, then answers from memory."""
        ...

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
    """A message being processed (few at a time)."""

    fingerprint: bytes
    expires_at: datetime
    #: Futures of the retries waiting for the reply.
    waiters: list[Waiter] = field(default_factory=list)


_pack = msgspec.msgpack.Encoder().encode
_Packed = tuple[bytes, float, int, tuple[tuple[str, str], ...], bytes]
_unpack = msgspec.msgpack.Decoder(_Packed).decode


def _slot(key: DedupKey) -> str:
    """`key` as one string, unambiguous whatever the ids hold (the sender's length first)."""
    return f"{len(key[0])}:{key[0]}{key[1]}"


def _key(slot: str) -> DedupKey:
    length, _, rest = slot.partition(":")
    return rest[: int(length)], rest[int(length) :]


class DedupTable:
    """`DedupStore` in memory, sans-IO.

    Built so that a full garbage collection has nothing to visit per answered message, however
    many the window holds (one per message received in the last `dedup_window`): they live in
    a `dict[str, bytes]` (key → fingerprint, expiry, status, headers and body, packed), which
    CPython does not even track, and their expiry order in per-second buckets whose closed
    ones are single strings (`dict[int, str]`, untracked too). Only the messages in progress
    are objects (`_Entry`, with their waiters).

    The runtime's `synapse.runtime.aio.MemoryDedupStore` is this table with asyncio futures as
    waiters.
    """

    def __init__(self, window: float, *, new_waiter: Callable[[], Waiter]) -> None:
        """`window`: seconds an entry outlives the later of receipt and `timestamp`
        (`P2PConfig.dedup_window`); `new_waiter` makes the waiter of a retry in progress."""
        if window <= 0:
            raise ValueError("the deduplication window must be positive")
        self._window = timedelta(seconds=window)
        self._in_progress: dict[DedupKey, _Entry] = {}
        self._answered: dict[str, bytes] = {}
        #: Second (epoch, rounded up) an entry expires in → its keys, joined by "\n" once
        #: no new entry can expire in that second any more (`_seal`), a list until then.
        self._closed: dict[int, str] = {}
        self._open: dict[int, list[str]] = {}
        #: Every bucket up to this second has been expired.
        self._expired_through: int | None = None
        #: Every bucket below this second is closed.
        self._sealed_below = -1
        self._new_waiter = new_waiter

    def __len__(self) -> int:
        return len(self._in_progress) + len(self._answered)

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, tuple) or len(key) != 2:
            return False
        return key in self._in_progress or _slot(key) in self._answered

    # --- expiry buckets -----------------------------------------------------------------------

    def _queue(self, slot: str, expires_at: float) -> None:
        second = math.ceil(expires_at)
        if self._expired_through is not None and second <= self._expired_through:
            second = self._expired_through + 1  # that bucket is gone: the next one
        closed = self._closed.get(second)
        if closed is not None:  # rare: a restored entry, or one completed late
            self._closed[second] = f"{closed}\n{slot}"
        else:
            self._open.setdefault(second, []).append(slot)

    def _seal(self, now: float) -> None:
        """Close the buckets no new entry can join: every new entry expires at least
        `window` from now."""
        first_open = math.ceil(now + self._window.total_seconds())
        if first_open <= self._sealed_below:
            return  # nothing new to close since the last call (most calls)
        self._sealed_below = first_open
        for second in [s for s in self._open if s < first_open]:
            slots = self._open.pop(second)
            closed = self._closed.get(second)
            self._closed[second] = "\n".join([closed, *slots] if closed else slots)

    # --- the table ----------------------------------------------------------------------------

    async def prefetch(self, key: DedupKey, now: datetime) -> None:
        """Nothing to read: the whole table is in memory."""

    def begin(
        self, key: DedupKey, fingerprint: bytes, *, now: datetime, timestamp: datetime
    ) -> Begin:
        pending = self._in_progress.get(key)
        if pending is not None:
            if pending.fingerprint != fingerprint:
                return Begin(DedupOutcome.REUSED)
            # One future per waiter: a waiter cancelled while waiting cancels only its own.
            waiter = self._new_waiter()
            pending.waiters.append(waiter)
            return Begin(DedupOutcome.IN_PROGRESS, waiter=waiter)
        slot = _slot(key)
        packed = self._answered.get(slot)
        if packed is not None:
            stored_fp, expires, status, headers, body = _unpack(packed)
            if expires > now.timestamp():
                if stored_fp != fingerprint:
                    return Begin(DedupOutcome.REUSED)
                reply = StoredReply(status, body, headers)
                return Begin(DedupOutcome.DUPLICATE, reply=reply)
            del self._answered[slot]  # expired but not yet purged
        self._in_progress[key] = _Entry(fingerprint, max(now, timestamp) + self._window)
        self._seal(now.timestamp())
        return Begin(DedupOutcome.NEW)

    def _finish(self, key: DedupKey, reply: StoredReply | None) -> _Entry:
        entry = self._in_progress.pop(key, None)
        if entry is None:
            raise KeyError(f"{key!r} is not in progress")
        for waiter in entry.waiters:
            if not waiter.done():
                waiter.set_result(reply)
        return entry

    def stage(self, key: DedupKey, reply: StoredReply) -> None:
        """Nothing to write ahead in memory."""

    def complete(self, key: DedupKey, reply: StoredReply) -> None:
        entry = self._finish(key, reply)
        if is_storable(reply.status):
            self._keep(key, entry.fingerprint, entry.expires_at, reply)

    def _keep(
        self, key: DedupKey, fingerprint: bytes, expires_at: datetime, reply: StoredReply
    ) -> None:
        slot = _slot(key)
        expires = expires_at.timestamp()
        self._answered[slot] = _pack(
            (fingerprint, expires, reply.status, reply.headers, reply.body)
        )
        self._queue(slot, expires)

    def abandon(self, key: DedupKey) -> None:
        self._finish(key, None)

    def expire(self, now: datetime) -> int:
        return len(self.expire_keys(now))

    def expire_keys(self, now: datetime) -> list[DedupKey]:
        """Like `expire`, returning the keys forgotten. Messages in progress stay (they are
        queued when they complete)."""
        removed: list[DedupKey] = []
        stamp = now.timestamp()
        self._seal(stamp)
        through = math.floor(stamp)
        due = [s for s in self._closed if s <= through]
        for second in sorted(due):
            for slot in self._closed.pop(second).split("\n"):
                packed = self._answered.get(slot)
                if packed is not None and _unpack(packed)[1] <= stamp:
                    del self._answered[slot]
                    removed.append(_key(slot))
        if self._expired_through is None or through > self._expired_through:
            self._expired_through = through
        return removed

    def forget(self, key: DedupKey) -> None:
        """Drop what is known of `key` (answered or in progress, its waiters left as they
        are): a tool that must see a message anew, never the runtime."""
        self._in_progress.pop(key, None)
        self._answered.pop(_slot(key), None)

    def restore(
        self, key: DedupKey, fingerprint: bytes, expires_at: datetime, reply: StoredReply
    ) -> None:
        """Put back an entry a durable store kept (at start-up)."""
        self._keep(key, fingerprint, expires_at, reply)
