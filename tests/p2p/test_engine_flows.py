"""The four flows (specs/protocol.md, 'Flows'), message by message, with both engines paired and no
sockets."""

from __future__ import annotations

from pairing import E_ID, R_ID, T0, Pair, at, nack_for, style_missing

from synapse.p2p.commands import Submit
from synapse.p2p.config import P2PConfig
from synapse.p2p.engine import (
    CancelExecution,
    DropQueued,
    Refusal,
    ResumeExecution,
    StartExecution,
    TaskEvent,
    TaskKey,
    Transition,
    Validation,
)
from synapse.p2p.states import Event, Role
from synapse.types import (
    Ack,
    CapabilityResponse,
    DecisionAction,
    ErrorCode,
    Heartbeat,
    HeartbeatStatus,
    HumanDecision,
    MessageType,
    Nack,
    Reason,
    SynapseError,
    TaskAck,
    TaskCancel,
    TaskComplete,
    TaskConfirm,
    TaskFailed,
    TaskInfoProvided,
    TaskNeedHuman,
    TaskNeedInfo,
    TaskReject,
    TaskRequest,
    TaskState,
    TaskStatusUpdate,
)

S = TaskState
T = MessageType


def moves(transitions: list[Transition]) -> list[tuple[str, str]]:
    return [(t.from_state.value, t.to_state.value) for t in transitions]


def events_of(pair: Pair, key: TaskKey) -> list[str]:
    return [a.kind for a in pair.actions[R_ID] if isinstance(a, TaskEvent) and a.key == key]


def confirmed_and_running(pair: Pair, task_type: str = "echo") -> TaskKey:
    """Submit, deliver the request and E's first status update: both sides `executing`."""
    key = pair.submit(task_type, {"text": "hi"})
    pair.deliver(R_ID)
    assert isinstance(pair.deliver(E_ID).message, TaskStatusUpdate)
    assert pair.states(key) == (S.EXECUTING, S.EXECUTING)
    return key


# --- §4.1 normal ------------------------------------------------------------------------------


def test_normal_flow(pair: Pair) -> None:
    # 1. R submits: pending, one task_request queued for E.
    key = pair.submit("echo", {"text": "写一首诗"})
    assert key == TaskKey(R_ID, key.task_id)
    assert pair.states(key) == (S.PENDING, None)
    [out] = pair.outbox[R_ID]
    assert isinstance(out.message, TaskRequest)
    assert (out.partner, out.key, out.message.to.agent_id) == (E_ID, key, E_ID)
    assert out.message.payload.task.id == key.task_id
    assert out.message.reply_to is None

    # 2. E confirms synchronously, starts the handler and queues its first status update.
    ex = pair.post(R_ID)
    assert isinstance(ex.reply, TaskConfirm)
    assert ex.reply.reply_to == out.message.id
    assert ex.reply.payload.task_id == key.task_id and ex.reply.payload.confirmed
    assert ex.reply.payload.capabilities_used == ["echo"]
    assert moves(ex.step.transitions) == [("idle", "confirmed"), ("confirmed", "executing")]
    assert [t.event for t in ex.step.transitions] == [
        Event.SEND_TASK_CONFIRM,
        Event.START_EXECUTION,
    ]
    assert ex.step.actions == [StartExecution(key, "echo", {"text": "写一首诗"})]
    assert pair.states(key) == (S.PENDING, S.EXECUTING)
    assert pair.queued(E_ID) == [T.TASK_STATUS_UPDATE]
    reply_step = pair.answer(ex)
    assert moves(reply_step.transitions) == [("pending", "confirmed")]
    assert pair.states(key) == (S.CONFIRMED, S.EXECUTING)
    assert pair.outbox[R_ID] == []

    # 3. Status updates (several), each acked with p2p:ack.
    ex = pair.deliver(E_ID)
    assert isinstance(ex.message, TaskStatusUpdate)
    assert ex.message.payload.status is S.EXECUTING
    assert isinstance(ex.reply, Ack) and ex.reply.reply_to == ex.message.id
    assert pair.states(key) == (S.EXECUTING, S.EXECUTING)
    for progress in (30, 60, 90):
        pair.report_status(key, progress=progress, message=f"{progress}%")
        ex = pair.deliver(E_ID)
        assert isinstance(ex.message, TaskStatusUpdate) and isinstance(ex.reply, Ack)
        assert ex.message.payload.progress == progress
        assert pair.rec(R_ID, key).progress == progress
        assert pair.rec(R_ID, key).status_message == f"{progress}%"
        assert pair.states(key) == (S.EXECUTING, S.EXECUTING)

    # 4. task_complete → 5. task_ack{completed}.
    pair.complete(key, "诗")
    assert pair.states(key) == (S.EXECUTING, S.COMPLETED)
    ex = pair.deliver(E_ID)
    assert isinstance(ex.message, TaskComplete)
    assert isinstance(ex.reply, TaskAck)
    assert ex.reply.payload.task_id == key.task_id
    assert ex.reply.payload.state is S.COMPLETED
    assert pair.states(key) == (S.COMPLETED, S.COMPLETED)
    result = pair.rec(R_ID, key).result
    assert result is not None and result.output == "诗"
    assert ex.reply_step is not None and ex.reply_step.transitions == []
    assert pair.outbox == {R_ID: [], E_ID: []}
    assert pair.starts(key) == 1
    assert events_of(pair, key) == [
        T.TASK_CONFIRM,
        T.TASK_STATUS_UPDATE,
        T.TASK_STATUS_UPDATE,
        T.TASK_STATUS_UPDATE,
        T.TASK_STATUS_UPDATE,
        T.TASK_COMPLETE,
    ]
    # Each side's history is its table's path.
    assert [t.to_state for t in pair.rec(R_ID, key).history] == [
        S.PENDING,
        S.CONFIRMED,
        *[S.EXECUTING] * 4,
        S.COMPLETED,
    ]
    assert [t.to_state for t in pair.rec(E_ID, key).history] == [
        S.CONFIRMED,
        S.EXECUTING,
        *[S.EXECUTING] * 3,
        S.COMPLETED,
    ]
    assert {t.role for t in pair.rec(E_ID, key).history} == {Role.EXECUTOR}
    assert pair.r.in_flight_with(E_ID) == pair.e.in_flight_with(R_ID) == 0


# --- §4.2 need_info -------------------------------------------------------------------------


def test_need_info_as_the_synchronous_reply() -> None:
    pair = Pair()
    required_by = at(T0 + 60)

    def validator(task_type: str, payload: dict[str, object]) -> object:
        if "style" not in payload:
            return Validation(
                missing_fields=[style_missing()], question="请选择生成风格", required_by=required_by
            )
        return Validation()

    pair.e.validator = validator  # type: ignore[assignment]
    key = pair.submit("text_generation", {"prompt": "写一首诗"})
    ex = pair.deliver(R_ID)
    assert isinstance(ex.reply, TaskNeedInfo)
    assert ex.reply.reply_to == ex.message.id
    assert [f.field for f in ex.reply.payload.missing_fields] == ["style"]
    assert ex.reply.payload.missing_fields[0].alternatives == ["现代", "浪漫"]
    assert ex.reply.payload.required_by == required_by
    assert ex.step.actions == [] and ex.step.outgoing == []  # nothing runs yet
    assert pair.states(key) == (S.INFO_NEEDED, S.INFO_NEEDED)
    assert pair.rec(R_ID, key).need_info == ex.reply.payload

    pair.provide_info(key, {"style": "古典"})
    assert pair.states(key) == (S.INFO_PROVIDED, S.INFO_NEEDED)
    ex = pair.deliver(R_ID)
    assert isinstance(ex.message, TaskInfoProvided)
    assert ex.message.payload.fields == {"style": "古典"}
    assert isinstance(ex.reply, TaskAck) and ex.reply.payload.state is S.INFO_PROVIDED
    # No task_confirm: E validates again and starts with the merged payload.
    assert moves(ex.step.transitions) == [
        ("info_needed", "info_provided"),
        ("info_provided", "executing"),
    ]
    assert ex.step.actions == [
        StartExecution(key, "text_generation", {"prompt": "写一首诗", "style": "古典"})
    ]
    assert pair.queued(E_ID) == [T.TASK_STATUS_UPDATE]
    assert pair.states(key) == (S.INFO_PROVIDED, S.EXECUTING)
    ex = pair.deliver(E_ID)
    assert isinstance(ex.message, TaskStatusUpdate) and isinstance(ex.reply, Ack)
    assert pair.states(key) == (S.EXECUTING, S.EXECUTING)
    # The required_by timer was disarmed by the answer.
    assert pair.e.next_deadline() != required_by.timestamp()
    pair.complete(key, "古典诗")
    assert isinstance(pair.deliver(E_ID).reply, TaskAck)
    assert pair.states(key) == (S.COMPLETED, S.COMPLETED)
    assert pair.starts(key) == 1


def test_need_info_answered_still_incomplete_asks_again(pair: Pair) -> None:
    def validator(task_type: str, payload: dict[str, object]) -> object:
        if payload.get("style") not in ("古典", "现代", "浪漫"):
            return Validation(missing_fields=[style_missing()])
        return Validation()

    pair.e.validator = validator  # type: ignore[assignment]
    key = pair.submit("text_generation", {"prompt": "p"})
    pair.deliver(R_ID)
    pair.provide_info(key, {"style": "?"})
    ex = pair.deliver(R_ID)
    assert moves(ex.step.transitions) == [
        ("info_needed", "info_provided"),
        ("info_provided", "info_needed"),
    ]
    assert pair.queued(E_ID) == [T.TASK_NEED_INFO]
    ex = pair.deliver(E_ID)
    assert isinstance(ex.reply, Ack)
    assert pair.states(key) == (S.INFO_NEEDED, S.INFO_NEEDED)
    pair.provide_info(key, {"style": "现代"})
    pair.deliver_all()
    assert pair.states(key) == (S.EXECUTING, S.EXECUTING)
    assert pair.starts(key) == 1


def test_need_info_answered_unacceptably_fails(pair: Pair) -> None:
    def validator(task_type: str, payload: dict[str, object]) -> object:
        if "style" not in payload:
            return Validation(missing_fields=[style_missing()])
        return Validation(ok=payload["style"] != "bad")

    pair.e.validator = validator  # type: ignore[assignment]
    key = pair.submit("text_generation", {"prompt": "p"})
    pair.deliver(R_ID)
    pair.provide_info(key, {"style": "bad"})
    pair.deliver(R_ID)
    assert pair.states(key) == (S.INFO_PROVIDED, S.FAILED)
    ex = pair.deliver(E_ID)
    assert isinstance(ex.message, TaskFailed)
    assert ex.message.payload.error.code == ErrorCode.INVALID_PARAMS
    assert pair.states(key) == (S.FAILED, S.FAILED)
    assert pair.starts(key) == 0


def test_need_info_during_execution(pair: Pair) -> None:
    key = confirmed_and_running(pair, "slow")
    pair.request_info(key, question="请选择生成风格")
    assert pair.states(key) == (S.EXECUTING, S.INFO_NEEDED)
    ex = pair.deliver(E_ID)
    assert isinstance(ex.message, TaskNeedInfo)
    assert ex.message.reply_to is None  # a callback, not a reply
    assert isinstance(ex.reply, Ack)
    assert pair.states(key) == (S.INFO_NEEDED, S.INFO_NEEDED)
    assert pair.rec(R_ID, key).need_info == ex.message.payload

    pair.provide_info(key, {"style": "浪漫"})
    ex = pair.deliver(R_ID)
    assert isinstance(ex.message, TaskInfoProvided)
    assert isinstance(ex.reply, TaskAck) and ex.reply.payload.state is S.INFO_PROVIDED
    assert moves(ex.step.transitions) == [
        ("info_needed", "info_provided"),
        ("info_provided", "executing"),
    ]
    # The running handler is resumed, not started again; the status update goes first.
    assert ex.step.actions == [ResumeExecution(key, {"style": "浪漫"})]
    assert [o.message.message_type for o in ex.step.outgoing] == [T.TASK_STATUS_UPDATE]
    ex = pair.deliver(E_ID)
    assert isinstance(ex.message, TaskStatusUpdate)
    assert ex.message.payload.status is S.EXECUTING
    assert pair.states(key) == (S.EXECUTING, S.EXECUTING)
    pair.complete(key)
    pair.deliver_all()
    assert pair.states(key) == (S.COMPLETED, S.COMPLETED)
    assert pair.starts(key) == 1


# --- §4.3 need_human ------------------------------------------------------------------------


def need_human(pair: Pair) -> tuple[TaskKey, str]:
    key = confirmed_and_running(pair, "portrait")
    pair.request_human(key)
    assert pair.states(key) == (S.EXECUTING, S.NEED_HUMAN)
    ex = pair.deliver(E_ID)
    assert isinstance(ex.message, TaskNeedHuman) and isinstance(ex.reply, Ack)
    assert ex.message.payload.reason.code == "ethical_decision"
    assert pair.states(key) == (S.NEED_HUMAN, S.NEED_HUMAN)
    assert pair.rec(R_ID, key).need_human_id == ex.message.id
    return key, ex.message.id


def test_need_human_approved(pair: Pair) -> None:
    key, asked = need_human(pair)
    step = pair.start_deciding(key)
    assert moves(step.transitions) == [("need_human", "human_deciding")]
    assert step.outgoing == []  # deciding is local to R
    assert pair.states(key) == (S.HUMAN_DECIDING, S.NEED_HUMAN)

    pair.decide(key, DecisionAction.APPROVE, approved_fields={"authorized": True})
    assert pair.states(key) == (S.HUMAN_APPROVED, S.NEED_HUMAN)
    ex = pair.deliver(R_ID)
    assert isinstance(ex.message, HumanDecision)
    assert ex.message.payload.reply_to == asked
    assert ex.message.payload.decision.action is DecisionAction.APPROVE
    assert isinstance(ex.reply, TaskAck) and ex.reply.payload.state is S.HUMAN_APPROVED
    assert moves(ex.step.transitions) == [
        ("need_human", "human_approved"),
        ("human_approved", "executing"),
    ]
    assert ex.step.actions == [ResumeExecution(key, ex.message.payload)]
    assert pair.states(key) == (S.HUMAN_APPROVED, S.EXECUTING)
    ex = pair.deliver(E_ID)
    assert isinstance(ex.message, TaskStatusUpdate)
    assert pair.states(key) == (S.EXECUTING, S.EXECUTING)
    pair.complete(key, "portrait.png")
    pair.deliver_all()
    assert pair.states(key) == (S.COMPLETED, S.COMPLETED)
    assert pair.starts(key) == 1


def test_need_human_rejected(pair: Pair) -> None:
    key, _ = need_human(pair)
    pair.start_deciding(key)
    pair.decide(key, DecisionAction.REJECT, rejection_reason="未获授权")
    assert pair.states(key) == (S.HUMAN_REJECTED, S.NEED_HUMAN)
    ex = pair.deliver(R_ID)
    assert isinstance(ex.message, HumanDecision)
    assert isinstance(ex.reply, TaskAck) and ex.reply.payload.state is S.HUMAN_REJECTED
    assert moves(ex.step.transitions) == [
        ("need_human", "human_rejected"),
        ("human_rejected", "failed"),
    ]
    assert CancelExecution(key, ErrorCode.PERMISSION_DENIED.value) in ex.step.actions
    assert pair.states(key) == (S.HUMAN_REJECTED, S.FAILED)
    ex = pair.deliver(E_ID)
    assert isinstance(ex.message, TaskFailed)
    assert ex.message.payload.error.code == ErrorCode.PERMISSION_DENIED
    assert ex.message.payload.error.recoverable is False
    assert ex.message.payload.error.message == "未获授权"
    assert isinstance(ex.reply, TaskAck) and ex.reply.payload.state is S.FAILED
    assert pair.states(key) == (S.FAILED, S.FAILED)
    error = pair.rec(R_ID, key).error
    assert error is not None and error.code == "permission_denied"


def test_decision_without_deliberation(pair: Pair) -> None:
    """`human_deciding` is optional: R may decide straight from `need_human`."""
    key, _ = need_human(pair)
    pair.decide(key, DecisionAction.APPROVE)
    pair.deliver_all()
    assert pair.states(key) == (S.EXECUTING, S.EXECUTING)


# --- §4.4 cancel -------------------------------------------------------------------------------


def test_cancel_before_the_reply_waits_for_it(pair: Pair) -> None:
    key = pair.submit("slow")
    step = pair.cancel(key, "changed my mind")
    assert step.outgoing == [] and step.transitions == []
    assert pair.queued(R_ID) == [T.TASK_REQUEST]
    ex = pair.post(R_ID)
    assert isinstance(ex.reply, TaskConfirm)
    assert pair.outbox[R_ID] == []  # still no cancel: the reply has not arrived
    pair.answer(ex)
    assert pair.queued(R_ID) == [T.TASK_CANCEL]
    assert pair.states(key) == (S.CONFIRMED, S.EXECUTING)
    ex = pair.deliver(R_ID)
    assert isinstance(ex.message, TaskCancel)
    assert ex.message.payload.reason == "changed my mind"
    assert isinstance(ex.reply, TaskAck) and ex.reply.payload.state is S.CANCELLED
    assert ex.step.actions == [CancelExecution(key, "cancelled"), DropQueued(key)]
    # E's queued status update was dropped; nothing more about the task is sent.
    assert pair.outbox == {R_ID: [], E_ID: []}
    assert pair.states(key) == (S.CANCELLED, S.CANCELLED)
    # Cancelling again is a no-op.
    assert pair.cancel(key).outgoing == []


def test_cancel_while_executing_and_a_late_result_is_discarded(pair: Pair) -> None:
    key = confirmed_and_running(pair, "slow")
    pair.report_status(key, progress=10)
    assert pair.queued(E_ID) == [T.TASK_STATUS_UPDATE]
    pair.cancel(key)
    assert pair.states(key) == (S.EXECUTING, S.EXECUTING)  # R waits for the task_ack
    ex = pair.deliver(R_ID)
    assert isinstance(ex.reply, TaskAck) and ex.reply.payload.state is S.CANCELLED
    assert CancelExecution(key, "cancelled") in ex.step.actions
    assert DropQueued(key) in ex.step.actions
    assert pair.outbox[E_ID] == []
    assert pair.states(key) == (S.CANCELLED, S.CANCELLED)
    assert ex.reply_step is not None
    assert moves(ex.reply_step.transitions) == [("executing", "cancelled")]
    # The handler did not stop in time: its late calls are discarded and send nothing.
    for late in (
        pair.complete(key, "too late"),
        pair.report_status(key, progress=99),
        pair.fail(key),
    ):
        assert late.discarded
        assert late.outgoing == [] and late.transitions == [] and late.actions == []
    assert pair.outbox == {R_ID: [], E_ID: []}
    assert pair.states(key) == (S.CANCELLED, S.CANCELLED)


def test_cancel_while_waiting_for_info_or_a_person(pair: Pair) -> None:
    info = confirmed_and_running(pair)
    pair.request_info(info)
    pair.deliver_all()
    human, _ = need_human(pair)
    pair.start_deciding(human)
    for key in (info, human):
        pair.cancel(key)
    pair.deliver_all()
    assert pair.states(info) == (S.CANCELLED, S.CANCELLED)
    assert pair.states(human) == (S.CANCELLED, S.CANCELLED)


def test_cancel_crossing_a_completion(pair: Pair) -> None:
    key = confirmed_and_running(pair)
    pair.complete(key)  # E is done; its task_complete is queued …
    pair.cancel(key)  # … while R's cancel crosses it.
    ex = pair.deliver(R_ID)
    assert isinstance(ex.message, TaskCancel)
    assert isinstance(ex.reply, Nack)
    assert ex.reply.payload.code == ErrorCode.TASK_ALREADY_COMPLETED
    assert ex.error is not None and ex.error.http_status == 409
    assert ex.reply_step is not None
    [refusal] = [a for a in ex.reply_step.actions if isinstance(a, Refusal)]
    assert refusal.key == key and refusal.sent is ex.message
    assert TaskEvent(key, "refused", S.EXECUTING, None, ex.reply.payload.message) in (
        ex.reply_step.actions
    )
    assert pair.states(key) == (S.EXECUTING, S.COMPLETED)  # R waits for the final callback
    ex = pair.deliver(E_ID)
    assert isinstance(ex.message, TaskComplete)
    assert isinstance(ex.reply, TaskAck) and ex.reply.payload.state is S.COMPLETED
    assert pair.states(key) == (S.COMPLETED, S.COMPLETED)


def test_cancel_crossing_a_failure(pair: Pair) -> None:
    key = confirmed_and_running(pair)
    pair.fail(key)
    pair.cancel(key)
    assert isinstance(pair.deliver(R_ID).reply, Nack)
    pair.deliver_all()
    assert pair.states(key) == (S.FAILED, S.FAILED)


# --- other outcomes of a task_request ------------------------------------------------------


def test_unknown_task_type_is_rejected(pair: Pair) -> None:
    key = pair.submit("translate")
    ex = pair.deliver(R_ID)
    assert isinstance(ex.reply, TaskReject)
    assert ex.reply.payload.reason.code == ErrorCode.CAPABILITY_LACKING
    assert pair.states(key) == (S.REJECTED, S.REJECTED)
    assert pair.rec(R_ID, key).reject == ex.reply.payload
    assert ex.step.actions == [] and ex.step.outgoing == []
    assert pair.e.active_executor_tasks() == 0
    assert events_of(pair, key) == [T.TASK_REJECT]


def test_deadline_already_past_is_rejected(pair: Pair) -> None:
    key = pair.submit("echo", deadline=at(T0 - 1))
    ex = pair.deliver(R_ID)
    assert isinstance(ex.reply, TaskReject)
    assert ex.reply.payload.reason.code == ErrorCode.EXECUTION_TIMEOUT
    assert pair.states(key) == (S.REJECTED, S.REJECTED)
    # No deadline timer is left behind for a task that never ran (only the heartbeat).
    assert pair.e.next_deadline() == T0 + pair.e.config.heartbeat_interval


def test_at_capacity_is_rejected_with_retry_after() -> None:
    pair = Pair(e_config=P2PConfig(max_concurrent_tasks=2, capacity_retry_after=7))
    first, second = confirmed_and_running(pair), confirmed_and_running(pair)
    third = pair.submit("echo")
    ex = pair.deliver(R_ID)
    assert isinstance(ex.reply, TaskReject)
    assert ex.reply.payload.reason.code == ErrorCode.RATE_LIMITED
    assert ex.reply.payload.alternatives is not None
    assert ex.reply.payload.alternatives.retry_after == 7
    assert pair.states(third) == (S.REJECTED, S.REJECTED)
    assert pair.e.heartbeat_status() is HeartbeatStatus.BUSY
    # Room again once one ends; a new attempt is a new task id.
    pair.complete(first)
    pair.deliver_all()
    fourth = pair.submit("echo")
    assert isinstance(pair.deliver(R_ID).reply, TaskConfirm)
    assert pair.states(fourth) == (S.CONFIRMED, S.EXECUTING)
    assert pair.states(second)[1] is S.EXECUTING


def test_validator_refusal_and_crash_are_rejections(pair: Pair) -> None:
    def validator(task_type: str, payload: dict[str, object]) -> object:
        if payload.get("crash"):
            raise RuntimeError("boom")
        if payload.get("bad"):
            return Validation(ok=False)
        if payload.get("seed_shape"):
            return ([], False)  # ValidateTask's ([]MissingField, bool)
        return Validation(ok=False, reason=Reason(code="quota", message="no quota"))

    pair.e.validator = validator  # type: ignore[assignment]
    codes = []
    for payload in ({"crash": 1}, {"bad": 1}, {"seed_shape": 1}, {}):
        key = pair.submit("echo", payload)
        ex = pair.deliver(R_ID)
        assert isinstance(ex.reply, TaskReject)
        assert pair.states(key) == (S.REJECTED, S.REJECTED)
        codes.append(ex.reply.payload.reason.code)
    assert codes == ["execution_failed", "invalid_params", "invalid_params", "quota"]


def test_failing_task(pair: Pair) -> None:
    key = confirmed_and_running(pair, "fail")
    step = pair.fail(key, ErrorCode.EXECUTION_FAILED.value, recoverable=True)
    assert moves(step.transitions) == [("executing", "failed")]
    assert pair.states(key) == (S.EXECUTING, S.FAILED)
    ex = pair.deliver(E_ID)
    assert isinstance(ex.message, TaskFailed)
    assert ex.message.payload.error.code == "execution_failed"
    assert ex.message.payload.error.recoverable is True
    assert isinstance(ex.reply, TaskAck) and ex.reply.payload.state is S.FAILED
    assert pair.states(key) == (S.FAILED, S.FAILED)
    assert pair.e.active_executor_tasks() == 0


def test_nack_to_a_task_request_rejects_it(pair: Pair) -> None:
    pair.e.draining = True
    key = pair.submit("echo")
    ex = pair.deliver(R_ID)
    assert isinstance(ex.reply, Nack)
    assert ex.reply.payload.code == ErrorCode.AGENT_NOT_READY
    assert ex.error is not None and ex.error.http_status == 503
    assert pair.states(key) == (S.REJECTED, None)
    rec = pair.rec(R_ID, key)
    assert rec.refusal == ex.reply.payload
    assert rec.history[-1].event is Event.REQUEST_REFUSED
    assert ex.reply_step is not None
    assert [type(a) for a in ex.reply_step.actions] == [Refusal, TaskEvent]
    assert pair.r.in_flight_with(E_ID) == 0


def test_a_callback_before_the_reply_is_an_implicit_confirm(pair: Pair) -> None:
    key = pair.submit("echo")
    ex = pair.post(R_ID)  # E confirms, but the reply is slow to arrive …
    update = pair.deliver(E_ID)  # … and E's first callback overtakes it.
    assert isinstance(update.message, TaskStatusUpdate) and isinstance(update.reply, Ack)
    assert moves(update.step.transitions) == [("pending", "executing")]
    assert pair.states(key) == (S.EXECUTING, S.EXECUTING)
    late = pair.answer(ex)
    assert isinstance(ex.reply, TaskConfirm)
    assert late.transitions == [] and late.actions == []  # the late confirm is ignored
    assert pair.states(key) == (S.EXECUTING, S.EXECUTING)


def test_a_final_callback_before_the_reply(pair: Pair) -> None:
    key = pair.submit("echo")
    ex = pair.post(R_ID)
    pair.complete(key)  # a quick handler: status update and completion both overtake the reply
    assert pair.queued(E_ID) == [T.TASK_STATUS_UPDATE, T.TASK_COMPLETE]
    pair.deliver(E_ID)
    done = pair.deliver(E_ID)
    assert isinstance(done.reply, TaskAck) and done.reply.payload.state is S.COMPLETED
    assert pair.states(key) == (S.COMPLETED, S.COMPLETED)
    assert pair.answer(ex).transitions == []
    assert pair.states(key) == (S.COMPLETED, S.COMPLETED)


def test_an_implicit_confirm_counts_as_the_reply_for_a_cancel(pair: Pair) -> None:
    """A callback proves E has the task, so the engine queues a cancel asked after it at once;
    per-task order (`Outgoing.key`) still holds it behind the request until its reply, which
    then sends no second cancel."""
    key = pair.submit("slow")
    ex = pair.post(R_ID)
    pair.deliver(E_ID)  # implicit confirm
    pair.cancel(key)
    assert pair.queued(R_ID) == [T.TASK_CANCEL]
    late = pair.answer(ex)
    assert late.outgoing == [] and late.transitions == []
    assert pair.queued(R_ID) == [T.TASK_CANCEL]
    cancel = pair.deliver(R_ID)
    assert isinstance(cancel.reply, TaskAck) and cancel.reply.payload.state is S.CANCELLED
    assert pair.states(key) == (S.CANCELLED, S.CANCELLED)
    assert pair.outbox == {R_ID: [], E_ID: []}


# --- capability query and heartbeat -----------------------------------------------------------


def test_capability_query_filtered_by_task_type(pair: Pair) -> None:
    for wanted, names in (
        (None, ["echo", "slow", "text_generation", "portrait", "fail"]),
        ("portrait", ["portrait"]),
        ("translate", []),
    ):
        query = pair.r.capability_query(E_ID, wanted, pair.now)
        step = pair.e.receive(query, pair.now)
        assert isinstance(step.reply, CapabilityResponse)
        assert step.reply.reply_to == query.id
        assert step.reply.payload.agent_id == E_ID
        assert [c.name for c in step.reply.payload.capabilities] == names
        assert step.reply.payload.max_concurrent_tasks == pair.e.config.max_concurrent_tasks
        assert step.transitions == [] and step.outgoing == []
        assert pair.r.on_reply(query, step.reply, pair.now).actions == []


def test_heartbeat_reply_carries_own_status_and_active_tasks(pair: Pair) -> None:
    beat = pair.r.heartbeat(E_ID, pair.now)
    assert beat.payload.active_tasks == 0
    step = pair.e.receive(beat, pair.now)
    assert isinstance(step.reply, Heartbeat)
    assert step.reply.reply_to == beat.id
    assert (step.reply.payload.status, step.reply.payload.active_tasks) == (HeartbeatStatus.OK, 0)

    confirmed_and_running(pair)
    confirmed_and_running(pair)
    beat = pair.r.heartbeat(E_ID, pair.now)
    assert beat.payload.active_tasks == 2
    reply = pair.e.receive(beat, pair.now).reply
    assert isinstance(reply, Heartbeat)
    assert (reply.payload.status, reply.payload.active_tasks) == (HeartbeatStatus.OK, 2)

    pair.e.draining = True
    reply = pair.e.receive(pair.r.heartbeat(E_ID, pair.now), pair.now).reply
    assert isinstance(reply, Heartbeat) and reply.payload.status is HeartbeatStatus.DRAINING


def test_both_roles_in_one_engine() -> None:
    """One peer can be R of one task and E of another with the same partner and task id."""
    pair = Pair()
    key = pair.submit("echo", task_id="task-1")
    pair.deliver_all()
    # E submits its own task-1 to R: a different task, keyed by (E, task-1).
    other, step = pair.e.submit(Submit(R_ID, "echo", {}, task_id="task-1"), pair.now)
    pair.absorb(pair.e, step)
    assert other == TaskKey(E_ID, "task-1") != key
    ex = pair.deliver(E_ID)
    assert isinstance(ex.reply, TaskConfirm)
    assert pair.rec(R_ID, other).role is Role.EXECUTOR
    assert pair.rec(R_ID, key).role is Role.REQUESTER
    assert pair.e.in_flight_with(R_ID) == 2


def test_a_cancel_asked_before_a_rejection_is_never_sent(pair: Pair) -> None:
    rejected = pair.submit("translate")
    pair.cancel(rejected)
    pair.deliver(R_ID)
    pair.e.draining = True
    refused = pair.submit("echo")
    pair.cancel(refused)
    pair.deliver(R_ID)
    assert pair.outbox == {R_ID: [], E_ID: []}
    assert pair.states(rejected) == (S.REJECTED, S.REJECTED)
    assert pair.states(refused) == (S.REJECTED, None)


def test_undeliverable_messages_are_told_to_the_requester_only(pair: Pair) -> None:
    key = confirmed_and_running(pair)
    pair.cancel(key)
    [cancel] = pair.drop(R_ID)
    step = pair.r.on_undeliverable(cancel.message, pair.now)
    assert step.actions == [
        TaskEvent(key, "undeliverable", S.EXECUTING, cancel.message, "partner did not answer")
    ]
    assert step.transitions == [] and pair.states(key) == (S.EXECUTING, S.EXECUTING)
    pair.report_status(key)
    [update] = pair.drop(E_ID)
    assert pair.e.on_undeliverable(update.message, pair.now).actions == []
    beat = pair.r.heartbeat(E_ID, pair.now)
    assert pair.r.on_undeliverable(beat, pair.now).actions == []


def test_a_nack_to_a_message_about_no_task_is_a_bare_refusal(pair: Pair) -> None:
    query = pair.r.capability_query(E_ID, None, pair.now)
    nack = nack_for(pair.e, query, SynapseError(ErrorCode.RATE_LIMITED, "slow down"))
    step = pair.r.on_reply(query, nack, pair.now)
    assert [type(a) for a in step.actions] == [Refusal]
    assert step.actions[0] == Refusal(None, query, nack.payload)
