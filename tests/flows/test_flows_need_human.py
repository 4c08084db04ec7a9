"""specs/protocol.md, 'Human decision' end to end: `task_need_human`, a person deciding,
`human_decision`; approve
completes, reject fails with `permission_denied` (not recoverable)."""

from __future__ import annotations

import asyncio

from flowkit import WAIT, E, Pair, R, collect

from synapse.p2p.engine import TaskEvent
from synapse.types import DecisionAction, TaskState


async def test_approve_completes(pair: Pair) -> None:
    handle = await pair.r.submit(E, "portrait", {"subject": "李白"})

    async def react(event: TaskEvent) -> None:
        if event.kind == "p2p:task_need_human":
            assert event.state is TaskState.NEED_HUMAN
            await handle.start_deciding()
            assert handle.state is TaskState.HUMAN_DECIDING
            # The person's deliberation is R's own business: E still waits in need_human.
            assert pair.e.protocol.get_task_status(handle.task_id, R) is TaskState.NEED_HUMAN
            await handle.approve({"authorized": True}, notes="ok")

    events = await collect(handle, react)
    outcome = await asyncio.wait_for(handle, WAIT)
    assert [e.kind for e in events] == [
        "p2p:task_confirm",
        "p2p:task_status_update",
        "p2p:task_need_human",
        "p2p:task_status_update",
        "p2p:task_complete",
    ]
    need = events[2].message
    assert need is not None
    assert need.payload.reason.code == "ethical_decision"
    assert [o.field for o in need.payload.options] == ["authorized"]
    resumed = events[3].message
    assert resumed is not None and resumed.payload.status is TaskState.EXECUTING
    assert outcome.ok and outcome.result is not None
    assert "李白" in outcome.result.output
    assert outcome.result.metadata == {"approved_fields": {"authorized": True}}

    [decision] = pair.seen(E, "in", "human_decision", handle.task_id)
    assert decision.message.payload.decision.action is DecisionAction.APPROVE
    assert decision.message.payload.reply_to == need.id
    requester = [t.to_state for t in handle.record.history]
    assert requester == [
        TaskState.PENDING,
        TaskState.CONFIRMED,
        TaskState.EXECUTING,
        TaskState.NEED_HUMAN,
        TaskState.HUMAN_DECIDING,
        TaskState.HUMAN_APPROVED,
        TaskState.EXECUTING,
        TaskState.COMPLETED,
    ]
    executor = [t.to_state for t in pair.e.protocol.engine.get(handle.key).history]
    assert executor == [
        TaskState.CONFIRMED,
        TaskState.EXECUTING,
        TaskState.NEED_HUMAN,
        TaskState.HUMAN_APPROVED,
        TaskState.EXECUTING,
        TaskState.COMPLETED,
    ]
    pair.assert_states_agree(handle.task_id, TaskState.COMPLETED)
    pair.assert_signed_in_mode()


async def test_reject_fails_with_permission_denied_not_recoverable(pair: Pair) -> None:
    handle = await pair.r.submit(E, "portrait", {"subject": "someone"})

    async def react(event: TaskEvent) -> None:
        if event.kind == "p2p:task_need_human":
            await handle.start_deciding()
            await handle.reject("no authorization")

    events = await collect(handle, react)
    outcome = await asyncio.wait_for(handle, WAIT)
    assert outcome.state is TaskState.FAILED
    assert outcome.error is not None
    assert outcome.error.code == "permission_denied" and outcome.error.recoverable is False
    assert [e.kind for e in events][-2:] == ["p2p:task_need_human", "p2p:task_failed"]
    executor = [t.to_state for t in pair.e.protocol.engine.get(handle.key).history]
    assert executor[-2:] == [TaskState.HUMAN_REJECTED, TaskState.FAILED]
    assert TaskState.HUMAN_REJECTED in [t.to_state for t in handle.record.history]
    assert pair.seen(E, "out", "task_complete", handle.task_id) == []
    pair.assert_states_agree(handle.task_id, TaskState.FAILED)
    pair.assert_signed_in_mode()


async def test_a_decision_without_deliberation_is_accepted_too(pair: Pair) -> None:
    handle = await pair.r.submit(E, "portrait", {"subject": "x"})

    async def react(event: TaskEvent) -> None:
        if event.kind == "p2p:task_need_human":
            await handle.approve()

    await collect(handle, react)
    assert (await asyncio.wait_for(handle, WAIT)).ok
    pair.assert_states_agree(handle.task_id, TaskState.COMPLETED)
