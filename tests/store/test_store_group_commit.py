"""Group commit of the SQLite store: commits made while a transaction is being written wait
together and go into the next transaction; each caller returns only once its own writes are
committed, and a failed transaction fails exactly the callers whose writes it held."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
from storekit import outbox_item

from synapse.store import SqliteStore, StoreUnavailable

WAITING = 8


class GatedStore(SqliteStore):
    """Its writer thread waits at a gate (the test opens it) before the first transaction:
    the commits made meanwhile queue behind it."""

    def __init__(self, path: Path, **options: Any) -> None:
        super().__init__(path, **options)
        self.gate = threading.Event()
        self.at_gate = threading.Event()
        self.transactions: list[int] = []  # writes per transaction
        self.after_first: Any = None  # called once the first transaction is written

    def _write(self, ops: Any, keep: int, kept: Any = None) -> None:
        if not self.transactions:
            self.at_gate.set()
            assert self.gate.wait(timeout=30), "the test never opened the gate"
        self.transactions.append(len(ops))
        super()._write(ops, keep, kept)
        if len(self.transactions) == 1 and self.after_first is not None:
            self.after_first()


def outbox_ids(path: Path) -> set[str]:
    """The outbox as another connection (another process) sees it: what is committed."""
    conn = sqlite3.connect(path)
    try:
        return {row[0] for row in conn.execute("SELECT message_id FROM outbox")}
    finally:
        conn.close()


async def held_first_commit(store: GatedStore) -> asyncio.Task[None]:
    store.add_outbox(outbox_item(1))
    first = asyncio.create_task(store.commit())
    await asyncio.to_thread(store.at_gate.wait, 30)
    return first


async def held_first_and_second_queued(
    store: GatedStore,
) -> tuple[asyncio.Task[None], asyncio.Task[None]]:
    """The first commit held in its transaction, a second queued behind it (outbox 1 and 2)."""
    first = await held_first_commit(store)
    store.add_outbox(outbox_item(2))
    second = asyncio.create_task(store.commit())
    await asyncio.sleep(0)
    return first, second


async def commit_and_check(store: SqliteStore, path: Path, seq: int) -> None:
    store.add_outbox(outbox_item(seq))
    await store.commit()
    # Returned: its own write is committed (seen by another connection).
    assert f"msg-{seq}" in outbox_ids(path)


async def test_commits_waiting_behind_a_transaction_share_the_next_one(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    store = GatedStore(path)
    first = await held_first_commit(store)
    waiting = [
        asyncio.create_task(commit_and_check(store, path, seq)) for seq in range(2, 2 + WAITING)
    ]
    await asyncio.sleep(0)  # every waiting commit has buffered its write and is waiting
    assert not any(task.done() for task in waiting)
    assert outbox_ids(path) == set()
    store.gate.set()
    await asyncio.gather(first, *waiting)
    assert store.transactions == [1, WAITING]  # one transaction for all that waited
    assert store.commits == 2
    assert outbox_ids(path) == {f"msg-{seq}" for seq in range(1, 2 + WAITING)}
    await store.close()


async def test_a_failed_transaction_fails_only_the_commits_it_held(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    store = GatedStore(path, busy_timeout=0.05)
    first = await held_first_commit(store)
    waiting = [asyncio.create_task(commit_and_check(store, path, seq)) for seq in (2, 3, 4)]
    await asyncio.sleep(0)
    # Another process holds the write lock once the first transaction is written.
    blocker = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    store.after_first = lambda: blocker.execute("BEGIN IMMEDIATE")
    store.gate.set()
    await first  # its transaction was written before the lock
    results = await asyncio.gather(*waiting, return_exceptions=True)
    assert all(isinstance(r, StoreUnavailable) for r in results), results
    assert outbox_ids(path) == {"msg-1"}
    blocker.execute("ROLLBACK")
    blocker.close()
    # The failed writes are kept and written by the next commit, in order.
    await store.commit()
    assert outbox_ids(path) == {"msg-1", "msg-2", "msg-3", "msg-4"}
    await store.close()


async def test_a_bug_in_one_commit_of_a_group_fails_only_its_caller(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    store = GatedStore(path)
    first = await held_first_commit(store)
    good = [asyncio.create_task(commit_and_check(store, path, seq)) for seq in (2, 3)]

    async def broken_commit() -> None:
        store._pending.append(lambda conn: conn.execute("INSERT INTO no_such_table VALUES (1)"))
        await store.commit()

    bad = asyncio.create_task(broken_commit())
    good.append(asyncio.create_task(commit_and_check(store, path, 4)))
    await asyncio.sleep(0)
    store.gate.set()
    await first
    await asyncio.gather(*good)
    assert store.transactions[:2] == [1, 4]  # the group, which failed, then each alone
    with pytest.raises(sqlite3.OperationalError, match="no_such_table"):
        await bad
    assert outbox_ids(path) == {"msg-1", "msg-2", "msg-3", "msg-4"}
    await store.close()


async def test_an_empty_commit_waits_for_the_transactions_queued_before_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.sqlite"
    store = GatedStore(path)
    first, second = await held_first_and_second_queued(store)
    empty = asyncio.create_task(store.commit())
    await asyncio.sleep(0)
    assert not empty.done()
    store.gate.set()
    await empty
    assert outbox_ids(path) == {"msg-1", "msg-2"}
    await asyncio.gather(first, second)
    await store.close()


async def test_purge_runs_in_the_writer_after_the_transaction_it_joins(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    store = GatedStore(path)
    first, second = await held_first_and_second_queued(store)
    purge = asyncio.create_task(store.purge(finished_before=0.0, now=0.0, limit=10))
    await asyncio.sleep(0)
    assert not purge.done()
    store.gate.set()
    assert await purge == 0
    assert second.done() and first.done()
    await store.close()
