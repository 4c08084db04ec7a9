"""`SqliteStore` and `MemoryStore`: what is kept, how it comes back, when it is durable."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import pytest
from storekit import R_ID, T0, Duo, dedup_entry, outbox_item

from synapse.p2p.states import Event, Role
from synapse.store import SqliteStore, open_store
from synapse.store.base import DeadLetter, Snapshot, StoreUnavailable
from synapse.store.kit import record_in
from synapse.store.memory import MemoryStore
from synapse.store.sql import TaskFilter
from synapse.store.sqlite import IS_FINAL, IS_LIVE, SCHEMA_VERSION, read_snapshot
from synapse.types import TaskState


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "store.sqlite"


async def reopened(store: SqliteStore) -> Snapshot:
    """Close `store` and read what a new process would find in its file: the snapshot it
    loads, plus the finished tasks and dedup entries it looks up by key."""
    await store.close()
    again = SqliteStore(store.path)
    try:
        snapshot = read_snapshot(again._conn, finished=True)
        rows = again._conn.execute("SELECT sender, message_id FROM dedup").fetchall()
        for sender, message_id in rows:
            entry = again.get_dedup((sender, message_id))
            assert entry is not None
            snapshot.dedup.append(entry)
        return snapshot
    finally:
        await again.close()


def count(path: Path, table: str) -> int:
    """Rows of `table` as a second connection (another process) sees them."""
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])
    finally:
        conn.close()


# --- tasks and their history ----------------------------------------------------------------------


async def test_tasks_round_trip_with_their_history(tmp_path: Path) -> None:
    r_store, e_store = SqliteStore(tmp_path / "r.sqlite"), SqliteStore(tmp_path / "e.sqlite")
    duo = Duo(r_store, e_store)
    key = duo.submit()
    duo.progress(key, 50)
    duo.complete(key)
    r_rec, e_rec = duo.record("r", key), duo.record("e", key)
    assert r_rec.state is e_rec.state is TaskState.COMPLETED
    await r_store.commit()
    await e_store.commit()

    [r_back] = (await reopened(r_store)).tasks
    [e_back] = (await reopened(e_store)).tasks
    assert r_back == r_rec  # every field, the history included
    assert e_back == e_rec
    states = [(t.from_state.value, t.to_state.value) for t in r_back.history]
    assert states == [
        ("idle", "pending"),
        ("pending", "confirmed"),
        ("confirmed", "executing"),
        ("executing", "executing"),
        ("executing", "completed"),
    ]
    assert all(t.message_id for t in r_back.history)  # each names the message that moved it


async def test_history_is_rebuilt_from_the_transitions_table(db: Path) -> None:
    store = SqliteStore(db)
    duo = Duo(MemoryStore(), store)
    key = duo.submit()
    duo.progress(key, 10)
    duo.progress(key, 90)
    await store.commit()
    # The record blob has no history; each transition is a row of its own, appended once.
    conn = sqlite3.connect(db)
    blob = conn.execute("SELECT record FROM tasks").fetchone()[0]
    rows = conn.execute(
        "SELECT from_state, to_state, event, message_id FROM transitions ORDER BY id"
    ).fetchall()
    conn.close()
    assert b'"history":[]' in blob
    rec = duo.record("e", key)
    assert rows == [
        (t.from_state.value, t.to_state.value, t.event.value, t.message_id) for t in rec.history
    ]
    [back] = (await reopened(store)).tasks
    assert back.history == rec.history


async def test_put_task_updates_one_row_and_appends_transitions(db: Path) -> None:
    store = SqliteStore(db)
    duo = Duo(store, MemoryStore())
    key = duo.submit()
    for percent in (20, 40, 60):
        duo.progress(key, percent)
    duo.complete(key)
    await store.commit()
    assert count(db, "tasks") == 1
    assert count(db, "transitions") == len(duo.record("r", key).history) == 7
    await store.close()


# --- the outbox -----------------------------------------------------------------------------------


async def test_outbox_comes_back_in_seq_order_and_seq_continues(db: Path) -> None:
    store = SqliteStore(db)
    for seq in (3, 1, 5, 2, 4):
        store.add_outbox(outbox_item(seq))
    store.remove_outbox("msg-5")
    await store.commit()
    snapshot = await reopened(store)
    assert [i.seq for i in snapshot.outbox] == [1, 2, 3, 4]
    assert snapshot.outbox[0] == outbox_item(1)  # every field, the key and body included
    again = SqliteStore(db)
    assert again.next_seq() == 5  # after the largest kept: new messages sort after old ones
    await again.close()


async def test_outbox_item_without_task_key(db: Path) -> None:
    store = SqliteStore(db)
    store.add_outbox(outbox_item(1, task=None))
    await store.commit()
    [item] = (await reopened(store)).outbox
    assert item.key is None


async def test_adding_the_same_message_twice_keeps_the_first(db: Path) -> None:
    store = SqliteStore(db)
    store.add_outbox(outbox_item(1, "msg-x"))
    store.add_outbox(outbox_item(2, "msg-x"))
    await store.commit()
    assert [i.seq for i in (await reopened(store)).outbox] == [1]


async def test_dead_letters_are_listed_apart_from_the_outbox(db: Path) -> None:
    store = SqliteStore(db)
    for seq in (1, 2, 3):
        store.add_outbox(outbox_item(seq))
    store.dead_letter("msg-2", "undeliverable: connection refused", T0 + 99)
    await store.commit()
    snapshot = await reopened(store)
    assert [i.message_id for i in snapshot.outbox] == ["msg-1", "msg-3"]
    assert snapshot.dead_letters == [
        DeadLetter(outbox_item(2), "undeliverable: connection refused", T0 + 99)
    ]


async def test_retry_dead_letter_and_drop_outbox(db: Path) -> None:
    store = SqliteStore(db)
    for seq in (1, 2, 3):
        store.add_outbox(outbox_item(seq))
    store.dead_letter("msg-1", "gave up", T0)
    store.dead_letter("msg-2", "gave up", T0)
    await store.commit()
    assert store.retry_dead_letter("msg-1") is True
    assert store.retry_dead_letter("msg-1") is False  # no longer a dead letter
    assert store.retry_dead_letter("msg-3") is False  # pending, not dead
    assert store.retry_dead_letter("nope") is False
    assert store.drop_outbox("msg-2") is True  # a dead letter, dropped for good
    assert store.drop_outbox("msg-3") is True  # a pending message too
    assert store.drop_outbox("msg-3") is False
    # The maintenance calls write at once: another connection sees them.
    assert count(db, "outbox") == 1
    snapshot = await reopened(store)
    assert [i.message_id for i in snapshot.outbox] == ["msg-1"]
    assert snapshot.dead_letters == []


# --- dedup ----------------------------------------------------------------------------------------


async def test_dedup_entries_round_trip_and_can_be_deleted(db: Path) -> None:
    store = SqliteStore(db)
    entries = [dedup_entry(f"m-{n}", T0 + n, status=200 if n % 2 else 400) for n in range(4)]
    for entry in entries:
        store.put_dedup(entry)
    store.delete_dedup([entries[0].key, ("someone", "unknown")])
    await store.commit()
    back = (await reopened(store)).dedup
    assert sorted(back, key=lambda e: e.key) == entries[1:]
    assert back[0].reply.headers == entries[1].reply.headers  # tuples of pairs, as stored


async def test_replacing_a_dedup_entry(db: Path) -> None:
    store = SqliteStore(db)
    store.put_dedup(dedup_entry("m", T0))
    store.put_dedup(dedup_entry("m", T0 + 5, status=409))
    await store.commit()
    [entry] = (await reopened(store)).dedup
    assert (entry.expires_at, entry.reply.status) == (T0 + 5, 409)


# --- committing -----------------------------------------------------------------------------------


async def test_writes_are_invisible_to_another_connection_until_commit(db: Path) -> None:
    store = SqliteStore(db)
    duo = Duo(MemoryStore(), store)
    duo.submit()
    store.add_outbox(outbox_item(1))
    store.put_dedup(dedup_entry("m", T0 + 1000))
    assert (count(db, "tasks"), count(db, "outbox"), count(db, "dedup")) == (0, 0, 0)
    commits = store.commits
    await store.commit()
    assert (count(db, "tasks"), count(db, "outbox"), count(db, "dedup")) == (1, 1, 1)
    assert store.commits == commits + 1  # one transaction for the whole batch
    await store.commit()
    assert store.commits == commits + 1  # nothing buffered: no transaction
    await store.close()


async def test_commit_now_writes_synchronously(db: Path) -> None:
    store = SqliteStore(db)
    store.add_outbox(outbox_item(1))
    store.commit_now()
    assert count(db, "outbox") == 1
    await store.close()


async def test_close_commits_what_is_buffered(db: Path) -> None:
    store = SqliteStore(db)
    store.add_outbox(outbox_item(1))
    await store.close()
    assert count(db, "outbox") == 1


async def test_commits_run_on_the_writer_thread_and_the_loop_stays_free(db: Path) -> None:
    store = SqliteStore(db)
    store.add_outbox(outbox_item(1))
    await store.commit()
    # Another process holds the write lock: our commit waits for it (busy_timeout) ...
    blocker = sqlite3.connect(db, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    store.add_outbox(outbox_item(2))
    commit = asyncio.create_task(store.commit())
    ticks = 0
    started = time.monotonic()
    while time.monotonic() - started < 0.5:  # ... while the event loop goes on turning
        await asyncio.sleep(0.01)
        ticks += 1
    assert not commit.done()
    assert ticks >= 20, ticks
    blocker.execute("COMMIT")
    blocker.close()
    await asyncio.wait_for(commit, 5)
    assert count(db, "outbox") == 2
    await store.close()


async def test_commits_apply_in_order(db: Path) -> None:
    store = SqliteStore(db)
    waits = []
    for seq in range(1, 6):
        store.add_outbox(outbox_item(seq))
        if seq % 2:
            store.remove_outbox(f"msg-{seq}")
        waits.append(asyncio.create_task(store.commit()))
        await asyncio.sleep(0)  # the commit takes its batch and hands it to the writer
    assert store._pending == []
    # An empty commit returns only once every earlier batch is written.
    await store.commit()
    assert count(db, "outbox") == 2
    # Commits made while a transaction is written join the next one (group commit).
    assert 1 <= store.commits <= 5
    await asyncio.gather(*waits)
    await store.close()


async def test_a_failing_batch_is_rolled_back_whole(db: Path) -> None:
    store = SqliteStore(db)
    store.add_outbox(outbox_item(1))
    await store.commit()
    store.add_outbox(outbox_item(2))
    store._pending.append(lambda conn: conn.execute("INSERT INTO nowhere VALUES (1)"))
    with pytest.raises(sqlite3.OperationalError):
        await store.commit()
    assert count(db, "outbox") == 1  # msg-2 went with the failed transaction
    store.add_outbox(outbox_item(3))
    await store.commit()  # the store is still usable
    assert count(db, "outbox") == 2
    await store.close()


# --- the file -------------------------------------------------------------------------------------


async def test_wal_mode_and_synchronous_setting(db: Path) -> None:
    store = SqliteStore(db)
    mode = store._conn.execute("PRAGMA journal_mode").fetchone()[0]
    sync = store._conn.execute("PRAGMA synchronous").fetchone()[0]
    assert (mode, sync) == ("wal", 1)  # NORMAL: survives SIGKILL
    await store.close()
    full = SqliteStore(db, synchronous="FULL")
    assert full._conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # survives power loss
    await full.close()


async def test_schema_version_is_written_and_checked(db: Path) -> None:
    await SqliteStore(db).close()
    conn = sqlite3.connect(db, isolation_level=None)
    version = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0]
    assert version == str(SCHEMA_VERSION)
    conn.execute("UPDATE meta SET value = ? WHERE key='schema_version'", (SCHEMA_VERSION + 1,))
    conn.close()
    with pytest.raises(RuntimeError, match="schema"):
        SqliteStore(db)


async def test_a_fresh_file_loads_empty(db: Path) -> None:
    store = SqliteStore(db)
    assert store.load() == Snapshot()
    assert store.durable is True
    await store.close()


async def test_open_store() -> None:
    assert isinstance(open_store("memory"), MemoryStore)


async def test_open_store_path(db: Path) -> None:
    store = open_store(str(db))
    assert isinstance(store, SqliteStore) and store.path == db
    await store.close()


# --- the memory store -----------------------------------------------------------------------------


async def test_memory_store_keeps_nothing_across_restarts_but_lists_its_outbox() -> None:
    store = MemoryStore()
    assert store.durable is False
    duo = Duo(store, MemoryStore())
    duo.submit()
    assert [store.next_seq() for _ in range(3)] == [1, 2, 3]
    for seq in (1, 2, 3):
        store.add_outbox(outbox_item(seq))
    store.remove_outbox("msg-1")
    store.dead_letter("msg-2", "gave up", T0)
    store.dead_letter("unknown", "gave up", T0)  # nothing to move
    store.put_dedup(dedup_entry("m", T0))
    store.delete_dedup([(R_ID, "m")])
    await store.commit()
    assert list(store.outbox) == ["msg-3"]
    assert store.dead_letters == {"msg-2": DeadLetter(outbox_item(2), "gave up", T0)}
    assert store.load() == Snapshot()
    await store.close()


# --- schema versions --------------------------------------------------------------------------

#: The partial indexes of a version-1 file, as version 1 created them.
V1_PARTIAL_INDEXES = """
DROP INDEX tasks_live; DROP INDEX tasks_finished; DROP INDEX tasks_finished_by_role;
CREATE INDEX tasks_live ON tasks (state)
    WHERE state NOT IN ('completed', 'failed', 'cancelled', 'rejected');
CREATE INDEX tasks_finished ON tasks (updated_at)
    WHERE state IN ('completed', 'failed', 'cancelled', 'rejected');
CREATE INDEX tasks_finished_by_role ON tasks (role, state)
    WHERE state IN ('completed', 'failed', 'cancelled', 'rejected');
UPDATE meta SET value = '1' WHERE key = 'schema_version';
"""

_UPSERT = (
    "INSERT INTO tasks (requester, task_id, role, state, updated_at, record) "
    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (requester, task_id) DO UPDATE SET "
    "role=excluded.role, state=excluded.state, updated_at=excluded.updated_at, "
    "record=excluded.record"
)


def ephemeral_tables_per_upsert(conn: sqlite3.Connection) -> int:
    """Temporary b-trees one task upsert builds (SQLite makes one for each `IN (...)` list
    it evaluates, each time it evaluates it)."""
    program = conn.execute("EXPLAIN " + _UPSERT, ("r", "t", "executor", "idle", 0.0, b"{}"))
    return sum(1 for row in program if row[1] == "OpenEphemeral")


def plan(conn: sqlite3.Connection, query: str) -> str:
    return str(conn.execute("EXPLAIN QUERY PLAN " + query).fetchall())


async def test_a_task_write_builds_no_temporary_table_and_reads_use_the_partial_indexes(
    db: Path,
) -> None:
    store = SqliteStore(db)
    conn = store._conn
    assert ephemeral_tables_per_upsert(conn) == 0
    assert "USING INDEX tasks_live" in plan(conn, f"SELECT record FROM tasks k WHERE {IS_LIVE}")
    assert "USING INDEX tasks_finished " in plan(
        conn, f"SELECT task_id FROM tasks WHERE {IS_FINAL} AND updated_at < 1 ORDER BY updated_at"
    )
    assert "COVERING INDEX tasks_finished_by_role" in plan(
        conn, f"SELECT role, state, count(*) FROM tasks WHERE {IS_FINAL} GROUP BY role, state"
    )
    await store.close()


async def test_a_version_1_file_is_upgraded_with_everything_in_it(db: Path) -> None:
    store = SqliteStore(db)
    duo = Duo(store, MemoryStore())
    done, live = duo.submit(task_id="t-done"), duo.submit(task_id="t-live")
    duo.complete(done)
    store.put_dedup(dedup_entry("m-1", T0 + 600))
    store.add_outbox(outbox_item(store.next_seq(), "m-out"))
    await store.commit()
    before = await reopened(store)
    conn = sqlite3.connect(db, isolation_level=None)
    conn.executescript(V1_PARTIAL_INDEXES)
    assert ephemeral_tables_per_upsert(conn) == 9  # what version 1 paid for every task write
    conn.close()

    again = SqliteStore(db)
    version = again._conn.execute("SELECT value FROM meta WHERE key='schema_version'")
    assert version.fetchone()[0] == str(SCHEMA_VERSION) == "3"
    assert ephemeral_tables_per_upsert(again._conn) == 0
    assert [t.key for t in again.load().tasks] == [live]  # the live one, through tasks_live
    assert again.count_finished() == {("requester", TaskState.COMPLETED): 1}
    assert await reopened(again) == before  # nothing lost, nothing changed
    # Opening it again finds it up to date: nothing more to do.
    await SqliteStore(db).close()
    with sqlite3.connect(db) as check:
        rows = check.execute(
            "SELECT name, sql FROM sqlite_master WHERE name LIKE 'tasks_%' AND sql LIKE '% IN %'"
        ).fetchall()
    assert rows == []


#: Version 2 indexed a task's context as an expression over its record, with no column, and
#: numbered transitions with AUTOINCREMENT.
V2_CONTEXT = """
DROP INDEX tasks_by_context;
ALTER TABLE tasks DROP COLUMN context_id;
CREATE INDEX tasks_by_context ON tasks
    (requester, json_extract(CAST(record AS TEXT), '$.context.session_id'), updated_at, task_id);
CREATE TABLE v2_transitions (
    id INTEGER PRIMARY KEY AUTOINCREMENT, requester TEXT NOT NULL, task_id TEXT NOT NULL,
    role TEXT NOT NULL, from_state TEXT NOT NULL, to_state TEXT NOT NULL, event TEXT NOT NULL,
    message_id TEXT, at REAL NOT NULL
);
INSERT INTO v2_transitions SELECT * FROM transitions;
DROP TABLE transitions;
ALTER TABLE v2_transitions RENAME TO transitions;
CREATE INDEX transitions_task ON transitions (requester, task_id);
UPDATE meta SET value = '2' WHERE key = 'schema_version';
"""


def autoincrement(conn: sqlite3.Connection) -> bool:
    """Whether a table numbers its rows with AUTOINCREMENT (one more b-tree written, the
    `sqlite_sequence` table, for every row inserted)."""
    rows = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table'").fetchall()
    return any("AUTOINCREMENT" in sql.upper() for (sql,) in rows)


def functions_per_upsert(conn: sqlite3.Connection) -> list[str]:
    """The SQL functions one task upsert calls (an index over an expression calls its
    function for the old row and the new)."""
    program = conn.execute("EXPLAIN " + _UPSERT, ("r", "t", "executor", "idle", 0.0, b"{}"))
    return [str(row[5]) for row in program if row[1] in ("Function", "PureFunc")]


async def test_a_task_write_parses_no_json_nor_numbers_rows_and_a_version_2_file_is_upgraded(
    db: Path,
) -> None:
    store = SqliteStore(db)
    assert functions_per_upsert(store._conn) == [] and not autoincrement(store._conn)
    for n, context in enumerate(["ctx-a", "ctx-b", None, "ctx-a"]):
        store.put_task(record_in(n, context, {"text": str(n)}), [])
    duo = Duo(store, MemoryStore())
    done, live = duo.submit(task_id="t-done"), duo.submit(task_id="t-live")
    duo.complete(done)
    await store.commit()
    before = await reopened(store)
    conn = sqlite3.connect(db, isolation_level=None)
    conn.executescript(V2_CONTEXT)
    assert any("json_extract" in f for f in functions_per_upsert(conn))  # what version 2 paid
    assert autoincrement(conn)
    conn.close()

    again = SqliteStore(db)
    version = again._conn.execute("SELECT value FROM meta WHERE key='schema_version'")
    assert version.fetchone()[0] == str(SCHEMA_VERSION) == "3"
    assert functions_per_upsert(again._conn) == [] and not autoincrement(again._conn)
    assert [t.key for t in again.load().tasks] == [live]
    in_a = TaskFilter(requester=R_ID, context_id="ctx-a")
    assert [row.key.task_id for row in again.list_tasks(limit=10, where=in_a)] == ["c-3", "c-0"]
    assert again.count_tasks(TaskFilter(context_id="ctx-b")) == 1
    assert "INDEX tasks_by_context (requester=? AND context_id=?)" in plan(
        again._conn, "SELECT task_id FROM tasks WHERE requester = 'r' AND context_id = 'x'"
    )
    assert await reopened(again) == before  # histories and all, in order
    # A transition written now follows the task's earlier ones.
    again = SqliteStore(db)
    record = again.get_task(live)
    assert record is not None and len(record.history) > 1
    first = record.history[0]
    again.put_task(record, [first])
    await again.commit()
    after = again.get_task(live)
    assert after is not None and after.history == [*record.history, first]
    await again.close()


def test_a_state_role_or_event_is_written_as_its_value() -> None:
    # The stores write str(member) (cheaper than `.value`): the same text, for every member.
    for enum in (TaskState, Role, Event):
        for member in enum:
            assert type(str(member)) is str and str(member) == member.value


async def test_a_lookup_the_file_cannot_answer_is_store_unavailable(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read that fails for the file's sake (a disk I/O error) is `StoreUnavailable`, as a
    commit that fails is: a message that needed it is answered 503 and retried, not treated
    as a bug of ours."""
    import synapse.store.sqlite as sqlite_store

    store = SqliteStore(db)

    def failing(*args: object) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(sqlite_store, "read_task", failing)
    monkeypatch.setattr(sqlite_store, "read_dedup", failing)
    with pytest.raises(StoreUnavailable, match="disk I/O error"):
        store.get_task(record_in(0, None, {}).key)
    with pytest.raises(StoreUnavailable, match="disk I/O error"):
        store.get_dedup((R_ID, "m-1"))
    monkeypatch.undo()
    assert store.get_task(record_in(0, None, {}).key) is None  # the next read answers
    await store.close()
