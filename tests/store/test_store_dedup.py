"""`DurableDedupStore`: the deduplication table written through to the store."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from aiohttp import web
from storekit import R_ID, dedup_entry

from synapse.p2p.dedup import DedupOutcome, StoredReply
from synapse.store import DurableDedupStore, SqliteStore
from synapse.transport.peer import Peer

REPLY = StoredReply.of(200, b'{"ok":1}', {"Content-Type": "application/json"})


async def test_completed_replies_are_written_to_the_store(tmp_path: Path) -> None:
    at = datetime.now(UTC)  # per test: a long session must not age it
    store = SqliteStore(tmp_path / "d.sqlite")
    table = DurableDedupStore(600, store)
    key = (R_ID, "m-1")
    assert table.begin(key, b"f", now=at, timestamp=at).outcome is DedupOutcome.NEW
    table.complete(key, REPLY)
    await store.commit()
    await store.close()

    again = SqliteStore(tmp_path / "d.sqlite")
    assert again.load().dedup == []  # not loaded: looked up by key when a message comes
    entry = again.get_dedup(key)
    assert entry is not None
    assert entry.key == key and entry.fingerprint == b"f" and entry.reply == REPLY
    assert entry.expires_at == (at + timedelta(seconds=600)).timestamp()
    restored = DurableDedupStore(600, again)
    assert len(restored) == 0  # nothing per message in memory
    begun = restored.begin(key, b"f", now=at, timestamp=at)
    assert begun.outcome is DedupOutcome.DUPLICATE and begun.reply == REPLY
    assert restored.begin(key, b"g", now=at, timestamp=at).outcome is DedupOutcome.REUSED
    await again.close()


async def test_unstorable_and_abandoned_replies_are_not_written(tmp_path: Path) -> None:
    at = datetime.now(UTC)  # per test: a long session must not age it
    store = SqliteStore(tmp_path / "d.sqlite")
    table = DurableDedupStore(600, store)
    for n, status in enumerate((429, 500, 503)):
        key = (R_ID, f"m-{n}")
        table.begin(key, b"f", now=at, timestamp=at)
        table.complete(key, StoredReply.of(status, b"{}"))
    table.begin((R_ID, "gone"), b"f", now=at, timestamp=at)
    table.abandon((R_ID, "gone"))
    await store.commit()
    assert all(store.get_dedup((R_ID, m)) is None for m in ("m-0", "m-1", "m-2", "gone"))
    await store.close()


async def test_expired_entries_are_not_restored(tmp_path: Path) -> None:
    at = datetime.now(UTC)  # per test: a long session must not age it
    store = SqliteStore(tmp_path / "d.sqlite")
    now = at.timestamp()
    store.put_dedup(dedup_entry("old", now - 1))
    store.put_dedup(dedup_entry("fresh", now + 60))
    await store.commit()
    table = DurableDedupStore(600, store)
    fresh = table.begin((R_ID, "fresh"), b"\x01" * 32, now=at, timestamp=at)
    assert fresh.outcome is DedupOutcome.DUPLICATE
    # The expired one is just another new message now.
    begun = table.begin((R_ID, "old"), b"\x01" * 32, now=at, timestamp=at)
    assert begun.outcome is DedupOutcome.NEW
    await store.close()


async def test_expiry_deletes_from_the_store(tmp_path: Path) -> None:
    at = datetime.now(UTC)  # per test: a long session must not age it
    store = SqliteStore(tmp_path / "d.sqlite")
    table = DurableDedupStore(600, store)
    for n in range(3):
        key = (R_ID, f"m-{n}")
        table.begin(key, b"f", now=at + timedelta(seconds=n), timestamp=at)
        table.complete(key, REPLY)
    await store.commit()
    later = (at + timedelta(seconds=601.5)).timestamp()
    assert await store.purge(finished_before=0, now=later, limit=100) == 2
    kept = [n for n in range(3) if store.get_dedup((R_ID, f"m-{n}")) is not None]
    assert kept == [2]
    await store.close()


async def test_an_empty_durable_table_is_the_one_the_server_uses(tmp_path: Path) -> None:
    """Regression: `MemoryDedupStore` has `__len__`, so an empty durable table was falsy and
    `SynapseServer` (`dedup or MemoryDedupStore(...)`) silently replaced it with a memory
    one: on a fresh store nothing was deduplicated durably, and after a crash a retry was
    processed again instead of getting its stored reply."""
    store = SqliteStore(tmp_path / "d.sqlite")
    table = DurableDedupStore(600, store)
    assert len(table) == 0 and bool(table)
    peer = Peer("agent-e", store=store, serve=False)
    peer.attach(web.Application(), "http://127.0.0.1:9/synapse/callback")
    assert isinstance(peer.server.dedup, DurableDedupStore)
    await store.close()
