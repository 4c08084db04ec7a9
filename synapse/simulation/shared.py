"""The shared store of simulated replicas: the real PostgreSQL store on a real server, its
round trips on the virtual clock.

Replicas of one agent share one PostgreSQL database (`synapse.store.leases`); their leases,
fences, outbox claims and takeovers are SQL statements and PL/pgSQL functions. The simulation
runs those very statements on a real server, so the semantics under test are the database's,
not a copy of them. What changes is only how a statement travels: `SimulatedPostgresStore`
is `synapse.store.postgres.PostgresStore` whose pooled connections are synchronous ones
behind an asynchronous face. Each statement waits a seeded round trip on the virtual clock,
then runs at once on the loop's thread, so the run is the same for a seed every time, and a
transaction stays open across those waits while other replicas run statements of their own
(a commit's fence share-locks its leases meanwhile, as it does in production).

Waiting for a row lock cannot block the loop's thread: every connection has a short
`lock_timeout`, and a statement that meets a lock held by an open transaction of another
replica is run again a moment later (virtual time), which is what waiting for the lock
amounts to. Inside a transaction the lock timeout aborts it: the commit fails as it would on
a lost connection, and the store's own handling retries it (each such case is traced).

A kill (`die`) closes the replica's connections: the server rolls back what they had
open, and nothing the process buffered is written. A pause (`synapse.simulation.loop`)
leaves them open, locks held, as SIGSTOP does. A cut from the database (`reachable` false
for a while) fails every statement and transaction of the replica's, its lookups too, as a
lost connection does, while the replica itself runs on.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import psycopg

from synapse.simulation.stores import StoreFaultSource
from synapse.store.base import StoreUnavailable
from synapse.store.postgres import PostgresStore, apply_migrations

#: How long a statement waits for a row lock before it is run again (real milliseconds:
#: the lock's holder is parked on the same thread, so waiting longer changes nothing).
LOCK_TIMEOUT_MS = 5
#: A statement that met a lock is run again after this many virtual seconds.
LOCK_RETRY = 0.01


class _Cursor:
    """A synchronous cursor with the asynchronous methods `PostgresStore` awaits."""

    def __init__(self, conn: _Connection, cur: psycopg.Cursor[Any]) -> None:
        self._conn = conn
        self._cur = cur

    @property
    def description(self) -> Any:
        return self._cur.description

    @property
    def rowcount(self) -> int:
        return self._cur.rowcount

    async def execute(self, query: Any, params: Any = None) -> _Cursor:
        await self._conn.round_trip()
        self._conn.run(lambda: self._cur.execute(query, params))
        return self

    async def executemany(self, query: Any, params: Any) -> None:
        await self._conn.round_trip()
        self._conn.run(lambda: self._cur.executemany(query, params))

    async def fetchall(self) -> list[tuple[Any, ...]]:
        return self._cur.fetchall()


class _Connection:
    """One pooled connection of a simulated replica (see the module's docstring)."""

    def __init__(self, store: SimulatedPostgresStore, conn: psycopg.Connection[Any]) -> None:
        self.store = store
        self.conn = conn
        self.autocommit = False

    async def round_trip(self) -> None:
        await asyncio.sleep(self.store.faults.delay() / 10)
        if self.store.fenced:
            raise psycopg.OperationalError("simulated: the process was killed")
        self.store.check_reachable()

    def run(self, statement: Callable[[], Any]) -> Any:
        try:
            return statement()
        except psycopg.errors.LockNotAvailable:
            self.store.trace(f"{self.store.name}: a statement met a lock held elsewhere")
            raise

    async def set_autocommit(self, value: bool) -> None:
        self.autocommit = value
        if not self.store.fenced:
            self.conn.autocommit = value

    def cursor(self) -> _Cursor:
        return _Cursor(self, self.conn.cursor())

    async def execute(self, query: Any, params: Any = None) -> _Cursor:
        cursor = self.cursor()
        while True:
            try:
                return await cursor.execute(query, params)
            except psycopg.errors.LockNotAvailable:
                if not self.autocommit:
                    raise  # inside a transaction: aborted, as a lost connection aborts it
                await asyncio.sleep(LOCK_RETRY)  # waiting for the lock, in virtual time

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        if self.store.faults.fails():
            raise psycopg.OperationalError("simulated: the database cannot be reached")
        self.store.check_reachable()
        try:
            yield
        except BaseException:
            if not self.store.fenced and not self.conn.closed:
                self.conn.rollback()
            raise
        if self.store.fenced:
            raise psycopg.OperationalError("simulated: the process was killed")
        try:
            await self.round_trip()
        except psycopg.OperationalError:
            # The COMMIT met a cut: the transaction ends rolled back, as every transaction a
            # cut meets does here. Left open, the pooled connection's next transaction would
            # have gone on inside it and committed both.
            if not self.store.fenced and not self.conn.closed:
                self.conn.rollback()
            raise
        self.conn.commit()

    @contextlib.asynccontextmanager
    async def pipeline(self) -> AsyncIterator[None]:
        yield  # statements go one by one: each its own round trip, the order the same


class _Pool:
    """What `PostgresStore` asks of its connection pool: a connection at a time (one per
    caller, opened when first needed and kept)."""

    def __init__(self, store: SimulatedPostgresStore) -> None:
        self.store = store
        self.idle: list[_Connection] = []
        self.every: list[_Connection] = []

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[_Connection]:
        if self.store.fenced:
            raise psycopg.OperationalError("simulated: the process was killed")
        if self.idle:
            conn = self.idle.pop()
        else:
            conn = _Connection(self.store, self.store.connect())
            self.every.append(conn)
        try:
            yield conn
        finally:
            if not self.store.fenced:
                self.idle.append(conn)

    def close_all(self) -> None:
        for conn in self.every:
            conn.conn.close()
        self.idle.clear()


class SimulatedPostgresStore(PostgresStore):
    """`PostgresStore` with its round trips on the virtual clock (see the module's
    docstring). `name` labels its trace lines."""

    def __init__(
        self,
        url: str,
        faults: StoreFaultSource,
        *,
        name: str,
        trace: Callable[[str], None],
        reachable: Callable[[], bool] = lambda: True,
    ) -> None:
        self.faults = faults
        self.name = name
        self.trace = trace
        self.fenced = False
        #: False while the process is cut from the database (see `check_reachable`).
        self.reachable = reachable
        super().__init__(url, apply_schema=False)
        self._sim_pool = _Pool(self)

    def connect(self) -> psycopg.Connection[Any]:
        conn = psycopg.connect(self.url, autocommit=False)
        with conn.transaction():
            conn.execute(f"SET lock_timeout = '{LOCK_TIMEOUT_MS}ms'".encode())
        return conn

    def _connect_reader(self) -> psycopg.Connection[Any]:
        conn = super()._connect_reader()
        conn.execute(f"SET lock_timeout = '{LOCK_TIMEOUT_MS}ms'".encode())
        return conn

    def check_reachable(self) -> None:
        """A statement (or a transaction's start) while the process is cut from the database
        fails as a lost connection does. (A real cut may leave a transaction open, its locks
        held, until the server notices the connection is gone; here it ends at once, rolled
        back, as when the server does notice.)"""
        if not self.reachable():
            raise psycopg.OperationalError("simulated: the database cannot be reached")

    def _usable_reader(self) -> psycopg.Connection[Any]:
        self.check_reachable()  # the lookups' connection: what a read would meet
        return super()._usable_reader()

    async def _open_pool(self) -> Any:
        return self._sim_pool

    def die(self) -> None:
        """The process was killed: its connections close (the server rolls back what they
        had open), and nothing more is written."""
        self.fenced = True
        self._pending = []
        self._retry = []
        self._sim_pool.close_all()
        self._reader.close()

    async def commit(self, *, discard_after: int | None = None) -> None:
        if self.fenced:
            raise StoreUnavailable("the process was killed")
        await super().commit(discard_after=discard_after)

    async def close(self) -> None:
        if self.fenced:
            return
        try:
            await super().close()
        finally:
            self._sim_pool.close_all()


class Databases:
    """A fresh database for each seed, made from a migrated template on one server."""

    def __init__(self, server_url: str, *, prefix: str = "synapse_sim") -> None:
        self.server_url = server_url
        self.prefix = prefix
        self.template = f"{prefix}_template"
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.template}"'.encode())
            conn.execute(f'CREATE DATABASE "{self.template}"'.encode())
        with psycopg.connect(self._url(self.template), autocommit=True) as conn:
            apply_migrations(conn)

    def _url(self, database: str) -> str:
        base, _, _ = self.server_url.rpartition("/")
        return f"{base}/{database}"

    def fresh(self, seed: int) -> str:
        name = f"{self.prefix}_{seed}"
        with psycopg.connect(self.server_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"'.encode())
        return self._url(name)

    def drop(self, url: str) -> None:
        name = url.rpartition("/")[2]
        with psycopg.connect(self.server_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())

    def close(self) -> None:
        with psycopg.connect(self.server_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.template}"'.encode())


def rows(url: str, query: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """One statement on a connection of its own (the checks at the end of a run)."""
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(query.encode(), params).fetchall()


__all__ = ["Databases", "SimulatedPostgresStore", "rows"]
