"""The engine's rules for running for months, on a fake clock: nobody waits forever (the
requester gives up on a silent executor, past the deadline, or when the executor lost the
task), unanswered questions end, one partner cannot take all capacity, and a finished task
can leave memory without changing any answer."""

from __future__ import annotations

import msgspec
from pairing import E_ID, R_ID, T0, Pair, at

from synapse.p2p.commands import Submit
from synapse.p2p.config import P2PConfig
from synapse.p2p.engine import DropQueued, Engine, TaskEvent, TaskKey
from synapse.p2p.states import Event
from synapse.types import (
    ErrorCode,
    SynapseError,
    TaskCancel,
    TaskConfirm,
    TaskFailed,
    TaskReject,
    TaskRequest,
    TaskState,
)

S = TaskState
QUIET = 100_000.0


def r_config(**kw: float) -> P2PConfig:
    """R: task_timeout 100 s, heartbeats every 10 s, lost after 3: silence limit 130 s."""
    base: dict[str, float] = {"task_timeout": 100, "heartbeat_interval": 10}
    return P2PConfig(**{**base, **kw})  # type: ignore[arg-type]


def e_config(**kw: float) -> P2PConfig:
    base: dict[str, float] = {"heartbeat_interval": QUIET, "task_timeout": QUIET}
    return P2PConfig(**{**base, **kw})  # type: ignore[arg-type]


def gave_up(pair: Pair, key: TaskKey, code: ErrorCode) -> str:
    rec = pair.rec(R_ID, key)
    assert rec.state is S.FAILED and rec.history[-1].event is Event.GIVE_UP
    assert rec.error is not None and rec.error.code == code.value and rec.error.recoverable
    [event] = [a for a in pair.actions[R_ID] if isinstance(a, TaskEvent) and a.kind == "gave_up"]
    assert event.key == key and event.state is S.FAILED and event.detail == rec.error.message
    return rec.error.message


# --- nobody waits forever -----------------------------------------------------------------------


def test_a_silent_executor_is_given_up_after_task_timeout_and_heartbeat_loss() -> None:
    pair = Pair(r_config=r_config(), e_config=e_config())
    key = pair.submit("slow")
    pair.deliver_all()
    assert pair.states(key) == (S.EXECUTING, S.EXECUTING)
    pair.advance(129)  # E's silence about the task: 129 s < 130 s
    assert pair.rec(R_ID, key).state is S.EXECUTING
    pair.report_status(key, progress=10)  # word about the task restarts R's patience
    pair.deliver_all()
    pair.advance(129)
    assert pair.rec(R_ID, key).state is S.EXECUTING
    pair.advance(1)
    text = gave_up(pair, key, ErrorCode.EXECUTION_TIMEOUT)
    assert "130 s" in text and E_ID in text
    # E is told: a task_cancel, which E acknowledges; R's record stays as it failed.
    about = [o.message.message_type.value for o in pair.outbox[R_ID] if o.key == key]
    assert about == ["p2p:task_cancel"]
    pair.deliver_all()
    assert pair.states(key) == (S.FAILED, S.CANCELLED)


def test_no_silence_timer_while_the_requester_owes_the_answer() -> None:
    pair = Pair(r_config=r_config(), e_config=e_config(input_timeout=QUIET))
    key = pair.submit("slow")
    pair.deliver_all()
    pair.request_info(key)
    pair.deliver_all()
    assert pair.states(key) == (S.INFO_NEEDED, S.INFO_NEEDED)
    pair.advance(10_000)  # R's person takes their time: E is waiting for R, not silent
    assert pair.rec(R_ID, key).state is S.INFO_NEEDED
    pair.provide_info(key, {"style": "古典"})
    pair.deliver_all()
    pair.advance(130)
    gave_up(pair, key, ErrorCode.EXECUTION_TIMEOUT)


def test_past_the_deadline_the_requester_gives_up() -> None:
    pair = Pair(r_config=r_config(task_timeout=QUIET), e_config=e_config())
    key = pair.submit("slow", deadline=at(T0 + 50))
    pair.drop(R_ID)  # the request never arrives: E never answers
    pair.advance(50 + 9)  # a heartbeat interval of grace for E's own task_failed
    assert pair.rec(R_ID, key).state is S.PENDING
    pair.advance(1)
    text = gave_up(pair, key, ErrorCode.EXECUTION_TIMEOUT)
    assert "deadline" in text
    # Never answered: no cancel (E never had the task); its request is dropped instead.
    assert DropQueued(key) in pair.actions[R_ID]
    assert [o for o in pair.outbox[R_ID] if o.key == key] == []


def test_task_not_found_from_the_executor_fails_the_task_at_once() -> None:
    pair = Pair(r_config=r_config(), e_config=e_config())
    key = pair.submit("slow")
    pair.deliver_all()
    del pair.e.tasks[key]  # E lost the task (a restart with the memory store, say)
    pair.cancel(key, reason="stop")
    [exchange] = pair.deliver_all()
    assert exchange.error is not None and exchange.error.code is ErrorCode.TASK_NOT_FOUND
    text = gave_up(pair, key, ErrorCode.TASK_NOT_FOUND)
    assert E_ID in text
    # No cancel to a task E says it has not got.
    assert [o for o in pair.outbox[R_ID] if o.key == key] == []


# --- fairness ------------------------------------------------------------------------------------


def test_an_unanswered_question_ends_after_input_timeout() -> None:
    pair = Pair(r_config=r_config(task_timeout=QUIET), e_config=e_config(input_timeout=600))
    key = pair.submit("text_generation", {"prompt": "p"})  # the synchronous task_need_info
    pair.deliver_all()
    assert pair.states(key) == (S.INFO_NEEDED, S.INFO_NEEDED)
    assert pair.e.active_executor_tasks() == 1
    pair.advance(599)
    assert pair.rec(E_ID, key).state is S.INFO_NEEDED
    pair.advance(1)
    [failed] = [o for o in pair.outbox[E_ID] if isinstance(o.message, TaskFailed)]
    assert failed.message.payload.error.code == ErrorCode.EXECUTION_TIMEOUT
    assert "within input_timeout (600 s)" in failed.message.payload.error.message
    assert pair.e.active_executor_tasks() == 0  # the capacity is free again
    pair.deliver_all()
    assert pair.states(key) == (S.FAILED, S.FAILED)


def test_need_human_without_a_deadline_ends_after_input_timeout() -> None:
    pair = Pair(r_config=r_config(task_timeout=QUIET), e_config=e_config(input_timeout=60))
    key = pair.submit("slow")
    pair.deliver_all()
    pair.request_human(key)
    pair.deliver_all()
    assert pair.states(key) == (S.NEED_HUMAN, S.NEED_HUMAN)
    pair.advance(60)
    pair.deliver_all()
    assert pair.states(key) == (S.FAILED, S.FAILED)
    rec = pair.rec(E_ID, key)
    assert rec.error is not None and rec.error.code == ErrorCode.EXECUTION_TIMEOUT.value


def test_required_by_wins_over_input_timeout() -> None:
    pair = Pair(r_config=r_config(task_timeout=QUIET), e_config=e_config(input_timeout=3600))
    key = pair.submit("slow")
    pair.deliver_all()
    pair.request_info(key, required_by=at(T0 + 30))
    pair.deliver_all()
    pair.advance(30)
    assert pair.rec(E_ID, key).state is S.FAILED


def test_one_partner_gets_at_most_its_share() -> None:
    config = e_config(max_concurrent_tasks=4, max_tasks_per_partner=2, capacity_retry_after=7)
    e = Engine(agent_id=E_ID, endpoint="http://e", config=config, capabilities=lambda: ["slow"])
    greedy = Engine(agent_id=R_ID, endpoint="http://r")
    other = Engine(agent_id="agent-x", endpoint="http://x")

    def request(r: Engine) -> TaskConfirm | TaskReject:
        _, step = r.submit(Submit(E_ID, "slow"), T0)
        message = step.outgoing[0].message
        assert isinstance(message, TaskRequest)
        reply = e.receive(message, T0).reply
        assert isinstance(reply, TaskConfirm | TaskReject)
        return reply

    assert [type(request(greedy)) for _ in range(2)] == [TaskConfirm, TaskConfirm]
    refused = request(greedy)
    assert isinstance(refused, TaskReject)
    assert refused.payload.reason.code == ErrorCode.RATE_LIMITED.value
    assert "per partner" in refused.payload.reason.message
    assert refused.payload.alternatives is not None
    assert refused.payload.alternatives.retry_after == 7
    assert isinstance(request(other), TaskConfirm)  # the rest of the capacity is still open
    assert e.active_executor_tasks() == 3


# --- leaving memory -------------------------------------------------------------------------------


def test_a_forgotten_task_answers_as_before_through_the_lookup() -> None:
    pair = Pair(r_config=r_config(), e_config=e_config())
    key = pair.submit("echo", {"text": "hi"})
    pair.deliver_all()
    pair.complete(key)
    pair.deliver_all()
    assert pair.states(key) == (S.COMPLETED, S.COMPLETED)
    request = next(ex.message for ex in pair.log if isinstance(ex.message, TaskRequest))
    kept = {side: pair.rec(side, key) for side in (R_ID, E_ID)}
    assert not pair.e.forget(TaskKey("nobody", "none"))
    for side, engine in ((R_ID, pair.r), (E_ID, pair.e)):
        assert engine.forget(key) and key not in engine.tasks
        assert engine.get(key) is None  # nothing without a store behind it
        engine.finished_lookup = lambda k, rec=kept[side]: rec if k == rec.key else None
        assert engine.get(key) is kept[side]
    # The same request again: the original decision, as when the task was in memory.
    again = msgspec.structs.replace(request, id="msg-again")
    reply = pair.e.receive(again, pair.now).reply
    assert isinstance(reply, TaskConfirm) and reply.reply_to == "msg-again"
    # A cancel of the finished task: 409 task_already_completed, not 404, nothing changed.
    try:
        pair.e.receive(_cancel_message(pair, key), pair.now)
    except SynapseError as exc:
        assert exc.code is ErrorCode.TASK_ALREADY_COMPLETED
    else:
        raise AssertionError("a cancel of a finished task was accepted")
    assert kept[E_ID].state is S.COMPLETED


def _cancel_message(pair: Pair, key: TaskKey) -> TaskCancel:
    from synapse.types import TaskCancelPayload, build_message

    message: TaskCancel = build_message(
        TaskCancel,
        TaskCancelPayload(task_id=key.task_id, reason="late"),
        sender=pair.r.sender,
        to=E_ID,
        timestamp=at(pair.now),
    )
    return message
