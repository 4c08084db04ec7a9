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

LISTED = [
    (role, state, event, target)
    for role, table in TRANSITIONS.items()
    for state, moves in table.items()
    for event, target in moves.items()
]
UNLISTED = [
    (role, state, event)
    for role in Role
    for state in TaskState
    for event in Event
    if event not in TRANSITIONS[role].get(state, {})
]
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


@pytest.mark.parametrize(("role", "state", "event", "target"), LISTED)
def test_every_listed_pair_gives_its_state(
    role: Role, state: TaskState, event: Event, target: TaskState
) -> None:
    assert next_state(role, state, event) is target


@pytest.mark.parametrize(("role", "state", "event"), UNLISTED)
def test_every_unlisted_pair_is_refused(role: Role, state: TaskState, event: Event) -> None:
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


def test_requester_flow_of_seed_3_2() -> None:
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


def test_implicit_confirm_and_cancel_rules_of_contract_6() -> None:
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
    for role, state, event, target in LISTED:
        assert f"| `{state.value}` | {event.value} | `{target.value}` |" in text, role
