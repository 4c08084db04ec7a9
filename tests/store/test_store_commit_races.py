"""A message refused because its commit failed takes back its own writes, and only those.

While a message's commit is in flight (here: held at a gate, then failed by a real SQLite
write lock) the other tasks go on: a handler completes and buffers its final record and its
`task_complete`. The refused message must not drop those writes on its way out, nor put back
engine state that someone else changed meanwhile: the completion is stored by the next commit
that succeeds, delivered once, and a restart neither runs the handler again nor builds a
second final callback with another id.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from diskfaults import write_lock
from rawpost import eventually
from storekit import E_ID, E_URL, R_ID, R_URL, T0

from synapse.p2p.commands import Cancel, RequestInfo, Submit
from synapse.p2p.engine import Engine, TaskKey, Transition
from synapse.runtime.delivering import restart_pause
from synapse.runtime.handler import ExecutionContext, Validation
from synapse.runtime.listener import RuntimeListener
from synapse.runtime.protocol import P2PProtocol
from synapse.store import SqliteStore
from synapse.store.base import FencedOut, OutboxItem, StoreUnavailable
from synapse.types import (
    ErrorCode,
    LocalProtocolError,
    Message,
    MessageType,
    MissingField,
    NotReady,
    TaskState,
)


class GatedStore(SqliteStore):
    """A `SqliteStore` whose writer thread waits at a gate the test opens: a commit is then
    surely in flight (its batch taken) while the test makes other writes."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, busy_timeout=0.05)
        self.gate = threading.Event()
        self.gate.set()
        self.at_gate = threading.Event()

    def _write(self, ops: Any, keep: int, kept: Any = None) -> None:
        self.at_gate.set()
        assert self.gate.wait(timeout=30), "the test never opened the gate"
        super()._write(ops, keep, kept)


class Handler:
    """Reports progress, then runs until the test lets it finish; counts its runs."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.returned = asyncio.Event()
        self.runs = 0

    async def execute_task(
        self, ctx: ExecutionContext, task_type: str, payload: dict[str, Any]
    ) -> Any:
        self.runs += 1
        await ctx.progress(0.5)
        await self.release.wait()
        self.returned.set()
        return "done"

    def validate_task(self, task_type: str, payload: dict[str, Any]) -> Validation:
        return Validation()

    def get_capabilities(self) -> list[str]:
        return ["work"]

    def is_resumable(self, task_type: str) -> bool:
        return True  # a restart that forgot the completion would run it, and complete, again


class Partner:
    """`agent-r`: answers every callback with its requester engine, and keeps what came.
    While `answer` is clear it holds its answer to the callbacks (the delivery worker waits)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.received: list[Message] = []
        self.answer = asyncio.Event()
        self.answer.set()

    async def send_callback(self, partner: str, message: Message, *, retry: bool = True) -> Message:
        self.received.append(message)
        await self.answer.wait()
        reply = self.engine.receive(message, T0).reply
        assert reply is not None
        return reply

    def finals(self, task_id: str) -> set[str]:
        return {
            m.id
            for m in self.received
            if m.message_type in (MessageType.TASK_COMPLETE, MessageType.TASK_FAILED)
            and getattr(m.payload, "task_id", None) == task_id
        }


def request(r: Engine, task_id: str) -> Message:
    _, step = r.submit(Submit(E_ID, "work", {}, task_id=task_id), T0)
    (out,) = step.outgoing
    return out.message


async def cancel_of_a_running_task(
    e: P2PProtocol, r: Engine, partner: Partner, key: TaskKey
) -> Message:
    """Task `key` requested of `e` and running (its progress durable): the requester's
    cancel of it."""
    asked = request(r, key.task_id)
    reply = await e.handle_message(asked)
    r.on_reply(asked, reply, T0)
    await eventually(lambda: len(partner.received) == 1, timeout=20)
    await e.commit()
    (cancel,) = r.handle(Cancel(key, reason="changed my mind"), T0).outgoing
    return cancel.message


@contextlib.asynccontextmanager
async def refused_at_the_gate(
    e: P2PProtocol, store: GatedStore, db: Path, message: Message
) -> AsyncIterator[None]:
    """`message` handled by `e`, its commit held at the store's gate while the caller acts,
    then let go on to fail (the database locked): the message is refused, retryable."""
    with write_lock(db):
        store.gate.clear()
        store.at_gate.clear()
        refused = asyncio.create_task(e.handle_message(message))
        await eventually(store.at_gate.is_set, timeout=20)
        yield
        store.gate.set()
        with pytest.raises(NotReady):
            await refused


async def test_a_refused_message_keeps_the_writes_others_made_during_its_commit(
    tmp_path: Path,
) -> None:
    db = tmp_path / "e.sqlite"
    r = Engine(agent_id=R_ID, endpoint=R_URL)
    partner = Partner(r)
    handler = Handler()
    store = GatedStore(db)
    e = P2PProtocol(agent_id=E_ID, endpoint=E_URL, handler=handler, sender=partner, store=store)
    before = TaskKey(R_ID, "before")
    async with e:
        partner.answer.clear()
        reply = await e.handle_message(request(r, "before"))
        assert reply.message_type is MessageType.TASK_CONFIRM
        # Its handler reports progress; the delivery worker is busy POSTing that update, so
        # what comes next for `before` stays buffered until that worker's next commit.
        await eventually(lambda: len(partner.received) == 1, timeout=20)
        await e.commit()  # nothing buffered when `during` comes

        with write_lock(db):
            store.gate.clear()
            store.at_gate.clear()
            during = asyncio.create_task(e.handle_message(request(r, "during")))
            await eventually(store.at_gate.is_set, timeout=20)
            # Meanwhile `before`'s handler finishes: its writes are buffered.
            handler.release.set()
            done = TaskState.COMPLETED
            await eventually(lambda: e.get_task_status("before", R_ID) is done, timeout=20)
            store.gate.set()
            with pytest.raises(NotReady) as refused:
                await during
            assert refused.value.code is ErrorCode.AGENT_NOT_READY
            assert refused.value.details == {"reason": "store_unavailable"}
        partner.answer.set()

        # The store writes again: the final callback goes out, once.
        await eventually(lambda: bool(partner.finals("before")), timeout=20)
        await eventually(lambda: before not in e._queues, timeout=20)
        await e.commit()
        # Nothing is counted any more: `before` ended, `during` was never taken.
        assert e.engine.active_executor_tasks() == 0
        assert e.engine.in_flight_with(R_ID) == 0
        assert e.engine._executing_for == {}
    stored = store.get_task(before)
    assert stored is not None and stored.is_final, stored
    await store.close()

    # A restart: the completion was stored, so nothing runs again, nothing is built again.
    handler2 = Handler()
    handler2.release.set()
    store2 = SqliteStore(db)
    e2 = P2PProtocol(agent_id=E_ID, endpoint=E_URL, handler=handler2, sender=partner, store=store2)
    e2.restore(store2.load())
    async with e2:
        rec = e2.task_record(before) or store2.get_task(before)
        assert rec is not None and rec.state in (TaskState.COMPLETED, TaskState.FAILED), rec
        assert e2.get_task_status("during", R_ID) is None  # refused: left no trace
        await eventually(lambda: not e2._workers, timeout=20)
    await store2.close()
    assert handler2.runs == 0
    assert len(partner.finals("before")) == 1, partner.received


async def test_a_refused_cancel_leaves_a_task_its_handler_finished_meanwhile_finished(
    tmp_path: Path,
) -> None:
    """The refused message is about the very task whose handler completes during its
    commit: rolling the task back would forget a completion already stored and queued."""
    db = tmp_path / "e.sqlite"
    r = Engine(agent_id=R_ID, endpoint=R_URL)
    partner = Partner(r)
    handler = Handler()
    store = GatedStore(db)
    e = P2PProtocol(agent_id=E_ID, endpoint=E_URL, handler=handler, sender=partner, store=store)
    key = TaskKey(R_ID, "t")
    async with e:
        cancel = await cancel_of_a_running_task(e, r, partner, key)
        async with refused_at_the_gate(e, store, db, cancel):
            handler.release.set()
            await eventually(handler.returned.is_set, timeout=20)
        # The cancel was refused: the handler's completion stands, and is delivered.
        await eventually(lambda: bool(partner.finals("t")), timeout=20)
        await eventually(lambda: key not in e._queues, timeout=20)
        await e.commit()
        final = e.get_task_status("t", R_ID)
        assert final is TaskState.COMPLETED, final
        assert e.engine.active_executor_tasks() == 0
    stored = store.get_task(key)
    assert stored is not None and stored.state is final, stored
    assert len(partner.finals("t")) == 1, partner.received
    await store.close()


async def test_a_task_let_go_during_a_failed_commit_is_not_brought_back(tmp_path: Path) -> None:
    """Replicas: a message's commit fails (the database is locked) after its task was let go
    meanwhile (its lease found lost by a renewal). Undoing the message must not put the task
    back in memory: a stale copy there would take a person's answers, fire timers and keep
    its handle waiting while another replica runs the task."""
    db = tmp_path / "e.sqlite"
    r = Engine(agent_id=R_ID, endpoint=R_URL)
    partner = Partner(r)
    store = GatedStore(db)
    e = P2PProtocol(agent_id=E_ID, endpoint=E_URL, handler=Handler(), sender=partner, store=store)
    key = TaskKey(R_ID, "t")
    async with e:
        cancel = await cancel_of_a_running_task(e, r, partner, key)
        async with refused_at_the_gate(e, store, db, cancel):
            e.release(key)  # meanwhile the renewal finds the lease lost
        assert not e.view.holds(key)
        assert e.get_task_status("t", R_ID) is not TaskState.CANCELLED
        assert e.engine.active_executor_tasks() == 0
    await store.close()


class Executor:
    """`agent-e` as a sans-IO engine: confirms the requester's POSTs, keeps them."""

    def __init__(self) -> None:
        self.engine = Engine(agent_id=E_ID, endpoint=E_URL)
        self.engine.capabilities = lambda: ("work",)
        self.received: list[Message] = []

    async def send_callback(self, partner: str, message: Message, *, retry: bool = True) -> Message:
        self.received.append(message)
        reply = self.engine.receive(message, T0).reply
        assert reply is not None
        return reply


async def test_a_person_answers_a_question_only_once_it_is_durable(tmp_path: Path) -> None:
    """A `task_need_info` is being committed when the person answers it: the answer waits.
    The commit fails, the question is undone, and the answer is refused (there is no
    question): it is never built on a question that vanished, nor sent."""
    db = tmp_path / "r.sqlite"
    executor = Executor()
    store = GatedStore(db)
    r = P2PProtocol(agent_id=R_ID, endpoint=R_URL, sender=executor, store=store)
    async with r:
        handle = await r.submit(Submit(E_ID, "work", {}, task_id="t"))
        await eventually(lambda: handle.state is TaskState.CONFIRMED, timeout=20)
        key = TaskKey(R_ID, "t")
        (question,) = executor.engine.handle(
            RequestInfo(key, [MissingField(field="size")], question="size?", required_by=None), T0
        ).outgoing
        with write_lock(db):
            store.gate.clear()
            store.at_gate.clear()
            asked = asyncio.create_task(r.handle_message(question.message))
            await eventually(store.at_gate.is_set, timeout=20)
            answer = asyncio.create_task(handle.provide_info({"size": 3}))
            store.gate.set()
            with pytest.raises(NotReady) as refused:
                await asked
            assert refused.value.code is ErrorCode.AGENT_NOT_READY
        with pytest.raises(LocalProtocolError):
            await answer
        assert handle.state is TaskState.CONFIRMED
        events = [t.event.value for t in handle.record.history]
        assert "recv task_need_info" not in events
        assert "send task_info_provided" not in events
        sent = [m.message_type for m in executor.received]
        assert MessageType.TASK_INFO_PROVIDED not in sent
    await store.close()


async def test_submit_returns_once_the_task_is_durable(tmp_path: Path) -> None:
    """A crash the moment `submit` returns finds the task in the store."""
    db = tmp_path / "r.sqlite"
    executor = Executor()
    store = GatedStore(db)
    r = P2PProtocol(agent_id=R_ID, endpoint=R_URL, sender=executor, store=store)
    async with r:
        store.gate.clear()
        store.at_gate.clear()
        submitting = asyncio.create_task(r.submit(Submit(E_ID, "work", {}, task_id="t")))
        await eventually(store.at_gate.is_set, timeout=20)
        assert not submitting.done()  # its commit is held at the gate
        # What the file holds now is what a crash would leave: nothing yet.
        reader = SqliteStore(db)
        assert reader.get_task(TaskKey(R_ID, "t")) is None
        store.gate.set()
        await submitting
        assert reader.get_task(TaskKey(R_ID, "t")) is not None
        await reader.close()
    await store.close()


class FencingStore(SqliteStore):
    """A `SqliteStore` whose next commit (once `fence_next` is set) is fenced out: another
    replica took over `lost`, a task other than the message's own."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.fence_next: frozenset[TaskKey] | None = None

    async def commit(self, *, discard_after: int | None = None) -> None:
        lost, self.fence_next = self.fence_next, None
        if lost is not None:
            if discard_after is not None:
                self.discard(discard_after)
            raise FencedOut("another replica owns the task now; retry", lost)
        await super().commit(discard_after=discard_after)


async def test_a_message_refused_for_another_tasks_lost_lease_lets_its_own_task_go_on(
    tmp_path: Path,
) -> None:
    """A commit fenced out names the tasks lost, which may be other tasks of the same batch.
    Letting those go must not leave the message's own task held as if its commit still ran:
    every later message about it, and its deliveries, would wait for that hold forever."""
    r = Engine(agent_id=R_ID, endpoint=R_URL)
    partner = Partner(r)
    handler = Handler()
    store = FencingStore(tmp_path / "e.sqlite")
    e = P2PProtocol(agent_id=E_ID, endpoint=E_URL, handler=handler, sender=partner, store=store)
    key = TaskKey(R_ID, "t")
    async with e:
        asked = request(r, "t")
        r.on_reply(asked, await e.handle_message(asked), T0)
        (cancel,) = r.handle(Cancel(key, reason="changed my mind"), T0).outgoing
        store.fence_next = frozenset({TaskKey(R_ID, "another")})
        with pytest.raises(NotReady):
            await e.handle_message(cancel.message)
        # The same cancel, sent again, is applied (not left waiting for a commit long over).
        reply = await asyncio.wait_for(e.handle_message(cancel.message), 10)
        assert reply.message_type is MessageType.TASK_ACK
        assert e.get_task_status("t", R_ID) is TaskState.CANCELLED
    await store.close()


class Transitions(RuntimeListener):
    def __init__(self) -> None:
        self.seen: list[tuple[str, TaskState]] = []

    def on_transition(self, transition: Transition) -> None:
        self.seen.append((transition.key.task_id, transition.to_state))


async def test_an_outcome_of_a_task_let_go_before_its_commit_is_not_announced(
    tmp_path: Path,
) -> None:
    """Between replicas, a step applied outside a message (a handler's outcome, a timer) is
    announced once the commit carrying its writes is done. If the task is let go before that
    (its lease lost: the commit drops its writes, another replica's outcome stands), the
    outcome is not announced here: announced means durable."""
    r = Engine(agent_id=R_ID, endpoint=R_URL)
    partner = Partner(r)
    handler = Handler()
    store = GatedStore(tmp_path / "e.sqlite")
    e = P2PProtocol(agent_id=E_ID, endpoint=E_URL, handler=handler, sender=partner, store=store)
    told = Transitions()
    e.listeners.append(told)
    lost, kept = TaskKey(R_ID, "lost"), TaskKey(R_ID, "kept")
    async with e:
        for task_id in ("lost", "kept"):
            reply = await e.handle_message(request(r, task_id))
            assert reply.message_type is MessageType.TASK_CONFIRM
        await eventually(lambda: len(partner.received) == 2, timeout=20)  # both progressed
        await e.commit()
        store.gate.clear()
        store.at_gate.clear()
        handler.release.set()  # both handlers return: two completions, applied and buffered
        await eventually(store.at_gate.is_set, timeout=20)  # their commit is in flight
        e.release(lost)  # meanwhile the lease of one is found lost
        store.gate.set()
        await eventually(lambda: ("kept", TaskState.COMPLETED) in told.seen, timeout=20)
        await e.commit()
    assert ("lost", TaskState.COMPLETED) not in told.seen
    assert e.get_task_status(kept.task_id, R_ID) is not TaskState.EXECUTING
    await store.close()


class FlakyGate:
    """Between replicas, the claim of each outbox row before its POST: this one cannot reach
    the shared store for its first `failures` claims of a `task_complete` (the task's last
    message: no later one starts a worker)."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.failed = 0

    async def __call__(self, item: OutboxItem) -> str:
        completes = f'"{MessageType.TASK_COMPLETE.value}"'.encode() in item.body
        if completes and self.failed < self.failures:
            self.failed += 1
            raise ConnectionError("the database went away")
        return "send"


@contextlib.asynccontextmanager
async def one_task_run(
    tmp_path: Path, partner: Partner, gate: FlakyGate | None = None
) -> AsyncIterator[P2PProtocol]:
    """`agent-e` on SQLite, the task `t` requested of it and its handler let go: the caller
    watches what reaches `partner`."""
    worker = Handler()
    store = SqliteStore(tmp_path / "e.sqlite")
    e = P2PProtocol(agent_id=E_ID, endpoint=E_URL, sender=partner, store=store)
    e.set_task_handler(worker)
    e.delivery_gate = gate
    async with e:
        asked = request(partner.engine, "t")
        partner.engine.on_reply(asked, await e.handle_message(asked), T0)
        worker.release.set()
        yield e
    await store.close()


async def test_a_claim_that_cannot_reach_the_store_is_asked_again_not_given_up(
    tmp_path: Path,
) -> None:
    partner = Partner(Engine(agent_id=R_ID, endpoint=R_URL))
    gate = FlakyGate(failures=3)
    async with one_task_run(tmp_path, partner, gate):
        await eventually(lambda: partner.finals("t"), timeout=20)
        assert gate.failed == 3
        assert len(partner.finals("t")) == 1


class FailingOnce(Partner):
    """A partner whose first `task_complete` meets an error no delivery expects (not a
    `DeliveryError`)."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self.failed: list[Message] = []

    async def send_callback(self, partner: str, message: Message, *, retry: bool = True) -> Message:
        if message.message_type is MessageType.TASK_COMPLETE and not self.failed:
            self.failed.append(message)
            raise RuntimeError("an error no delivery expects")
        return await super().send_callback(partner, message, retry=retry)


async def test_a_delivery_worker_stopped_by_an_unforeseen_error_leaves_no_message_behind(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    partner = FailingOnce(Engine(agent_id=R_ID, endpoint=R_URL))
    async with one_task_run(tmp_path, partner) as e:
        await eventually(lambda: partner.finals("t"), timeout=20)
        (failed,) = partner.failed
        assert partner.finals("t") == {failed.id}  # sent again, by a worker started again
        await eventually(lambda: e.get_task_status("t", R_ID) is TaskState.COMPLETED, timeout=20)
    assert "delivery_worker_failed" in caplog.text


async def test_a_submit_waits_out_a_store_that_cannot_be_read(tmp_path: Path) -> None:
    """A submit looks its task id up in the store (a finished task keeps it); a store that
    cannot be read then (the database out of reach) is waited out, as a commit that fails
    is, rather than raised to the caller of a call that could not have changed anything."""
    store = SqliteStore(tmp_path / "e.sqlite")
    e = P2PProtocol(
        agent_id=E_ID,
        endpoint=E_URL,
        sender=Partner(Engine(agent_id=R_ID, endpoint=R_URL)),
        store=store,
    )
    lookups: list[TaskKey] = []

    def away_twice(key: TaskKey) -> Any:
        lookups.append(key)
        if len(lookups) <= 2:
            raise StoreUnavailable("the database cannot be reached")
        return store.get_task(key)

    async with e:
        e.engine.finished_lookup = away_twice
        handle = await e.submit(Submit(R_ID, "work", {}, task_id="t"))
        assert handle.key == TaskKey(E_ID, "t")
        assert len(lookups) == 3
        assert e.get_task_status("t", E_ID) is not None
    await store.close()


def test_a_worker_stopped_again_and_again_waits_longer_each_time() -> None:
    """An error that comes back every time a worker starts is not logged every 2 s for the
    life of the process: the pause doubles, up to five minutes."""
    pauses = [restart_pause(n) for n in range(1, 12)]
    assert pauses[:4] == [2.0, 4.0, 8.0, 16.0]
    assert pauses == sorted(pauses)
    assert max(pauses) == 300.0
