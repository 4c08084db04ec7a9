"""A store that cannot write: the commit fails whole, nothing is dropped, and it recovers.

The faults are real: a write lock held by another SQLite connection, a full file system (a
small tmpfs), files even root cannot open for writing (`chattr +i`). Every failed commit
raises `StoreUnavailable`; its writes stay buffered and are written by the first commit that
succeeds, in order, except those the caller asked to drop (`discard_after`).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from diskfaults import fill, set_immutable, small_tmpfs, write_lock
from storekit import outbox_item

from synapse.logs import capture_events
from synapse.store import SqliteStore, StoreUnavailable


def count(path: Path, table: str) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])
    finally:
        conn.close()


def ids(path: Path) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return [r[0] for r in conn.execute("SELECT message_id FROM outbox ORDER BY seq")]
    finally:
        conn.close()


def files_of(db: Path) -> list[Path]:
    return sorted(db.parent.glob(db.name + "*"))


async def test_a_held_write_lock_fails_the_commit_and_the_batch_is_written_later(
    tmp_path: Path,
) -> None:
    db = tmp_path / "store.sqlite"
    store = SqliteStore(db, busy_timeout=0.05)
    store.add_outbox(outbox_item(1))
    await store.commit()
    with write_lock(db):
        store.add_outbox(outbox_item(2))
        with pytest.raises(StoreUnavailable, match="locked"):
            await store.commit()
        store.add_outbox(outbox_item(3))
        with pytest.raises(StoreUnavailable):
            await store.commit()
        with pytest.raises(StoreUnavailable):
            await store.commit()  # nothing new buffered: the kept batch is tried again
    assert ids(db) == ["msg-1"]
    await store.commit()  # nothing new buffered, but the failed batches are written now
    assert ids(db) == ["msg-1", "msg-2", "msg-3"]
    await store.close()


async def test_discard_after_drops_only_what_the_caller_rolls_back(tmp_path: Path) -> None:
    db = tmp_path / "store.sqlite"
    store = SqliteStore(db, busy_timeout=0.05)
    with write_lock(db):
        store.add_outbox(outbox_item(1))  # someone else's write: kept
        mark = store.mark()
        store.add_outbox(outbox_item(2))  # this message's: dropped on failure
        with pytest.raises(StoreUnavailable):
            await store.commit(discard_after=mark)
    await store.commit()
    assert ids(db) == ["msg-1"]
    await store.close()


async def test_one_log_line_per_failure_episode(tmp_path: Path) -> None:
    db = tmp_path / "store.sqlite"
    store = SqliteStore(db, busy_timeout=0.02)
    with capture_events() as logs, write_lock(db):
        for seq in range(1, 6):
            store.add_outbox(outbox_item(seq))
            with pytest.raises(StoreUnavailable):
                await store.commit()
    with capture_events() as later:
        await store.commit()
        store.add_outbox(outbox_item(9))
        await store.commit()
    assert [e["event"] for e in logs] == ["store_unavailable"], logs
    assert [e["event"] for e in later] == ["store_recovered"], later
    assert later[0]["failed_commits"] == 5
    assert count(db, "outbox") == 6
    await store.close()


async def test_a_full_disk_fails_the_commit_and_it_is_written_once_space_is_back(
    tmp_path: Path,
) -> None:
    with small_tmpfs(tmp_path / "disk") as disk:
        db = disk / "store.sqlite"
        store = SqliteStore(db)
        store.add_outbox(outbox_item(1))
        await store.commit()
        filler = fill(disk)
        try:
            for seq in range(2, 5):
                store.add_outbox(outbox_item(seq, task=f"t-{seq}"))
                store._pending.append(  # a big row, so that the WAL must grow
                    lambda conn, key=f"pad-{seq}": conn.execute(
                        "INSERT INTO meta (key, value) VALUES (?, ?)", (key, "x" * 200_000)
                    )
                )
                with pytest.raises(StoreUnavailable, match="full"):
                    await store.commit()
        finally:
            filler.unlink()
        await store.commit()
        assert ids(db) == ["msg-1", "msg-2", "msg-3", "msg-4"]
        await store.close()


async def test_unwritable_files_fail_the_commit_and_it_is_written_once_fixed(
    tmp_path: Path,
) -> None:
    db = tmp_path / "store.sqlite"
    first = SqliteStore(db)
    first.add_outbox(outbox_item(1))
    await first.close()
    files = files_of(db)
    set_immutable(files, True)
    try:
        store = SqliteStore(db)  # opens (read-only: SQLite falls back to it)
        assert len(store.load().outbox) == 1
        store.add_outbox(outbox_item(2))
        with pytest.raises(StoreUnavailable, match="readonly"):
            await store.commit()
    finally:
        set_immutable(files, False)
    await store.commit()
    assert ids(db) == ["msg-1", "msg-2"]
    await store.close()
