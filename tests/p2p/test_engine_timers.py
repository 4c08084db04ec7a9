"""Timeouts, deadlines and heartbeats on a fake clock (specs/protocol.md, 'Task states'), with no
sleeping."""

from __future__ import annotations

import pytest
from pairing import E_ID, R_ID, T0, Pair, Snapshot, at, style_missing

from synapse.p2p.commands import Submit
from synapse.p2p.config import P2PConfig
from synapse.p2p.engine import (
    CancelExecution,
    PartnerReachability,
    Step,
    TaskEvent,
    TaskKey,
    Validation,
)
from synapse.types import (
    DecisionAction,
    ErrorCode,
    Heartbeat,
    HeartbeatStatus,
    SynapseError,
    TaskFailed,
    TaskState,
    TaskStatusUpdate,
    TaskStatusUpdatePayload,
    build_message,
)

S = TaskState
QUIET = 100_000.0  # a heartbeat interval that never fires within a test


def quiet(**kw: float) -> P2PConfig:
    """No heartbeat, and no wait for an answer, ends within a test unless asked for."""
    kw.setdefault("input_timeout", QUIET)
    kw.setdefault("task_timeout", QUIET)
    return P2PConfig(heartbeat_interval=QUIET, **kw)  # type: ignore[arg-type]


def running(pair: Pair, task_type: str = "slow", **kw: object) -> TaskKey:
    key = pair.submit(task_type, **kw)
    pair.deliver_all()
    assert pair.states(key) == (S.EXECUTING, S.EXECUTING)
    return key


def timed_out(step: Step, key: TaskKey, text: str) -> None:
    """`step` failed `key` with execution_timeout, told R and stopped the handler."""
    assert [(t.from_state, t.to_state) for t in step.transitions][-1][1] is S.FAILED
    [out] = [o for o in step.outgoing if o.key == key]
    assert isinstance(out.message, TaskFailed)
    assert out.message.payload.error.code == ErrorCode.EXECUTION_TIMEOUT
    assert text in out.message.payload.error.message
    assert CancelExecution(key, ErrorCode.EXECUTION_TIMEOUT.value) in step.actions


def nothing(step: Step) -> None:
    assert step.transitions == [] and step.actions == []
    assert not [o for o in step.outgoing if o.key is not None]


# --- TaskTimeout --------------------------------------------------------------------------------


def test_task_timeout_counts_executing_time_only() -> None:
    pair = Pair(e_config=quiet(task_timeout=100), r_config=quiet())
    key = running(pair)
    assert pair.e.next_deadline() == T0 + 100
    nothing(pair.advance(60)[1])

    # 60 s used. Waiting for information does not count …
    pair.request_info(key)
    pair.deliver_all()
    assert pair.e.next_deadline() == T0 + QUIET  # the timeout is disarmed while waiting
    nothing(pair.advance(1_000)[1])
    pair.provide_info(key, {"style": "古典"})
    pair.deliver_all()
    assert pair.states(key) == (S.EXECUTING, S.EXECUTING)
    assert pair.e.next_deadline() == pair.now + 40

    # … 30 s more, then waiting for a person does not count either.
    nothing(pair.advance(30)[1])
    pair.request_human(key)
    pair.deliver_all()
    nothing(pair.advance(5_000)[1])
    pair.start_deciding(key)
    pair.decide(key, DecisionAction.APPROVE)
    pair.deliver_all()
    assert pair.states(key) == (S.EXECUTING, S.EXECUTING)
    assert pair.e.next_deadline() == pair.now + 10

    nothing(pair.advance(9.5)[1])
    _, step = pair.advance(0.5)
    timed_out(step, key, "TaskTimeout")
    assert pair.states(key) == (S.EXECUTING, S.FAILED)
    assert pair.rec(E_ID, key).executed_time == 100
    [failed] = pair.deliver_all()
    assert failed.reply.payload.state is S.FAILED  # type: ignore[union-attr]
    assert pair.states(key) == (S.FAILED, S.FAILED)
    # A late result from the stopped handler goes nowhere.
    assert pair.complete(key).discarded
    assert pair.outbox[E_ID] == []


def test_status_updates_do_not_restart_the_timeout() -> None:
    pair = Pair(e_config=quiet(task_timeout=100), r_config=quiet())
    key = running(pair)
    for _ in range(9):
        pair.advance(10)
        pair.report_status(key, progress=10)
        pair.deliver_all()
    assert pair.e.next_deadline() == T0 + 100
    timed_out(pair.advance(10)[1], key, "TaskTimeout")


def test_no_timeout_once_the_task_ends() -> None:
    pair = Pair(e_config=quiet(task_timeout=100), r_config=quiet())
    key = running(pair)
    pair.complete(key)
    pair.deliver_all()
    assert pair.e.next_deadline() == T0 + QUIET
    nothing(pair.advance(500)[1])
    assert pair.states(key) == (S.COMPLETED, S.COMPLETED)


# --- deadlines ----------------------------------------------------------------------------------


def test_task_deadline_fires() -> None:
    pair = Pair(e_config=quiet(), r_config=quiet())
    key = running(pair, deadline=at(T0 + 50))
    assert pair.e.next_deadline() == T0 + 50
    nothing(pair.advance(49.9)[1])
    _, step = pair.advance(0.1)
    timed_out(step, key, "deadline")
    pair.deliver_all()
    assert pair.states(key) == (S.FAILED, S.FAILED)
    error = pair.rec(R_ID, key).error
    assert error is not None and error.code == "execution_timeout"


def test_task_deadline_fires_while_waiting_for_information() -> None:
    pair = Pair(e_config=quiet(), r_config=quiet())
    key = pair.submit("text_generation", {"prompt": "p"}, deadline=at(T0 + 50))
    pair.deliver_all()
    assert pair.states(key) == (S.INFO_NEEDED, S.INFO_NEEDED)
    timed_out(pair.advance(50)[1], key, "deadline")
    pair.deliver_all()
    assert pair.states(key) == (S.FAILED, S.FAILED)


def test_required_by_fires_when_unanswered() -> None:
    pair = Pair(e_config=quiet(), r_config=quiet())
    key = running(pair)
    pair.request_info(key, required_by=at(pair.now + 20))
    pair.deliver_all()
    assert pair.e.next_deadline() == T0 + 20
    nothing(pair.advance(19)[1])
    timed_out(pair.advance(1)[1], key, "no task_info_provided by its required_by")
    # R's answer crosses the failure: refused with 409, then the failure arrives.
    pair.provide_info(key, {"style": "古典"})
    late = pair.deliver(R_ID)
    assert late.error is not None and late.error.http_status == 409
    assert pair.states(key) == (S.INFO_PROVIDED, S.FAILED)
    pair.deliver_all()
    assert pair.states(key) == (S.FAILED, S.FAILED)


def test_required_by_is_disarmed_by_the_answer() -> None:
    pair = Pair(e_config=quiet(), r_config=quiet())
    key = running(pair)
    pair.request_info(key, required_by=at(pair.now + 20))
    pair.deliver_all()
    pair.advance(10)
    pair.provide_info(key, {"style": "古典"})
    pair.deliver_all()
    nothing(pair.advance(100)[1])
    assert pair.states(key) == (S.EXECUTING, S.EXECUTING)


def test_required_by_of_the_synchronous_need_info() -> None:
    def validator(task_type: str, payload: dict[str, object]) -> Validation:
        if "style" in payload:
            return Validation()
        return Validation(missing_fields=[style_missing()], required_by=at(T0 + 30))

    pair = Pair(validator=validator, e_config=quiet(), r_config=quiet())
    key = pair.submit("text_generation", {"prompt": "p"})
    pair.deliver_all()
    assert pair.e.next_deadline() == T0 + 30
    timed_out(pair.advance(30)[1], key, "no task_info_provided by its required_by")
    pair.deliver_all()
    assert pair.states(key) == (S.FAILED, S.FAILED)


def test_need_human_deadline_fires() -> None:
    pair = Pair(e_config=quiet(), r_config=quiet())
    key = running(pair, "portrait")
    pair.request_human(key, deadline=at(pair.now + 300))
    pair.deliver_all()
    pair.start_deciding(key)  # a person is still thinking …
    nothing(pair.advance(299)[1])
    timed_out(pair.advance(1)[1], key, "no human_decision by its deadline")
    pair.deliver_all()
    assert pair.states(key) == (S.FAILED, S.FAILED)


def test_need_human_deadline_is_disarmed_by_the_decision() -> None:
    pair = Pair(e_config=quiet(task_timeout=10_000), r_config=quiet())
    key = running(pair, "portrait")
    pair.request_human(key, deadline=at(pair.now + 300))
    pair.deliver_all()
    pair.decide(key, DecisionAction.APPROVE)
    pair.deliver_all()
    nothing(pair.advance(299)[1])
    nothing(pair.advance(1)[1])
    assert pair.states(key) == (S.EXECUTING, S.EXECUTING)


def test_several_timers_due_at_once_fail_the_task_once() -> None:
    pair = Pair(e_config=quiet(task_timeout=100), r_config=quiet())
    key = running(pair, deadline=at(T0 + 50))
    _, step = pair.advance(10_000)  # the clock jumps over the deadline and the timeout
    assert [t.to_state for t in step.transitions] == [S.FAILED]
    assert len([o for o in step.outgoing if o.key == key]) == 1
    assert pair.e.next_deadline() == T0 + QUIET


def test_next_deadline_tracks_the_earliest_timer() -> None:
    pair = Pair(e_config=P2PConfig(task_timeout=300, heartbeat_interval=1_000), r_config=quiet())
    assert pair.e.next_deadline() is None and pair.r.next_deadline() is None
    key = running(pair, deadline=at(T0 + 200))
    assert pair.r.next_deadline() == T0 + QUIET  # R: only its heartbeat
    assert pair.e.next_deadline() == T0 + 200  # deadline < timeout < heartbeat
    pair.request_info(key, required_by=at(T0 + 50))
    assert pair.e.next_deadline() == T0 + 50
    pair.deliver_all()
    pair.advance(10)
    pair.provide_info(key, {"style": "古典"})
    pair.deliver_all()
    assert pair.e.next_deadline() == T0 + 200  # required_by disarmed; timeout at T0 + 310
    other = running(pair, deadline=at(T0 + 120))
    assert pair.e.next_deadline() == T0 + 120
    pair.complete(other)
    assert pair.e.next_deadline() == T0 + 200
    pair.complete(key)
    assert pair.e.next_deadline() == T0 + 1_000  # the heartbeat
    pair.advance(1_000)
    assert pair.e.next_deadline() is None  # nothing in flight: heartbeats stop


# --- heartbeats ---------------------------------------------------------------------------------


def heartbeats(step: Step) -> list[tuple[str, Heartbeat]]:
    return [(o.partner, o.message) for o in step.outgoing if isinstance(o.message, Heartbeat)]


def test_heartbeats_go_only_to_partners_with_tasks_in_flight(pair: Pair) -> None:
    pair.r.heard("agent-x", pair.now)  # a known partner without tasks
    nothing_yet = pair.advance(30)
    assert heartbeats(nothing_yet[0]) == heartbeats(nothing_yet[1]) == []
    key = running(pair)
    assert pair.r.next_deadline() == pair.now + 30
    for _ in range(3):
        r_step, e_step = pair.advance(30)
        [(to, beat)] = heartbeats(r_step)
        assert to == E_ID and beat.to.agent_id == E_ID
        assert (beat.payload.status, beat.payload.active_tasks) == (HeartbeatStatus.OK, 1)
        [(to, beat)] = heartbeats(e_step)
        assert to == R_ID and beat.payload.active_tasks == 1
        exchanges = pair.deliver_all()
        assert [type(x.reply) for x in exchanges] == [Heartbeat, Heartbeat]
        assert r_step.actions == e_step.actions == []  # answered: nobody is unreachable
    # Not before the interval.
    assert heartbeats(pair.advance(29)[0]) == []
    pair.advance(1)
    pair.deliver_all()
    pair.complete(key)
    pair.deliver_all()
    r_step, e_step = pair.advance(30)
    assert heartbeats(r_step) == heartbeats(e_step) == []
    assert pair.r.next_deadline() is None and pair.e.next_deadline() is None
    # A new task starts them again.
    running(pair)
    assert len(heartbeats(pair.advance(30)[0])) == 1


def test_silence_marks_a_partner_unreachable_without_touching_tasks(pair: Pair) -> None:
    key = running(pair)
    mine, _ = pair.r.submit(Submit(E_ID, "slow", {}), pair.now)  # a second, never delivered
    history = (len(pair.rec(R_ID, key).history), len(pair.rec(E_ID, key).history))
    for _ in range(2):
        r_step, e_step = pair.advance(30)
        assert r_step.actions == e_step.actions == []
        pair.drop(R_ID), pair.drop(E_ID)  # nobody answers
    r_step, e_step = pair.advance(30)  # 3 × 30 s of silence
    assert r_step.actions[0] == PartnerReachability(E_ID, reachable=False)
    events = [a for a in r_step.actions if isinstance(a, TaskEvent)]
    assert {(a.key, a.kind, a.state) for a in events} == {
        (key, "partner_unreachable", S.EXECUTING),
        (mine, "partner_unreachable", S.PENDING),
    }
    # E sees R silent too, but E's tasks have no requester handle to tell.
    assert e_step.actions == [PartnerReachability(R_ID, reachable=False)]
    assert not pair.r.is_reachable(E_ID) and not pair.e.is_reachable(R_ID)
    # No task state changed; heartbeats keep going so that the partner can come back.
    assert r_step.transitions == e_step.transitions == []
    assert pair.states(key) == (S.EXECUTING, S.EXECUTING)
    assert pair.states(mine) == (S.PENDING, None)
    assert (len(pair.rec(R_ID, key).history), len(pair.rec(E_ID, key).history)) == history
    assert len(heartbeats(r_step)) == 1
    # Said once, not at every heartbeat.
    r_step, _ = pair.advance(30)
    assert r_step.actions == [] and len(heartbeats(r_step)) == 1

    # heard(): reachable again, with an event per requester task.
    back = pair.r.heard(E_ID, pair.now)
    assert back.actions[0] == PartnerReachability(E_ID, reachable=True)
    assert {(a.kind, a.key) for a in back.actions if isinstance(a, TaskEvent)} == {
        ("partner_reachable", key),
        ("partner_reachable", mine),
    }
    assert pair.r.is_reachable(E_ID)
    assert pair.r.heard(E_ID, pair.now).actions == []  # only once
    # Any authenticated message counts: E hears R's heartbeat.
    beat = pair.r.heartbeat(E_ID, pair.now)
    assert pair.e.receive(beat, pair.now).actions == [PartnerReachability(R_ID, reachable=True)]
    assert pair.e.is_reachable(R_ID)
    assert pair.states(key) == (S.EXECUTING, S.EXECUTING)


def test_a_refused_message_is_no_sign_of_life(pair: Pair) -> None:
    """Only an accepted message proves the partner alive: one the engine refuses leaves it
    unreachable, its backlog held and its silence counting, and reports nothing."""
    key = running(pair)
    for _ in range(3):
        pair.advance(30)
        pair.drop(R_ID), pair.drop(E_ID)  # nobody answers
    assert not pair.r.is_reachable(E_ID)
    pair.r.keep_heartbeat(E_ID, pair.now)  # messages for E wait
    before = Snapshot.of(pair.r)
    pair.advance(1)
    stray = pair.e.task_ack(pair.r.heartbeat(E_ID, pair.now), pair.rec(E_ID, key), pair.now)
    unknown = build_message(
        TaskStatusUpdate,
        TaskStatusUpdatePayload(task_id="no-such-task", status=S.EXECUTING),
        sender=pair.e.sender,
        to=R_ID,
        timestamp=at(pair.now),
    )
    for message in (unknown, stray):
        with pytest.raises(SynapseError):
            pair.r.receive(message, pair.now)
    assert not pair.r.is_reachable(E_ID)
    assert Snapshot.of(pair.r) == before
    # An accepted one does: reachable again, reported once.
    beat = pair.e.heartbeat(R_ID, pair.now)
    step = pair.r.receive(beat, pair.now)
    assert step.actions[0] == PartnerReachability(E_ID, reachable=True)
    assert pair.r.is_reachable(E_ID) and Snapshot.of(pair.r) != before


def test_a_reply_to_our_heartbeat_keeps_the_partner_reachable(pair: Pair) -> None:
    running(pair)
    for _ in range(10):
        r_step, e_step = pair.advance(30)
        assert not [
            a for a in r_step.actions + e_step.actions if isinstance(a, PartnerReachability)
        ]
        pair.drop(R_ID)  # R's heartbeats are lost, but E's reach R and are answered
        pair.deliver_all()
    assert pair.r.is_reachable(E_ID) and pair.e.is_reachable(R_ID)


def test_silence_counts_from_when_heartbeats_start_not_from_an_idle_spell(pair: Pair) -> None:
    """After a quiet spell with nothing in flight, a new task's partner gets the full
    `missed_heartbeat_limit` intervals before it is called unreachable."""
    key = running(pair)
    pair.complete(key)
    pair.deliver_all()
    pair.advance(1_000)  # idle: no heartbeats, nobody is missing any
    pair.submit("echo")  # … and E is down now: the request does not get through
    pair.drop(R_ID)
    for _ in range(2):
        r_step, _ = pair.advance(30)
        assert r_step.actions == []
        pair.drop(R_ID)
    r_step, _ = pair.advance(30)
    assert r_step.actions[0] == PartnerReachability(E_ID, reachable=False)
