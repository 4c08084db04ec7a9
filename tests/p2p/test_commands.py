"""Commands as values: what the requester and the running handler tell the engine is one
frozen value each, carried out by `Engine.handle(command, now)`, the same as the method it
names; a command the task's state does not allow is refused and changes nothing."""

from __future__ import annotations

import dataclasses

import msgspec
import pytest
from pairing import E_ID, Pair

from synapse.p2p.commands import (
    Cancel,
    Complete,
    Fail,
    ProvideInfo,
    ReportStatus,
    RequestHuman,
    RequestInfo,
    Submit,
)
from synapse.p2p.engine import Engine
from synapse.types import (
    ErrorCode,
    LocalProtocolError,
    MessageType,
    TaskCompletePayload,
    TaskError,
    TaskNeedHumanPayload,
    TaskNeedInfoPayload,
    TaskResult,
    TaskState,
    TaskStatusUpdatePayload,
)


def test_a_command_is_a_frozen_value() -> None:
    command = Cancel(key=None, reason="no longer needed")  # type: ignore[arg-type]
    with pytest.raises(dataclasses.FrozenInstanceError):
        command.reason = "changed"  # type: ignore[misc]
    assert command == Cancel(key=None, reason="no longer needed")  # type: ignore[arg-type]


def test_submit_and_handle_request_the_same_task() -> None:
    """`Engine.submit` is `handle(Submit)` that also returns the new task's key."""
    with_key, by_handle = Pair(deterministic_ids=True), Pair(deterministic_ids=True)
    key, step = with_key.r.submit(Submit(E_ID, "echo", {"text": "hi"}), with_key.now)
    with_key.absorb(with_key.r, step)
    step = by_handle.r.handle(Submit(E_ID, "echo", {"text": "hi"}), by_handle.now)
    by_handle.absorb(by_handle.r, step)
    assert step.transitions[0].key == key  # a submitted task's key: its first transition's
    for pair in (with_key, by_handle):
        pair.deliver_all()
    assert with_key.states(key) == by_handle.states(key) == (TaskState.EXECUTING,) * 2
    result = TaskResult(output_type="text", output="hi")
    for pair in (with_key, by_handle):
        pair.absorb(pair.e, pair.e.handle(ReportStatus(key, progress=50), pair.now))
        pair.absorb(pair.e, pair.e.handle(Complete(key, result), pair.now))
        pair.deliver_all()
    assert with_key.states(key) == by_handle.states(key) == (TaskState.COMPLETED,) * 2
    assert [t.to_state for t in with_key.rec(E_ID, key).history] == [
        t.to_state for t in by_handle.rec(E_ID, key).history
    ]


#: The commands whose fields are their message payload's, under the same names.
CARRIED = {
    ReportStatus: TaskStatusUpdatePayload,
    RequestInfo: TaskNeedInfoPayload,
    RequestHuman: TaskNeedHumanPayload,
    Complete: TaskCompletePayload,
}


@pytest.mark.parametrize("command", list(CARRIED), ids=lambda c: c.__name__)
def test_a_command_carries_its_payload_fields_by_their_names(command: type) -> None:
    """The engine builds these payloads from the command's fields as they are, so a field is
    declared on the payload and on the command, and nowhere else in the engine."""
    fields = {f.name for f in dataclasses.fields(command)} - {"key"}
    assert fields <= _names(CARRIED[command])


def _names(struct: type) -> set[str]:
    return {f.name for f in msgspec.structs.fields(struct)}


def test_a_progress_field_reaches_the_wire_from_the_command() -> None:
    pair = Pair(deterministic_ids=True)
    key, step = pair.r.submit(Submit(E_ID, "echo", {"text": "hi"}), pair.now)
    pair.absorb(pair.r, step)
    pair.deliver_all()
    step = pair.e.handle(ReportStatus(key, 40.0, "halfway", {"draft": 1}), pair.now)
    (out,) = step.outgoing
    assert isinstance(out.message.payload, TaskStatusUpdatePayload)
    payload = out.message.payload
    assert (payload.progress, payload.message, payload.intermediate_result) == (
        40.0,
        "halfway",
        {"draft": 1},
    )
    assert payload.status is TaskState.EXECUTING


def test_the_engine_has_one_way_in_per_command() -> None:
    """Commands are values: no keyword twin of a command on the engine, and a small surface."""
    public = [name for name in dir(Engine) if not name.startswith("_")]
    twins = {"provide_info", "start_deciding", "decide", "cancel", "report_status"}
    twins |= {"request_info", "request_human", "complete", "fail", "request"}
    assert not twins & set(public)
    assert len(public) <= 32, public


def test_a_command_the_state_does_not_allow_is_refused_and_changes_nothing() -> None:
    pair = Pair()
    key = pair.submit()
    pair.deliver_all()
    before = pair.r.snapshot()
    # The task executes: nobody asked for information, so none can be provided.
    with pytest.raises(LocalProtocolError):
        pair.r.handle(ProvideInfo(key, {"style": "modern"}), pair.now)
    assert pair.r.snapshot() == before
    error = TaskError(code=ErrorCode.EXECUTION_FAILED.value, message="boom")
    pair.absorb(pair.e, pair.e.handle(Fail(key, error), pair.now))
    assert pair.queued(E_ID) == [MessageType.TASK_FAILED]
