"""The PostgreSQL store: one database that several replicas of one agent can share.

Writes are buffered on the event loop by the `put_*` calls and made durable by `commit()`.
Commits that arrive while a transaction is being written join the next one (a group commit):
one transaction carries the writes of every message that came in meanwhile, over a connection
of an asynchronous pool, and BEGIN, the fence of replicas' leases, the writes and COMMIT travel
in one pipelined round trip (psycopg 3 pipeline mode). Transactions are written one after the
other, in the order of their commits, so a task's later state never lands before an earlier
one, and when `commit()` returns every earlier commit is durable too. A commit that fails (the
database is down, a constraint, a lost connection) raises: nothing of its transaction is
applied, and the runtime must not acknowledge what it carried.

What is synchronous, and why: the store interface looks finished tasks up by key while a
message is being checked, on the event loop (`get_task`, `list_tasks`). Those point lookups run
on a dedicated autocommit connection, each one an index lookup of a fraction of a millisecond
on a nearby server, and a new task (the usual message) needs none: its lease was just claimed,
so it is known not to be stored. The dedup entry of every message received is looked up before
it is judged, off the loop (`fetch_dedup`, on a pooled connection); the writes, the bulk of the
traffic, never block the loop.

The schema is versioned (`synapse.store.migrations`): opening the store applies the
migrations it lacks, under an advisory lock so that replicas starting together are safe;
`synapse migrate --store URL` applies them by hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from synapse.logs import get_logger
from synapse.p2p.dedup import DedupKey
from synapse.p2p.engine import TaskKey, TaskRecord, Transition
from synapse.store.base import (
    DeadLetter,
    DedupEntry,
    FencedOut,
    ListCursor,
    OutboxItem,
    Snapshot,
    StoreUnavailable,
    TaskFilter,
    TaskRow,
)
from synapse.store.holding import DatabaseHold, StoreInUse, let_go_of_database
from synapse.store.migrations import apply_migrations as apply_migrations
from synapse.store.migrations import migrate as migrate
from synapse.store.migrations import migrations
from synapse.store.migrations import schema_version as schema_version
from synapse.store.pgbatch import DELETE_DELIVERED, INSERT_TRANSITIONS, Op, send_batch
from synapse.store.pgbatch import Group as _Group
from synapse.store.pglink import client_link_checks, server_link_checks
from synapse.store.shared import Fence, Tag
from synapse.store.sql import (
    DEDUP_COLUMNS,
    OutboxMaintenance,
    count_query,
    decode_record,
    encode_record,
    listing_query,
    task_rows,
    transition_row,
)
from synapse.store.sql import FINAL as _FINAL
from synapse.store.sql import OUTBOX_COLUMNS as _OUTBOX_COLUMNS
from synapse.store.sql import TRANSITION_COLUMNS as _TRANSITION_COLUMNS
from synapse.store.sql import dedup_entry as _dedup_entry
from synapse.store.sql import outbox_item as _item
from synapse.store.sql import transition as _transition
from synapse.types import TaskState

log = get_logger("synapse.store")

#: Outbox sequence numbers per block taken from the database sequence.
SEQ_BLOCK = 1024


_Op = Op


#: A task's context id, read from its record by the function migration 0005 adds: the same
#: expression as index tasks_by_context's, so that a listing of one context is an index range.
_CONTEXT_ID = "synapse_context_id(record)"


#: The message `synapse_fence_all` raises when a lease of the batch is not held as expected.
_FENCE_REFUSED = "synapse: lease not held"
_DEDUP_LOOKUP = f"SELECT {DEDUP_COLUMNS} FROM dedup WHERE sender = %s AND message_id = %s"
#: Dedup entries read by the statement that claimed a new task's lease, kept for the lookup
#: that follows it (a handful at a time: each is taken at once).
_REMEMBERED_AT_MOST = 1024


class PostgresStore(OutboxMaintenance):
    """`TaskStore` in a PostgreSQL database (see the module's docstring)."""

    durable = True

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 4,
        apply_schema: bool = True,
        connect_timeout: float = 10.0,
    ) -> None:
        self.url = url
        self._connect_timeout = int(connect_timeout)
        #: What every connection connects with: `url`, and a dead link noticed within
        #: seconds, at the client's end here (`synapse.store.pglink`); the server's end is
        #: set on each new connection (`_connect_reader`, `_check_link_async`).
        self._conninfo = make_conninfo(url, **client_link_checks(url))
        self._reader = self._connect_reader()
        if apply_schema:
            apply_migrations(self._reader)
        else:
            found = schema_version(self._reader)
            if found != len(migrations()):
                self._reader.close()
                raise RuntimeError(
                    f"store schema version {found}, this version of synapse needs "
                    f"{len(migrations())}: run `synapse migrate --store URL`"
                )
        self._lock = threading.Lock()
        self._pool = AsyncConnectionPool(
            self._conninfo,
            min_size=1,
            max_size=pool_size,
            open=False,
            kwargs={"autocommit": False},
            configure=self._check_link_async,
        )
        self._pool_opened = False
        self._pending: list[_Op] = []
        #: Writes handed to commits so far: marks count from the first write ever buffered,
        #: so a mark still means the same point once a commit has taken the buffer.
        self._taken = 0
        #: The writes of batches that failed for want of the database (connection lost,
        #: server down): written first by the next batch, in order.
        self._retry: list[_Op] = []
        #: Commits waiting for the next transaction, the one being written, and the task
        #: writing them one after the other (see `commit`).
        self._forming: _Group | None = None
        self._writing: _Group | None = None
        self._writer: asyncio.Future[None] | None = None
        self._seq_next = 0
        self._seq_end = 0
        self.commits = 0
        #: Set by `synapse.store.leases.Ownership`: every write of a task is tagged with the
        #: lease it is made under, and a batch writes only the tasks whose leases still hold.
        self.fence: Fence | None = None
        self._remembered: dict[DedupKey, DedupEntry | None] = {}
        #: The task of each outbox row this process knows (its removal is fenced too).
        self._outbox_keys: dict[str, TaskKey] = {}
        #: Set by `Ownership` too: what `load()` returns at start-up when replicas share
        #: the database (the tasks this process took over, not every live task).
        self.load_override: Callable[[], Snapshot] | None = None
        #: How this process holds the database (`hold`): shared as one of the agent's
        #: replicas, exclusive as the only process serving it; and how long `hold` waits
        #: for a process that has just died to let go.
        self._hold = DatabaseHold()
        self.patience = 3.0

    # --- connections ------------------------------------------------------------------------

    async def _open_pool(self) -> AsyncConnectionPool:
        if not self._pool_opened:
            self._pool_opened = True
            await self._pool.open(wait=False)
        return self._pool

    def _connect_reader(self) -> psycopg.Connection[Any]:
        conn = psycopg.connect(
            self._conninfo, autocommit=True, connect_timeout=self._connect_timeout
        )
        try:
            if (check := server_link_checks(self.url, conn.info.server_version)) is not None:
                conn.execute(check)
        except BaseException:
            conn.close()
            raise
        return conn

    async def _check_link_async(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """The server's side of `synapse.store.pglink`, on a new connection of the pool."""
        if (check := server_link_checks(self.url, conn.info.server_version)) is not None:
            await conn.execute(check)
            await conn.commit()  # left idle, as the pool wants it

    def _usable_reader(self) -> psycopg.Connection[Any]:
        """The autocommit connection, opened again if it was lost (the server restarted, a
        network cut): every connection comes back by itself once the server answers again.
        (Called with `_lock` held.)"""
        if self._reader.closed or self._reader.broken:
            old, self._reader = self._reader, self._connect_reader()
            old.close()
            log.warning("postgres_reconnected", connection="lookups")
            self._hold.take_again(self._reader)  # the lost session's: writes wait for it
        return self._reader

    def _hold_refused(self) -> StoreInUse | None:
        """Whether another process holds the store now (in a worker thread, before a
        transaction, when the hold is in doubt or was refused): a statement on the hold's
        connection opens it again, and takes the hold again, if it was lost."""
        with contextlib.suppress(psycopg.OperationalError, StoreUnavailable):  # so will the write
            self.read_rows("SELECT 1")
            with self._lock:
                if self._hold.refused is not None:
                    self._hold.take_again(self._usable_reader())
            self._hold.doubtful = False
        return self._hold.refused

    async def probe_write(self) -> None:
        """Raise `StoreUnavailable` while another process holds the store: before each
        transaction, and for readiness (a balancer sends this process nothing it may not
        write). A round trip only while the hold is in doubt or refused."""
        if self._hold.doubtful or self._hold.refused is not None:
            in_use = await asyncio.to_thread(self._hold_refused)
            if in_use is not None:
                raise StoreUnavailable(f"postgresql: writes refused: {in_use}")

    def hold(self) -> None:
        """A session advisory lock of the database (`synapse.store.holding`), on the
        lookups' connection: shared when this process is one of the agent's replicas (its
        writes fenced by leases), exclusive otherwise; taken again when that connection
        comes back after a loss."""
        with self._lock:
            if not self._hold.held:
                shared = self.fence is not None
                try:
                    self._hold.take(self._usable_reader(), shared=shared, patience=self.patience)
                except psycopg.OperationalError:
                    if not self._reader.broken:
                        raise
                    # Lost since it was opened (a restart of the server): once more, anew.
                    self._hold.take(self._usable_reader(), shared=shared, patience=self.patience)

    def read_rows(
        self, query: str, params: Sequence[Any] | Mapping[str, Any] = ()
    ) -> list[tuple[Any, ...]]:
        """One statement on the autocommit connection; its rows, if it returns any. A read
        that meets a connection lost since the last one is tried once more on a new one
        (reads only: a write whose connection broke may or may not have been done). Raises
        `StoreUnavailable` when the database cannot be reached."""
        with self._lock:
            try:
                try:
                    cur = self._usable_reader().execute(query.encode(), params)
                    return cur.fetchall() if cur.description is not None else []
                except psycopg.OperationalError:
                    if not self._reader.broken or not _is_read(query):
                        raise
                cur = self._usable_reader().execute(query.encode(), params)
                return cur.fetchall() if cur.description is not None else []
            except psycopg.OperationalError as exc:
                raise StoreUnavailable(f"the database cannot be reached: {exc}") from exc

    async def execute(self, query: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """One statement, in autocommit (its own transaction, one round trip: no BEGIN and
        COMMIT of their own), on a pooled connection, without blocking the loop (statements
        that may wait for a row lock must not run on `_read`'s connection: the loop would
        wait for a transaction that needs the loop to end). Raises `StoreUnavailable` when
        the database cannot be reached."""
        try:
            pool = await self._open_pool()
            async with pool.connection() as conn:
                await conn.set_autocommit(True)
                try:
                    cur = await conn.execute(query.encode(), params)
                    return await cur.fetchall() if cur.description is not None else []
                finally:
                    await conn.set_autocommit(False)
        except (psycopg.OperationalError, PoolTimeout) as exc:
            # The database out of reach (a restart, a network cut): the caller's to wait out.
            raise StoreUnavailable(f"the database cannot be reached: {exc}") from exc

    # --- reading ----------------------------------------------------------------------------

    def load(self) -> Snapshot:
        if self.load_override is not None:
            return self.load_override()
        snapshot = Snapshot()
        history: dict[TaskKey, list[Transition]] = {}
        live = f"k.state NOT IN {_FINAL}"
        for row in self.read_rows(
            f"SELECT {', '.join('t.' + c for c in _TRANSITION_COLUMNS.split(', '))} "
            "FROM tasks k JOIN transitions t ON t.requester = k.requester "
            f"AND t.task_id = k.task_id WHERE {live} ORDER BY t.id"
        ):
            transition = _transition(row)
            history.setdefault(transition.key, []).append(transition)
        for (blob,) in self.read_rows(f"SELECT record FROM tasks k WHERE {live}"):
            record = decode_record(bytes(blob))
            record.history = history.get(record.key, [])
            snapshot.tasks.append(record)
        for row in self.read_rows(
            f"SELECT {_OUTBOX_COLUMNS}, dead_reason, dead_at FROM outbox ORDER BY seq"
        ):
            item = _item(row)
            if row[7] is None:
                snapshot.outbox.append(self._known(item))
            else:
                snapshot.dead_letters.append(DeadLetter(item, row[7], float(row[8])))
        return snapshot

    def task_snapshot(self, key: TaskKey) -> Snapshot:
        """One task with its history and its pending outbox rows (a takeover)."""
        snapshot = Snapshot()
        record = self.get_task(key)
        if record is not None:
            snapshot.tasks.append(record)
        for row in self.read_rows(
            f"SELECT {_OUTBOX_COLUMNS} FROM outbox WHERE requester = %s AND task_id = %s "
            "AND dead_reason IS NULL ORDER BY ord",
            (key.requester, key.task_id),
        ):
            snapshot.outbox.append(self._known(item=_item(row)))
        return snapshot

    def _known(self, item: OutboxItem) -> OutboxItem:
        if item.key is not None and self.fence is not None:
            self._outbox_keys[item.message_id] = item.key
        return item

    def get_task(self, key: TaskKey) -> TaskRecord | None:
        if self.fence is not None and self.fence.unstored(key):
            return None  # a new task this replica just claimed: no round trip to learn that
        rows = self.read_rows(
            "SELECT record FROM tasks WHERE requester = %s AND task_id = %s",
            (key.requester, key.task_id),
        )
        if not rows:
            return None
        record = decode_record(bytes(rows[0][0]))
        record.history = [
            _transition(t)
            for t in self.read_rows(
                f"SELECT {_TRANSITION_COLUMNS} FROM transitions "
                "WHERE requester = %s AND task_id = %s ORDER BY id",
                (key.requester, key.task_id),
            )
        ]
        return record

    def get_dedup(self, key: DedupKey) -> DedupEntry | None:
        rows = self.read_rows(_DEDUP_LOOKUP, key)
        return _dedup_entry(rows[0]) if rows else None

    def remember_dedup(self, key: DedupKey, row: Sequence[Any]) -> None:
        """What the statement that claimed a new task's lease read of the dedup entry of the
        message bringing it (a `DEDUP_COLUMNS` row, all NULL if none): the lookup that comes
        next for `key` is answered from it, without a round trip."""
        if len(self._remembered) >= _REMEMBERED_AT_MOST:
            self._remembered.clear()  # lookups that never came (the message was refused)
        self._remembered[key] = None if row[0] is None else _dedup_entry(row)

    async def fetch_dedup(self, key: DedupKey) -> DedupEntry | None:
        """`get_dedup` without blocking the event loop (a pooled connection), or from what
        the claim of the message's task read (`remember_dedup`)."""
        if key in self._remembered:
            return self._remembered.pop(key)
        rows = await self.execute(_DEDUP_LOOKUP, key)
        return _dedup_entry(rows[0]) if rows else None

    def list_tasks(
        self, *, limit: int, before: ListCursor | None = None, where: TaskFilter | None = None
    ) -> list[TaskRow]:
        return task_rows(self.read_rows(*listing_query(where, before, limit, "%s", _CONTEXT_ID)))

    def count_tasks(self, where: TaskFilter | None = None) -> int:
        return int(self.read_rows(*count_query(where, "%s", _CONTEXT_ID))[0][0])

    def count_finished(self) -> dict[tuple[str, TaskState], int]:
        rows = self.read_rows(
            f"SELECT role, state, count(*) FROM tasks WHERE state IN {_FINAL} GROUP BY role, state"
        )
        return {(str(role), TaskState(state)): int(n) for role, state, n in rows}

    def outbox_count(self) -> int:
        """Messages not yet delivered (dead letters excluded)."""
        return int(self.read_rows("SELECT count(*) FROM outbox WHERE dead_reason IS NULL")[0][0])

    # --- retention --------------------------------------------------------------------------

    async def purge(self, *, finished_before: float, now: float, limit: int) -> int:
        """One retention batch. Rows another replica is purging right now are skipped
        (`SKIP LOCKED`), so replicas purging together never delete a row twice nor wait."""
        await self.commit()  # in order with the writes made before
        pool = await self._open_pool()
        async with pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "WITH doomed AS (SELECT requester, task_id FROM tasks "
                f"WHERE state IN {_FINAL} AND updated_at < %s ORDER BY updated_at LIMIT %s "
                "FOR UPDATE SKIP LOCKED), "
                "gone_history AS (DELETE FROM transitions t USING doomed d "
                "WHERE t.requester = d.requester AND t.task_id = d.task_id), "
                "gone_leases AS (DELETE FROM leases l USING doomed d "
                "WHERE l.requester = d.requester AND l.task_id = d.task_id) "
                "DELETE FROM tasks t USING doomed d "
                "WHERE t.requester = d.requester AND t.task_id = d.task_id",
                (finished_before, limit),
            )
            removed = max(cur.rowcount, 0)
            cur = await conn.execute(
                "DELETE FROM outbox WHERE seq IN (SELECT seq FROM outbox "
                "WHERE dead_reason IS NOT NULL AND dead_at < %s LIMIT %s FOR UPDATE SKIP LOCKED)",
                (finished_before, limit),
            )
            removed += max(cur.rowcount, 0)
            cur = await conn.execute(
                "DELETE FROM dedup WHERE (sender, message_id) IN (SELECT sender, message_id "
                "FROM dedup WHERE expires_at <= %s LIMIT %s FOR UPDATE SKIP LOCKED)",
                (now, limit),
            )
            removed += max(cur.rowcount, 0)
        return removed

    def next_seq(self) -> int:
        """Unique across every process sharing the database: numbers come in blocks from a
        database sequence, so only one call in `SEQ_BLOCK` asks the server."""
        if self._seq_next >= self._seq_end:
            block = int(self.read_rows("SELECT nextval('outbox_seq_blocks')")[0][0])
            self._seq_next, self._seq_end = block * SEQ_BLOCK, (block + 1) * SEQ_BLOCK
        self._seq_next += 1
        return self._seq_next

    # --- buffered writes --------------------------------------------------------------------

    def _tag(self, key: TaskKey | None, *, create: bool = False) -> Tag | None:
        if self.fence is None or key is None:
            return None
        return (key, self.fence.epoch_for(key, create=create))

    def put_task(self, record: TaskRecord, transitions: Sequence[Transition]) -> None:
        key = record.key
        tag = self._tag(key, create=True)
        self._pending.append(
            (
                "INSERT INTO tasks (requester, task_id, role, state, updated_at, record) "
                "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (requester, task_id) DO UPDATE SET "
                "role = excluded.role, state = excluded.state, "
                "updated_at = excluded.updated_at, record = excluded.record "
                # A final task stays final, whatever a writer remembers of it.
                f"WHERE tasks.state NOT IN {_FINAL} OR tasks.state = excluded.state",
                (
                    key.requester,
                    key.task_id,
                    record.role.value,
                    record.state.value,
                    record.updated_at,
                    encode_record(record),
                ),
                False,
                tag,
            )
        )
        if transitions:
            rows = [transition_row(t) for t in transitions]
            self._pending.append((INSERT_TRANSITIONS, rows, True, tag))

    def add_outbox(self, item: OutboxItem) -> None:
        key = item.key
        claimed_by: str | None = None
        claimed_until: float | None = None
        if key is not None and self.fence is not None:
            self._outbox_keys[item.message_id] = key
            # Written claimed by this replica, in the transaction fenced by the task's lease:
            # its first POST needs no claim of its own.
            claimed_until = self.fence.preclaim(item.message_id, key)
            claimed_by = self.fence.replica_id if claimed_until is not None else None
        self._pending.append(
            (
                f"INSERT INTO outbox ({_OUTBOX_COLUMNS}, claimed_by, claimed_until) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                (
                    item.seq,
                    item.message_id,
                    item.partner,
                    key.requester if key else None,
                    key.task_id if key else None,
                    item.body,
                    item.created_at,
                    claimed_by,
                    claimed_until,
                ),
                False,
                self._tag(key),
            )
        )

    def remove_outbox(self, message_id: str) -> None:
        tag = self._tag(self._outbox_keys.pop(message_id, None))
        self._pending.append((DELETE_DELIVERED, (message_id,), False, tag))

    def give_back_lease(self, key: TaskKey, holder: str, epoch: int) -> None:
        """Delete `holder`'s lease of `key` at `epoch` with the next commit (nothing if it
        moved meanwhile: another replica's lease stays)."""
        self._pending.append(
            (
                "DELETE FROM leases WHERE requester = %s AND task_id = %s AND holder = %s "
                "AND epoch = %s",
                (key.requester, key.task_id, holder, epoch),
                False,
                None,
            )
        )

    def dead_letter(self, message_id: str, reason: str, at: float) -> None:
        self._pending.append(
            (
                "UPDATE outbox SET dead_reason = %s, dead_at = %s WHERE message_id = %s",
                (reason, at, message_id),
                False,
                self._tag(self._outbox_keys.get(message_id)),
            )
        )

    def put_dedup(self, entry: DedupEntry) -> None:
        self._pending.append(
            (
                "INSERT INTO dedup (sender, message_id, fingerprint, expires_at, status, body, "
                "headers) VALUES (%s, %s, %s, %s, %s, %s, %s) "
                "ON CONFLICT (sender, message_id) DO UPDATE SET "
                "fingerprint = excluded.fingerprint, expires_at = excluded.expires_at, "
                "status = excluded.status, body = excluded.body, headers = excluded.headers",
                (
                    entry.key[0],
                    entry.key[1],
                    entry.fingerprint,
                    entry.expires_at,
                    entry.reply.status,
                    entry.reply.body,
                    json.dumps(entry.reply.headers),
                ),
                False,
                None,
            )
        )

    def delete_dedup(self, keys: Iterable[DedupKey]) -> None:
        rows = [tuple(key) for key in keys]
        if rows:
            self._pending.append(
                ("DELETE FROM dedup WHERE sender = %s AND message_id = %s", rows, True, None)
            )

    # --- committing -------------------------------------------------------------------------

    async def _write_groups(self) -> None:
        """Write the forming group, then the one that formed meanwhile, until none is left:
        commits made while a transaction is in flight share the next one (a group commit)."""
        try:
            while self._forming is not None:
                group, self._forming = self._forming, None
                self._writing = group
                await self._write(group)
        finally:
            self._writing = None
            self._writer = None

    async def _write(self, group: _Group) -> None:
        """Write `group`'s commits (after the writes of a batch that failed for want of the
        database) in one transaction, and settle each commit: written; fenced out (its own
        writes dropped, because one of its tasks was taken over: the other commits' writes
        are written all the same); or failed with the transaction."""
        commits = group.commits
        batch = list(self._retry)
        spans: list[tuple[int, int]] = []
        for commit in commits:
            # A commit's own writes are those after `keep` (the message it commits, which
            # its caller undoes if refused); those before were buffered by others.
            spans.append((len(batch) + commit.keep, len(batch) + len(commit.ops)))
            batch.extend(commit.ops)
        refused: list[bool] = [False] * len(commits)
        dropped: set[Tag] = set()
        try:
            if batch:
                await self.probe_write()  # while another process holds the store: refused
                pool = await self._open_pool()
                async with pool.connection() as conn:
                    dropped = await self._transaction(conn, batch, spans, refused)
        except (psycopg.OperationalError, PoolTimeout, StoreUnavailable) as exc:
            # The database cannot be reached or written now: nothing of the batch was
            # written. Keep it for the next commit, except what each caller rolls back.
            self._retry = self._retry + [op for c in commits for op in c.ops[: c.keep]]
            self._hold.doubtful = self._hold.held  # its session may be gone too
            unavailable = exc if isinstance(exc, StoreUnavailable) else None
            group.settle(unavailable or StoreUnavailable(f"postgresql: {exc}"))
            return
        except BaseException as exc:
            self._retry = []  # a statement's own failure (a bug): not retried
            group.settle(exc)
            if not isinstance(exc, Exception):
                raise
            return
        self._retry = []
        if batch:
            self.commits += 1
        lost: frozenset[TaskKey] = frozenset()
        if dropped:
            assert self.fence is not None
            lost = self.fence.fenced_out(frozenset(dropped))
            log.warning("writes_fenced_out", tasks=len(dropped), lost=len(lost), own=any(refused))
        group.settle(None, [lost if r else None for r in refused])

    async def _transaction(
        self,
        conn: psycopg.AsyncConnection[Any],
        batch: list[_Op],
        spans: list[tuple[int, int]],
        refused: list[bool],
    ) -> set[Tag]:
        """Write `batch` in one transaction; return the leases found lost. Their writes are
        dropped, and so are the own writes (`spans`) of every commit that had one among them:
        `refused` says which commits."""
        fence = self.fence
        if fence is None:
            await self._write_held(conn, batch)
            return set()
        tags = {op[3] for op in batch if op[3] is not None}
        if not tags:
            async with conn.transaction():
                await send_batch(conn.cursor(), batch)
            return set()
        try:
            # The usual case, in one round trip: BEGIN, the fence (which aborts the
            # transaction if a lease is not held as the writes expect), the writes, COMMIT.
            async with conn.pipeline(), conn.transaction():
                cur = conn.cursor()
                await cur.execute(
                    b"SELECT synapse_fence_all(%s, %s, %s, %s, %s)", self._fence_params(tags)
                )
                await send_batch(cur, batch)
            return set()
        except psycopg.errors.RaiseException as exc:
            if _FENCE_REFUSED not in str(exc):
                raise
        # A task was taken over: find which leases are lost, and write the rest.
        async with conn.transaction():
            cur = conn.cursor()
            dropped = await self._fenced_out(cur, tags)
            withdrawn: set[int] = set()  # the own writes of each commit that lost a task
            for n, (start, end) in enumerate(spans):
                refused[n] = any(op[3] in dropped for op in batch[start:end])
                if refused[n]:
                    withdrawn.update(range(start, end))
            kept = [op for i, op in enumerate(batch) if op[3] not in dropped and i not in withdrawn]
            async with conn.pipeline():
                await send_batch(cur, kept)
        return dropped

    async def _write_held(self, conn: psycopg.AsyncConnection[Any], batch: list[_Op]) -> None:
        """Write `batch` in one transaction of a store held alone (no replicas, no leases),
        which commits only while the hold is: its session (the lookups' connection) may have
        been ended alone, its lock with it, and another process may hold the store now."""
        holder = self._reader.info.backend_pid if self._hold.held else None
        try:
            async with conn.pipeline(), conn.transaction():
                cur = conn.cursor()
                if holder is not None:
                    await cur.execute(_HOLD_ALIVE, (holder,))
                await send_batch(cur, batch)
        except psycopg.errors.DivisionByZero as exc:
            # Checked again (and taken again, if nobody else has it) before the next write.
            self._hold.doubtful = True
            raise StoreUnavailable("postgresql: the session holding the store has ended") from exc

    def _fence_params(self, tags: set[Tag]) -> tuple[Any, ...]:
        fence = self.fence
        assert fence is not None
        wanted = sorted(tags, key=lambda tag: (tag[0].requester, tag[0].task_id, tag[1]))
        return (
            [key.requester for key, _ in wanted],
            [key.task_id for key, _ in wanted],
            [epoch for _, epoch in wanted],
            fence.replica_id,
            fence.claim_until(),
        )

    async def _fenced_out(self, cur: psycopg.AsyncCursor[Any], tags: set[Tag]) -> set[Tag]:
        """The leases among `tags` that this replica no longer holds, checked (and
        share-locked until the commit) in one statement.

        Fencing task by task, not the batch whole: a batch carries the writes of many tasks,
        and one task taken over must not take the others' writes down with it (they would be
        lost while the runtime goes on to deliver what it believes committed)."""
        await cur.execute(
            b"SELECT ok_requester, ok_task_id, ok_epoch "
            b"FROM synapse_fence_many(%s, %s, %s, %s, %s)",
            self._fence_params(tags),
        )
        held = {(TaskKey(r, t), int(e)) for r, t, e in await cur.fetchall()}
        return tags - held

    async def commit(self, *, discard_after: int | None = None) -> None:
        """Make every buffered change durable. Commits made while a transaction is being
        written join the next one (a group commit): each returns once the transaction
        holding its writes is committed, and transactions are written in the order of their
        commits. With nothing buffered, wait for the transaction holding what others took
        (the latest one), or write a failed one again.

        Raises `StoreUnavailable` when the database cannot be reached; the commit's writes
        (but those after `discard_after`, which the caller undoes) are tried again by the
        next commit. Raises `FencedOut` when one of its tasks was taken over by another
        replica: none of its writes were made.
        """
        ops, self._pending = self._pending, []
        base, self._taken = self._taken, self._taken + len(ops)
        if not ops and not self._retry:
            # The latest transaction may hold this caller's writes (buffered before someone
            # else committed them): if it fails, so does this commit, so nothing is sent or
            # acknowledged on the strength of writes that were rolled back.
            latest = self._forming or self._writing
            if latest is None:
                return
            await asyncio.shield(latest.join([], 0))
            return
        keep = len(ops) if discard_after is None else max(0, min(discard_after - base, len(ops)))
        if self._forming is None:
            self._forming = _Group()
        done = self._forming.join(ops, keep)
        if self._writer is None:
            self._writer = asyncio.ensure_future(self._write_groups())
        # Shielded: a cancelled caller must not abandon a transaction half sent.
        lost = await asyncio.shield(done)
        if lost is not None:
            raise FencedOut("another replica owns the task now; retry", lost)

    def mark(self) -> int:
        """A point in the buffered writes that `discard` can drop back to."""
        return self._taken + len(self._pending)

    def discard(self, mark: int) -> None:
        """Drop the writes buffered since `mark` (a message refused after all). Once a
        commit took them (it dropped them itself, see `commit`), what is buffered now is
        other callers' and stays."""
        start = mark - self._taken
        if start >= 0:
            del self._pending[start:]

    async def close(self) -> None:
        try:
            if self._pending or self._retry:  # a failed batch was reported to its callers
                await self.commit()
            if self._writer is not None:
                await asyncio.shield(self._writer)
        finally:
            if self._pool_opened:
                await self._pool.close()
            with self._lock:
                if self._hold.held and not self._reader.broken:
                    with contextlib.suppress(psycopg.Error):
                        let_go_of_database(self._reader)
                self._reader.close()

    # --- maintenance ------------------------------------------------------------------------

    _mark = "%s"
    _reset_on_retry = ("claimed_by", "claimed_until")  # a fresh claim, by whoever sends it

    def _maintain(self, query: str, params: tuple[Any, ...]) -> int:
        with self._lock:
            return int(self._usable_reader().execute(query.encode(), params).rowcount)


#: Aborts a transaction unless session `%s` (the lookups' connection of this store) still
#: holds an advisory lock: a division by zero, in the same round trip as the writes, where a
#: function would need a migration of the schema.
_HOLD_ALIVE = (
    b"SELECT 1 / (SELECT count(*)::int FROM pg_locks "
    b"WHERE locktype = 'advisory' AND pid = %s AND granted)"
)


def _is_read(query: str) -> bool:  # tried again, a SELECT does no harm (a sequence may skip)
    return query.lstrip()[:6].upper() == "SELECT"


__all__ = ["PostgresStore", "apply_migrations", "migrate", "schema_version"]
