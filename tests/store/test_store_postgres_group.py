"""Group commit on a real PostgreSQL server: commits that arrive together share one
transaction, each returns once that transaction is durable, a failed transaction refuses every
commit in it and loses none of their writes, and a commit whose task was taken over is refused
alone while the others in its transaction are written."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import AsyncIterator, Callable
from typing import Any

import psycopg
import pytest
from storekit import Duo, outbox_item

from synapse.p2p.engine import TaskKey
from synapse.store.base import FencedOut, StoreUnavailable
from synapse.store.memory import MemoryStore
from synapse.store.postgres import PostgresStore

MESSAGES = 20


def keys(n: int) -> list[TaskKey]:
    return [TaskKey("agent-r", f"t-{i}") for i in range(n)]


async def messages(duo: Duo, store: PostgresStore, n: int) -> list[Any]:
    """`n` messages handled at once, as the runtime does: each buffers its writes (a new
    task, here) and commits them before it answers."""

    async def one(i: int) -> None:
        duo.submit(task_id=f"t-{i}")
        await store.commit()

    return await asyncio.gather(*(one(i) for i in range(n)), return_exceptions=True)


async def test_concurrent_commits_share_one_transaction(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    duo = Duo(MemoryStore(), store)
    before = store.commits
    assert await messages(duo, store, MESSAGES) == [None] * MESSAGES
    assert store.commits - before == 1  # one transaction for the twenty
    reader = PostgresStore(pg_url)
    assert all(reader.get_task(key) is not None for key in keys(MESSAGES))
    await reader.close()
    await store.close()


async def test_commits_made_during_a_transaction_join_the_next_one(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = PostgresStore(pg_url)
    duo = Duo(MemoryStore(), store)
    started, release = asyncio.Event(), asyncio.Event()
    write = store._transaction

    async def held(*args: Any) -> Any:  # the first transaction waits until the others came
        started.set()
        await release.wait()
        return await write(*args)

    monkeypatch.setattr(store, "_transaction", held)
    duo.submit(task_id="first")
    first = asyncio.ensure_future(store.commit())
    await started.wait()

    async def one(i: int) -> None:
        duo.submit(task_id=f"t-{i}")
        await store.commit()

    rest = [asyncio.ensure_future(one(i)) for i in range(MESSAGES)]
    # Scheduled after the first step of each (asyncio runs callbacks in order): by then all
    # twenty have buffered their writes and joined the next transaction.
    asyncio.get_running_loop().call_soon(release.set)
    await first
    assert await asyncio.gather(*rest) == [None] * MESSAGES
    assert store.commits == 2  # the first alone, then the twenty that came meanwhile
    await store.close()


async def test_a_failed_group_refuses_every_commit_in_it_and_loses_none(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = PostgresStore(pg_url)
    duo = Duo(MemoryStore(), store)

    async def unreachable() -> Any:
        raise psycopg.OperationalError("connection refused")

    reach = store._open_pool
    monkeypatch.setattr(store, "_open_pool", unreachable)
    outcomes = await messages(duo, store, MESSAGES)
    assert all(isinstance(outcome, StoreUnavailable) for outcome in outcomes)
    reader = PostgresStore(pg_url)
    assert all(reader.get_task(key) is None for key in keys(MESSAGES))  # nothing half written
    monkeypatch.setattr(store, "_open_pool", reach)
    await store.commit()  # the database is back: the next commit writes all of them
    assert all(reader.get_task(key) is not None for key in keys(MESSAGES))
    await reader.close()
    await store.close()


async def test_a_fenced_commit_is_refused_alone_in_its_group(pair) -> None:  # type: ignore[no-untyped-def]
    (a, b), clock = pair
    duo = Duo(MemoryStore(), a.store)
    kept, taken = duo.submit(task_id="kept"), duo.submit(task_id="taken")
    await a.store.commit()
    clock.now += 11
    assert await b.take_over(taken) is not None

    async def message(key: TaskKey) -> None:
        mark = a.store.mark()
        duo.complete(key)
        try:
            await a.store.commit(discard_after=mark)
        except FencedOut:
            a.store.discard(mark)
            raise

    outcomes = await asyncio.gather(message(kept), message(taken), return_exceptions=True)
    assert outcomes[0] is None
    assert isinstance(outcomes[1], FencedOut) and outcomes[1].keys == frozenset({taken})
    assert a.store.commits == 2  # the first, then the group (written again without `taken`)
    done = a.store.get_task(kept)
    assert done is not None and done.state.value == "completed"
    stolen = b.store.get_task(taken)
    assert stolen is not None and stolen.state.value == "executing"


class CountingCursor:
    """A cursor that remembers each statement sent through it."""

    def __init__(self, cur: Any, sent: list[str]) -> None:
        self.cur = cur
        self.sent = sent

    async def execute(self, query: bytes, params: Any = None) -> Any:
        self.sent.append(query.decode())
        return await self.cur.execute(query, params)

    async def executemany(self, query: bytes, params: Any) -> Any:
        self.sent.append(query.decode())
        return await self.cur.executemany(query, params)


async def test_a_groups_history_and_delivered_rows_take_one_statement_each(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The transitions of every task in a group go in one statement, in order, and so do the
    deletions of the delivered outbox rows: each task's history reads back as written."""
    import synapse.store.postgres as postgres_module

    sent: list[str] = []
    real = postgres_module.send_batch

    async def counted(cur: Any, batch: Any) -> None:
        await real(CountingCursor(cur, sent), batch)

    monkeypatch.setattr(postgres_module, "send_batch", counted)
    store = PostgresStore(pg_url)
    duo = Duo(MemoryStore(), store)
    tasks = [duo.submit(task_id=f"t-{i}") for i in range(MESSAGES)]
    for key in tasks:
        duo.progress(key, 50)
        duo.complete(key)
    for n in range(MESSAGES):
        store.add_outbox(outbox_item(n + 1, f"m-{n}", task=None))
    await store.commit()
    assert sum("INSERT INTO transitions" in q for q in sent) == 1
    for n in range(MESSAGES):
        store.remove_outbox(f"m-{n}")
    sent.clear()
    await store.commit()
    assert sent == ["DELETE FROM outbox WHERE message_id = ANY(%s::text[])"]
    assert store.outbox_count() == 0
    reader = PostgresStore(pg_url)
    for key in tasks:
        stored = reader.get_task(key)
        assert stored is not None
        written = duo.record("e", key).history
        assert [(t.from_state, t.to_state, t.event) for t in stored.history] == [
            (t.from_state, t.to_state, t.event) for t in written
        ]
        assert len(written) >= 3
    await reader.close()
    await store.close()


class _NoPool:
    """A pool that hands out no connection (the transaction is the test's)."""

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[None]:
        yield None


def written_by(
    monkeypatch: pytest.MonkeyPatch, store: PostgresStore, transaction: Callable[..., Any]
) -> None:
    """`store`'s transactions are `transaction`, with no connection of a pool."""

    async def pool() -> _NoPool:
        return _NoPool()

    monkeypatch.setattr(store, "_open_pool", pool)
    monkeypatch.setattr(store, "_transaction", transaction)


async def test_a_writer_cancelled_mid_transaction_cancels_its_commits(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process stops while a group is being written (its tasks cancelled): each commit of
    the group ends cancelled, not failed with a cancellation as its exception (which nobody
    retrieves once its caller is cancelled too, and asyncio logs as an error)."""
    store = PostgresStore(pg_url)
    duo = Duo(MemoryStore(), store)
    started = asyncio.Event()

    async def never(*args: Any) -> Any:  # the transaction is under way when the stop comes
        started.set()
        await asyncio.Event().wait()

    written_by(monkeypatch, store, never)
    callers = [asyncio.create_task(messages(duo, store, 1)) for _ in range(3)]
    await started.wait()
    group, writer = store._writing, store._writer
    assert group is not None and writer is not None and group.commits
    for task in [*callers, writer]:
        task.cancel()
    await asyncio.gather(*callers, return_exceptions=True)
    await asyncio.wait_for(asyncio.wait([commit.done for commit in group.commits]), 10)
    assert all(commit.done.cancelled() for commit in group.commits)
    store._reader.close()


async def test_a_commit_failing_after_its_caller_was_cancelled_logs_nothing(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller cancelled while its transaction is written (a request whose client went
    away) never reads how the transaction ended; when it fails, that failure is nobody's:
    asyncio must not log it as an exception never retrieved."""
    store = PostgresStore(pg_url)
    duo = Duo(MemoryStore(), store)
    started, fail = asyncio.Event(), asyncio.Event()

    async def failing(*args: Any) -> Any:
        started.set()
        await fail.wait()
        raise psycopg.OperationalError("the server went away")

    written_by(monkeypatch, store, failing)
    logged: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: logged.append(context))
    try:
        caller = asyncio.create_task(messages(duo, store, 1))
        await started.wait()
        caller.cancel()
        await asyncio.gather(caller, return_exceptions=True)
        writer = store._writer
        assert writer is not None
        fail.set()
        await writer
        del caller, writer
        gc.collect()
    finally:
        loop.set_exception_handler(None)
    assert [c.get("message") for c in logged] == []
    store._reader.close()  # (closing would try the failed writes again)
