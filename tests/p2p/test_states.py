"""The transition table, pair by pair, for both roles (specs/protocol.md, 'Task states')."""

from __future__ import annotations

from collections import deque
from pathlib import Path

import pytest

from synapse.p2p.states import (
    TRANSITIONS,
    Event,
    Role,
    TransitionError,
    allowed_messages,
    next_state,
    render_spec,
)
from synapse.types import FINAL_STATES, ErrorCode, MessageType, SynapseError, TaskState

S = TaskState
SPEC = Path(__file__).resolve().parents[2] / "specs" / "state-machine.md"

E = Event
#: What R's partner may be doing: working on the task. Every callback of E's work is allowed
#: here; `pending` counts as an implicit confirm (a callback overtook the reply).
R_WORKING = {S.PENDING, S.CONFIRMED, S.EXECUTING, S.INFO_PROVIDED, S.HUMAN_APPROVED}
#: Where E may start (or resume) the handler.
E_READY = {S.CONFIRMED, S.INFO_PROVIDED, S.HUMAN_APPROVED}


def oracle(role: Role, state: TaskState, event: Event) -> TaskState | None:
    """The state after `event`, or None if refused: written from the prose rules of
    specs/protocol.md ('Task states', 'Flows'), independently of `TRANSITIONS`."""
    if state.is_final:
        return None  # final states are final
    if role is Role.REQUESTER:
        if state is S.IDLE:
            return S.PENDING if event is E.SEND_TASK_REQUEST else None
        if event is E.RECV_TASK_FAILED:
            return S.FAILED  # E may fail a task it holds at any moment
        if event is E.GIVE_UP:
            return S.FAILED  # R may give up on a live task at any moment (nobody waits forever)
        if event is E.RECV_CANCEL_ACK:
            return S.CANCELLED if state is not S.PENDING else None  # no cancel before the reply
        if state is S.PENDING:
            answers = {
                E.RECV_TASK_CONFIRM: S.CONFIRMED,
                E.RECV_TASK_REJECT: S.REJECTED,
                E.REQUEST_REFUSED: S.REJECTED,
            }
            if event in answers:
                return answers[event]
        if state in R_WORKING:
            callbacks = {
                E.RECV_TASK_STATUS_UPDATE: S.EXECUTING,
                E.RECV_TASK_NEED_INFO: S.INFO_NEEDED,
                E.RECV_TASK_NEED_HUMAN: S.NEED_HUMAN,
                E.RECV_TASK_COMPLETE: S.COMPLETED,
            }
            return callbacks.get(event)
        if state is S.INFO_NEEDED:
            return S.INFO_PROVIDED if event is E.SEND_TASK_INFO_PROVIDED else None
        if state in (S.NEED_HUMAN, S.HUMAN_DECIDING):
            if event is E.HUMAN_DECIDING and state is S.NEED_HUMAN:
                return S.HUMAN_DECIDING
            decisions = {
                E.SEND_HUMAN_APPROVE: S.HUMAN_APPROVED,
                E.SEND_HUMAN_REJECT: S.HUMAN_REJECTED,
            }
            return decisions.get(event)
        return None  # human_rejected: only E's task_failed (or a cancel) ends it
    if state in (S.PENDING, S.HUMAN_DECIDING):
        return None  # states of R only
    if state is S.IDLE:
        answers = {
            E.SEND_TASK_CONFIRM: S.CONFIRMED,
            E.SEND_TASK_REJECT: S.REJECTED,
            E.SEND_TASK_NEED_INFO: S.INFO_NEEDED,
        }
        return answers.get(event)
    if event is E.RECV_TASK_CANCEL:
        return S.CANCELLED  # any non-final state may be cancelled
    if event is E.SEND_TASK_FAILED:
        return S.FAILED  # deadline, timeout, handler error or a person's rejection
    if event is E.START_EXECUTION:
        return S.EXECUTING if state in E_READY else None
    if state is S.EXECUTING:
        work = {
            E.SEND_TASK_STATUS_UPDATE: S.EXECUTING,
            E.SEND_TASK_NEED_INFO: S.INFO_NEEDED,
            E.SEND_TASK_NEED_HUMAN: S.NEED_HUMAN,
            E.SEND_TASK_COMPLETE: S.COMPLETED,
        }
        return work.get(event)
    if state is S.INFO_PROVIDED and event is E.SEND_TASK_NEED_INFO:
        return S.INFO_NEEDED  # the answer lacked a field: ask again
    if state is S.INFO_NEEDED and event is E.RECV_TASK_INFO_PROVIDED:
        return S.INFO_PROVIDED
    if state is S.NEED_HUMAN:
        decisions = {E.RECV_HUMAN_APPROVE: S.HUMAN_APPROVED, E.RECV_HUMAN_REJECT: S.HUMAN_REJECTED}
        return decisions.get(event)
    return None


EVERY_PAIR = [(role, state, event) for role in Role for state in TaskState for event in Event]
ALLOWED = [(r, s_, e, oracle(r, s_, e)) for r, s_, e in EVERY_PAIR if oracle(r, s_, e) is not None]
REFUSED = [(r, s_, e) for r, s_, e in EVERY_PAIR if oracle(r, s_, e) is None]

#: States E never has: it answers a request at once (no `pending`), and only a person at R
#: decides (`human_deciding` is R only, specs/protocol.md, 'Task states'). E's table leaves them
#: out.
NOT_EXECUTOR = {S.PENDING, S.HUMAN_DECIDING}


def reachable(role: Role) -> set[TaskState]:
    seen = {S.IDLE}
    todo = deque([S.IDLE])
    while todo:
        for target in TRANSITIONS[role][todo.popleft()].values():
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def test_the_tables_cover_the_fourteen_states() -> None:
    assert len(TaskState) == 14
    assert set(TRANSITIONS[Role.REQUESTER]) == set(TaskState)
    assert set(TRANSITIONS[Role.EXECUTOR]) == set(TaskState) - NOT_EXECUTOR
    for role in Role:
        for moves in TRANSITIONS[role].values():
            assert set(moves.values()) <= set(TRANSITIONS[role])


@pytest.mark.parametrize("state", sorted(NOT_EXECUTOR))
def test_a_state_outside_the_executor_table_is_refused_not_a_key_error(state: TaskState) -> None:
    for event in Event:
        with pytest.raises(TransitionError) as info:
            next_state(Role.EXECUTOR, state, event)
        assert info.value.details == {"state": state.value, "allowed": []}


@pytest.mark.parametrize(("role", "state", "event", "target"), ALLOWED)
def test_every_move_the_rules_allow_gives_their_state(
    role: Role, state: TaskState, event: Event, target: TaskState
) -> None:
    assert next_state(role, state, event) is target


def test_the_oracle_is_not_the_table_in_disguise() -> None:
    """Both ways: every move of the table is one the rules allow, and the rules refuse some."""
    table = {
        (role, state, event): target
        for role, moves_by_state in TRANSITIONS.items()
        for state, moves in moves_by_state.items()
        for event, target in moves.items()
    }
    assert table == {(r, s_, e): t for r, s_, e, t in ALLOWED}
    assert len(REFUSED) > len(ALLOWED)


@pytest.mark.parametrize(("role", "state", "event"), REFUSED)
def test_every_move_the_rules_refuse_is_refused(role: Role, state: TaskState, event: Event) -> None:
    with pytest.raises(TransitionError) as info:
        next_state(role, state, event)
    error = info.value
    assert isinstance(error, SynapseError)
    assert (error.role, error.state, error.event) == (role, state, event)
    if state.is_final:
        assert error.code is ErrorCode.TASK_ALREADY_COMPLETED
        assert error.http_status == 409
        assert error.details == {"state": state.value}
    else:
        assert error.code is ErrorCode.INVALID_PARAMS
        assert error.http_status == 400
        assert error.details == {"state": state.value, "allowed": allowed_messages(role, state)}


def test_the_refusal_of_a_received_message_names_its_type() -> None:
    with pytest.raises(TransitionError) as info:
        next_state(Role.EXECUTOR, S.EXECUTING, Event.RECV_TASK_INFO_PROVIDED)
    assert "p2p:task_info_provided" in info.value.message
    assert info.value.details == {"state": "executing", "allowed": ["p2p:task_cancel"]}


@pytest.mark.parametrize("role", list(Role))
def test_final_states_have_no_way_out(role: Role) -> None:
    for state in FINAL_STATES:
        assert TRANSITIONS[role][state] == {}
        assert allowed_messages(role, state) == []
        for event in Event:
            with pytest.raises(TransitionError):
                next_state(role, state, event)


@pytest.mark.parametrize("role", list(Role))
def test_non_final_states_can_still_end(role: Role) -> None:
    """From every reachable non-final state some path leads to a final state."""
    for start in reachable(role) - FINAL_STATES:
        seen, todo = {start}, deque([start])
        while todo:
            for target in TRANSITIONS[role][todo.popleft()].values():
                if target not in seen:
                    seen.add(target)
                    todo.append(target)
        assert seen & FINAL_STATES, start


def test_nothing_returns_to_idle_or_pending() -> None:
    """States never go backwards to the start (specs/protocol.md, 'Task states')."""
    for role in Role:
        for state, moves in TRANSITIONS[role].items():
            assert S.IDLE not in moves.values()
            if state is not S.IDLE:
                assert S.PENDING not in moves.values()


def test_every_requester_state_is_reachable_from_idle() -> None:
    assert reachable(Role.REQUESTER) == set(TaskState)


def test_every_executor_state_but_human_deciding_is_reachable_from_idle() -> None:
    """`human_deciding` is R only (specs/protocol.md, 'Task states': a person at R decides);
    `pending` is R's wait
    for the synchronous reply, which E never has: E goes from `idle` straight to its answer."""
    assert reachable(Role.EXECUTOR) == set(TaskState) - NOT_EXECUTOR
    for moves in TRANSITIONS[Role.EXECUTOR].values():
        assert S.HUMAN_DECIDING not in moves.values()
        assert Event.HUMAN_DECIDING not in moves


def test_each_role_only_sends_and_receives_its_own_directions() -> None:
    """E's table receives only R → E messages, R's only E → R ones (specs/protocol.md,
    'Message types')."""
    r_to_e = {MessageType.TASK_INFO_PROVIDED, MessageType.HUMAN_DECISION, MessageType.TASK_CANCEL}
    for state in TaskState:
        assert set(allowed_messages(Role.EXECUTOR, state)) <= {t.value for t in r_to_e}
        assert not set(allowed_messages(Role.REQUESTER, state)) & {t.value for t in r_to_e}


def test_the_requester_flow_through_every_kind_of_state() -> None:
    path = [
        (Event.SEND_TASK_REQUEST, S.PENDING),
        (Event.RECV_TASK_CONFIRM, S.CONFIRMED),
        (Event.RECV_TASK_STATUS_UPDATE, S.EXECUTING),
        (Event.RECV_TASK_NEED_INFO, S.INFO_NEEDED),
        (Event.SEND_TASK_INFO_PROVIDED, S.INFO_PROVIDED),
        (Event.RECV_TASK_STATUS_UPDATE, S.EXECUTING),
        (Event.RECV_TASK_NEED_HUMAN, S.NEED_HUMAN),
        (Event.HUMAN_DECIDING, S.HUMAN_DECIDING),
        (Event.SEND_HUMAN_APPROVE, S.HUMAN_APPROVED),
        (Event.RECV_TASK_STATUS_UPDATE, S.EXECUTING),
        (Event.RECV_TASK_COMPLETE, S.COMPLETED),
    ]
    state = S.IDLE
    for event, expected in path:
        state = next_state(Role.REQUESTER, state, event)
        assert state is expected


def test_implicit_confirm_and_cancel_rules() -> None:
    # A callback for a task still pending at R counts as an implicit confirm.
    for event in (
        Event.RECV_TASK_STATUS_UPDATE,
        Event.RECV_TASK_NEED_HUMAN,
        Event.RECV_TASK_COMPLETE,
        Event.RECV_TASK_FAILED,
    ):
        assert next_state(Role.REQUESTER, S.PENDING, event) is not S.PENDING
    # R sends no task_cancel before the reply: no cancel ack while pending.
    with pytest.raises(TransitionError):
        next_state(Role.REQUESTER, S.PENDING, Event.RECV_CANCEL_ACK)
    # Any non-final state E can be in goes to cancelled on task_cancel.
    for state in reachable(Role.EXECUTOR) - FINAL_STATES - {S.IDLE}:
        assert next_state(Role.EXECUTOR, state, Event.RECV_TASK_CANCEL) is S.CANCELLED
        assert next_state(Role.EXECUTOR, state, Event.SEND_TASK_FAILED) is S.FAILED
    for state in reachable(Role.REQUESTER) - FINAL_STATES - {S.IDLE, S.PENDING}:
        assert next_state(Role.REQUESTER, state, Event.RECV_CANCEL_ACK) is S.CANCELLED
    # need_human ends with E failing on a rejection.
    assert next_state(Role.EXECUTOR, S.HUMAN_REJECTED, Event.SEND_TASK_FAILED) is S.FAILED
    assert next_state(Role.REQUESTER, S.HUMAN_REJECTED, Event.RECV_TASK_FAILED) is S.FAILED


def test_recv_events_name_their_message_type() -> None:
    for event in Event:
        if event.value.startswith("recv ") and event is not Event.REQUEST_REFUSED:
            assert event.message_type is not None
            assert event.message_type.short in event.value
        elif not event.value.startswith("recv "):
            assert event.message_type is None


def test_spec_file_is_current() -> None:
    """specs/state-machine.md is generated from the table. If this fails, regenerate it:

    python -m synapse.p2p.states > specs/state-machine.md
    """
    assert SPEC.read_text(encoding="utf-8") == render_spec(), (
        "specs/state-machine.md is stale: run `python -m synapse.p2p.states > "
        "specs/state-machine.md`"
    )


def test_spec_lists_every_transition() -> None:
    text = render_spec()
    for role, state, event, target in ALLOWED:
        assert f"| `{state.value}` | {event.value} | `{target.value}` |" in text, role
