"""The store kit: what every `TaskStore` backend must do, as checks any backend runs.

A new backend is: implement `synapse.store.base.TaskStore`, then run `STORE_CHECKS` against it
(tests/store/test_store_backends.py runs them on memory, SQLite and PostgreSQL; docs/durability.md
shows a backend's own test module, ten lines). Each check gets a `StoreBackend`, which opens
stores on one location (a file, a database) so that a durable backend can be closed and
opened again the way a restarted process would.

The records the checks store are real: `Duo` wires a requester engine and an executor engine
back to back on a fake clock and saves every step's transitions to each side's store, the way
the runtime does, so a store sees exactly what it would in a peer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from synapse.p2p.commands import Complete, ReportStatus, Submit
from synapse.p2p.dedup import StoredReply
from synapse.p2p.engine import Engine, Step, TaskKey, TaskRecord
from synapse.p2p.states import Role
from synapse.store.base import DeadLetter, DedupEntry, OutboxItem, TaskFilter, TaskStore
from synapse.store.holding import StoreInUse
from synapse.store.memory import MemoryStore
from synapse.types import (
    Message,
    TaskContext,
    TaskResult,
    TaskSpec,
    TaskState,
    encode_message,
)

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
R_ID, E_ID = "agent-r", "agent-e"
R_URL, E_URL = "http://127.0.0.1:1/r", "http://127.0.0.1:2/e"


class FakeClock:
    """A fake clock the test moves by hand (`clock.now += 11`)."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def save(store: TaskStore, engine: Engine, step: Step) -> None:
    """What `P2PProtocol._persist` does with a step: each touched task and its transitions."""
    by_task: dict[TaskKey, list[Any]] = {}
    for transition in step.transitions:
        by_task.setdefault(transition.key, []).append(transition)
    for key, transitions in by_task.items():
        rec = engine.get(key)
        assert rec is not None
        store.put_task(rec, transitions)


@dataclass
class Duo:
    r_store: TaskStore
    e_store: TaskStore
    now: float = T0
    r: Engine = field(init=False)
    e: Engine = field(init=False)
    #: Every message POSTed, in order (requests and callbacks).
    sent: list[Message] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.r = Engine(agent_id=R_ID, endpoint=R_URL)
        self.e = Engine(agent_id=E_ID, endpoint=E_URL)
        self.e.capabilities = lambda: ("echo", "slow")

    def tick(self, seconds: float = 1.0) -> float:
        self.now += seconds
        return self.now

    def deliver(self, sender: Engine, step: Step) -> None:
        """Save `step`, then POST its outgoing messages to the other engine, recursively."""
        store = self.r_store if sender is self.r else self.e_store
        save(store, sender, step)
        receiver = self.e if sender is self.r else self.r
        receiver_store = self.e_store if sender is self.r else self.r_store
        for out in step.outgoing:
            self.sent.append(out.message)
            got = receiver.receive(out.message, self.tick())
            save(receiver_store, receiver, got)
            assert got.reply is not None
            self.deliver(sender, sender.on_reply(out.message, got.reply, self.tick()))
            self.deliver(receiver, Step(outgoing=got.outgoing))

    def submit(self, task_type: str = "echo", task_id: str = "t-1") -> TaskKey:
        key, step = self.r.submit(
            Submit(E_ID, task_type, {"text": "hi"}, task_id=task_id), self.tick()
        )
        self.deliver(self.r, step)
        return key

    def progress(self, key: TaskKey, percent: float) -> None:
        self.deliver(self.e, self.e.handle(ReportStatus(key, progress=percent), self.tick()))

    def complete(self, key: TaskKey) -> None:
        result = TaskResult(output_type="text", output="hi")
        self.deliver(self.e, self.e.handle(Complete(key, result), self.tick()))

    def record(self, side: str, key: TaskKey) -> TaskRecord:
        rec = (self.r if side == "r" else self.e).get(key)
        assert rec is not None
        return rec


def outbox_item(seq: int, message_id: str | None = None, *, task: str | None = "t-1") -> OutboxItem:
    return OutboxItem(
        seq=seq,
        message_id=message_id or f"msg-{seq}",
        partner=R_ID,
        key=TaskKey(R_ID, task) if task is not None else None,
        body=f'{{"n":{seq}}}'.encode(),
        created_at=T0 + seq,
    )


def message_item(seq: int, message: Message, key: TaskKey | None) -> OutboxItem:
    return OutboxItem(seq, message.id, message.to.agent_id, key, encode_message(message), T0)


def dedup_entry(message_id: str, expires_at: float, *, status: int = 200) -> DedupEntry:
    reply = StoredReply.of(
        status,
        f'{{"reply_to":"{message_id}"}}'.encode(),
        {"Content-Type": "application/json", "X-Synapse-Signature": "sha256=" + "ab" * 32},
    )
    return DedupEntry((R_ID, message_id), b"\x01" * 32, expires_at, reply)


class StoreBackend:
    """Opens stores of one backend on one location, and closes what it opened."""

    def __init__(self, name: str, make: Callable[[], TaskStore], *, durable: bool) -> None:
        self.name = name
        self.make = make
        #: Whether what a store commits survives closing it (not a memory store).
        self.durable = durable
        self.opened: list[TaskStore] = []

    def open(self) -> TaskStore:
        store = self.make()
        self.opened.append(store)
        return store

    async def reopen(self, store: TaskStore) -> TaskStore:
        """Close `store` and open the same location again (a restart)."""
        await store.close()
        self.opened.remove(store)
        return self.open()

    async def close(self) -> None:
        for store in self.opened:
            await store.close()
        self.opened.clear()


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


async def check_a_finished_task_is_looked_up_by_key_with_its_history(backend: StoreBackend) -> None:
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


async def check_live_tasks_come_back_at_start_and_finished_ones_do_not(
    backend: StoreBackend,
) -> None:
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


async def check_listing_pages_newest_first_with_filters_and_counts(backend: StoreBackend) -> None:
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


async def check_listing_by_context_and_by_task_id(backend: StoreBackend) -> None:
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


async def check_the_outbox_and_its_dead_letters_survive_a_restart(backend: StoreBackend) -> None:
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


async def check_next_seq_increases_and_continues_after_a_restart(backend: StoreBackend) -> None:
    store = backend.open()
    seqs = [store.next_seq() for _ in range(5)]
    assert seqs == sorted(set(seqs))
    store.add_outbox(outbox_item(seqs[-1]))
    await store.commit()
    if backend.durable:
        store = await backend.reopen(store)
        assert store.next_seq() > seqs[-1]  # new messages sort after the kept ones


# --- dedup ----------------------------------------------------------------------------------------


async def check_dedup_entries_round_trip_replace_and_delete(backend: StoreBackend) -> None:
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


async def check_purge_removes_old_finished_work_and_expired_dedup_only(
    backend: StoreBackend,
) -> None:
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


async def check_one_process_holds_the_store_at_a_time(backend: StoreBackend) -> None:
    """A second store on the location is refused the hold (`StoreInUse`) while the first has
    it, and gets it once the first is closed: two processes never serve one store."""
    first, second = backend.open(), backend.open()
    first.hold()
    first.hold()  # idempotent
    try:
        second.hold()
    except StoreInUse:
        pass
    else:
        raise AssertionError("a second store on the location was given the hold")
    await backend.reopen(first)
    second.hold()


@dataclass(frozen=True)
class StoreCheck:
    """One requirement of a backend: `run(backend)` raises AssertionError if it is not met."""

    name: str
    run: Callable[[StoreBackend], Awaitable[None]]
    #: Only a durable backend can meet it (it closes and reopens the store).
    durable_only: bool = False


#: Every check of the kit, in the order the contract reads: tasks, the outbox, dedup, retention.
STORE_CHECKS: tuple[StoreCheck, ...] = (
    StoreCheck("finished task by key", check_a_finished_task_is_looked_up_by_key_with_its_history),
    StoreCheck("live tasks at start", check_live_tasks_come_back_at_start_and_finished_ones_do_not),
    StoreCheck("listing", check_listing_pages_newest_first_with_filters_and_counts),
    StoreCheck("listing by context and id", check_listing_by_context_and_by_task_id),
    StoreCheck(
        "outbox across a restart",
        check_the_outbox_and_its_dead_letters_survive_a_restart,
        durable_only=True,
    ),
    StoreCheck("sequence numbers", check_next_seq_increases_and_continues_after_a_restart),
    StoreCheck("dedup", check_dedup_entries_round_trip_replace_and_delete, durable_only=True),
    StoreCheck("purge", check_purge_removes_old_finished_work_and_expired_dedup_only),
    StoreCheck("one holder", check_one_process_holds_the_store_at_a_time, durable_only=True),
)


def store_checks(*, durable: bool) -> tuple[StoreCheck, ...]:
    """The checks a backend must pass: all of them if it is durable."""
    return tuple(c for c in STORE_CHECKS if durable or not c.durable_only)
