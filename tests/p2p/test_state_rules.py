"""Rules that move a task live in, or are derived from, the table in synapse/p2p/states.py:
timers per state (one declaration for the live path and for restore), recovery's running
states, the states awaiting the synchronous reply, and the conformance kit's own model of the
executor, which must equal the table's projection."""

from __future__ import annotations

import copy
from datetime import timedelta

from pairing import T0, Pair, at

from synapse.conformance.rules import EXECUTOR_MOVES, REQUESTER_MOVES
from synapse.p2p.config import P2PConfig
from synapse.p2p.engine import Engine, StartExecution, TaskKey
from synapse.p2p.states import (
    AWAITING_REPLY,
    QUESTION_STATES,
    RESTARTED_BY_EVERY_MOVE,
    RUNNING_STATES,
    STATE_TIMERS,
    TRANSITIONS,
    Event,
    Role,
    StateTimer,
    state_timers,
    timers_entered,
    timers_left,
)
from synapse.types import DecisionAction, HumanDecisionPayload, TaskState

S = TaskState
QUIET = P2PConfig(heartbeat_interval=100_000.0, task_timeout=300.0)


def armed(engine: Engine, key: TaskKey) -> dict[str, float]:
    """The task timers armed for `key`: kind → due time."""
    timers = engine._timers
    live = {k: seq for k, seq in timers._armed.items()}
    return {
        kind: when
        for when, seq, (kind, target) in timers._heap
        if target == key and live.get((kind, target)) == seq
    }


def restored(pair: Pair) -> Engine:
    """A fresh executor engine that took back E's records, as after a restart."""
    engine = Engine(agent_id=pair.e.agent_id, endpoint=pair.e.endpoint, config=QUIET)
    engine.restore(copy.deepcopy(list(pair.e.tasks.values())), pair.now)
    return engine


def executing_time_spent(pair: Pair, key: TaskKey) -> None:
    rec = pair.e.get(key)
    assert rec is not None and rec.executing_since is not None
    # What restore sees of the executing time: what was spent up to now.
    rec.executed_time += pair.now - rec.executing_since
    rec.executing_since = pair.now


def test_restore_arms_the_timers_a_live_move_into_the_state_arms() -> None:
    cases = []
    pair = Pair(e_config=QUIET, r_config=QUIET)
    key = pair.submit("slow")
    pair.deliver_all()
    pair.now += 40
    cases.append(("executing", key))
    asked = pair.submit("slow")
    pair.deliver_all()
    pair.request_info(asked, required_by=at(pair.now + 120))
    cases.append(("info_needed", asked))
    human = pair.submit("portrait")
    pair.deliver_all()
    pair.request_human(human, deadline=at(pair.now + 90))
    cases.append(("need_human", human))
    live = {name: armed(pair.e, k) for name, k in cases}
    assert set(live["executing"]) == {StateTimer.TASK_TIMEOUT}
    assert live["executing"][StateTimer.TASK_TIMEOUT] == T0 + QUIET.task_timeout
    wait = {StateTimer.ANSWER_WAIT}
    assert set(live["info_needed"]) == wait and set(live["need_human"]) == wait
    executing_time_spent(pair, key)
    again = restored(pair)
    assert {name: armed(again, k) for name, k in cases} == live


def test_timers_per_state_are_declared_once_and_cover_the_executor_waits() -> None:
    # The requester's patience runs wherever it waits for the executor, and nowhere else.
    assert {s for s, timers in STATE_TIMERS[Role.REQUESTER].items() if timers} == {
        S.IDLE,
        S.PENDING,
        S.CONFIRMED,
        S.EXECUTING,
        S.INFO_PROVIDED,
        S.HUMAN_APPROVED,
        S.HUMAN_REJECTED,
    }
    assert timers_left(Role.REQUESTER, S.EXECUTING, S.INFO_NEEDED) == {StateTimer.SILENCE}
    assert timers_entered(Role.REQUESTER, S.INFO_NEEDED, S.INFO_PROVIDED) == {StateTimer.SILENCE}
    assert {StateTimer.SILENCE} == RESTARTED_BY_EVERY_MOVE
    assert state_timers(Role.EXECUTOR, S.EXECUTING) == {StateTimer.TASK_TIMEOUT}
    assert timers_entered(Role.EXECUTOR, S.CONFIRMED, S.EXECUTING) == {StateTimer.TASK_TIMEOUT}
    assert timers_left(Role.EXECUTOR, S.EXECUTING, S.NEED_HUMAN) == {StateTimer.TASK_TIMEOUT}
    assert timers_entered(Role.EXECUTOR, S.EXECUTING, S.NEED_HUMAN) == {StateTimer.ANSWER_WAIT}
    assert timers_entered(Role.EXECUTOR, S.EXECUTING, S.EXECUTING) == frozenset()
    for role in Role:
        for state in STATE_TIMERS[role]:
            assert not state.is_final and state in TRANSITIONS[role]


def test_an_answer_wait_stops_on_leaving_its_state() -> None:
    pair = Pair(e_config=QUIET, r_config=QUIET)
    key = pair.submit("slow")
    pair.deliver_all()
    pair.request_info(key, required_by=at(pair.now + 60))
    pair.deliver_all()
    assert StateTimer.ANSWER_WAIT in armed(pair.e, key)
    pair.provide_info(key, {"style": "古典"})
    pair.deliver_all()
    assert StateTimer.ANSWER_WAIT not in armed(pair.e, key)


def test_recoverys_running_states_are_where_execution_starts() -> None:
    starts = {
        s for s, moves in TRANSITIONS[Role.EXECUTOR].items() if Event.START_EXECUTION in moves
    }
    assert starts | {S.EXECUTING} == RUNNING_STATES
    assert {S.CONFIRMED, S.EXECUTING, S.INFO_PROVIDED, S.HUMAN_APPROVED} == RUNNING_STATES


def test_awaiting_the_reply_is_where_a_confirm_is_accepted() -> None:
    assert {S.PENDING} == AWAITING_REPLY
    for state in AWAITING_REPLY:
        assert Event.RECV_CANCEL_ACK not in TRANSITIONS[Role.REQUESTER][state]


def test_the_conformance_kits_executor_model_is_the_tables_projection() -> None:
    """The kit keeps its own graph (it must not trust the engine it may be checking); it must
    still say exactly what the table says, projected to what is visible from outside."""
    table = TRANSITIONS[Role.EXECUTOR]
    exits = {S.FAILED.value, S.CANCELLED.value}
    projected = {
        state.value: frozenset(target.value for target in moves.values()) - exits
        for state, moves in table.items()
        if state is not S.IDLE
    }
    assert projected == dict(EXECUTOR_MOVES)
    for state, moves in table.items():
        if not state.is_final and state is not S.IDLE:
            assert {t.value for t in moves.values()} >= exits, state  # failed, cancelled
    requester_moves = {
        (state.value, target.value)
        for state, moves in table.items()
        for event, target in moves.items()
        if event.message_type is not None  # a message of the requester's moved it
    }
    assert requester_moves == REQUESTER_MOVES


def test_the_restart_path_resumes_a_running_task_from_the_derived_set() -> None:
    pair = Pair(e_config=QUIET, r_config=QUIET)
    key = pair.submit("slow")
    pair.deliver_all()
    rec = pair.e.get(key)
    assert rec is not None and rec.state in RUNNING_STATES
    pair.now += 5
    executing_time_spent(pair, key)
    again = restored(pair)
    step = again.recover(key, resumable=True, now=pair.now + timedelta(seconds=1).total_seconds())
    assert [type(a).__name__ for a in step.actions] == ["StartExecution"]


def test_a_question_waits_through_a_restart_and_its_answer_starts_the_handler_again() -> None:
    """A resumable handler interrupted while its task waits on its question: the task goes on
    waiting (no failure, no new question), and the answer starts the handler again with it;
    a handler that cannot resume fails the task as before."""
    for kind in ("info", "human"):
        pair = Pair(e_config=QUIET, r_config=QUIET)
        key = pair.submit("slow")
        pair.deliver_all()
        if kind == "info":
            pair.request_info(key)
        else:
            pair.request_human(key)
        pair.deliver_all()
        waiting = pair.rec("e", key).state
        assert waiting in QUESTION_STATES
        failing = restored(pair).recover(key, resumable=False, now=pair.now)
        assert [t.to_state for t in failing.transitions] == [S.FAILED]
        pair.e = restored(pair)
        step = pair.e.recover(key, resumable=True, now=pair.now)
        assert not step.actions and not step.transitions and not step.outgoing
        assert pair.rec("e", key).state is waiting
        starts = pair.starts(key)
        if kind == "info":
            pair.provide_info(key, {"style": "现代"})
        else:
            pair.decide(key, DecisionAction.APPROVE, approved_fields={"authorized": True})
        pair.deliver_all()
        assert pair.starts(key) == starts + 1
        start = [a for a in pair.actions["agent-e"] if isinstance(a, StartExecution)][-1]
        assert pair.rec("e", key).state is S.EXECUTING
        if kind == "info":
            assert start.answered == {"style": "现代"} and start.payload["style"] == "现代"
        else:
            assert isinstance(start.answered, HumanDecisionPayload)
            assert start.answered.decision.approved_fields == {"authorized": True}
