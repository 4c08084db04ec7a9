"""specs/protocol.md, 'Cancellation' end to end: `task_cancel` and its `task_ack`; both sides end
`cancelled` and the
executor sends nothing more about the task (no late `task_complete`)."""

from __future__ import annotations

import asyncio

from flowkit import WAIT, E, Pair, R, collect, eventually

from synapse.p2p.engine import TaskEvent
from synapse.types import TaskState


async def test_cancel_a_slow_task_both_sides_cancelled_nothing_after(pair: Pair) -> None:
    handle = await pair.r.submit(E, "slow", {"steps": 40, "delay": 0.02})

    async def react(event: TaskEvent) -> None:
        message = event.message
        if message is not None and getattr(message.payload, "progress", None):
            await handle.cancel("changed my mind")

    events = await collect(handle, react)
    outcome = await asyncio.wait_for(handle, WAIT)
    assert outcome.state is TaskState.CANCELLED
    assert events[-1].kind == "p2p:task_ack" and events[-1].state is TaskState.CANCELLED
    task_id = handle.task_id
    pair.assert_states_agree(task_id, TaskState.CANCELLED)

    [cancel] = pair.seen(E, "in", "task_cancel", task_id)
    assert cancel.message.payload.reason == "changed my mind"
    [ack] = pair.seen(E, "reply_out", "task_ack", task_id)
    assert ack.message.payload.state is TaskState.CANCELLED
    # The handler was stopped: once its coroutine has ended nothing more can come of it.
    await eventually(lambda: handle.key not in pair.e.protocol._running)
    assert pair.seen(R, "in", "task_complete", task_id) == []
    assert pair.seen(E, "out", "task_complete", task_id) == []
    assert [s for s in pair.seen(E, "out", task_id=task_id) if s.seq > ack.seq] == []
    assert pair.e.protocol.pending_deliveries == 0
    pair.assert_states_agree(task_id, TaskState.CANCELLED)
    pair.assert_signed_in_mode()


async def test_a_cancel_asked_at_once_waits_for_the_reply_to_the_request(pair: Pair) -> None:
    handle = await pair.r.submit(E, "slow", {"steps": 50, "delay": 0.02})
    await handle.cancel()  # before the reply: R must hold it until the task is confirmed
    outcome = await asyncio.wait_for(handle, WAIT)
    assert outcome.state is TaskState.CANCELLED
    [reply] = pair.seen(R, "reply_in", "task_confirm", handle.task_id)
    [cancel] = pair.seen(R, "out", "task_cancel", handle.task_id)
    assert reply.seq < cancel.seq
    pair.assert_states_agree(handle.task_id, TaskState.CANCELLED)


async def test_cancel_while_waiting_for_information_or_a_person(pair: Pair) -> None:
    info = await pair.r.submit(E, "text_generation", {"prompt": "p"})
    human = await pair.r.submit(E, "portrait", {"subject": "s"})

    async def cancel_on(kind: str, handle: object) -> None:
        async def react(event: TaskEvent) -> None:
            if event.kind == kind:
                await handle.cancel()  # type: ignore[attr-defined]

        await collect(handle, react)  # type: ignore[arg-type]

    await asyncio.wait_for(
        asyncio.gather(
            cancel_on("p2p:task_need_info", info), cancel_on("p2p:task_need_human", human)
        ),
        WAIT,
    )
    for handle in (info, human):
        assert (await asyncio.wait_for(handle, WAIT)).state is TaskState.CANCELLED
        pair.assert_states_agree(handle.task_id, TaskState.CANCELLED)
        assert pair.seen(E, "out", "task_complete", handle.task_id) == []


async def test_cancelling_a_finished_task_sends_nothing(pair: Pair) -> None:
    handle = await pair.r.submit(E, "echo", {"text": "done"})
    assert (await asyncio.wait_for(handle, WAIT)).ok
    await handle.cancel()
    # A cancel to send would be queued by now: cancel() applies the engine's step at once.
    assert pair.r.protocol.pending_deliveries == 0
    assert pair.seen(R, "out", "task_cancel") == []
    pair.assert_states_agree(handle.task_id, TaskState.COMPLETED)
