"""The SQLite store's schema, its upgrades, and its rows: how a connection is opened and
upgraded, how records are encoded and read back, and how old rows are purged in batches.
`synapse.store.sqlite.SqliteStore` writes and reads through these."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

from synapse.logs import get_logger
from synapse.p2p.dedup import DedupKey
from synapse.p2p.engine import TaskKey, TaskRecord
from synapse.store.base import DeadLetter, DedupEntry, Snapshot
from synapse.store.sql import OUTBOX_COLUMNS as _OUTBOX_COLUMNS
from synapse.store.sql import decode_record
from synapse.store.sql import dedup_entry as _dedup_entry
from synapse.store.sql import outbox_item as _item
from synapse.store.sql import transition as _transition
from synapse.types import TaskState

SCHEMA_VERSION = 3
#: A transition's `id` orders a task's history; a new row takes the largest id plus one, so
#: the history of a task stays in order even where ids of purged rows are used again.
_TRANSITIONS = """CREATE TABLE IF NOT EXISTS transitions (
    id INTEGER PRIMARY KEY,
    requester TEXT NOT NULL,
    task_id TEXT NOT NULL,
    role TEXT NOT NULL,
    from_state TEXT NOT NULL,
    to_state TEXT NOT NULL,
    event TEXT NOT NULL,
    message_id TEXT,
    at REAL NOT NULL
)"""
_TRANSITIONS_INDEX = (
    "CREATE INDEX IF NOT EXISTS transitions_task ON transitions (requester, task_id)"
)
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tasks (
    requester TEXT NOT NULL,
    task_id TEXT NOT NULL,
    role TEXT NOT NULL,
    state TEXT NOT NULL,
    updated_at REAL NOT NULL,
    record BLOB NOT NULL,
    context_id TEXT,
    PRIMARY KEY (requester, task_id)
);
{transitions};
{transitions_index};
CREATE TABLE IF NOT EXISTS outbox (
    seq INTEGER PRIMARY KEY,
    message_id TEXT NOT NULL UNIQUE,
    partner TEXT NOT NULL,
    requester TEXT,
    task_id TEXT,
    body BLOB NOT NULL,
    created_at REAL NOT NULL,
    dead_reason TEXT,
    dead_at REAL
);
CREATE TABLE IF NOT EXISTS dedup (
    sender TEXT NOT NULL,
    message_id TEXT NOT NULL,
    fingerprint BLOB NOT NULL,
    expires_at REAL NOT NULL,
    status INTEGER NOT NULL,
    body BLOB NOT NULL,
    headers TEXT NOT NULL,
    PRIMARY KEY (sender, message_id)
);
CREATE INDEX IF NOT EXISTS tasks_listing ON tasks (updated_at, requester, task_id);
CREATE INDEX IF NOT EXISTS tasks_by_requester ON tasks (requester, updated_at, task_id);
CREATE INDEX IF NOT EXISTS tasks_by_context ON tasks (requester, context_id, updated_at, task_id);
CREATE INDEX IF NOT EXISTS tasks_by_task_id ON tasks (task_id);
CREATE INDEX IF NOT EXISTS dedup_expiry ON dedup (expires_at);
CREATE INDEX IF NOT EXISTS outbox_dead ON outbox (dead_at) WHERE dead_reason IS NOT NULL;
"""
#: A task's context (`task_request.context.session_id`, an A2A `contextId`): a column the
#: store fills from the record as it writes it, indexed (`tasks_by_context`) so that a listing
#: of one context is a range of an index. Version 2 indexed the expression below instead,
#: which parsed the record's JSON on every write of a task (a fifth of SQLite's instructions
#: in an echo task).
CONTEXT_ID = "context_id"
_CONTEXT_IN_RECORD = "json_extract(CAST(record AS TEXT), '$.context.session_id')"
_SCHEMA = _SCHEMA.replace("{transitions}", _TRANSITIONS).replace(
    "{transitions_index}", _TRANSITIONS_INDEX
)
_FINAL_STATES = [state.value for state in TaskState if state.is_final]
#: A final task, and a live one, as the partial indexes and the queries that use them test it:
#: comparisons, not `state IN (...)`. SQLite 3.40 builds an ephemeral table for every IN list
#: each time it evaluates one, and a task upsert evaluates the partial indexes' conditions
#: for the old row and the new (9 tables per upsert: a third of the instructions of an echo
#: task's writes). A query uses a partial index only if its WHERE holds the index's condition
#: word for word: use these here, not the IN list of `synapse.store.sql.FINAL`.
IS_FINAL = "(" + " OR ".join(f"state = '{state}'" for state in _FINAL_STATES) + ")"
IS_LIVE = "(" + " AND ".join(f"state <> '{state}'" for state in _FINAL_STATES) + ")"
#: Live tasks (the snapshot at open), finished tasks by age (the retention purge), finished
#: tasks by role and state (`count_finished`).
_PARTIAL_INDEXES = f"""
CREATE INDEX IF NOT EXISTS tasks_live ON tasks (state) WHERE {IS_LIVE};
CREATE INDEX IF NOT EXISTS tasks_finished ON tasks (updated_at) WHERE {IS_FINAL};
CREATE INDEX IF NOT EXISTS tasks_finished_by_role ON tasks (role, state) WHERE {IS_FINAL};
"""
_SCHEMA += _PARTIAL_INDEXES


def _version_3(conn: sqlite3.Connection) -> None:
    """Version 3: the context id as a column, filled from the records already stored, and
    transitions numbered without AUTOINCREMENT (which updated `sqlite_sequence`, one more
    b-tree and page, on every write of a transition). Each part is skipped if done."""
    table = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'transitions'").fetchone()
    if "AUTOINCREMENT" in table[0].upper():
        conn.execute(_TRANSITIONS.replace("transitions", "transitions_renumbered", 1))
        conn.execute("INSERT INTO transitions_renumbered SELECT * FROM transitions ORDER BY id")
        conn.execute("DROP TABLE transitions")
        conn.execute("ALTER TABLE transitions_renumbered RENAME TO transitions")
        conn.execute(_TRANSITIONS_INDEX)
        conn.execute("DELETE FROM sqlite_sequence WHERE name = 'transitions'")
    columns = {row[1] for row in conn.execute("PRAGMA table_info(tasks)")}
    if "context_id" not in columns:
        conn.execute("ALTER TABLE tasks ADD COLUMN context_id TEXT")
    conn.execute(f"UPDATE tasks SET context_id = {_CONTEXT_IN_RECORD}")
    conn.execute("DROP INDEX IF EXISTS tasks_by_context")
    conn.execute(
        "CREATE INDEX tasks_by_context ON tasks (requester, context_id, updated_at, task_id)"
    )


#: What brings a file from the version before each to it, in one transaction (`connect`).
#: 2: the partial indexes test states by comparisons (`IS_FINAL`), not by IN lists.
#: 3: the context id is a column (`CONTEXT_ID`); transitions without AUTOINCREMENT.
_UPGRADES: dict[int, str | Callable[[sqlite3.Connection], None]] = {
    2: "DROP INDEX IF EXISTS tasks_live; DROP INDEX IF EXISTS tasks_finished; "
    "DROP INDEX IF EXISTS tasks_finished_by_role;" + _PARTIAL_INDEXES,
    3: _version_3,
}
#: Seconds of expiry time per set of the dedup index (`SqliteStore.dedup_known_absent`).
DEDUP_SLICE = 60.0
#: Size of the WAL file kept after a checkpoint (it is truncated down to this).
_JOURNAL_SIZE_LIMIT = 8 * 1024 * 1024

log = get_logger("synapse.store")

Op = Callable[[sqlite3.Connection], object]


def open_reader(path: Path) -> sqlite3.Connection:
    """The connection for point lookups on the event loop: it never writes."""
    reader = sqlite3.connect(str(path), check_same_thread=False)
    reader.execute("PRAGMA query_only=1")
    return reader


def connect(
    path: str | Path, synchronous: str = "NORMAL", busy_timeout: float = 5.0
) -> sqlite3.Connection:
    """Open (and create or check) a store database.

    `busy_timeout` is how long (seconds) a write waits for another connection's lock
    before its commit fails.
    """
    conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
    conn.execute("PRAGMA busy_timeout=5000")
    # Pages freed by the retention purge go back to the file system (`purge` runs an
    # incremental vacuum). A new file takes the mode if it is set before anything writes
    # the file (the WAL switch below does); an older file needs one VACUUM, once.
    if conn.execute("PRAGMA auto_vacuum").fetchone()[0] != 2:
        conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
        if conn.execute("PRAGMA auto_vacuum").fetchone()[0] != 2:
            conn.execute("VACUUM")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
    conn.execute(f"PRAGMA journal_size_limit={_JOURNAL_SIZE_LIMIT}")
    row = _schema_version(conn)
    if row is not None and row > SCHEMA_VERSION:
        raise RuntimeError(f"{path}: store schema {row}, this version reads {SCHEMA_VERSION}")
    if row is not None and row < SCHEMA_VERSION:
        _upgrade(conn)
    conn.executescript(_SCHEMA)
    if _schema_version(conn) is None:
        conn.execute(
            "INSERT INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
        )
    return conn


def _schema_version(conn: sqlite3.Connection) -> int | None:
    """The file's schema version; None for a file without the store's tables yet."""
    if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'meta'").fetchone() is None:
        return None
    row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
    return None if row is None else int(row[0])


def _upgrade(conn: sqlite3.Connection) -> None:
    """Bring an older file to `SCHEMA_VERSION`, one step a transaction (another process
    opening the file meanwhile finds each step done or not begun)."""
    while True:
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = _schema_version(conn)
            assert version is not None
            if version >= SCHEMA_VERSION:
                conn.execute("ROLLBACK")
                return
            step = _UPGRADES[version + 1]
            if callable(step):
                step(conn)
            else:
                for statement in step.split(";"):
                    if statement.strip():
                        conn.execute(statement)
            conn.execute(
                "UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(version + 1),)
            )
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        log.info("store_upgraded", schema_version=version + 1)


def read_task(conn: sqlite3.Connection, key: TaskKey) -> TaskRecord | None:
    """One stored task with its history (a point lookup on the primary key)."""
    row = conn.execute(
        "SELECT record FROM tasks WHERE requester = ? AND task_id = ?",
        (key.requester, key.task_id),
    ).fetchone()
    if row is None:
        return None
    record = decode_record(row[0])
    record.history = [
        _transition(t)
        for t in conn.execute(
            "SELECT requester, task_id, role, from_state, to_state, event, message_id, at "
            "FROM transitions WHERE requester = ? AND task_id = ? ORDER BY id",
            (key.requester, key.task_id),
        ).fetchall()
    ]
    return record


def read_snapshot(conn: sqlite3.Connection, *, finished: bool = False) -> Snapshot:
    """The live tasks (every task with `finished`), the outbox and its dead letters.

    Finished tasks stay in the file: the engine looks them up one by one when a message
    names one (`read_task`), so a restart reads only the work in flight.
    """
    snapshot = Snapshot()
    where = "" if finished else f"WHERE {IS_LIVE}"
    # The live tasks through their partial index, then each one's history through
    # `transitions_task`: never a scan of the history of every task kept.
    for (blob,) in conn.execute(f"SELECT record FROM tasks k {where}").fetchall():
        record = decode_record(blob)
        record.history = [
            _transition(row)
            for row in conn.execute(
                "SELECT requester, task_id, role, from_state, to_state, event, message_id, at "
                "FROM transitions WHERE requester = ? AND task_id = ? ORDER BY id",
                (record.key.requester, record.key.task_id),
            ).fetchall()
        ]
        snapshot.tasks.append(record)
    for row in conn.execute(
        f"SELECT {_OUTBOX_COLUMNS}, dead_reason, dead_at FROM outbox ORDER BY seq"
    ):
        item = _item(row)
        if row[7] is None:
            snapshot.outbox.append(item)
        else:
            snapshot.dead_letters.append(DeadLetter(item, row[7], float(row[8])))
    return snapshot


def read_dedup(conn: sqlite3.Connection, key: DedupKey) -> DedupEntry | None:
    row = conn.execute(
        "SELECT sender, message_id, fingerprint, expires_at, status, body, headers FROM dedup "
        "WHERE sender = ? AND message_id = ?",
        key,
    ).fetchone()
    return _dedup_entry(row) if row is not None else None


def purge_batch(conn: sqlite3.Connection, finished_before: float, now: float, limit: int) -> int:
    """One retention batch, in one transaction, then an incremental vacuum."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        keys = conn.execute(
            f"SELECT requester, task_id FROM tasks WHERE {IS_FINAL} "
            "AND updated_at < ? ORDER BY updated_at LIMIT ?",
            (finished_before, limit),
        ).fetchall()
        removed = len(keys)
        if keys:
            conn.executemany("DELETE FROM transitions WHERE requester = ? AND task_id = ?", keys)
            conn.executemany("DELETE FROM tasks WHERE requester = ? AND task_id = ?", keys)
        removed += conn.execute(
            "DELETE FROM outbox WHERE rowid IN (SELECT rowid FROM outbox "
            "WHERE dead_reason IS NOT NULL AND dead_at < ? LIMIT ?)",
            (finished_before, limit),
        ).rowcount
        removed += conn.execute(
            "DELETE FROM dedup WHERE rowid IN (SELECT rowid FROM dedup "
            "WHERE expires_at <= ? LIMIT ?)",
            (now, limit),
        ).rowcount
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    if removed:
        conn.execute("PRAGMA incremental_vacuum")
        # Copy the log into the file and empty it: with a short retention the WAL would
        # otherwise stay at its high-water mark (readers keep a checkpoint from resetting it).
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return removed


#: SQLite's primary result codes for a database that cannot be written right now (busy or
#: locked by another connection, out of memory, read-only, I/O error, full, cannot open the
#: file, lock protocol, permission), as opposed to a bug in a statement.
_ENVIRONMENTAL = frozenset({3, 5, 6, 7, 8, 10, 13, 14, 15, 23})


#: Read-only, cannot open, permission: the connection must be opened again to recover.
REOPEN_CODES = frozenset({3, 8, 14})


def is_environmental(exc: Exception) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in _ENVIRONMENTAL
    return isinstance(exc, OSError | MemoryError)
