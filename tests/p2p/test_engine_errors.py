"""What the engine refuses, with which code, and that a refusal changes nothing (specs/protocol.md,
'Order of checks', 'Error codes' and 'Task states')."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from pairing import E_ID, R_ID, Pair, Snapshot, at, style_missing

from synapse.p2p.commands import Cancel, ProvideInfo, ReportStatus, Submit
from synapse.p2p.engine import Engine, TaskKey
from synapse.types import (
    Ack,
    AckPayload,
    DecidedBy,
    Decision,
    DecisionAction,
    ErrorCode,
    HumanDecision,
    HumanDecisionPayload,
    LocalProtocolError,
    Message,
    Nack,
    NackPayload,
    NotReady,
    RemoteProtocolError,
    Sender,
    SynapseError,
    TaskAck,
    TaskAckPayload,
    TaskCancel,
    TaskCancelPayload,
    TaskComplete,
    TaskCompletePayload,
    TaskConfirm,
    TaskConfirmPayload,
    TaskInfoProvided,
    TaskInfoProvidedPayload,
    TaskNeedInfo,
    TaskReject,
    TaskRequest,
    TaskResult,
    TaskState,
    TaskStatusUpdate,
    TaskStatusUpdatePayload,
    build_message_now,
)

S = TaskState
X_ID = "agent-x"
X = Sender(agent_id=X_ID, endpoint="http://x.test/synapse/callback")


def running(pair: Pair, task_type: str = "slow") -> TaskKey:
    key = pair.submit(task_type)
    pair.deliver_all()
    assert pair.states(key) == (S.EXECUTING, S.EXECUTING)
    return key


def refused(engine: Engine, message: Message, now: float) -> SynapseError:
    """`engine.receive(message)` raises; and every task's state and history are unchanged."""
    before = Snapshot.of(engine)
    with pytest.raises(SynapseError) as info:
        engine.receive(message, now)
    assert Snapshot.of(engine) == before
    assert info.value.http_status == info.value.code.http_status
    return info.value


def as_from(sender: Sender, cls: Any, payload: Any, to: str, now: float) -> Message:
    message: Message = build_message_now(cls, payload, sender=sender, to=to, timestamp=at(now))
    return message


def cancel_from(pair: Pair, sender: Sender, task_id: str) -> Message:
    return as_from(sender, TaskCancel, TaskCancelPayload(task_id=task_id), E_ID, pair.now)


def status_from(pair: Pair, sender: Sender, task_id: str, to: str = R_ID) -> Message:
    payload = TaskStatusUpdatePayload(task_id=task_id, status=S.EXECUTING)
    return as_from(sender, TaskStatusUpdate, payload, to, pair.now)


# --- task not found ---------------------------------------------------------------------------


def test_unknown_task_is_not_found(pair: Pair) -> None:
    for engine, message in (
        (pair.e, cancel_from(pair, pair.r.sender, "task-nope")),
        (pair.r, status_from(pair, pair.e.sender, "task-nope")),
    ):
        error = refused(engine, message, pair.now)
        assert error.code is ErrorCode.TASK_NOT_FOUND and error.http_status == 404
        assert error.details == {"task_id": "task-nope"}


def test_a_party_not_of_the_task_gets_404(pair: Pair) -> None:
    key = running(pair)
    # X cancels R's task at E: (X, id) is not a task of E's.
    assert refused(pair.e, cancel_from(pair, X, key.task_id), pair.now).code is (
        ErrorCode.TASK_NOT_FOUND
    )
    # X reports on R's task to R: R's partner for it is E, not X.
    assert refused(pair.r, status_from(pair, X, key.task_id), pair.now).code is (
        ErrorCode.TASK_NOT_FOUND
    )
    complete = as_from(
        X,
        TaskComplete,
        TaskCompletePayload(task_id=key.task_id, result=TaskResult(output_type="text")),
        R_ID,
        pair.now,
    )
    assert refused(pair.r, complete, pair.now).code is ErrorCode.TASK_NOT_FOUND
    assert pair.states(key) == (S.EXECUTING, S.EXECUTING)


def test_wrong_direction_gets_404(pair: Pair) -> None:
    key = running(pair)
    # An E → R type sent by R to the executor side of its own task.
    wrong = [
        status_from(pair, pair.r.sender, key.task_id, to=E_ID),
        as_from(
            pair.r.sender,
            TaskComplete,
            TaskCompletePayload(task_id=key.task_id, result=TaskResult(output_type="text")),
            E_ID,
            pair.now,
        ),
    ]
    for message in wrong:
        assert refused(pair.e, message, pair.now).code is ErrorCode.TASK_NOT_FOUND
    # An R → E type sent by E to the requester side.
    backwards = [
        as_from(pair.e.sender, TaskCancel, TaskCancelPayload(task_id=key.task_id), R_ID, pair.now),
        as_from(
            pair.e.sender,
            TaskInfoProvided,
            TaskInfoProvidedPayload(task_id=key.task_id, fields={}),
            R_ID,
            0,
        ),
    ]
    for message in backwards:
        assert refused(pair.r, message, pair.now).code is ErrorCode.TASK_NOT_FOUND
    assert pair.states(key) == (S.EXECUTING, S.EXECUTING)


# --- state ------------------------------------------------------------------------------------


def test_message_not_allowed_in_the_state(pair: Pair) -> None:
    key = running(pair)
    info = as_from(
        pair.r.sender,
        TaskInfoProvided,
        TaskInfoProvidedPayload(task_id=key.task_id, fields={"style": "古典"}),
        E_ID,
        pair.now,
    )
    error = refused(pair.e, info, pair.now)
    assert error.code is ErrorCode.INVALID_PARAMS and error.http_status == 400
    assert error.details == {"state": "executing", "allowed": ["p2p:task_cancel"]}

    # R waiting for information does not take a status update.
    pair.request_info(key)
    pair.deliver_all()
    assert pair.states(key) == (S.INFO_NEEDED, S.INFO_NEEDED)
    error = refused(pair.r, status_from(pair, pair.e.sender, key.task_id), pair.now)
    assert error.code is ErrorCode.INVALID_PARAMS
    assert error.details is not None and error.details["state"] == "info_needed"
    assert "p2p:task_failed" in error.details["allowed"]


def test_anything_after_final_is_409(pair: Pair) -> None:
    key = running(pair)
    pair.complete(key)
    pair.deliver_all()
    assert pair.states(key) == (S.COMPLETED, S.COMPLETED)
    for engine, message in (
        (pair.r, status_from(pair, pair.e.sender, key.task_id)),
        (pair.e, cancel_from(pair, pair.r.sender, key.task_id)),
        (
            pair.e,
            as_from(
                pair.r.sender,
                TaskInfoProvided,
                TaskInfoProvidedPayload(task_id=key.task_id, fields={}),
                E_ID,
                pair.now,
            ),
        ),
    ):
        error = refused(engine, message, pair.now)
        assert error.code is ErrorCode.TASK_ALREADY_COMPLETED and error.http_status == 409
        assert error.details == {"state": "completed"}


def test_the_same_final_callback_with_a_new_id_is_409(pair: Pair) -> None:
    key = running(pair)
    pair.complete(key)
    [done] = pair.deliver_all()
    again = msgspec.structs.replace(done.message, id="msg-again")
    assert refused(pair.r, again, pair.now).code is ErrorCode.TASK_ALREADY_COMPLETED


# --- re-sent task_request ----------------------------------------------------------------------


def resend(request: Message, new_id: str) -> Message:
    return msgspec.structs.replace(request, id=new_id)


@pytest.mark.parametrize(
    ("task_type", "payload", "reply_type"),
    [
        ("echo", {"text": "hi"}, TaskConfirm),
        ("translate", {}, TaskReject),
        ("text_generation", {"prompt": "p"}, TaskNeedInfo),
    ],
)
def test_a_re_sent_task_request_gets_the_original_decision(
    pair: Pair, task_type: str, payload: dict[str, Any], reply_type: type[Message]
) -> None:
    key = pair.submit(task_type, payload)
    first = pair.deliver(R_ID)
    assert isinstance(first.reply, reply_type)
    before = Snapshot.of(pair.e, liveness=False)
    actions, outbox = list(pair.actions[E_ID]), list(pair.outbox[E_ID])
    step = pair.e.receive(resend(first.message, "msg-second"), pair.now + 5)
    assert step.reply is not None
    assert type(step.reply) is reply_type
    assert step.reply.payload == first.reply.payload
    assert step.reply.reply_to == "msg-second"
    assert step.transitions == [] and step.outgoing == [] and step.actions == []
    assert Snapshot.of(pair.e, liveness=False) == before
    assert (pair.actions[E_ID], pair.outbox[E_ID]) == (actions, outbox)
    assert pair.starts(key) == (1 if reply_type is TaskConfirm else 0)


def test_a_re_sent_task_request_after_the_end_still_gets_the_decision(pair: Pair) -> None:
    key = pair.submit("echo")
    first = pair.deliver(R_ID)
    pair.complete(key)
    pair.deliver_all()
    step = pair.e.receive(resend(first.message, "msg-later"), pair.now)
    assert isinstance(step.reply, TaskConfirm) and step.reply.reply_to == "msg-later"
    assert pair.starts(key) == 1


def test_another_task_under_a_used_id(pair: Pair) -> None:
    key = pair.submit("slow", {"steps": 3})
    first = pair.deliver(R_ID)
    assert isinstance(first.message, TaskRequest)
    other_task = msgspec.structs.replace(first.message.payload.task, payload={"steps": 4})
    other = msgspec.structs.replace(
        first.message,
        id="msg-other",
        payload=msgspec.structs.replace(first.message.payload, task=other_task),
    )
    error = refused(pair.e, other, pair.now)
    assert error.code is ErrorCode.INVALID_PARAMS and error.http_status == 400
    assert error.details == {"reason": "task_id_in_use", "task_id": key.task_id}
    pair.fail(key)
    pair.deliver_all()
    error = refused(pair.e, msgspec.structs.replace(other, id="msg-other-2"), pair.now)
    assert error.code is ErrorCode.TASK_ALREADY_COMPLETED and error.http_status == 409


def test_draining_refuses_new_tasks_only(pair: Pair) -> None:
    key = running(pair)
    pair.e.draining = True
    pair.submit("echo")
    ex = pair.deliver(R_ID)
    assert isinstance(ex.reply, Nack) and ex.error is not None
    assert (ex.error.code, ex.error.http_status) == (ErrorCode.AGENT_NOT_READY, 503)
    assert ex.error.details == {"reason": "draining"}
    # Our own state, not the partner's fault: a refusal, but no RemoteProtocolError.
    assert isinstance(ex.error, NotReady) and not isinstance(ex.error, RemoteProtocolError)
    # A task already in flight still takes its messages.
    pair.cancel(key)
    pair.deliver_all()
    assert pair.states(key) == (S.CANCELLED, S.CANCELLED)
    pair.e.draining, pair.e.ready = False, False
    pair.submit("echo")
    error = pair.post(R_ID).error
    assert error is not None and error.details == {"reason": "starting"}


# --- human_decision ----------------------------------------------------------------------------


def decision_for(pair: Pair, key: TaskKey, reply_to: str) -> Message:
    payload = HumanDecisionPayload(
        task_id=key.task_id,
        decision_id="dec-1",
        reply_to=reply_to,
        decided_by=DecidedBy(user_id="user-1"),
        decision=Decision(action=DecisionAction.APPROVE),
    )
    return as_from(pair.r.sender, HumanDecision, payload, E_ID, pair.now)


def test_human_decision_answering_another_message(pair: Pair) -> None:
    key = running(pair)
    pair.request_human(key)
    [asked] = pair.deliver_all()
    error = refused(pair.e, decision_for(pair, key, "msg-something-else"), pair.now)
    assert error.code is ErrorCode.INVALID_PARAMS
    assert error.details == {"reason": "reply_to_mismatch", "expected": asked.message.id}
    assert pair.states(key) == (S.NEED_HUMAN, S.NEED_HUMAN)
    step = pair.e.receive(decision_for(pair, key, asked.message.id), pair.now)
    assert isinstance(step.reply, TaskAck) and step.reply.payload.state is S.HUMAN_APPROVED


def test_human_decision_when_nobody_asked(pair: Pair) -> None:
    key = running(pair)
    error = refused(pair.e, decision_for(pair, key, "msg-any"), pair.now)
    # The state is judged before the payload's reply_to.
    assert error.code is ErrorCode.INVALID_PARAMS
    assert error.details == {"state": "executing", "allowed": ["p2p:task_cancel"]}


# --- requests are not replies -------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda p, k: as_from(p.e.sender, Ack, AckPayload(), R_ID, p.now),
        lambda p, k: as_from(
            p.e.sender, TaskAck, TaskAckPayload(task_id=k.task_id, state=S.CANCELLED), R_ID, p.now
        ),
        lambda p, k: as_from(p.e.sender, Nack, NackPayload(code="invalid_params"), R_ID, p.now),
        lambda p, k: as_from(p.e.sender, TaskConfirm, pair_confirm_payload(k), R_ID, p.now),
    ],
)
def test_a_reply_only_type_posted_is_refused(
    pair: Pair, make: Callable[[Pair, TaskKey], Message]
) -> None:
    key = running(pair)
    error = refused(pair.r, make(pair, key), pair.now)
    assert error.code is ErrorCode.INVALID_PARAMS
    assert error.details == {"reason": "reply_only_type"}
    assert pair.states(key) == (S.EXECUTING, S.EXECUTING)


def pair_confirm_payload(key: TaskKey) -> Any:
    return TaskConfirmPayload(task_id=key.task_id)


# --- a refusal changes nothing --------------------------------------------------------------------


def test_refusals_at_every_stage_leave_both_sides_alone(pair: Pair) -> None:
    """Throw every R → E and E → R message at each side in each stage of a task's life."""
    key = pair.submit("text_generation", {"prompt": "p"})
    stages: list[Callable[[], object]] = [
        lambda: pair.deliver(R_ID),  # need_info (synchronous)
        lambda: pair.provide_info(key, {"style": "古典"}),
        lambda: pair.deliver_all(),  # executing
        lambda: pair.request_info(key, missing_fields=[style_missing()]),
        lambda: pair.deliver_all(),
        lambda: pair.provide_info(key, {"style": "现代"}),
        lambda: pair.deliver_all(),
        lambda: pair.request_human(key),
        lambda: pair.deliver_all(),
        lambda: pair.start_deciding(key),
    ]
    probes = [
        (pair.e, cancel_from(pair, X, key.task_id)),
        (pair.e, status_from(pair, pair.r.sender, key.task_id, to=E_ID)),
        (pair.r, status_from(pair, X, key.task_id)),
        (
            pair.r,
            as_from(
                pair.e.sender, TaskCancel, TaskCancelPayload(task_id=key.task_id), R_ID, pair.now
            ),
        ),
        (pair.e, decision_for(pair, key, "msg-wrong")),
    ]
    for stage in stages:
        stage()
        for engine, message in probes:
            refused(engine, message, pair.now)
    assert pair.states(key) == (S.HUMAN_DECIDING, S.NEED_HUMAN)


def test_local_commands_out_of_turn_raise_and_change_nothing(pair: Pair) -> None:
    key = running(pair)
    before = (Snapshot.of(pair.r), Snapshot.of(pair.e))
    for command in (
        lambda: pair.provide_info(key, {"a": 1}),
        lambda: pair.start_deciding(key),
        lambda: pair.decide(key, DecisionAction.APPROVE),
        lambda: pair.r.handle(ReportStatus(key), pair.now),
        lambda: pair.e.handle(ProvideInfo(key, {}), pair.now),
        lambda: pair.r.handle(Cancel(TaskKey(R_ID, "task-nope")), pair.now),
    ):
        with pytest.raises(LocalProtocolError):
            command()
    pair.request_info(key)
    with pytest.raises(LocalProtocolError):
        pair.complete(key)  # the handler waits for the information first
    with pytest.raises(LocalProtocolError):
        pair.r.submit(Submit(E_ID, "echo", {}, task_id=key.task_id), pair.now)
    assert Snapshot.of(pair.r) == before[0]
    assert pair.states(key) == (S.EXECUTING, S.INFO_NEEDED)
