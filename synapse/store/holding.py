"""One process serves a store: the hold a peer takes on its store as it starts.

Two processes serving one SQLite file (a second `synapse serve` started by mistake, a
service manager restarting a process that had not died) would each recover the same live
tasks and run their handlers, each deliver the same outbox, each answer messages about tasks
the other holds in memory, and overwrite each other's writes: every promise of the runtime
(one writer of a task, a message applied once, nothing acknowledged lost) assumes one
process per store. Replicas of one agent share a PostgreSQL store through leases instead
(`synapse.store.leases`), and a process that is not a replica must not join them.

So a peer holds its store while it runs (`TaskStore.hold`, called before `load`):

- SQLite: an exclusive `flock` on a file beside the store, `<store>-lock`, which names its
  holder (process id, host, since when). The operating system lets go of it when the process
  ends, however it ends; the file stays (removing it would let two processes lock two
  different files of one name). Tools that read or repair a store (`synapse outbox`,
  `synapse audit`) do not take the hold: they work beside a running peer.
- PostgreSQL: a session advisory lock of the database, shared by replicas
  (`synapse serve`, `synapse.transport.replicas`), exclusive for any other process
  (`synapse mcp`, a `Peer` given a `PostgresStore` without replicas).

A store already held raises `StoreInUse`, which says who holds it.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

from synapse.logs import get_logger
from synapse.store.base import StoreUnavailable
from synapse.types.errors import SynapseException

log = get_logger("synapse.store")

try:
    import fcntl
except ImportError:  # pragma: no cover - not a POSIX system: no hold on files there
    fcntl = None  # type: ignore[assignment]


class StoreInUse(SynapseException):
    """Another process serves this store (the message says which, where it can tell)."""


def _lock_path(store: Path) -> Path:
    return store.with_name(store.name + "-lock")


def holder_line() -> str:
    """Who holds a store: this process, its host, since when (UTC)."""
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return f"process {os.getpid()} on {socket.gethostname()} since {since}"


class FileHold:
    """An exclusive `flock` on `<store>-lock`, beside an SQLite store, naming its holder."""

    def __init__(self, store: Path) -> None:
        self.path = _lock_path(store)
        self._fd: int | None = None
        self._writable = False
        if fcntl is None:  # pragma: no cover
            return
        writable = True
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            # A lock file that cannot be written (made immutable with the store's files, on
            # a read-only mount) still locks, opened for reading: the store is then served
            # read-only, every change refused until the files are fixed, and still by one
            # process. One that cannot be opened at all means no store can be served here.
            try:
                fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                raise StoreUnavailable(f"cannot open {self.path}: {exc.strerror or exc}") from exc
            writable = False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "unknown"
            os.close(fd)
            raise StoreInUse(
                f"store {store} is served by another process ({holder}): one process "
                "serves an SQLite store at a time (replicas of one agent share a "
                "PostgreSQL store)"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        if writable:
            os.ftruncate(fd, 0)
            os.pwrite(fd, (holder_line() + "\n").encode(), 0)
        self._fd, self._writable = fd, writable

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Let go (the process goes on without serving the store). Idempotent."""
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                if self._writable:
                    os.ftruncate(fd, 0)  # the holder named no more
            finally:
                os.close(fd)


#: Key of the advisory lock that processes serving a PostgreSQL store hold ("synapse" in hex,
#: plus one: the key below it serializes migrations).
SERVING_LOCK = 0x73796E61707366


def take_database_hold(conn: Any, *, shared: bool, patience: float = 3.0) -> None:
    """Take the serving lock on `conn`, a PostgreSQL session in autocommit (a psycopg
    connection): shared for a replica, exclusive for any other process; `StoreInUse` if
    held otherwise for `patience` seconds. (A process that has just died may hold it a
    moment longer: the server ends its session once it notices the connection closed. A
    process that stops lets go at once: `let_go_of_database`.)"""
    take = "pg_try_advisory_lock_shared" if shared else "pg_try_advisory_lock"
    give_up_at, pause = time.monotonic() + patience, 0.05
    while True:
        row = conn.execute(f"SELECT {take}(%s)".encode(), (SERVING_LOCK,)).fetchone()
        if row is not None and row[0]:
            return
        if time.monotonic() >= give_up_at:
            break
        time.sleep(pause)  # off the event loop: `hold` runs in a worker thread
        pause = min(pause * 2, 0.5)
    if shared:
        raise StoreInUse(
            "the PostgreSQL store is served by a process that is not a replica (synapse mcp, "
            "or a Peer given the store without replicas): replicas cannot join it"
        )
    raise StoreInUse(
        "the PostgreSQL store is served by another process: only the replicas of one agent "
        "(synapse serve) share one; any other process needs a database of its own"
    )


class DatabaseHold:
    """This process's hold of a PostgreSQL store, kept across the loss of its connection.

    The lock is its session's: when that connection is lost (the server restarted, a
    network cut) so is the lock, and another process may take it before this one is back.
    The store takes it again on the new connection (`take_again`). While another process
    holds it, `refused` says so and the store writes nothing, failing its commits as if the
    database were away (the runtime answers 503 and waits), so that two processes never
    serve the store at once; it tries again before each transaction, and writes again once
    the hold is its own. `doubtful` marks a hold whose connection may have been lost without
    a statement on it noticing yet (a transaction failed for want of the database): the
    store checks it before its next transaction."""

    def __init__(self) -> None:
        #: None while not held; True for a replica's shared hold, False for an exclusive one.
        self.shared: bool | None = None
        self.refused: StoreInUse | None = None
        self.doubtful = False

    @property
    def held(self) -> bool:
        return self.shared is not None

    def take(self, conn: Any, *, shared: bool, patience: float) -> None:
        take_database_hold(conn, shared=shared, patience=patience)
        self.shared = shared

    def take_again(self, conn: Any) -> None:
        """Take the hold as it was on `conn` (a new connection, or the same one after a
        refusal), without waiting; on refusal, `refused` says why (logged once)."""
        if self.shared is None:
            return
        try:
            take_database_hold(conn, shared=self.shared, patience=0)
        except StoreInUse as exc:
            if self.refused is None:
                log.error("store_in_use", error=str(exc), writes="refused until held again")
            self.refused = exc
            return
        if self.refused is not None:
            log.warning("store_held_again")
        self.refused = None


def let_go_of_database(conn: Any) -> None:
    """Give the serving lock back on `conn`, at once (before its connection closes: the
    server would otherwise end the session, and the lock with it, a moment later)."""
    conn.execute(b"SELECT pg_advisory_unlock_all()")


__all__ = [
    "SERVING_LOCK",
    "DatabaseHold",
    "FileHold",
    "StoreInUse",
    "holder_line",
    "let_go_of_database",
    "take_database_hold",
]
