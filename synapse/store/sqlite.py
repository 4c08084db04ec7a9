"""The SQLite store: the embedded default of `synapse serve`.

What is synchronous, and why: writes are buffered on the event loop and handed to one writer
thread that owns the connection, so the loop never blocks on disk. Commits group: the
`commit()` calls made while a transaction is being written wait together and go into the next
one (each caller still returns only once its own writes are committed), and the writer wakes
the loop once per transaction, not once per caller.
The runtime awaits `commit()` before it answers a message whose effects must survive a crash
and before it POSTs a queued message. The database runs in WAL mode with
`synchronous=NORMAL` by default: a committed transaction survives the process being killed
(SIGKILL), and only an operating-system crash or power loss may lose the last ones. Pass
`synchronous="FULL"` to survive those too, at the cost of an fsync per commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

from synapse.logs import get_logger
from synapse.p2p.dedup import DedupKey
from synapse.p2p.engine import TaskKey, TaskRecord, Transition
from synapse.store.base import (
    DedupEntry,
    ListCursor,
    OutboxItem,
    Snapshot,
    StoreUnavailable,
    TaskFilter,
    TaskRow,
)
from synapse.store.holding import FileHold
from synapse.store.sql import OUTBOX_COLUMNS as _OUTBOX_COLUMNS
from synapse.store.sql import (
    OutboxMaintenance,
    count_query,
    encode_record,
    listing_query,
    task_rows,
    transition_row,
)
from synapse.store.sqlite_schema import (
    CONTEXT_ID,
    DEDUP_SLICE,
    IS_FINAL,
    IS_LIVE,
    REOPEN_CODES,
    SCHEMA_VERSION,
    Op,
    connect,
    is_environmental,
    open_reader,
    purge_batch,
    read_dedup,
    read_snapshot,
    read_task,
)
from synapse.types import TaskState

log = get_logger("synapse.store")


class _FailureEpisode:
    """One log line when commits start failing and one when they succeed again, not one
    per failed commit: a locked or full disk fails every request until it is fixed."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.failures = 0
        self.since = 0.0

    def failed(self, exc: Exception) -> None:
        self.failures += 1
        if self.failures == 1:
            self.since = time.monotonic()
            log.error("store_unavailable", path=self.path, error=str(exc))

    def recovered(self) -> None:
        if self.failures:
            log.warning(
                "store_recovered",
                path=self.path,
                failed_commits=self.failures,
                seconds=round(time.monotonic() - self.since, 3),
            )
            self.failures = 0


class _Batch:
    """One transaction of the writer thread: the commits (each its writes and how many of them
    to keep for a retry if the transaction fails) and jobs (purge, probe) that came while the
    previous one was being written. Built and settled on the event loop; read by the writer."""

    __slots__ = (
        "commits",
        "error",
        "errors",
        "idle",
        "job_outcomes",
        "job_results",
        "jobs",
        "loop",
        "waiters",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.commits: list[tuple[list[Op], int]] = []
        self.waiters: list[asyncio.Future[None]] = []
        #: Empty commits waiting for this transaction (nothing of their own to write).
        self.idle: list[asyncio.Future[None]] = []
        self.jobs: list[Callable[[], object]] = []
        self.job_results: list[asyncio.Future[Any]] = []
        #: Set by the writer: (succeeded, value or exception) of each job.
        self.job_outcomes: list[tuple[bool, Any]] = []
        #: Set by the writer: the transaction's failure, and each commit's.
        self.error: BaseException | None = None
        self.errors: list[BaseException | None] = []


class SqliteStore(OutboxMaintenance):
    """`TaskStore` in one SQLite file, written by one background thread."""

    durable = True

    def __init__(
        self,
        path: str | Path,
        *,
        synchronous: Literal["NORMAL", "FULL"] = "NORMAL",
        busy_timeout: float = 5.0,
    ) -> None:
        self.path = Path(path)
        self._synchronous, self._busy_timeout = synchronous, busy_timeout
        self._conn = connect(self.path, synchronous, busy_timeout)
        # Point lookups on the event loop (finished tasks, dedup entries) use their own
        # connection: in WAL mode they never wait for the writer thread.
        self._reader = open_reader(self.path)
        #: Held by every read and by a reopen, which replaces the reader too (writer thread).
        self._reading = threading.Lock()
        self._pending: list[Op] = []
        #: The writes of failed batches, written first by the next one (writer thread only).
        self._retry: list[Op] = []
        self._failing = False
        self._reopen = False
        self._episode = _FailureEpisode(str(self.path))
        self._lock = threading.Lock()
        row = self._conn.execute("SELECT COALESCE(MAX(seq), 0) FROM outbox").fetchone()
        self._seq = int(row[0])
        #: What the dedup table may hold, kept in memory so that the lookup of every message
        #: received (nearly always a new one) needs no SQL: `dedup_known_absent`. The entries
        #: in the file when it was opened all expire by `_dedup_horizon`; those written since
        #: are indexed by a hash of their key, in sets by the minute they expire in (dropped
        #: whole once past). A superset of the table: a hash collision, a discarded or
        #: deleted entry only sends a lookup to SQL.
        row = self._conn.execute("SELECT COALESCE(MAX(expires_at), 0) FROM dedup").fetchone()
        self._dedup_horizon = float(row[0])
        self._dedup_index: dict[int, set[int]] = {}
        #: Transactions written (a group of commits is one).
        self.commits = 0
        #: Event loop side: the batch being written, and the one forming behind it.
        self._writing: _Batch | None = None
        self._forming: _Batch | None = None
        self._queue: queue.SimpleQueue[_Batch | None] = queue.SimpleQueue()
        self._writer = threading.Thread(target=self._run_writer, name="synapse-store", daemon=True)
        self._writer_running = True
        self._writer.start()
        self._hold: FileHold | None = None

    # --- reading ----------------------------------------------------------------------------

    def hold(self) -> None:
        """An exclusive lock on `<file>-lock` (`synapse.store.holding`): a second process
        serving the file raises `StoreInUse`."""
        if self._hold is None:
            self._hold = FileHold(self.path)

    def load(self) -> Snapshot:
        with self._lock:
            return read_snapshot(self._conn)

    def get_task(self, key: TaskKey) -> TaskRecord | None:
        with self._reading:
            try:
                return read_task(self._reader, key)
            except sqlite3.OperationalError as exc:  # a disk I/O error, say: retry later
                raise StoreUnavailable(f"sqlite: cannot read {self.path}: {exc}") from exc

    def dedup_known_absent(self, key: DedupKey, now: float) -> bool:
        """True if no entry of `key` unexpired at `now` (`expires_at > now`) can be in the
        table, answered from memory; False if SQL must tell (`get_dedup`).

        This assumes the file's dedup table is written by this store only (a served SQLite
        file is one process's; replicas share PostgreSQL).
        """
        if now < self._dedup_horizon:
            return False  # entries from before this process may still be live: ask SQL
        index = self._dedup_index
        if not index:
            return True
        digest = hash(key)
        past = None
        for minute, digests in index.items():
            if minute * DEDUP_SLICE <= now:
                past = minute if past is None else max(past, minute)
            elif digest in digests:
                return False
        if past is not None:  # every entry of those minutes has expired
            for minute in [m for m in index if m <= past]:
                del index[minute]
        return True

    def get_dedup(self, key: DedupKey) -> DedupEntry | None:
        with self._reading:
            try:
                return read_dedup(self._reader, key)
            except sqlite3.OperationalError as exc:
                raise StoreUnavailable(f"sqlite: cannot read {self.path}: {exc}") from exc

    def list_tasks(
        self, *, limit: int, before: ListCursor | None = None, where: TaskFilter | None = None
    ) -> list[TaskRow]:
        with self._reading:
            rows = self._reader.execute(*listing_query(where, before, limit, "?", CONTEXT_ID))
        return task_rows(rows)

    def count_finished(self) -> dict[tuple[str, TaskState], int]:
        with self._reading:
            rows = self._reader.execute(
                f"SELECT role, state, count(*) FROM tasks INDEXED BY tasks_finished_by_role "
                f"WHERE {IS_FINAL} GROUP BY role, state"
            ).fetchall()
        return {(role, TaskState(state)): int(n) for role, state, n in rows}

    def count_tasks(self, where: TaskFilter | None = None) -> int:
        with self._reading:
            return int(self._reader.execute(*count_query(where, "?", CONTEXT_ID)).fetchone()[0])

    async def purge(self, *, finished_before: float, now: float, limit: int) -> int:
        def run() -> int:
            with self._lock:
                return purge_batch(self._conn, finished_before, now, limit)

        # In the writer thread: in order with the commits, never on the loop.
        return int(await self._in_writer(run))

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    # --- buffered writes --------------------------------------------------------------------

    def put_task(self, record: TaskRecord, transitions: Sequence[Transition]) -> None:
        blob = encode_record(record)
        key, context = record.key, record.context
        params = (
            key.requester,
            key.task_id,
            str(record.role),  # the value of a string enum, as in `transition_row`
            str(record.state),
            record.updated_at,
            blob,
            None if context is None else context.session_id,
        )
        rows = [transition_row(t) for t in transitions]

        def op(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO tasks (requester, task_id, role, state, updated_at, record, "
                "context_id) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (requester, task_id) "
                "DO UPDATE SET role=excluded.role, state=excluded.state, "
                "updated_at=excluded.updated_at, record=excluded.record, "
                "context_id=excluded.context_id",
                params,
            )
            if rows:
                conn.executemany(
                    "INSERT INTO transitions (requester, task_id, role, from_state, to_state, "
                    "event, message_id, at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    rows,
                )

        self._pending.append(op)

    def add_outbox(self, item: OutboxItem) -> None:
        key = item.key
        params = (
            item.seq,
            item.message_id,
            item.partner,
            key.requester if key else None,
            key.task_id if key else None,
            item.body,
            item.created_at,
        )
        self._pending.append(
            lambda conn: conn.execute(
                f"INSERT OR IGNORE INTO outbox ({_OUTBOX_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                params,
            )
        )

    def remove_outbox(self, message_id: str) -> None:
        self._pending.append(
            lambda conn: conn.execute("DELETE FROM outbox WHERE message_id = ?", (message_id,))
        )

    def dead_letter(self, message_id: str, reason: str, at: float) -> None:
        self._pending.append(
            lambda conn: conn.execute(
                "UPDATE outbox SET dead_reason = ?, dead_at = ? WHERE message_id = ?",
                (reason, at, message_id),
            )
        )

    def put_dedup(self, entry: DedupEntry) -> None:
        # Indexed before it is committed: the index may hold more than the table, never less.
        minute = math.ceil(entry.expires_at / DEDUP_SLICE)
        digests = self._dedup_index.get(minute)
        if digests is None:
            digests = self._dedup_index[minute] = set()
        digests.add(hash(entry.key))
        params = (
            entry.key[0],
            entry.key[1],
            entry.fingerprint,
            entry.expires_at,
            entry.reply.status,
            entry.reply.body,
            json.dumps(entry.reply.headers),
        )
        self._pending.append(
            lambda conn: conn.execute(
                "INSERT OR REPLACE INTO dedup (sender, message_id, fingerprint, expires_at, "
                "status, body, headers) VALUES (?, ?, ?, ?, ?, ?, ?)",
                params,
            )
        )

    def delete_dedup(self, keys: Iterable[DedupKey]) -> None:
        rows = list(keys)
        if rows:
            self._pending.append(
                lambda conn: conn.executemany(
                    "DELETE FROM dedup WHERE sender = ? AND message_id = ?", rows
                )
            )

    # --- committing -------------------------------------------------------------------------

    def mark(self) -> int:
        return len(self._pending)

    def discard(self, mark: int) -> None:
        del self._pending[mark:]

    def _write(
        self, ops: list[Op], keep: int, kept: list[Op] | None = None
    ) -> None:  # in the writer thread
        """One transaction of `ops`; if it fails for the database's sake, `ops[:keep]` (or
        `kept`) are written first by the next one."""
        with self._lock:
            batch = self._retry + ops
            if not batch:
                return
            try:
                if self._reopen:
                    # SQLite opened the file read-only (it was unwritable): it never
                    # upgrades such a connection, so open the file again to see it fixed.
                    # Close first: connections of one process share the file's lock and
                    # shared-memory state, so a new one would inherit the read-only mapping:
                    # the reader too, which opened the file read-only like the writer.
                    with self._reading:
                        self._conn.close()
                        self._reader.close()
                        self._conn = connect(self.path, self._synchronous, self._busy_timeout)
                        self._reader = open_reader(self.path)
                    self._reopen = False
                conn = self._conn
                try:
                    conn.execute("BEGIN IMMEDIATE")
                    for op in batch:
                        op(conn)
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        with contextlib.suppress(sqlite3.Error):
                            conn.execute("ROLLBACK")
                    raise
            except Exception as exc:
                if not is_environmental(exc):
                    # A bug (bad SQL, a broken constraint): retrying would fail forever.
                    self._retry = []
                    raise
                # Nothing was written: keep the batch for the next commit (in order), but
                # not what the caller will roll back.
                self._retry = self._retry + (ops[:keep] if kept is None else kept)
                if getattr(exc, "sqlite_errorcode", 0) & 0xFF in REOPEN_CODES:
                    self._reopen = True  # until a connection is opened again
                self._failing = True
                self._episode.failed(exc)
                raise StoreUnavailable(f"{self.path}: {exc}") from exc
            self._retry = []
            self._failing = False
            self.commits += 1
            self._episode.recovered()

    async def commit(self, *, discard_after: int | None = None) -> None:
        """Write every buffered change in one transaction (in the writer thread).

        The writer runs transactions in order, so when this returns every earlier commit is
        durable too. Commits made while a transaction is being written join the next one (a
        group commit): each returns once the transaction holding its writes is committed.
        With nothing buffered it only waits for the transactions still to be written (no
        thread hop when there is none: the runtime commits before every POST), unless an
        earlier one failed: then it writes that one again. Raises `StoreUnavailable` when
        the transaction fails (see `TaskStore.commit`).
        """
        ops, self._pending = self._pending, []
        loop = asyncio.get_running_loop()
        if not ops and not self._failing:
            last = self._forming or self._writing
            if last is None:
                return
            idle: asyncio.Future[None] = loop.create_future()
            last.idle.append(idle)
            await idle
            return
        keep = len(ops) if discard_after is None else max(0, min(discard_after, len(ops)))
        batch = self._forming_batch(loop)
        batch.commits.append((ops, keep))
        # Not shielded: a cancelled caller cancels only its own future; its writes are in
        # the batch and are written all the same.
        done: asyncio.Future[None] = loop.create_future()
        batch.waiters.append(done)
        if self._writing is None:
            self._launch()
        await done

    def _forming_batch(self, loop: asyncio.AbstractEventLoop) -> _Batch:
        batch = self._forming
        if batch is None:
            batch = self._forming = _Batch(loop)
        return batch

    async def _in_writer(self, job: Callable[[], object]) -> Any:
        """Run `job` in the writer thread, after the transaction it joins."""
        loop = asyncio.get_running_loop()
        batch = self._forming_batch(loop)
        result: asyncio.Future[Any] = loop.create_future()
        batch.jobs.append(job)
        batch.job_results.append(result)
        if self._writing is None:
            self._launch()
        return await result

    def _launch(self) -> None:  # on the loop
        if not self._writer_running:  # a flag: Thread.is_alive takes a lock, every commit
            raise RuntimeError(f"{self.path}: the store is closed")
        self._writing, self._forming = self._forming, None
        self._queue.put(self._writing)

    def _settle(self, batch: _Batch) -> None:  # on the loop, once per transaction
        for waiter, error in zip(batch.waiters, batch.errors, strict=True):
            if not waiter.done():
                if error is None:
                    waiter.set_result(None)
                else:
                    waiter.set_exception(error)
        for waiter in batch.idle:
            if not waiter.done():
                if batch.error is None:
                    waiter.set_result(None)
                else:
                    waiter.set_exception(batch.error)
        for result, (succeeded, value) in zip(batch.job_results, batch.job_outcomes, strict=True):
            if not result.done():
                if succeeded:
                    result.set_result(value)
                else:
                    result.set_exception(value)
        self._writing = None
        if self._forming is not None:
            self._launch()

    def _run_writer(self) -> None:  # the writer thread
        try:
            while (batch := self._queue.get()) is not None:
                self._write_batch(batch)
                try:
                    batch.loop.call_soon_threadsafe(self._settle, batch)
                except RuntimeError:  # its loop is closed: nobody waits for it any more
                    if self._writing is batch:
                        self._writing = None
        finally:
            self._writer_running = False

    def _write_batch(self, batch: _Batch) -> None:  # the writer thread
        commits = batch.commits
        try:
            if len(commits) == 1:
                self._write(*commits[0])
            else:
                ops = [op for group, _ in commits for op in group]
                kept = [op for group, keep in commits for op in group[:keep]]
                self._write(ops, len(ops), kept)
            batch.errors = [None] * len(commits)
        except Exception as exc:
            batch.error = exc
            if len(commits) > 1 and not isinstance(exc, StoreUnavailable):
                # A bug in one commit's writes (bad SQL, a broken constraint), not the
                # database: write each commit alone, so that only its own caller fails.
                batch.errors = []
                for group, keep in commits:
                    try:
                        self._write(group, keep)
                        batch.errors.append(None)
                    except Exception as alone:
                        batch.errors.append(alone)
                batch.error = None
            else:
                batch.errors = [exc] * len(commits)
        except BaseException as exc:  # reported to the callers, not lost
            batch.error = exc
            batch.errors = [exc] * len(commits)
        for job in batch.jobs:
            try:
                batch.job_outcomes.append((True, job()))
            except BaseException as exc:  # reported to the caller
                batch.job_outcomes.append((False, exc))

    async def probe_write(self) -> None:
        """Raise if a write transaction cannot start now (readiness checks: `/readyz`).

        Runs in the writer thread, after the batches before it, without waiting for a lock
        another process holds.
        """

        def probe() -> None:
            with self._lock:
                conn = self._conn
                (timeout,) = conn.execute("PRAGMA busy_timeout").fetchone()
                conn.execute("PRAGMA busy_timeout=0")
                try:
                    conn.execute("BEGIN IMMEDIATE")
                    conn.execute("ROLLBACK")
                finally:
                    conn.execute(f"PRAGMA busy_timeout={int(timeout)}")

        await self._in_writer(probe)

    def commit_now(self) -> None:
        """Synchronous commit, for tools outside the event loop (`synapse outbox`)."""
        ops, self._pending = self._pending, []
        self._write(ops, len(ops))

    async def close(self) -> None:
        try:
            await self.commit()
        finally:
            self._queue.put(None)
            await asyncio.get_running_loop().run_in_executor(None, self._writer.join)
            with self._lock:
                self._conn.close()
            with self._reading:
                self._reader.close()
            self._release_hold()

    def _release_hold(self) -> None:
        hold, self._hold = self._hold, None
        if hold is not None:
            hold.release()

    # --- maintenance (the `synapse outbox` command) -----------------------------------------

    def _maintain(self, query: str, params: tuple[Any, ...]) -> int:
        with self._lock:
            return self._conn.execute(query, params).rowcount


__all__ = [
    "IS_FINAL",
    "IS_LIVE",
    "SCHEMA_VERSION",
    "SqliteStore",
    "connect",
    "encode_record",
    "read_snapshot",
    "read_task",
]
