"""Restart recovery in-process: `Peer`s with `SqliteStore`s, stopped and started again.

Two peers on fixed ports of 127.0.0.1 (so that a restarted peer is found where it was), each
with its own SQLite file and a fast `P2PConfig`. Stopping a peer here is orderly (its buffered
writes are committed); the crash cases, SIGKILL of a real process, are in `tests/faults`.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from storekit import free_port

from synapse.demo.handler import DemoHandler
from synapse.p2p.config import P2PConfig
from synapse.p2p.engine import TaskKey, TaskRecord
from synapse.runtime.handler import ExecutionContext
from synapse.store import SqliteStore
from synapse.transport.partners import Partner
from synapse.transport.peer import Peer
from synapse.types import (
    SIGNATURE_HEADER,
    Sender,
    TaskRequest,
    TaskRequestPayload,
    TaskSpec,
    TaskState,
    build_message_now,
    encode_message,
    header_signature,
    refreshed,
)

E, R = "agent-e", "agent-r"
SECRET = "restart-secret-0123456789abcdefg"
FAST = P2PConfig(
    max_retries=1,
    retry_base_delay=0.02,
    retry_max_delay=0.05,
    heartbeat_interval=0.2,
    request_timeout=2.0,
)


def url(port: int) -> str:
    return f"http://127.0.0.1:{port}/synapse/callback"


class Handler(DemoHandler):
    """The demo handler, counting its executions; resumable on restart if asked."""

    def __init__(self, resumable: bool = False) -> None:
        self.resumable = resumable
        self.executions: Counter[str] = Counter()

    def is_resumable(self, task_type: str) -> bool:
        return self.resumable

    async def execute_task(
        self, ctx: ExecutionContext, task_type: str, payload: dict[str, Any]
    ) -> Any:
        self.executions[ctx.task_id] += 1
        return await super().execute_task(ctx, task_type, payload)


@dataclass
class Node:
    """One peer that can be stopped and started again on the same port and file."""

    agent_id: str
    port: int
    path: Path
    partner: str
    partner_port: int
    config: P2PConfig = FAST
    handler: Handler = field(default_factory=Handler)
    peer: Peer | None = None

    async def start(self) -> Peer:
        assert self.peer is None
        self.peer = Peer(
            self.agent_id,
            partners=[Partner(self.partner, url(self.partner_port), (SECRET,))],
            handler=self.handler,
            port=self.port,
            config=self.config,
            store=SqliteStore(self.path),
        )
        await self.peer.start()
        return self.peer

    async def stop(self) -> None:
        if self.peer is not None:
            await self.peer.close(drain_timeout=0.0)
            self.peer = None

    @property
    def running(self) -> Peer:
        assert self.peer is not None
        return self.peer

    def record(self, task_id: str, requester: str = R) -> TaskRecord | None:
        return self.running.protocol.engine.get(TaskKey(requester, task_id))

    def state(self, task_id: str) -> TaskState | None:
        rec = self.record(task_id)
        return rec.state if rec else None


async def until(probe: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout} s: {what}")
        await asyncio.sleep(0.02)


@pytest.fixture
async def nodes(tmp_path: Path) -> AsyncIterator[Callable[..., tuple[Node, Node]]]:
    made: list[Node] = []

    def make(e_config: P2PConfig = FAST, resumable: bool = False) -> tuple[Node, Node]:
        pe, pr = free_port(), free_port()
        e = Node(E, pe, tmp_path / "e.sqlite", R, pr, e_config, Handler(resumable))
        r = Node(R, pr, tmp_path / "r.sqlite", E, pe)
        made.extend((e, r))
        return e, r

    yield make
    for node in made:
        await node.stop()


def applied_updates(rec: TaskRecord) -> list[str | None]:
    return [t.message_id for t in rec.history if t.event.value == "recv task_status_update"]


async def test_tasks_and_their_history_survive_a_restart(
    nodes: Callable[..., tuple[Node, Node]],
) -> None:
    e, r = nodes()
    await e.start()
    await r.start()
    handle = await r.running.submit(E, "echo", {"text": "kept"})
    outcome = await handle.result(10)
    assert outcome.ok
    await until(lambda: e.state(handle.task_id) is TaskState.COMPLETED)
    r_before, e_before = r.record(handle.task_id), e.record(handle.task_id)
    assert r_before is not None and e_before is not None
    await r.stop()
    await e.stop()

    await e.start()
    await r.start()
    r_after, e_after = r.record(handle.task_id), e.record(handle.task_id)
    assert r_after == r_before and e_after == e_before  # every field, history included
    assert [t.to_state for t in r_after.history] == [
        TaskState.PENDING,
        TaskState.CONFIRMED,
        TaskState.EXECUTING,
        TaskState.COMPLETED,
    ]
    # The requester's handle of a restored task is settled with its outcome.
    again = r.running.protocol.handle(handle.key)
    assert again is not None
    restored = await again.result(1)
    assert restored.ok and restored.result is not None and restored.result.output == "kept"
    assert e.handler.executions == {handle.task_id: 1}


async def test_undelivered_callbacks_are_resent_after_a_restart(
    nodes: Callable[..., tuple[Node, Node]],
) -> None:
    e, r = nodes()
    await e.start()
    await r.start()
    steps = 4
    handle = await r.running.submit(E, "slow", {"steps": steps, "delay": 0.1})
    task_id = handle.task_id
    await until(lambda: r.state(task_id) is TaskState.EXECUTING)

    await r.stop()  # the requester goes down ...
    await until(lambda: e.state(task_id) is TaskState.COMPLETED, what="E completes")
    await until(lambda: e.running.protocol.pending_deliveries > 0)
    await e.stop()  # ... and the executor too, with callbacks still undelivered
    probe = SqliteStore(e.path)
    undelivered = probe.load().outbox
    await probe.close()
    assert undelivered and {i.key for i in undelivered} == {TaskKey(R, task_id)}
    assert [i.seq for i in undelivered] == sorted(i.seq for i in undelivered)

    await e.start()  # the executor comes back first: its outbox parks, R is still down
    await until(lambda: R in e.running.protocol.engine._backlog, what="E parks its outbox")
    await r.start()  # R restores its task and keeps waiting; E resends after a heartbeat
    restored = r.running.protocol.handle(TaskKey(R, task_id))
    assert restored is not None
    outcome = await restored.result(10)
    assert outcome.ok, outcome

    rec = r.record(task_id)
    assert rec is not None
    updates = applied_updates(rec)
    assert len(updates) == steps + 1 and len(set(updates)) == len(updates), rec.history
    await until(lambda: e.running.protocol.pending_deliveries == 0)
    await e.stop()
    probe = SqliteStore(e.path)
    assert probe.load().outbox == []
    await probe.close()
    assert e.handler.executions == {task_id: 1}


def signed_request(task_id: str, r_port: int) -> tuple[TaskRequest, bytes, dict[str, str]]:
    message = build_message_now(
        TaskRequest,
        TaskRequestPayload(task=TaskSpec(id=task_id, type="echo", payload={"text": "t"})),
        sender=Sender(agent_id=R, endpoint=url(r_port)),
        to=E,
    )
    body = encode_message(message)
    headers = {"Content-Type": "application/json", SIGNATURE_HEADER: header_signature(SECRET, body)}
    return message, body, headers


async def test_the_dedup_table_survives_a_restart(nodes: Callable[..., tuple[Node, Node]]) -> None:
    e, r = nodes()
    await e.start()  # R is never started: E's callbacks just wait in its outbox
    message, body, headers = signed_request("dedup-1", r.port)
    async with aiohttp.ClientSession() as session:

        async def post(data: bytes, hdrs: dict[str, str]) -> tuple[int, bytes, str]:
            async with session.post(url(e.port), data=data, headers=hdrs) as resp:
                return resp.status, await resp.read(), resp.headers[SIGNATURE_HEADER]

        first = await post(body, headers)
        assert first[0] == 200 and b'"p2p:task_confirm"' in first[1]
        await e.stop()
        await e.start()
        # The same bytes after the restart: the stored reply, byte for byte, signature too.
        assert await post(body, headers) == first
        # A retry (same id, new timestamp and signature): the same stored reply.
        retry = encode_message(refreshed(message))
        retry_headers = {**headers, SIGNATURE_HEADER: header_signature(SECRET, retry)}
        assert await post(retry, retry_headers) == first
    assert e.handler.executions == {"dedup-1": 1}


@pytest.mark.parametrize("resumable", [False, True], ids=["failed", "resumed"])
async def test_an_interrupted_executor_task_is_failed_or_resumed(
    nodes: Callable[..., tuple[Node, Node]], resumable: bool
) -> None:
    e, r = nodes(resumable=resumable)
    await e.start()
    await r.start()
    handle = await r.running.submit(E, "slow", {"steps": 30, "delay": 0.05})
    await until(lambda: r.state(handle.task_id) is TaskState.EXECUTING)
    await e.stop()  # the handler is cancelled; the task stays `executing` in the store
    await e.start()

    outcome = await handle.result(10)
    if resumable:
        assert outcome.ok, outcome
        assert e.handler.executions == {handle.task_id: 2}
    else:
        assert outcome.state is TaskState.FAILED
        assert outcome.error is not None
        assert (outcome.error.code, outcome.error.message, outcome.error.recoverable) == (
            "execution_failed",
            "interrupted by restart",
            True,
        )
        assert e.handler.executions == {handle.task_id: 1}


async def test_an_undeliverable_callback_becomes_a_dead_letter_and_can_be_retried(
    nodes: Callable[..., tuple[Node, Node]],
) -> None:
    config = P2PConfig(
        max_retries=1,
        retry_base_delay=0.02,
        retry_max_delay=0.05,
        heartbeat_interval=0.2,
        request_timeout=2.0,
        dead_letter_after=0.5,
    )
    e, r = nodes(e_config=config)
    await e.start()
    await r.start()
    handle = await r.running.submit(E, "slow", {"steps": 3, "delay": 0.2})
    task_id = handle.task_id
    await until(lambda: r.state(task_id) is TaskState.EXECUTING)
    await r.stop()  # before the completion could be delivered, say
    await until(lambda: e.state(task_id) is TaskState.COMPLETED)

    rec = e.record(task_id)
    assert rec is not None
    # R never answers again: past `dead_letter_after` the messages become dead letters.
    await until(
        lambda: e.running.protocol.pending_deliveries == 0,
        timeout=5,
        what="the outbox given up on",
    )
    await e.stop()
    store = SqliteStore(e.path)
    snapshot = store.load()
    assert snapshot.outbox == []
    dead = [d.item.message_id for d in snapshot.dead_letters]
    assert dead and all(d.reason.startswith("undeliverable") for d in snapshot.dead_letters)
    assert rec.is_final and all(t.key != rec.key for t in snapshot.tasks)  # finished: not loaded
    kept = store.get_task(rec.key)  # … but kept, and found by key
    assert kept is not None and kept.dead_letters == dead  # the task's record says so
    # A person puts them back (`synapse outbox --retry`): delivered at the next start.
    assert all(store.retry_dead_letter(message_id) for message_id in dead)
    await store.close()

    await r.start()
    await e.start()
    restored = r.running.protocol.handle(TaskKey(R, task_id))
    assert restored is not None
    outcome = await restored.result(10)
    assert outcome.ok and outcome.result is not None
    assert outcome.result.output == "done after 3 steps"
