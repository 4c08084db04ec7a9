"""Issue 3 item 10: every transition and every message in or out is one structlog event with
task id, message id, type and the states around it; partner reachability is queryable."""

from __future__ import annotations

import asyncio

import msgspec
from flowkit import WAIT, E, Pair, R, eventually

from synapse.logs import capture_events
from synapse.types import TaskState


async def test_one_event_per_transition_and_per_message(pair: Pair) -> None:
    with capture_events() as logs:
        handle = await pair.r.submit(E, "echo", {"text": "logged"})
        outcome = await asyncio.wait_for(handle, WAIT)
        # The last reply_in (E reading R's task_ack) is logged just after the outcome.
        await eventually(
            lambda: any(
                e["event"] == "reply_in"
                and e.get("task_id") == handle.task_id
                and e.get("type") == "p2p:task_ack"
                for e in logs
            )
        )
    assert outcome.state is TaskState.COMPLETED
    task_logs = [e for e in logs if e.get("task_id") == handle.task_id]

    transitions = [e for e in task_logs if e["event"] == "transition"]
    assert {(e["role"], e["from_state"], e["to_state"]) for e in transitions} >= {
        ("requester", "idle", "pending"),
        ("requester", "pending", "confirmed"),
        ("requester", "executing", "completed"),
        ("executor", "idle", "confirmed"),
        ("executor", "confirmed", "executing"),
        ("executor", "executing", "completed"),
    }
    for event in transitions:
        assert event["requester"] == R and event["trigger"]

    received = [e for e in task_logs if e["event"] == "message_in"]
    assert [e["type"] for e in received] == [
        "p2p:task_request",  # at E
        "p2p:task_status_update",  # at R
        "p2p:task_complete",  # at R
    ]
    request, update, complete = received
    assert (request["from_state"], request["to_state"]) == (None, "executing")
    assert (update["from_state"], update["to_state"]) == ("confirmed", "executing")
    assert (complete["from_state"], complete["to_state"]) == ("executing", "completed")
    for event in received:
        assert event["message_id"].startswith("msg-") and event["status"] == 200

    sent = [e for e in task_logs if e["event"] == "message_out"]
    assert [e["type"] for e in sent] == [
        "p2p:task_request",
        "p2p:task_status_update",
        "p2p:task_complete",
    ]
    replies = [e for e in task_logs if e["event"] == "reply_in"]
    assert [e["type"] for e in replies] == ["p2p:task_confirm", "p2p:ack", "p2p:task_ack"]
    assert all(e["reply_to"] and e["message_id"] for e in replies)


async def test_refused_messages_are_logged_with_an_unchanged_state(pair: Pair) -> None:
    handle = await pair.r.submit(E, "echo", {"text": "once"})
    await asyncio.wait_for(handle, WAIT)
    with capture_events() as logs:
        await handle.cancel()  # already final: nothing is sent
        again = await pair.r.submit(E, "nope", {})
        await asyncio.wait_for(again, WAIT)
    [request] = [e for e in logs if e["event"] == "message_in" and e["task_id"] == again.task_id]
    assert request["reply"] == "p2p:task_reject" and request["to_state"] == "rejected"


async def test_partner_status_lists_who_is_reachable(pair: Pair) -> None:
    handle = await pair.r.submit(E, "echo", {"text": "hello"})
    await asyncio.wait_for(handle, WAIT)
    assert pair.r.protocol.partner_status() == {E: True}
    assert pair.e.protocol.partner_status() == {R: True}


async def test_the_runtime_tells_the_transport_what_it_logs(pair: Pair) -> None:
    """The transport logs from the runtime's `Receipt`, not from the engine: a message about a
    finished task (looked up in the store) is refused with its state unchanged."""
    handle = await pair.r.submit(E, "echo", {"text": "receipt"})
    await asyncio.wait_for(handle, WAIT)
    [complete] = pair.seen(R, "in", "task_complete", handle.task_id)

    # Another task_complete (a new id) about the finished task: refused, nothing changes.
    other = msgspec.structs.replace(complete.message, id="msg-another-complete")
    receipt = await pair.r.protocol.receive_message(other, states=True)
    assert receipt.reply is None and receipt.error is not None
    assert receipt.error.code.value == "task_already_completed"
    assert receipt.task_id == handle.task_id
    assert receipt.from_state is receipt.to_state is TaskState.COMPLETED
    # The same task_complete again, however late: answered as it was, applied never again.
    receipt = await pair.r.protocol.receive_message(complete.message, states=True)
    assert receipt.error is None and receipt.reply is not None
    assert receipt.reply.message_type.value == "p2p:task_ack"
    assert receipt.from_state is receipt.to_state is TaskState.COMPLETED

    quiet = await pair.r.protocol.receive_message(other)  # states not asked for
    assert quiet.error is not None and quiet.from_state is quiet.to_state is None
