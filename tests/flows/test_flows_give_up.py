"""Nobody waits forever, over real loopback HTTP: a requester gives up on an executor that
falls silent about a task, or that answers `task_not_found` (it lost the task in a restart);
`await handle` ends with `TaskAbandoned`, and `result(timeout=…)` says what it waited for."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import pytest
from flowkit import eventually

from synapse.demo.handler import DemoHandler
from synapse.p2p.config import P2PConfig
from synapse.runtime.handler import ExecutionContext
from synapse.runtime.protocol import TaskAbandoned
from synapse.transport.peer import Peer
from synapse.types import Capability, ErrorCode, TaskState

R, E, SECRET = "agent-r", "agent-e", "give-up-secret"
FAST: dict[str, Any] = {"max_retries": 1, "retry_base_delay": 0.02, "request_timeout": 5}


class SilentHandler(DemoHandler):
    """`hang`: confirmed, started, and then never a word (a handler stuck on I/O, say)."""

    def get_capabilities(self) -> Sequence[Capability]:
        return [*super().get_capabilities(), Capability(name="hang")]

    async def execute_task(
        self, ctx: ExecutionContext, task_type: str, payload: dict[str, Any]
    ) -> Any:
        if task_type == "hang":
            await asyncio.Event().wait()
        return await super().execute_task(ctx, task_type, payload)


@asynccontextmanager
async def peers(r_config: P2PConfig) -> AsyncIterator[tuple[Peer, Peer]]:
    r = Peer(R, config=r_config)
    e = Peer(E, handler=SilentHandler(), config=P2PConfig(**FAST))
    await r.start()
    await e.start()
    r.add_partner(E, e.endpoint, [SECRET])
    e.add_partner(R, r.endpoint, [SECRET])
    try:
        yield r, e
    finally:
        await r.close(0)
        await e.close(0)


async def test_a_silent_executor_ends_the_handle_with_a_clear_exception() -> None:
    # Silence limit: task_timeout 0.5 s + 1 missed heartbeat × 0.25 s.
    config = P2PConfig(task_timeout=0.5, heartbeat_interval=0.25, missed_heartbeat_limit=1, **FAST)
    async with peers(config) as (r, e):
        handle = await r.submit(E, "hang")
        await eventually(lambda: handle.state is TaskState.EXECUTING)
        with pytest.raises(TimeoutError) as waited:
            await handle.result(timeout=0.05)
        text = str(waited.value)
        assert handle.task_id in text and E in text and "0.05 s" in text and "executing" in text
        started = time.monotonic()
        with pytest.raises(TaskAbandoned) as ended:
            await handle
        assert time.monotonic() - started < 5
        error = ended.value.outcome.error
        assert ended.value.outcome.state is TaskState.FAILED and error is not None
        assert error.code == ErrorCode.EXECUTION_TIMEOUT.value
        assert "no word from agent-e" in error.message and handle.task_id in str(ended.value)
        kinds = [event.kind async for event in handle.events()]
        assert kinds[-1] == "gave_up"
        # The executor was told: its task is cancelled, its handler stopped.
        await eventually(lambda: e.protocol.engine.get(handle.key) is not None)
        await eventually(
            lambda: e.protocol.engine.get(handle.key).state is TaskState.CANCELLED  # type: ignore[union-attr]
        )


async def test_task_not_found_from_a_restarted_executor_fails_the_handle_at_once() -> None:
    async with peers(P2PConfig(**FAST)) as (r, e):
        handle = await r.submit(E, "slow", {"steps": 100, "delay": 0.1})
        await eventually(lambda: handle.state is TaskState.EXECUTING)
        port = e.port
        await e.close(0)  # the executor restarts with the memory store: the task is gone
        again = Peer(E, handler=SilentHandler(), config=P2PConfig(**FAST), port=port)
        await again.start()
        again.add_partner(R, r.endpoint, [SECRET])
        try:
            started = time.monotonic()
            await handle.cancel("no longer needed")
            with pytest.raises(TaskAbandoned) as ended:
                await handle.result(timeout=10)
            assert time.monotonic() - started < 5
            error = ended.value.outcome.error
            assert error is not None and error.code == ErrorCode.TASK_NOT_FOUND.value
            assert handle.state is TaskState.FAILED
        finally:
            await again.close(0)


def dead_endpoint() -> str:
    """A URL nobody listens on (bound, then released)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/synapse/callback"


async def test_a_request_to_a_partner_that_never_answers_ends_once_its_deliveries_run_out() -> None:
    from synapse import DeliveryError, TaskUndeliverable

    requester = Peer(R, port=0, config=P2PConfig(**FAST))
    async with requester:
        requester.add_partner("dead", dead_endpoint(), (SECRET,))
        handle = await requester.submit("dead", "echo", {"text": "hi"})
        with pytest.raises(TaskUndeliverable) as raised:
            await handle.result(timeout=10)
        assert isinstance(raised.value, DeliveryError)
        outcome = raised.value.outcome
        assert outcome.state is TaskState.FAILED and outcome.error is not None
        assert outcome.error.code == "undeliverable"
        assert requester.protocol.pending_deliveries == 0  # the request is not retried later
        assert requester.store.load().outbox == []


async def test_waiting_for_the_partner_instead_is_a_setting() -> None:
    config = P2PConfig(**FAST, fail_undelivered_requests=False)
    requester = Peer(R, port=0, config=config)
    async with requester:
        requester.add_partner("dead", dead_endpoint(), (SECRET,))
        handle = await requester.submit("dead", "echo", {"text": "hi"})
        async with asyncio.timeout(10):
            async for event in handle:
                if event.kind == "undeliverable":  # retries ran out: it waits for a heartbeat
                    break
        assert handle.state is TaskState.PENDING
        assert requester.protocol.pending_deliveries == 1
