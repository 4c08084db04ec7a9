"""One suite, every backend: the `TaskStore` contract on memory, SQLite and PostgreSQL.

Each test gets a `Backend` that opens stores on one location (a file, a database), so a
durable backend can be closed and opened again the way a restarted process would. The
PostgreSQL case runs against a real server (`pgserver`); it is skipped, naming the package to
install, on a machine without one (and fails under CI=true).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from storekit import R_ID, T0, Duo, dedup_entry, outbox_item

from synapse.p2p.engine import TaskKey, TaskRecord
from synapse.p2p.states import Role
from synapse.store import SqliteStore
from synapse.store.base import DeadLetter, TaskFilter, TaskStore
from synapse.store.memory import MemoryStore
from synapse.types import TaskContext, TaskSpec, TaskState


@dataclass
class Backend:
    name: str
    make: Callable[[], TaskStore]
    opened: list[TaskStore] = field(default_factory=list)

    @property
    def durable(self) -> bool:
        return self.name != "memory"

    def open(self) -> TaskStore:
        store = self.make()
        self.opened.append(store)
        return store

    async def reopen(self, store: TaskStore) -> TaskStore:
        """Close `store` and open the same location again (a restart)."""
        await store.close()
        self.opened.remove(store)
        return self.open()


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    make: Callable[[], TaskStore]
    if request.param == "memory":
        make = MemoryStore
    elif request.param == "sqlite":
        path = tmp_path / "store.sqlite"

        def make() -> TaskStore:
            return SqliteStore(path)
    else:
        from synapse.store.postgres import PostgresStore

        url = request.getfixturevalue("pg_url")

        def make() -> TaskStore:
            return PostgresStore(url)

    backend = Backend(request.param, make)
    yield backend
    for store in backend.opened:
        await store.close()


def finished_tasks(store: TaskStore, count: int) -> tuple[Duo, list[TaskKey]]:
    """`count` echo tasks run to completion; `store` is the requester's."""
    duo = Duo(store, MemoryStore())
    keys = []
    for n in range(count):
        key = duo.submit(task_id=f"t-{n:03d}")
        duo.complete(key)
        keys.append(key)
    return duo, keys


# --- tasks ----------------------------------------------------------------------------------------


async def test_a_finished_task_is_looked_up_by_key_with_its_history(backend: Backend) -> None:
    store = backend.open()
    duo, [key] = finished_tasks(store, 1)
    await store.commit()
    if backend.durable:
        store = await backend.reopen(store)
    back = store.get_task(key)
    assert back == duo.record("r", key)  # every field, the history included
    assert back is not None and back.state is TaskState.COMPLETED
    assert [t.to_state.value for t in back.history][-1] == "completed"
    assert store.get_task(TaskKey(R_ID, "nope")) is None


async def test_live_tasks_come_back_at_start_and_finished_ones_do_not(backend: Backend) -> None:
    store = backend.open()
    duo = Duo(store, MemoryStore())
    live = duo.submit(task_id="live")
    duo.progress(live, 30)
    done = duo.submit(task_id="done")
    duo.complete(done)
    await store.commit()
    store = await backend.reopen(store) if backend.durable else store
    snapshot = store.load()
    if backend.durable:
        [back] = snapshot.tasks
        assert back == duo.record("r", live)
        assert back.state is TaskState.EXECUTING
    else:
        assert snapshot.tasks == []  # nothing survives a memory store


async def test_listing_pages_newest_first_with_filters_and_counts(backend: Backend) -> None:
    store = backend.open()
    _, keys = finished_tasks(store, 7)
    await store.commit()
    pages, cursor = [], None
    while True:
        page = store.list_tasks(limit=3, before=cursor)
        if not page:
            break
        pages.append([row.key.task_id for row in page])
        cursor = page[-1].cursor
    assert [len(p) for p in pages] == [3, 3, 1]
    assert [tid for p in pages for tid in p] == [k.task_id for k in reversed(keys)]
    assert store.count_tasks() == 7
    completed = TaskFilter(states=frozenset({TaskState.COMPLETED}))
    assert store.count_tasks(completed) == 7
    assert store.count_tasks(TaskFilter(states=frozenset({TaskState.FAILED}))) == 0
    assert store.count_tasks(TaskFilter(requester="someone-else")) == 0
    last = store.get_task(keys[-1])
    assert last is not None
    recent = store.list_tasks(limit=10, where=TaskFilter(updated_after=last.updated_at))
    assert [row.key for row in recent] == [keys[-1]]
    assert store.count_finished() == {("requester", TaskState.COMPLETED): 7}


def record_in(n: int, context_id: str | None, payload: dict[str, str]) -> TaskRecord:
    key = TaskKey(R_ID, f"c-{n}")
    return TaskRecord(
        key=key,
        role=Role.EXECUTOR,
        partner=R_ID,
        task=TaskSpec(id=key.task_id, type="echo", payload=payload),
        context=TaskContext(session_id=context_id) if context_id is not None else None,
        request_id=f"m-{n}",
        created_at=T0,
        state=TaskState.COMPLETED,
        updated_at=T0 + n,
    )


async def test_listing_by_context_and_by_task_id(backend: Backend) -> None:
    # Served by indexes on the durable stores (`tasks_by_context`, `tasks_by_task_id`); a
    # record holding a NUL escape is written like any other (an index expression that
    # raised would refuse the write).
    store = backend.open()
    records = [
        record_in(0, "ctx-a", {"text": "a"}),
        record_in(1, "ctx-b", {"text": "b"}),
        record_in(2, "ctx-a", {"text": "nul \x00 inside"}),
        record_in(3, None, {"text": "no context"}),
        record_in(4, "ctx-a", {"text": "a again"}),
    ]
    for rec in records:
        store.put_task(rec, [])
    await store.commit()
    in_a = TaskFilter(requester=R_ID, context_id="ctx-a")
    listed = [row.key.task_id for row in store.list_tasks(limit=10, where=in_a)]
    assert listed == ["c-4", "c-2", "c-0"]  # newest first
    assert store.count_tasks(in_a) == len(listed)
    first = store.list_tasks(limit=1, where=in_a)
    assert [
        row.key.task_id for row in store.list_tasks(limit=5, before=first[0].cursor, where=in_a)
    ] == listed[1:]
    assert store.count_tasks(TaskFilter(context_id="nope")) == 0
    by_id = store.list_tasks(limit=5, where=TaskFilter(task_id="c-2"))
    assert [row.key for row in by_id] == [records[2].key]
    back = store.get_task(records[2].key)
    assert back is not None and back.task.payload == {"text": "nul \x00 inside"}


# --- the outbox -----------------------------------------------------------------------------------


async def test_the_outbox_and_its_dead_letters_survive_a_restart(backend: Backend) -> None:
    if not backend.durable:
        pytest.skip("a memory store keeps nothing across a restart")
    store = backend.open()
    for seq in (3, 1, 5, 2, 4):
        store.add_outbox(outbox_item(seq))
    store.add_outbox(outbox_item(9, "msg-1"))  # the same message again: the first is kept
    store.remove_outbox("msg-5")
    store.dead_letter("msg-2", "undeliverable: connection refused", T0 + 99)
    await store.commit()
    snapshot = (await backend.reopen(store)).load()
    assert snapshot.outbox == [outbox_item(1), outbox_item(3), outbox_item(4)]
    assert snapshot.dead_letters == [
        DeadLetter(outbox_item(2), "undeliverable: connection refused", T0 + 99)
    ]


async def test_next_seq_increases_and_continues_after_a_restart(backend: Backend) -> None:
    store = backend.open()
    seqs = [store.next_seq() for _ in range(5)]
    assert seqs == sorted(set(seqs))
    store.add_outbox(outbox_item(seqs[-1]))
    await store.commit()
    if backend.durable:
        store = await backend.reopen(store)
        assert store.next_seq() > seqs[-1]  # new messages sort after the kept ones


# --- dedup ----------------------------------------------------------------------------------------


async def test_dedup_entries_round_trip_replace_and_delete(backend: Backend) -> None:
    if not backend.durable:
        pytest.skip("the memory dedup table keeps its own entries (tests/p2p)")
    store = backend.open()
    entries = [dedup_entry(f"m-{n}", T0 + n, status=200 if n % 2 else 400) for n in range(4)]
    for entry in entries:
        store.put_dedup(entry)
    store.put_dedup(dedup_entry("m-3", T0 + 30, status=409))
    store.delete_dedup([entries[0].key, ("someone", "unknown")])
    await store.commit()
    store = await backend.reopen(store)
    assert store.get_dedup(entries[0].key) is None
    assert store.get_dedup(entries[1].key) == entries[1]
    assert store.get_dedup(entries[2].key) == entries[2]
    replaced = store.get_dedup(entries[3].key)
    assert replaced is not None and replaced.reply.status == 409 and replaced.expires_at == T0 + 30


# --- retention ------------------------------------------------------------------------------------


async def test_purge_removes_old_finished_work_and_expired_dedup_only(backend: Backend) -> None:
    store = backend.open()
    duo = Duo(store, MemoryStore())
    old = duo.submit(task_id="old")
    duo.complete(old)
    live = duo.submit(task_id="live")  # live tasks are never purged, however old
    cutoff = duo.tick(100)
    new = duo.submit(task_id="new")
    duo.complete(new)
    store.put_dedup(dedup_entry("expired", cutoff - 1))
    store.put_dedup(dedup_entry("current", cutoff + 1000))
    store.add_outbox(outbox_item(1, "dead-old"))
    store.dead_letter("dead-old", "gave up", cutoff - 50)
    await store.commit()
    removed = 0
    while (batch := await store.purge(finished_before=cutoff, now=cutoff, limit=1)) >= 1:
        removed += batch
    assert store.get_task(old) is None
    assert store.get_task(new) is not None
    if backend.durable:
        assert removed == 3  # the old task, the expired dedup entry, the old dead letter
        assert store.get_dedup(("agent-r", "expired")) is None
        assert store.get_dedup(("agent-r", "current")) is not None
        store = await backend.reopen(store)
        assert [t.key for t in store.load().tasks] == [live]
        assert store.load().dead_letters == []
    else:
        assert removed >= 1
