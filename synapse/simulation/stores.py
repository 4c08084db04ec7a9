"""The stores of simulated peers: the real ones, with their writes on the virtual clock.

`SimulatedSqliteStore` is `synapse.store.sqlite.SqliteStore` (its file, schema, group
commits, failure handling and recovery) with one change: a transaction is written on the
event loop, a seeded delay after it formed, instead of by the writer thread whenever the
operating system schedules it. A commit may fail as a full or broken disk fails it (the
store's own handling of an environmental error runs), and a killed peer's store is
`fence`d: what it had not written is lost (SIGKILL), what it had written stays in the file
for the next incarnation to recover.

`SimulatedMemoryStore` is the memory store with slow and failing commits (it has no file:
its peers are never restarted).
"""

from __future__ import annotations

import asyncio
import random
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from synapse.store.base import StoreUnavailable
from synapse.store.memory import MemoryStore
from synapse.store.sqlite import SqliteStore, _Batch


@dataclass(frozen=True, slots=True)
class StoreFaults:
    """How a simulated store misbehaves: each commit fails with probability `failure`, and
    takes up to `slow` seconds."""

    failure: float = 0.0
    slow: float = 0.0

    @classmethod
    def draw(cls, rng: random.Random) -> StoreFaults:
        return cls(
            failure=rng.choice((0.0, 0.03, 0.15, 0.4)),
            slow=rng.choice((0.0, 0.002, 0.5, 5.0)),
        )


class StoreFaultSource:
    """The store faults in force (none once the simulation heals), drawn from one RNG."""

    def __init__(self, faults: StoreFaults, rng: random.Random) -> None:
        self.faults = faults
        self.rng = rng
        self.active = True
        #: Commits failed so far.
        self.failed = 0

    def fails(self) -> bool:
        if self.active and self.faults.failure and self.rng.random() < self.faults.failure:
            self.failed += 1
            return True
        return False

    def delay(self) -> float:
        if not self.faults.slow:
            return 0.0
        return self.rng.uniform(0, self.faults.slow if self.active else self.faults.slow / 100)


class _FlakyConnection:
    """A SQLite connection whose next transaction fails to begin when told to (as a disk
    I/O error does: the store treats it as the database's, keeps the writes, retries)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self.fail_next = False

    def execute(self, sql: str, *args: Any) -> Any:
        if self.fail_next and sql == "BEGIN IMMEDIATE":
            self.fail_next = False
            raise OSError(5, "simulated disk I/O error")
        return self._conn.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


class SimulatedSqliteStore(SqliteStore):
    """A `SqliteStore` written on the event loop (see the module's docstring)."""

    def __init__(self, path: str | Path, faults: StoreFaultSource) -> None:
        super().__init__(path)
        # No writer thread: transactions are written on the loop, in `_write_on_loop`.
        self._queue.put(None)
        self._writer.join()
        self._faults = faults
        self._conn = _FlakyConnection(self._conn)  # type: ignore[assignment]
        self.fenced = False

    def _launch(self) -> None:
        if self.fenced:
            return  # killed: nothing more reaches the file, and nobody waits any more
        self._writing, self._forming = self._forming, None
        batch = self._writing
        assert batch is not None
        batch.loop.call_later(self._faults.delay(), self._write_on_loop, batch)

    def _write_on_loop(self, batch: _Batch) -> None:
        if self.fenced:
            return
        if self._faults.fails():
            self._conn.fail_next = True  # type: ignore[attr-defined]
        self._write_batch(batch)
        self._settle(batch)

    def fence(self) -> None:
        """The process was killed: drop what was not written, write nothing more."""
        self.fenced = True
        self._pending = []
        self._forming = None
        self._writing = None
        self._conn.close()
        self._reader.close()
        self._release_hold()  # the system lets go of a dead process's locks

    async def commit(self, *, discard_after: int | None = None) -> None:
        if self.fenced:
            raise StoreUnavailable("the process was killed")
        await super().commit(discard_after=discard_after)

    async def close(self) -> None:
        if self.fenced:
            return
        await super().close()


class SimulatedMemoryStore(MemoryStore):
    """A `MemoryStore` whose commits are slow and sometimes fail."""

    def __init__(self, faults: StoreFaultSource) -> None:
        super().__init__()
        self._faults = faults

    async def commit(self, *, discard_after: int | None = None) -> None:
        delay = self._faults.delay()
        if delay:
            await asyncio.sleep(delay)
        if self._faults.fails():
            if discard_after is not None:
                self.discard(discard_after)
            raise StoreUnavailable("simulated commit failure")
        await super().commit(discard_after=discard_after)


__all__ = ["SimulatedMemoryStore", "SimulatedSqliteStore", "StoreFaultSource", "StoreFaults"]
