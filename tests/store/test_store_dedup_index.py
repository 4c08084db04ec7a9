"""The SQLite store answers "surely not a duplicate" from memory (`dedup_known_absent`), and
sends to SQL every key it cannot vouch for: a duplicate is recognised the same way by the
process that answered it and by the next one, after a restart."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from storekit import R_ID

from synapse.p2p.dedup import DedupKey, DedupOutcome, StoredReply
from synapse.store import DedupEntry, DurableDedupStore, SqliteStore

REPLY = StoredReply.of(200, b'{"ok":1}', {"Content-Type": "application/json"})


class CountingStore(SqliteStore):
    """Counts the SQL lookups of the dedup table."""

    lookups = 0

    def get_dedup(self, key: DedupKey) -> DedupEntry | None:
        self.lookups += 1
        return super().get_dedup(key)


async def answer(table: DurableDedupStore, store: SqliteStore, key: DedupKey, at: datetime) -> None:
    assert table.begin(key, b"f", now=at, timestamp=at).outcome is DedupOutcome.NEW
    table.complete(key, REPLY)
    await store.commit()


async def test_new_messages_need_no_sql_and_duplicates_are_looked_up(tmp_path: Path) -> None:
    at = datetime.now(UTC)
    store = CountingStore(tmp_path / "d.sqlite")
    table = DurableDedupStore(600, store)
    for n in range(20):
        await answer(table, store, (R_ID, f"m-{n}"), at)
    assert store.lookups == 0  # a fresh file, keys never written: answered from memory
    begun = table.begin((R_ID, "m-3"), b"f", now=at, timestamp=at)
    assert begun.outcome is DedupOutcome.DUPLICATE and begun.reply == REPLY
    assert table.begin((R_ID, "m-4"), b"g", now=at, timestamp=at).outcome is DedupOutcome.REUSED
    assert store.lookups == 2  # each key the index holds is looked up
    await store.close()


async def test_after_a_restart_duplicates_are_recognised_the_same_way(tmp_path: Path) -> None:
    at = datetime.now(UTC)
    path = tmp_path / "d.sqlite"
    store = CountingStore(path)
    await answer(DurableDedupStore(600, store), store, (R_ID, "m-1"), at)
    await store.close()

    again = CountingStore(path)
    table = DurableDedupStore(600, again)
    # The index is empty, but the file holds live entries: every key goes to SQL.
    assert table.begin((R_ID, "m-1"), b"f", now=at, timestamp=at).outcome is DedupOutcome.DUPLICATE
    assert table.begin((R_ID, "m-1"), b"g", now=at, timestamp=at).outcome is DedupOutcome.REUSED
    assert table.begin((R_ID, "m-2"), b"f", now=at, timestamp=at).outcome is DedupOutcome.NEW
    assert again.lookups == 3
    # Once every entry from before the restart has expired, memory answers again.
    later = at + timedelta(seconds=601)
    assert table.begin((R_ID, "m-1"), b"f", now=later, timestamp=later).outcome is DedupOutcome.NEW
    assert again.lookups == 3
    await again.close()


async def test_the_index_forgets_expired_entries_and_never_misses_a_live_one(
    tmp_path: Path,
) -> None:
    at = datetime.now(UTC)
    store = CountingStore(tmp_path / "d.sqlite")
    table = DurableDedupStore(600, store)
    key = (R_ID, "m-1")
    await answer(table, store, key, at)
    now = at.timestamp()
    assert not store.dedup_known_absent(key, now + 599)  # still live: SQL must answer
    assert store.dedup_known_absent(key, now + 661)  # its minute is past
    assert store._dedup_index == {}
    # A discarded write (a refused message) leaves only a harmless lookup behind.
    mark = store.mark()
    store.put_dedup(DedupEntry((R_ID, "m-2"), b"f", now + 600, REPLY))
    store.discard(mark)
    assert not store.dedup_known_absent((R_ID, "m-2"), now)
    assert table.begin((R_ID, "m-2"), b"f", now=at, timestamp=at).outcome is DedupOutcome.NEW
    await store.close()
