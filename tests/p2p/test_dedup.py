"""Deduplication by (`from.agent_id`, `id`): specs/protocol.md, 'Deduplication'."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from synapse.p2p.dedup import (
    Begin,
    DedupOutcome,
    DedupStore,
    StoredReply,
    is_storable,
)
from synapse.runtime.aio import MemoryDedupStore

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
WINDOW = 600.0
KEY = ("agent-r", "msg-1")
FP = b"\x01" * 32
OTHER_FP = b"\x02" * 32
REPLY = StoredReply.of(
    200, b'{"type":"p2p:ack"}', {"Content-Type": "application/json", "X-Synapse-Signature": "s"}
)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def begin(
    store: MemoryDedupStore, key: tuple[str, str] = KEY, fp: bytes = FP, **kw: datetime
) -> Begin:
    return store.begin(key, fp, now=kw.get("now", T0), timestamp=kw.get("timestamp", T0))


def test_memory_store_is_a_dedup_store() -> None:
    store: DedupStore = MemoryDedupStore(WINDOW)
    assert store.begin(KEY, FP, now=T0, timestamp=T0).outcome is DedupOutcome.NEW


async def test_new_then_duplicate_gets_the_same_bytes() -> None:
    store = MemoryDedupStore(WINDOW)
    assert begin(store).outcome is DedupOutcome.NEW
    store.complete(KEY, REPLY)
    again = begin(store, now=at(5), timestamp=at(5))
    assert again.outcome is DedupOutcome.DUPLICATE
    assert again.reply == REPLY
    assert again.reply is not None and again.reply.body == REPLY.body
    assert again.reply.header_dict["X-Synapse-Signature"] == "s"


async def test_other_content_with_the_same_key_is_reused() -> None:
    store = MemoryDedupStore(WINDOW)
    begin(store)
    assert begin(store, fp=OTHER_FP).outcome is DedupOutcome.REUSED  # while in progress
    store.complete(KEY, REPLY)
    assert begin(store, fp=OTHER_FP).outcome is DedupOutcome.REUSED  # and after


async def test_keys_are_per_sender() -> None:
    store = MemoryDedupStore(WINDOW)
    begin(store)
    assert begin(store, ("agent-other", "msg-1"), OTHER_FP).outcome is DedupOutcome.NEW
    assert begin(store, ("agent-r", "msg-2"), OTHER_FP).outcome is DedupOutcome.NEW
    assert len(store) == 3


async def test_in_progress_waiters_get_the_same_reply() -> None:
    store = MemoryDedupStore(WINDOW)
    assert begin(store).outcome is DedupOutcome.NEW
    first, second = begin(store), begin(store)
    assert first.outcome is second.outcome is DedupOutcome.IN_PROGRESS
    assert first.waiter is not None and second.waiter is not None
    waiting = asyncio.gather(first.waiter, second.waiter)
    await asyncio.sleep(0)
    assert not waiting.done()
    store.complete(KEY, REPLY)
    assert list(await waiting) == [REPLY, REPLY]
    assert begin(store).outcome is DedupOutcome.DUPLICATE


async def test_a_cancelled_waiter_does_not_cancel_the_others() -> None:
    store = MemoryDedupStore(WINDOW)
    begin(store)
    first, second = begin(store), begin(store)
    assert first.waiter is not None and second.waiter is not None
    task = asyncio.ensure_future(first.waiter)
    await asyncio.sleep(0)
    task.cancel()
    store.complete(KEY, REPLY)
    assert await second.waiter == REPLY


@pytest.mark.parametrize("status", [429, 500, 502, 503, 504])
async def test_429_and_5xx_are_not_stored_but_reach_waiters(status: int) -> None:
    store = MemoryDedupStore(WINDOW)
    begin(store)
    waiting = begin(store)
    assert waiting.waiter is not None
    busy = StoredReply.of(status, b"nack")
    store.complete(KEY, busy)
    assert await waiting.waiter == busy
    assert KEY not in store
    assert begin(store).outcome is DedupOutcome.NEW  # the sender's retry is processed anew


@pytest.mark.parametrize("status", [200, 400, 403, 404, 409])
def test_storable(status: int) -> None:
    assert is_storable(status)
    assert not is_storable(429) and not is_storable(503)


async def test_abandon_forgets_and_wakes_waiters_with_none() -> None:
    store = MemoryDedupStore(WINDOW)
    begin(store)
    waiting = begin(store)
    assert waiting.waiter is not None
    store.abandon(KEY)
    assert await waiting.waiter is None
    assert begin(store).outcome is DedupOutcome.NEW


def test_complete_or_abandon_an_unknown_key_is_a_bug() -> None:
    store = MemoryDedupStore(WINDOW)
    with pytest.raises(KeyError):
        store.complete(KEY, REPLY)
    with pytest.raises(KeyError):
        store.abandon(KEY)
    begin(store)
    store.complete(KEY, REPLY)
    with pytest.raises(KeyError):
        store.complete(KEY, REPLY)  # only once


def test_expiry_counts_from_the_later_of_receipt_and_timestamp() -> None:
    store = MemoryDedupStore(WINDOW)
    a, b = ("r", "received-late"), ("r", "timestamp-ahead")
    store.begin(a, FP, now=at(100), timestamp=at(0))  # expires at 700
    store.begin(b, FP, now=at(0), timestamp=at(200))  # expires at 800
    store.complete(a, REPLY)
    store.complete(b, REPLY)
    assert store.expire(at(699)) == 0
    assert store.expire(at(700)) == 1
    assert a not in store and b in store
    assert store.expire(at(800)) == 1
    assert len(store) == 0


def test_an_expired_entry_is_new_again_even_before_purging() -> None:
    store = MemoryDedupStore(WINDOW)
    begin(store)
    store.complete(KEY, REPLY)
    assert begin(store, now=at(WINDOW - 1)).outcome is DedupOutcome.DUPLICATE
    assert (
        begin(store, fp=OTHER_FP, now=at(WINDOW), timestamp=at(WINDOW)).outcome is DedupOutcome.NEW
    )
    store.complete(KEY, REPLY)
    assert store.expire(at(WINDOW)) == 0  # the old heap item no longer matches
    assert store.expire(at(2 * WINDOW)) == 1


async def test_in_progress_entries_outlive_their_expiry_until_completed() -> None:
    store = MemoryDedupStore(WINDOW)
    begin(store)
    assert store.expire(at(WINDOW + 1)) == 0
    assert KEY in store
    assert begin(store, now=at(WINDOW + 1)).outcome is DedupOutcome.IN_PROGRESS
    store.complete(KEY, REPLY)
    assert store.expire(at(WINDOW + 2)) == 1


def test_expire_is_cheap_for_many_entries() -> None:
    store = MemoryDedupStore(WINDOW)
    for i in range(10_000):
        key = ("r", f"m{i}")
        store.begin(key, FP, now=at(i / 100), timestamp=at(i / 100))
        store.complete(key, REPLY)
    assert store.expire(at(WINDOW + 50)) == 5001
    assert len(store) == 4999


def test_window_must_be_positive() -> None:
    with pytest.raises(ValueError):
        MemoryDedupStore(0)
