"""specs/protocol.md, 'Missing information' end to end: `task_need_info` as the synchronous reply,
`task_info_provided`, then
executing again (first callback: a status update `executing`) and complete."""

from __future__ import annotations

import asyncio

from flowkit import WAIT, E, Pair, R, collect

from synapse.p2p.engine import TaskEvent
from synapse.types import TaskState


async def test_need_info_then_provide_info_then_complete(pair: Pair) -> None:
    handle = await pair.r.submit(E, "text_generation", {"prompt": "秋夜"})

    async def react(event: TaskEvent) -> None:
        if event.kind == "p2p:task_need_info":
            assert pair.r.protocol.get_task_status(handle.task_id) is TaskState.INFO_NEEDED
            assert pair.e.protocol.get_task_status(handle.task_id, R) is TaskState.INFO_NEEDED
            await handle.provide_info({"style": "浪漫"}, notes="by the test")

    events = await collect(handle, react)
    outcome = await asyncio.wait_for(handle, WAIT)
    kinds = [e.kind for e in events]
    assert kinds == ["p2p:task_need_info", "p2p:task_status_update", "p2p:task_complete"]

    need = events[0].message
    assert need is not None
    [missing] = need.payload.missing_fields
    assert missing.field == "style"
    assert missing.suggested_value == "古典"
    assert missing.alternatives == ["现代", "浪漫"]
    # It was the synchronous reply to the task_request, not a callback.
    [request] = pair.seen(R, "out", "task_request", handle.task_id)
    assert need.reply_to == request.message.id
    assert pair.seen(E, "out", "task_need_info") == []

    resumed = events[1].message
    assert resumed is not None and resumed.payload.status is TaskState.EXECUTING
    assert outcome.ok and outcome.result is not None
    assert "秋夜" in str(outcome.result.output) and "浪漫" in str(outcome.result.output)
    # Executing again without any task_confirm.
    assert pair.seen(R, "reply_in", "task_confirm") == []
    assert pair.seen(R, "in", "task_confirm") == []

    [provided] = pair.seen(E, "in", "task_info_provided", handle.task_id)
    assert provided.message.payload.fields == {"style": "浪漫"}
    [ack] = pair.seen(E, "reply_out", "task_ack", handle.task_id)
    assert ack.message.reply_to == provided.message.id
    executor_states = [t.to_state for t in pair.e.protocol.engine.get(handle.key).history]
    assert executor_states == [
        TaskState.INFO_NEEDED,
        TaskState.INFO_PROVIDED,
        TaskState.EXECUTING,
        TaskState.COMPLETED,
    ]
    pair.assert_states_agree(handle.task_id, TaskState.COMPLETED)
    pair.assert_signed_in_mode()


async def test_with_every_field_given_it_confirms_at_once(pair: Pair) -> None:
    handle = await pair.r.submit(E, "text_generation", {"prompt": "海", "style": "现代"})
    events = await collect(handle)
    assert next(e.kind for e in events) == "p2p:task_confirm"
    outcome = await asyncio.wait_for(handle, WAIT)
    assert outcome.result is not None and "海" in outcome.result.output
    pair.assert_states_agree(handle.task_id, TaskState.COMPLETED)
