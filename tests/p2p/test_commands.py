"""Commands as values: what the requester and the running handler tell the engine is one
frozen value each, carried out by `Engine.handle(command, now)`, the same as the method it
names; a command the task's state does not allow is refused and changes nothing."""

from __future__ import annotations

import dataclasses

import pytest
from pairing import E_ID, Pair

from synapse.p2p.commands import (
    Cancel,
    Complete,
    Fail,
    ProvideInfo,
    ReportStatus,
    Submit,
)
from synapse.types import (
    ErrorCode,
    LocalProtocolError,
    MessageType,
    TaskError,
    TaskResult,
    TaskState,
)


def test_a_command_is_a_frozen_value() -> None:
    command = Cancel(key=None, reason="no longer needed")  # type: ignore[arg-type]
    with pytest.raises(dataclasses.FrozenInstanceError):
        command.reason = "changed"  # type: ignore[misc]
    assert command == Cancel(key=None, reason="no longer needed")  # type: ignore[arg-type]


def test_handle_carries_out_each_command_as_its_method_does() -> None:
    by_method, by_value = Pair(deterministic_ids=True), Pair(deterministic_ids=True)
    key, step = by_method.r.submit(E_ID, "echo", {"text": "hi"}, now=by_method.now)
    by_method.absorb(by_method.r, step)
    step = by_value.r.handle(Submit(E_ID, "echo", {"text": "hi"}), by_value.now)
    by_value.absorb(by_value.r, step)
    assert step.transitions[0].key == key  # a submitted task's key: its first transition's
    for pair in (by_method, by_value):
        pair.deliver_all()
    assert by_method.states(key) == by_value.states(key) == (TaskState.EXECUTING,) * 2
    result = TaskResult(output_type="text", output="hi")
    by_method.absorb(by_method.e, by_method.e.report_status(key, now=by_method.now, progress=50))
    by_value.absorb(by_value.e, by_value.e.handle(ReportStatus(key, progress=50), by_value.now))
    by_method.absorb(by_method.e, by_method.e.complete(key, result, now=by_method.now))
    by_value.absorb(by_value.e, by_value.e.handle(Complete(key, result), by_value.now))
    for pair in (by_method, by_value):
        pair.deliver_all()
    assert by_method.states(key) == by_value.states(key) == (TaskState.COMPLETED,) * 2
    assert [t.to_state for t in by_method.rec(E_ID, key).history] == [
        t.to_state for t in by_value.rec(E_ID, key).history
    ]


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
