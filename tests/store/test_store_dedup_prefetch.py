"""The PostgreSQL store's dedup lookups leave the event loop free: `prefetch` reads the entry
on a pooled connection before `begin`, which then answers from memory; a key answered here
while its lookup was in flight voids what the lookup read; and the statement that claims a
new task's lease reads its message's entry, so that its lookup costs no round trip."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pytest
from storekit import R_ID, FakeClock

from synapse.p2p.dedup import DedupKey, DedupOutcome, StoredReply
from synapse.p2p.engine import TaskKey
from synapse.store import DurableDedupStore
from synapse.store.base import DedupEntry
from synapse.store.leases import Ownership
from synapse.store.postgres import PostgresStore

REPLY = StoredReply.of(200, b'{"ok":1}', {"Content-Type": "application/json"})


def no_blocking_lookup(store: PostgresStore, monkeypatch: pytest.MonkeyPatch) -> None:
    def blocking(key: DedupKey) -> DedupEntry | None:
        raise AssertionError(f"looked {key} up on the event loop")

    monkeypatch.setattr(store, "get_dedup", blocking)


async def test_a_duplicate_is_recognised_without_a_lookup_on_the_loop(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = datetime.now(UTC)
    writer = PostgresStore(pg_url)
    first = DurableDedupStore(600, writer)
    key = (R_ID, "m-1")
    await first.prefetch(key, at)
    assert first.begin(key, b"f", now=at, timestamp=at).outcome is DedupOutcome.NEW
    first.complete(key, REPLY)
    await writer.commit()

    store = PostgresStore(pg_url)  # another replica, or this one after a restart
    no_blocking_lookup(store, monkeypatch)
    table = DurableDedupStore(600, store)
    await table.prefetch(key, at)
    begun = table.begin(key, b"f", now=at, timestamp=at)
    assert begun.outcome is DedupOutcome.DUPLICATE and begun.reply == REPLY
    await table.prefetch(key, at)
    assert table.begin(key, b"g", now=at, timestamp=at).outcome is DedupOutcome.REUSED
    await table.prefetch((R_ID, "m-new"), at)
    assert table.begin((R_ID, "m-new"), b"f", now=at, timestamp=at).outcome is DedupOutcome.NEW
    for store_ in (writer, store):
        await store_.close()


async def test_a_key_answered_during_its_lookup_is_not_taken_for_new(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A retry whose lookup read 'absent' before the original was answered here must not be
    processed again: the lookup is voided, and `begin` asks the store."""
    at = datetime.now(UTC)
    store = PostgresStore(pg_url)
    key = (R_ID, "m-1")
    read, release = asyncio.Event(), asyncio.Event()
    fetch = store.fetch_dedup

    async def slow_fetch(k: DedupKey) -> DedupEntry | None:
        found = await fetch(k)  # absent: the original is not answered yet
        read.set()
        await release.wait()
        return found

    monkeypatch.setattr(store, "fetch_dedup", slow_fetch)
    table = DurableDedupStore(600, store)
    retry = asyncio.ensure_future(table.prefetch(key, at))
    await read.wait()
    # Meanwhile the original is processed and answered (its lookup not needed: in flight).
    assert table.begin(key, b"f", now=at, timestamp=at).outcome is DedupOutcome.NEW
    table.complete(key, REPLY)
    await store.commit()
    release.set()
    await retry
    begun = table.begin(key, b"f", now=at, timestamp=at)
    assert begun.outcome is DedupOutcome.DUPLICATE and begun.reply == REPLY
    await store.close()


async def test_the_claim_of_a_new_task_reads_its_messages_dedup_entry(
    pair: tuple[list[Ownership], FakeClock], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task_request's one statement claims the task's lease and reads the message's dedup
    entry: the lookup before it is judged needs no round trip of its own."""
    (a, b), clock = pair
    at = datetime.fromtimestamp(clock(), UTC)
    answered = (R_ID, "m-answered")
    table_b = DurableDedupStore(600, b.store)
    await table_b.prefetch(answered, at)
    assert table_b.begin(answered, b"f", now=at, timestamp=at).outcome is DedupOutcome.NEW
    table_b.complete(answered, REPLY)
    await b.store.commit()  # another replica answered it once (its task is another one)

    statements: list[str] = []
    execute = a.store.execute

    async def counted(query: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        statements.append(query)
        return await execute(query, params)

    monkeypatch.setattr(a.store, "execute", counted)
    table = DurableDedupStore(600, a.store)
    assert await a.claim(TaskKey(R_ID, "t-1"), answered)
    await table.prefetch(answered, at)
    begun = table.begin(answered, b"f", now=at, timestamp=at)
    assert begun.outcome is DedupOutcome.DUPLICATE and begun.reply == REPLY
    fresh = (R_ID, "m-fresh")
    assert await a.claim(TaskKey(R_ID, "t-2"), fresh)
    await table.prefetch(fresh, at)
    assert table.begin(fresh, b"f", now=at, timestamp=at).outcome is DedupOutcome.NEW
    assert len(statements) == 2  # the two claims, and no lookup
    # A task another replica leases is not claimed, and nothing is remembered for it.
    assert await b.claim(TaskKey(R_ID, "t-3"))
    assert not await a.claim(TaskKey(R_ID, "t-3"), (R_ID, "m-other"))
    await table.prefetch((R_ID, "m-other"), at)
    assert len(statements) == 4  # that claim, and then a lookup of its own
