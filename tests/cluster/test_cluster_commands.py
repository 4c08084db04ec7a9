"""A person's answer (or any command of the Python API) on a replica that does not hold the
task: two requester replicas in this process on one PostgreSQL database, an executor asking
for a decision, everything over loopback HTTP.

The replica without the lease has at most a stale copy of the task, read from the store: it
gives no handle to change it, and a change decided on the holder just before its lease was
taken over is refused once its writes are found dropped, instead of being announced."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from pgserver import free_port

from synapse import ExecutionContext, TaskResult, Validation
from synapse.p2p.config import P2PConfig
from synapse.p2p.engine import TaskKey
from synapse.runtime.protocol import TaskHandle
from synapse.store.postgres import PostgresStore
from synapse.transport.peer import Peer
from synapse.transport.replicas import Replicas, enable_replicas
from synapse.types import HumanOption, NotReady, Reason, TaskState

SECRET = "replica-commands-secret-012345678"
TTL = 1.0
CONFIG = P2PConfig(max_retries=30, retry_base_delay=0.05, retry_max_delay=0.3)


class AsksAPerson:
    def get_capabilities(self) -> list[str]:
        return ["deploy"]

    def validate_task(self, task_type: str, payload: dict[str, Any]) -> Validation:
        return Validation()

    async def execute_task(
        self, ctx: ExecutionContext, task_type: str, payload: dict[str, Any]
    ) -> TaskResult:
        answer = await ctx.need_human(
            Reason(code="risky", message="a person decides"),
            options=[HumanOption(field="go", value=True)],
        )
        return TaskResult(output_type="json", output={"by": answer.decided_by.user_id})


async def until_waiting(handle: TaskHandle) -> None:
    """Until the executor's question has reached the requester."""
    async with asyncio.timeout(20):
        async for _event in handle:
            if handle.state is TaskState.NEED_HUMAN:
                return


@dataclass
class Pair:
    a: Peer
    b: Peer
    replicas: tuple[Replicas, Replicas]
    executor: Peer


@pytest.fixture
async def pair(pg_url: str) -> AsyncIterator[Pair]:
    executor_port, a_port, b_port = free_port(), free_port(), free_port()
    executor = Peer(
        "exec", port=executor_port, host="127.0.0.1", handler=AsksAPerson(), config=CONFIG
    )
    peers, getters = [], []
    for port in (a_port, b_port):
        peer = Peer("req", host="127.0.0.1", port=port, store=PostgresStore(pg_url), config=CONFIG)
        getters.append(enable_replicas(peer, peer.store, ttl=TTL))  # type: ignore[arg-type]
        peers.append(peer)
    a, b = peers
    await executor.start()
    for peer in peers:
        await peer.start()
        peer.add_partner("exec", f"http://127.0.0.1:{executor_port}/synapse/callback", (SECRET,))
    # The requester's callbacks go to `a`, which holds every task it submits.
    executor.add_partner("req", f"http://127.0.0.1:{a_port}/synapse/callback", (SECRET,))
    built = tuple(getter() for getter in getters)
    assert built[0] is not None and built[1] is not None
    try:
        yield Pair(a, b, (built[0], built[1]), executor)
    finally:
        for peer in (*peers, executor):
            await peer.close(drain_timeout=0)


async def test_a_replica_without_the_lease_has_no_handle_to_change_the_task(pair: Pair) -> None:
    handle = await pair.a.submit("exec", "deploy", {})
    await until_waiting(handle)
    key = TaskKey("req", handle.task_id)
    # `b` can read the task from the store (not finished) but does not hold it.
    assert key not in pair.b.protocol.engine.tasks and pair.b.store.get_task(key) is not None
    assert pair.b.protocol.handle(key) is None
    await handle.approve()
    outcome = await handle.result(timeout=20)
    assert outcome.result is not None and outcome.result.output == {"by": "req"}


async def test_an_answer_whose_task_was_taken_over_before_it_was_stored_is_refused(
    pair: Pair,
) -> None:
    handle = await pair.a.submit("exec", "deploy", {})
    await until_waiting(handle)
    key = TaskKey("req", handle.task_id)
    # `a` stops renewing (frozen, cut off from the database): once its lease has run out,
    # `b` takes the task over. `a` does not know yet, and a person answers there.
    a_replicas, b_replicas = pair.replicas
    assert a_replicas._loop_task is not None
    a_replicas._loop_task.cancel()
    taken = None
    for _ in range(100):
        taken = await b_replicas.ownership.take_over(key)
        if taken is not None:
            break
        await asyncio.sleep(TTL / 10)  # the lease runs out on the database's clock
    assert taken is not None
    pair.b.protocol.restore(taken)
    with pytest.raises(NotReady, match="another replica"):
        await handle.approve()
    # Nothing of it reached the store, and the new holder takes the answer.
    stored = pair.b.store.get_task(key)
    assert stored is not None and stored.state is TaskState.NEED_HUMAN
    assert not [e for e in stored.audit if e.action == "approve"]
    b_handle = pair.b.protocol.handle(key)
    assert b_handle is not None
    await b_handle.approve()
    assert b_handle.record.state is not TaskState.NEED_HUMAN
