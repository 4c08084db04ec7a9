"""Memory holds live work only, the store keeps finished work for the retention, and the
SQLite file stops growing once the retention purges as fast as work finishes."""

from __future__ import annotations

import asyncio
import gc
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from rawpost import eventually
from storekit import R_ID, T0, dedup_entry, outbox_item

from synapse.demo.handler import DemoHandler
from synapse.p2p.config import P2PConfig
from synapse.p2p.dedup import DedupOutcome, StoredReply
from synapse.p2p.durations import format_duration, parse_duration
from synapse.p2p.engine import TaskKey, TaskRecord, Transition
from synapse.p2p.states import Event, Role
from synapse.runtime.aio import MemoryDedupStore
from synapse.runtime.retention import purge_interval
from synapse.store import DurableDedupStore, SqliteStore
from synapse.store.memory import MemoryStore
from synapse.store.sqlite import IS_FINAL
from synapse.transport.peer import Peer
from synapse.types import LocalProtocolError, TaskSpec, TaskState

E_ID = "agent-e"
SECRET = "retention-secret-0123456789abcde"
S = TaskState


def record(n: int, state: TaskState, updated_at: float) -> tuple[TaskRecord, list[Transition]]:
    key = TaskKey(R_ID, f"t-{n}")
    rec = TaskRecord(
        key=key,
        role=Role.EXECUTOR,
        partner=R_ID,
        task=TaskSpec(id=key.task_id, type="echo", payload={"text": "x" * 200}),
        context=None,
        request_id=f"msg-{n}",
        created_at=updated_at,
        state=state,
        updated_at=updated_at,
    )
    moves = [Transition(key, Role.EXECUTOR, S.IDLE, S.CONFIRMED, Event.SEND_TASK_CONFIRM, None, 0)]
    if state.is_final:
        moves.append(
            Transition(key, Role.EXECUTOR, S.CONFIRMED, state, Event.SEND_TASK_FAILED, None, 0)
        )
    rec.history = list(moves)
    return rec, moves


# --- the SQLite store -----------------------------------------------------------------------------


async def test_restart_loads_live_tasks_only_and_finds_finished_ones_by_key(
    tmp_path: Path,
) -> None:
    store = SqliteStore(tmp_path / "e.sqlite")
    for n in range(10):
        store.put_task(*record(n, S.COMPLETED if n < 8 else S.EXECUTING, T0))
    await store.commit()
    await store.close()
    again = SqliteStore(tmp_path / "e.sqlite")
    snapshot = again.load()
    assert sorted(r.key.task_id for r in snapshot.tasks) == ["t-8", "t-9"]
    assert all(len(r.history) == 1 for r in snapshot.tasks)
    found = again.get_task(TaskKey(R_ID, "t-3"))
    assert found is not None and found.state is S.COMPLETED and len(found.history) == 2
    assert again.get_task(TaskKey(R_ID, "t-99")) is None
    page = again.list_tasks(limit=4)
    assert len(page) == 4
    rest = again.list_tasks(limit=100, before=page[-1].cursor)
    assert {r.key.task_id for r in page} | {r.key.task_id for r in rest} == {
        f"t-{n}" for n in range(10)
    }
    assert len(page) + len(rest) == 10
    await again.close()


async def test_purge_removes_what_is_past_the_retention_and_nothing_else(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "e.sqlite")
    for n in range(5):
        store.put_task(*record(n, S.COMPLETED, T0))  # old and finished: purged
    store.put_task(*record(5, S.COMPLETED, T0 + 100))  # finished, but recent: kept
    store.put_task(*record(6, S.EXECUTING, T0))  # old but live: kept
    store.put_dedup(dedup_entry("expired", T0 + 10))
    store.put_dedup(dedup_entry("alive", T0 + 1000))
    for seq in (1, 2):
        store.add_outbox(outbox_item(seq))
    store.dead_letter("msg-1", "gave up", T0)  # an old dead letter: purged
    await store.commit()
    removed = await store.purge(finished_before=T0 + 50, now=T0 + 50, limit=3)
    assert removed == 3 + 1 + 1  # a batch of at most 3 tasks, the dead letter, the entry
    removed = await store.purge(finished_before=T0 + 50, now=T0 + 50, limit=3)
    assert removed == 2  # the rest of the old finished tasks
    assert await store.purge(finished_before=T0 + 50, now=T0 + 50, limit=3) == 0
    kept = {r.key.task_id for r in store.list_tasks(limit=100)}
    assert kept == {"t-5", "t-6"}
    conn = store._reader
    assert conn.execute("SELECT count(*) FROM transitions WHERE task_id = 't-0'").fetchone() == (0,)
    assert store.get_dedup((R_ID, "expired")) is None
    assert store.get_dedup((R_ID, "alive")) is not None
    assert [i.message_id for i in store.load().outbox] == ["msg-2"]  # pending: kept
    assert store.load().dead_letters == []
    await store.close()


async def test_with_a_short_retention_the_file_stops_growing(tmp_path: Path) -> None:
    path = tmp_path / "e.sqlite"
    store = SqliteStore(path)
    sizes = []
    n = 0
    for round_ in range(6):
        now = T0 + 100 * round_
        for _ in range(300):
            n += 1
            store.put_task(*record(n, S.COMPLETED, now))
            store.put_dedup(dedup_entry(f"m-{n}", now + 30))
        await store.commit()
        # Retention 50 s: everything of the rounds before is past it.
        while await store.purge(finished_before=now - 50, now=now, limit=500):
            pass
        # The WAL is bounded (checkpoints, journal_size_limit); what matters is the file
        # once the log is in it.
        with store._lock:
            store._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        sizes.append(path.stat().st_size)
    warm = sizes[1]
    assert max(sizes[2:]) <= 1.3 * warm, sizes
    await store.close()
    assert path.stat().st_size <= 1.3 * warm


async def test_a_new_file_uses_incremental_vacuum_from_the_start(tmp_path: Path) -> None:
    import sqlite3

    store = SqliteStore(tmp_path / "new.sqlite")
    await store.close()
    conn = sqlite3.connect(tmp_path / "new.sqlite")  # another process, say: no VACUUM needed
    assert conn.execute("PRAGMA auto_vacuum").fetchone() == (2,)
    assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    conn.close()


async def test_an_old_file_is_converted_to_incremental_vacuum(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "old.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE leftover (x)")  # a file made before auto_vacuum was set
    conn.commit()
    conn.close()
    store = SqliteStore(path)
    assert store._reader.execute("PRAGMA auto_vacuum").fetchone() == (2,)
    await store.close()


# --- the memory store ---------------------------------------------------------------------------


async def test_the_memory_store_keeps_finished_tasks_up_to_a_count_and_the_retention() -> None:
    store = MemoryStore(max_finished=3)
    for n in range(5):
        store.put_task(*record(n, S.COMPLETED, T0 + n))
    store.put_task(*record(9, S.EXECUTING, T0))  # live tasks are the engine's
    assert [k.task_id for k in store.finished] == ["t-2", "t-3", "t-4"]
    assert store.get_task(TaskKey(R_ID, "t-0")) is None
    assert store.get_task(TaskKey(R_ID, "t-4")) is not None
    assert await store.purge(finished_before=T0 + 4, now=T0 + 4, limit=10) == 2
    assert [k.task_id for k in store.finished] == ["t-4"]
    assert [r.key.task_id for r in store.list_tasks(limit=10)] == ["t-4"]


def tracked_objects() -> int:
    """What a full collection has to scan (after two: garbage is gone, tuples of atoms are
    untracked, those holding such tuples too)."""
    gc.collect()
    gc.collect()
    return len(gc.get_objects())


def test_finished_tasks_in_the_memory_store_give_the_collector_nothing_to_scan() -> None:
    # A full collection scans every tracked object: a kept `TaskRecord` with its history is
    # a dozen of them, 10,000 kept tasks a pause of hundreds of milliseconds.
    store = MemoryStore(max_finished=10_000)
    before = tracked_objects()
    for n in range(2_000):
        store.put_task(*record(n, S.COMPLETED, T0 + n))
    assert tracked_objects() - before < 100  # not one per task
    found = store.get_task(TaskKey(R_ID, "t-7"))
    assert found is not None and found.state is S.COMPLETED and len(found.history) == 2
    assert found.task.payload == {"text": "x" * 200}


def test_answered_messages_in_the_memory_dedup_window_give_the_collector_nothing() -> None:
    table = MemoryDedupStore(600.0)
    now = datetime.fromtimestamp(T0, UTC)
    reply = StoredReply.of(200, b'{"type":"p2p:ack"}', {"Content-Type": "application/json"})
    before = tracked_objects()
    for n in range(2_000):
        key = ("agent-r", f"msg-{n}")
        assert table.begin(key, b"f" * 32, now=now, timestamp=now).outcome is DedupOutcome.NEW
        table.complete(key, StoredReply(reply.status, reply.body, reply.headers))
    assert tracked_objects() - before < 100  # not one per message in the window
    again = table.begin(("agent-r", "msg-7"), b"f" * 32, now=now, timestamp=now)
    assert again.outcome is DedupOutcome.DUPLICATE and again.reply == reply


# --- two peers over loopback HTTP -----------------------------------------------------------------


async def pair(tmp_path: Path, **config: float) -> tuple[Peer, Peer]:
    fast = P2PConfig(max_retries=1, retry_base_delay=0.01, request_timeout=5, **config)  # type: ignore[arg-type]
    r = Peer(R_ID, config=fast, store=SqliteStore(tmp_path / "r.sqlite"))
    e = Peer(E_ID, handler=DemoHandler(), config=fast, store=SqliteStore(tmp_path / "e.sqlite"))
    await r.start()
    await e.start()
    r.add_partner(E_ID, e.endpoint, [SECRET])
    e.add_partner(R_ID, r.endpoint, [SECRET])
    return r, e


async def test_finished_tasks_leave_memory_once_acknowledged(tmp_path: Path) -> None:
    r, e = await pair(tmp_path)
    try:
        handles = [await r.submit(E_ID, "echo", {"text": f"hi {n}"}) for n in range(20)]
        outcomes = await asyncio.gather(*(h.result(20) for h in handles))
        assert all(o.ok for o in outcomes)
        for peer in (r, e):
            await eventually(lambda p=peer: not p.protocol.engine.tasks)  # type: ignore[misc]
            assert not peer.protocol._finals
        assert isinstance(e.server.dedup, DurableDedupStore) and len(e.server.dedup) == 0
        for handle in handles:
            kept = e.store.get_task(handle.key)
            assert kept is not None and kept.state is S.COMPLETED
            assert handle.record.state is S.COMPLETED  # the handle keeps its own record
            assert e.protocol.engine.get(handle.key) is not None  # through the store
        assert len(e.protocol.list_tasks()) == 20
        # A task id is still taken once its task left memory.
        with pytest.raises(LocalProtocolError, match="already used"):
            await r.submit(E_ID, "echo", {"text": "hi 0"}, task_id=handles[0].task_id)
    finally:
        await r.close(0)
        await e.close(0)


async def test_the_runtime_purges_past_the_retention(tmp_path: Path) -> None:
    r, e = await pair(tmp_path, retain=0.2)
    try:
        handles = [await r.submit(E_ID, "echo", {"text": f"hi {n}"}) for n in range(5)]
        assert all(o.ok for o in await asyncio.gather(*(h.result(20) for h in handles)))
        assert e.store.get_task(handles[0].key) is not None
        started = time.monotonic()
        await eventually(lambda: all(e.store.get_task(h.key) is None for h in handles), timeout=10)
        assert time.monotonic() - started < 10
        await eventually(lambda: e.protocol.list_tasks() == {}, timeout=5)
    finally:
        await r.close(0)
        await e.close(0)


# --- durations -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30), ("15m", 900), ("12h", 43200), ("7d", 604800), ("90", 90), ("2.5", 2.5)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds
    assert parse_duration(format_duration(seconds)) == seconds


@pytest.mark.parametrize("text", ["", "5x", "-3", "1w", "s", "nan", "inf"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


def test_purge_interval_follows_the_retention() -> None:
    assert purge_interval(5) == 1.0 and purge_interval(100) == 20.0
    assert purge_interval(7 * 86400) == 60.0


async def test_finished_tasks_are_counted_by_role_and_state_from_an_index(tmp_path: Path) -> None:
    sqlite, memory = SqliteStore(tmp_path / "e.sqlite"), MemoryStore()
    for store in (sqlite, memory):
        for n in range(6):
            state = (S.COMPLETED, S.FAILED, S.EXECUTING)[n % 3]
            store.put_task(*record(n, state, T0))
    await sqlite.commit()
    expected = {("executor", S.COMPLETED): 2, ("executor", S.FAILED): 2}
    assert sqlite.count_finished() == expected == memory.count_finished()
    plan = sqlite._reader.execute(
        "EXPLAIN QUERY PLAN SELECT role, state, count(*) FROM tasks INDEXED BY "
        f"tasks_finished_by_role WHERE {IS_FINAL} GROUP BY role, state"
    ).fetchall()
    assert "COVERING INDEX" in str(plan)  # no table rows read, however many are kept
    await sqlite.close()
