"""specs/protocol.md, 'Normal task' end to end: submit, confirm or reject, progress, complete or
fail; capabilities.

Two real peers on 127.0.0.1, requests signed in header and in body mode.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import math
from datetime import UTC, datetime, timedelta

from flowkit import FAST, WAIT, E, Pair, PairFactory, R, collect, eventually

from synapse.demo.handler import DemoHandler
from synapse.transport.peer import Peer
from synapse.types import HeartbeatStatus, TaskState


def kinds(events: list[object]) -> list[str]:
    return [e.kind for e in events]  # type: ignore[attr-defined]


async def test_echo_completes_with_its_text(pair: Pair) -> None:
    handle = await pair.r.submit(E, "echo", {"text": "你好, peer"})
    events = await collect(handle)
    outcome = await asyncio.wait_for(handle, WAIT)
    assert outcome.ok and outcome.state is TaskState.COMPLETED
    assert outcome.result is not None
    assert (outcome.result.output_type, outcome.result.output) == ("text", "你好, peer")
    assert kinds(events) == ["p2p:task_confirm", "p2p:task_status_update", "p2p:task_complete"]
    first_update = events[1].message
    assert first_update is not None and first_update.payload.status is TaskState.EXECUTING
    pair.assert_states_agree(handle.task_id, TaskState.COMPLETED)
    pair.assert_signed_in_mode()
    # The requester acknowledged the completion with a task_ack naming its own final state.
    [ack] = pair.seen(R, "reply_out", "task_ack", handle.task_id)
    assert ack.message.payload.state is TaskState.COMPLETED


async def test_slow_reports_progress_in_order_then_completes(pair: Pair) -> None:
    steps = 7
    handle = await pair.r.submit(E, "slow", {"steps": steps, "delay": 0.01})
    events = await collect(handle)
    assert (await asyncio.wait_for(handle, WAIT)).ok
    updates = [e.message.payload for e in events if e.kind == "p2p:task_status_update"]
    assert updates[0].status is TaskState.EXECUTING and updates[0].progress is None
    progress = [u.progress for u in updates[1:]]
    assert progress == [math.floor(100 * i / steps) for i in range(1, steps + 1)]
    assert kinds(events)[0] == "p2p:task_confirm" and kinds(events)[-1] == "p2p:task_complete"
    assert handle.record.progress == 100
    pair.assert_states_agree(handle.task_id, TaskState.COMPLETED)
    pair.assert_signed_in_mode()


async def test_callbacks_of_one_task_arrive_one_at_a_time_in_order(pair: Pair) -> None:
    handle = await pair.r.submit(E, "slow", {"steps": 20, "delay": 0})
    await collect(handle)
    task_id = handle.task_id
    sent = [s for s in pair.seen(E, "out", task_id=task_id)]
    received = [s for s in pair.seen(R, "in", task_id=task_id)]
    # R received exactly what E sent, in the same order.
    assert [s.message.id for s in received] == [s.message.id for s in sent]
    assert len(sent) == 22  # executing, 20 steps, complete
    # E posted each callback only after the previous one was acknowledged.
    acks = pair.seen(E, "reply_in", task_id=None)
    for earlier, later in itertools.pairwise(sent):
        ack = next(a for a in acks if a.message.reply_to == earlier.message.id)
        assert ack.seq < later.seq
    # And R acknowledged each before the next one reached it.
    replies = pair.seen(R, "reply_out")
    for earlier, later in itertools.pairwise(received):
        reply = next(r for r in replies if r.message.reply_to == earlier.message.id)
        assert reply.seq < later.seq
        assert reply.type in ("p2p:ack", "p2p:task_ack")


async def test_a_failing_task_fails_with_execution_failed_recoverable(pair: Pair) -> None:
    handle = await pair.r.submit(E, "fail", {})
    events = await collect(handle)
    outcome = await asyncio.wait_for(handle, WAIT)
    assert outcome.state is TaskState.FAILED and not outcome.ok
    assert outcome.error is not None
    assert outcome.error.code == "execution_failed" and outcome.error.recoverable is True
    assert kinds(events) == ["p2p:task_confirm", "p2p:task_status_update", "p2p:task_failed"]
    pair.assert_states_agree(handle.task_id, TaskState.FAILED)
    pair.assert_signed_in_mode()


async def test_an_unknown_type_is_rejected_with_capability_lacking(pair: Pair) -> None:
    handle = await pair.r.submit(E, "teleport", {"to": "mars"})
    events = await collect(handle)
    outcome = await asyncio.wait_for(handle, WAIT)
    assert outcome.state is TaskState.REJECTED
    assert outcome.reject is not None and outcome.reject.reason.code == "capability_lacking"
    assert kinds(events) == ["p2p:task_reject"]
    pair.assert_states_agree(handle.task_id, TaskState.REJECTED)
    # A reject is the synchronous answer, HTTP 200: no callback ever follows it.
    assert pair.seen(E, "out", task_id=handle.task_id) == []


async def test_a_task_the_handler_refuses_is_rejected_with_invalid_params(pair: Pair) -> None:
    handle = await pair.r.submit(E, "slow", {"steps": 0})
    outcome = await asyncio.wait_for(handle, WAIT)
    assert outcome.state is TaskState.REJECTED
    assert outcome.reject is not None and outcome.reject.reason.code == "invalid_params"
    pair.assert_states_agree(handle.task_id, TaskState.REJECTED)


async def test_many_tasks_at_once_all_end_and_both_sides_agree(pair: Pair) -> None:
    handles = [await pair.r.submit(E, "echo", {"text": f"#{i}"}) for i in range(20)]
    handles += [await pair.r.submit(E, "fail", {}) for _ in range(3)]
    outcomes = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), WAIT)
    assert [o.result.output for o in outcomes[:20] if o.result] == [f"#{i}" for i in range(20)]
    assert {o.state for o in outcomes[20:]} == {TaskState.FAILED}
    assert pair.r.protocol.list_tasks() == pair.e.protocol.list_tasks()
    assert len(pair.e.protocol.list_tasks()) == 23


async def test_capability_query_filtered_and_unfiltered(pair: Pair) -> None:
    everything = await asyncio.wait_for(pair.r.capabilities(E), WAIT)
    assert everything.agent_id == E
    assert [c.name for c in everything.capabilities] == [
        "echo",
        "slow",
        "text_generation",
        "portrait",
        "fail",
    ]
    assert everything.max_concurrent_tasks == FAST.max_concurrent_tasks
    slow = await asyncio.wait_for(pair.r.capabilities(E, "slow"), WAIT)
    assert [c.name for c in slow.capabilities] == ["slow"]
    assert slow.capabilities[0].input_schema is not None
    none = await asyncio.wait_for(pair.r.capabilities(E, "Slow"), WAIT)
    assert none.capabilities == []
    # Either side may ask: both directions are signed the same way.
    back = await asyncio.wait_for(pair.e.capabilities(R, "echo"), WAIT)
    assert back.agent_id == R and [c.name for c in back.capabilities] == ["echo"]
    pair.assert_signed_in_mode()
    queries = pair.seen(E, "in", "capability_query") + pair.seen(R, "in", "capability_query")
    assert len(queries) == 4


async def test_a_deadline_already_past_is_rejected_with_execution_timeout(pair: Pair) -> None:
    past = datetime.now(UTC) - timedelta(seconds=1)
    handle = await pair.r.submit(E, "echo", {"text": "late"}, deadline=past)
    outcome = await asyncio.wait_for(handle, WAIT)
    assert outcome.state is TaskState.REJECTED
    assert outcome.reject is not None and outcome.reject.reason.code == "execution_timeout"
    pair.assert_states_agree(handle.task_id, TaskState.REJECTED)


async def test_at_max_concurrent_tasks_a_new_one_is_rejected_rate_limited(
    make_pair: PairFactory,
) -> None:
    one_at_a_time = dataclasses.replace(FAST, max_concurrent_tasks=1, capacity_retry_after=7)
    async with make_pair("body", config=one_at_a_time) as pair:
        busy = await pair.r.submit(E, "slow", {"steps": 50, "delay": 0.02})
        await eventually(lambda: busy.state is TaskState.EXECUTING)
        status, _ = await asyncio.wait_for(pair.r.ping(E), WAIT)
        assert status.status is HeartbeatStatus.BUSY and status.active_tasks == 1
        extra = await pair.r.submit(E, "echo", {"text": "no room"})
        outcome = await asyncio.wait_for(extra, WAIT)
        assert outcome.state is TaskState.REJECTED and outcome.reject is not None
        assert outcome.reject.reason.code == "rate_limited"
        assert outcome.reject.alternatives is not None
        assert outcome.reject.alternatives.retry_after == 7
        await busy.cancel()
        assert (await asyncio.wait_for(busy, WAIT)).state is TaskState.CANCELLED
        # Room again: a new attempt is a new task, and it runs.
        again = await pair.r.submit(E, "echo", {"text": "room"})
        assert (await asyncio.wait_for(again, WAIT)).ok


async def test_flows_work_midway_through_a_secret_rotation() -> None:
    """R already signs with the new secret; E still signs with the old one and accepts both."""
    old, new = "secret-2025", "secret-2026"
    async with (
        Peer(R, handler=DemoHandler(), config=FAST, signing_mode="body") as r,
        Peer(E, handler=DemoHandler(), config=FAST) as e,
    ):
        r.add_partner(E, e.endpoint, (new, old))
        e.add_partner(R, r.endpoint, (old, new))
        handle = await r.submit(E, "slow", {"steps": 3, "delay": 0})
        assert (await asyncio.wait_for(handle, WAIT)).ok
        assert (await asyncio.wait_for(e.capabilities(R, "echo"), WAIT)).capabilities
        # A peer that knows only the retired secret is refused.
        e.add_partner(R, r.endpoint, ("secret-2024",))
        refused = await r.submit(E, "echo", {"text": "x"})
        outcome = await asyncio.wait_for(refused, WAIT)
        assert outcome.state is TaskState.REJECTED and outcome.reject is None
        assert outcome.refusal is not None and outcome.refusal.code == "permission_denied"
