"""The task state machine as data: one transition table per role over the 14 states.

`TRANSITIONS[role][state][event]` is the next state. A pair that is not in the table is not
allowed; `next_state` raises at one place. `specs/state-machine.md` is printed from this table
(`python -m synapse.p2p.states`), and a test fails when the checked-in copy is stale.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Mapping
from enum import StrEnum

from synapse.types import REPLY_ONLY_TYPES, ErrorCode, MessageType, RemoteProtocolError, TaskState

S = TaskState


class Role(StrEnum):
    """Which side of a task this peer is."""

    REQUESTER = "requester"
    """R: submitted the task (the protocol: 请求方)."""
    EXECUTOR = "executor"
    """E: runs the task (the protocol: 执行方)."""


class Event(StrEnum):
    """What moves a task: a message sent or received, or a local step."""

    SEND_TASK_REQUEST = "send task_request"
    RECV_TASK_CONFIRM = "recv task_confirm"
    RECV_TASK_REJECT = "recv task_reject"
    RECV_TASK_NEED_INFO = "recv task_need_info"
    RECV_TASK_STATUS_UPDATE = "recv task_status_update"
    RECV_TASK_NEED_HUMAN = "recv task_need_human"
    RECV_TASK_COMPLETE = "recv task_complete"
    RECV_TASK_FAILED = "recv task_failed"
    SEND_TASK_INFO_PROVIDED = "send task_info_provided"
    HUMAN_DECIDING = "human deciding"
    SEND_HUMAN_APPROVE = "send human_decision(approve)"
    SEND_HUMAN_REJECT = "send human_decision(reject)"
    RECV_CANCEL_ACK = "recv task_ack(cancelled)"
    REQUEST_REFUSED = "recv nack to task_request"
    #: R gives up on its own: the executor fell silent past `task_timeout` and the
    #: heartbeat-loss time, the deadline passed, or it answered `task_not_found`.
    GIVE_UP = "give up (executor silent or lost the task)"

    SEND_TASK_CONFIRM = "send task_confirm"
    SEND_TASK_REJECT = "send task_reject"
    SEND_TASK_NEED_INFO = "send task_need_info"
    START_EXECUTION = "start execution"
    SEND_TASK_STATUS_UPDATE = "send task_status_update"
    SEND_TASK_NEED_HUMAN = "send task_need_human"
    SEND_TASK_COMPLETE = "send task_complete"
    SEND_TASK_FAILED = "send task_failed"
    RECV_TASK_INFO_PROVIDED = "recv task_info_provided"
    RECV_HUMAN_APPROVE = "recv human_decision(approve)"
    RECV_HUMAN_REJECT = "recv human_decision(reject)"
    RECV_TASK_CANCEL = "recv task_cancel"

    @property
    def message_type(self) -> MessageType | None:
        """The message type a `recv …` event stands for (None for local steps)."""
        return _EVENT_MESSAGE.get(self)


#: `recv task_confirm` and `recv human_decision(approve)`: an event that is a message received.
_RECEIPT = re.compile(r"recv ([a-z_]+)(?:\([a-z]+\))?")


def _received_type(event: Event) -> MessageType | None:
    """The message type an event's own text names (`recv task_ack(cancelled)` → `p2p:task_ack`),
    so that a message type is spelled once, in `MessageType`."""
    receipt = _RECEIPT.fullmatch(event.value)
    return None if receipt is None else MessageType(f"p2p:{receipt.group(1)}")


_EVENT_MESSAGE: dict[Event, MessageType] = {
    event: message_type for event in Event if (message_type := _received_type(event)) is not None
}

# What a callback from E does at R once R has the task confirmed (or implicitly confirmed).
_R_CALLBACKS: dict[Event, TaskState] = {
    Event.RECV_TASK_STATUS_UPDATE: S.EXECUTING,
    Event.RECV_TASK_NEED_INFO: S.INFO_NEEDED,
    Event.RECV_TASK_NEED_HUMAN: S.NEED_HUMAN,
    Event.RECV_TASK_COMPLETE: S.COMPLETED,
    Event.RECV_TASK_FAILED: S.FAILED,
    Event.RECV_CANCEL_ACK: S.CANCELLED,
}
# Ways out of every non-final state at E: R cancels, or E fails the task (timeout, error).
_E_EXITS: dict[Event, TaskState] = {
    Event.RECV_TASK_CANCEL: S.CANCELLED,
    Event.SEND_TASK_FAILED: S.FAILED,
}

TRANSITIONS: Mapping[Role, Mapping[TaskState, Mapping[Event, TaskState]]] = {
    Role.REQUESTER: {
        S.IDLE: {Event.SEND_TASK_REQUEST: S.PENDING},
        S.PENDING: {
            Event.GIVE_UP: S.FAILED,
            Event.RECV_TASK_CONFIRM: S.CONFIRMED,
            Event.RECV_TASK_REJECT: S.REJECTED,
            Event.RECV_TASK_NEED_INFO: S.INFO_NEEDED,
            Event.REQUEST_REFUSED: S.REJECTED,
            # A callback that overtakes the synchronous reply counts as an implicit confirm.
            Event.RECV_TASK_STATUS_UPDATE: S.EXECUTING,
            Event.RECV_TASK_NEED_HUMAN: S.NEED_HUMAN,
            Event.RECV_TASK_COMPLETE: S.COMPLETED,
            Event.RECV_TASK_FAILED: S.FAILED,
        },
        S.CONFIRMED: {**_R_CALLBACKS, Event.GIVE_UP: S.FAILED},
        S.EXECUTING: {**_R_CALLBACKS, Event.GIVE_UP: S.FAILED},
        S.INFO_NEEDED: {
            Event.SEND_TASK_INFO_PROVIDED: S.INFO_PROVIDED,
            Event.RECV_TASK_FAILED: S.FAILED,
            Event.RECV_CANCEL_ACK: S.CANCELLED,
            Event.GIVE_UP: S.FAILED,
        },
        S.INFO_PROVIDED: {**_R_CALLBACKS, Event.GIVE_UP: S.FAILED},
        S.NEED_HUMAN: {
            Event.HUMAN_DECIDING: S.HUMAN_DECIDING,
            Event.SEND_HUMAN_APPROVE: S.HUMAN_APPROVED,
            Event.SEND_HUMAN_REJECT: S.HUMAN_REJECTED,
            Event.RECV_TASK_FAILED: S.FAILED,
            Event.RECV_CANCEL_ACK: S.CANCELLED,
            Event.GIVE_UP: S.FAILED,
        },
        S.HUMAN_DECIDING: {
            Event.SEND_HUMAN_APPROVE: S.HUMAN_APPROVED,
            Event.SEND_HUMAN_REJECT: S.HUMAN_REJECTED,
            Event.RECV_TASK_FAILED: S.FAILED,
            Event.RECV_CANCEL_ACK: S.CANCELLED,
            Event.GIVE_UP: S.FAILED,
        },
        S.HUMAN_APPROVED: {**_R_CALLBACKS, Event.GIVE_UP: S.FAILED},
        S.HUMAN_REJECTED: {
            Event.RECV_TASK_FAILED: S.FAILED,
            Event.RECV_CANCEL_ACK: S.CANCELLED,
            Event.GIVE_UP: S.FAILED,
        },
        S.COMPLETED: {},
        S.FAILED: {},
        S.CANCELLED: {},
        S.REJECTED: {},
    },
    Role.EXECUTOR: {
        S.IDLE: {
            Event.SEND_TASK_CONFIRM: S.CONFIRMED,
            Event.SEND_TASK_REJECT: S.REJECTED,
            Event.SEND_TASK_NEED_INFO: S.INFO_NEEDED,
        },
        S.CONFIRMED: {Event.START_EXECUTION: S.EXECUTING, **_E_EXITS},
        S.EXECUTING: {
            Event.SEND_TASK_STATUS_UPDATE: S.EXECUTING,
            Event.SEND_TASK_NEED_INFO: S.INFO_NEEDED,
            Event.SEND_TASK_NEED_HUMAN: S.NEED_HUMAN,
            Event.SEND_TASK_COMPLETE: S.COMPLETED,
            **_E_EXITS,
        },
        S.INFO_NEEDED: {Event.RECV_TASK_INFO_PROVIDED: S.INFO_PROVIDED, **_E_EXITS},
        S.INFO_PROVIDED: {
            Event.START_EXECUTION: S.EXECUTING,
            # The information given is still not enough: ask again.
            Event.SEND_TASK_NEED_INFO: S.INFO_NEEDED,
            **_E_EXITS,
        },
        S.NEED_HUMAN: {
            Event.RECV_HUMAN_APPROVE: S.HUMAN_APPROVED,
            Event.RECV_HUMAN_REJECT: S.HUMAN_REJECTED,
            **_E_EXITS,
        },
        S.HUMAN_APPROVED: {Event.START_EXECUTION: S.EXECUTING, **_E_EXITS},
        S.HUMAN_REJECTED: dict(_E_EXITS),
        S.COMPLETED: {},
        S.FAILED: {},
        S.CANCELLED: {},
        S.REJECTED: {},
    },
}


class TransitionError(RemoteProtocolError):
    """A received message that the task's current state does not allow (the peer's fault)."""

    def __init__(self, role: Role, state: TaskState, event: Event) -> None:
        if state.is_final:
            super().__init__(
                ErrorCode.TASK_ALREADY_COMPLETED,
                f"task is already {state.value}",
                {"state": state.value},
            )
        else:
            super().__init__(
                ErrorCode.INVALID_PARAMS,
                f"{event.message_type or event.value} is not allowed in state {state.value}",
                {"state": state.value, "allowed": allowed_messages(role, state)},
            )
        self.role = role
        self.state = state
        self.event = event


def next_state(role: Role, state: TaskState, event: Event) -> TaskState:
    """The state after `event`, or `TransitionError` if the table does not allow it."""
    try:
        return TRANSITIONS[role][state][event]
    except KeyError:
        raise TransitionError(role, state, event) from None


def allowed_events(role: Role, state: TaskState) -> list[Event]:
    # A role's table omits the states it never has (E: `pending`, `human_deciding`).
    return list(TRANSITIONS[role].get(state, {}))


def allowed_messages(role: Role, state: TaskState) -> list[str]:
    """Message types a partner may POST about a task in `state` (`nack.details.allowed`).

    Synchronous replies (`task_confirm`, `task_ack`, …) move states too, but are never
    POSTed, so they are not listed.
    """
    found: list[str] = []
    for event in TRANSITIONS[role].get(state, {}):
        message_type = event.message_type
        if event.value.startswith("recv ") and message_type is not None:
            if message_type in REPLY_ONLY_TYPES:
                continue
            name = message_type.value
            if name not in found:
                found.append(name)
    return found


def allows(role: Role, state: TaskState, event: Event) -> bool:
    """Whether the table has `event` in `state` for `role`."""
    return event in TRANSITIONS[role].get(state, {})


# --- timers and sets derived from the table -----------------------------------------------------


class StateTimer(StrEnum):
    """A timer that runs while a task is in a state: started on entering it, stopped on leaving."""

    TASK_TIMEOUT = "task_timeout"
    """`TaskTimeout`: executing time left; passing it fails the task (`execution_timeout`)."""
    ANSWER_WAIT = "answer_wait"
    """The `required_by` of a `task_need_info` or the `deadline` of a `task_need_human`, if set;
    passing it unanswered fails the task (`execution_timeout`)."""
    SILENCE = "silence"
    """The requester's patience with a silent executor: `task_timeout` plus the time to notice
    lost heartbeats. Every move of the task restarts it (`RESTARTED_BY_EVERY_MOVE`); passing
    it, the requester gives up on the task."""


#: States in which the requester owes the next message (the executor waits for its answer):
#: the executor's silence is expected there, and the requester's patience does not run.
REQUESTER_OWES_NEXT = frozenset({S.INFO_NEEDED, S.NEED_HUMAN, S.HUMAN_DECIDING})
#: Timers that start again on every move of the task, not only on entering their state: any
#: word about the task (or our answer to it) restarts the requester's patience.
RESTARTED_BY_EVERY_MOVE = frozenset({StateTimer.SILENCE})


#: Which timers run in which state, per role: declared once, used by the live path (each move
#: starts the timers of the state it enters and stops those of the state it leaves) and by
#: `restore` (a restarted task re-arms the timers of the state it is in).
STATE_TIMERS: Mapping[Role, Mapping[TaskState, frozenset[StateTimer]]] = {
    Role.EXECUTOR: {
        S.EXECUTING: frozenset({StateTimer.TASK_TIMEOUT}),
        S.INFO_NEEDED: frozenset({StateTimer.ANSWER_WAIT}),
        S.NEED_HUMAN: frozenset({StateTimer.ANSWER_WAIT}),
    },
    Role.REQUESTER: {
        state: frozenset({StateTimer.SILENCE})
        for state in TRANSITIONS[Role.REQUESTER]
        if not state.is_final and state not in REQUESTER_OWES_NEXT
    },
}


def state_timers(role: Role, state: TaskState) -> frozenset[StateTimer]:
    return STATE_TIMERS[role].get(state, frozenset())


def timers_entered(role: Role, old: TaskState, new: TaskState) -> frozenset[StateTimer]:
    """Timers to start on the move `old → new`."""
    return state_timers(role, new) - state_timers(role, old)


def timers_left(role: Role, old: TaskState, new: TaskState) -> frozenset[StateTimer]:
    """Timers to stop on the move `old → new`."""
    return state_timers(role, old) - state_timers(role, new)


@functools.cache
def timer_changes(
    role: Role, old: TaskState, new: TaskState
) -> tuple[frozenset[StateTimer], frozenset[StateTimer]]:
    """(`timers_left`, `timers_entered`) of the move `old → new`, worked out once per move:
    every transition of every task asks."""
    return timers_left(role, old, new), timers_entered(role, old, new)


#: Executor states whose handler is running or about to run: `executing`, and every state
#: execution starts (or resumes) from. A restart that interrupts a handler in one of them may
#: start it again.
RUNNING_STATES: frozenset[TaskState] = frozenset(
    {S.EXECUTING}
    | {
        state
        for state, moves in TRANSITIONS[Role.EXECUTOR].items()
        if Event.START_EXECUTION in moves
    }
)

#: Executor states in which a running handler waits for the requester's answer (a
#: `task_info_provided` or a `human_decision` moves it on). A restart that interrupts a
#: resumable handler in one of them keeps the task waiting; the answer starts it again.
QUESTION_STATES: frozenset[TaskState] = frozenset(
    state
    for state, moves in TRANSITIONS[Role.EXECUTOR].items()
    if Event.RECV_TASK_INFO_PROVIDED in moves or Event.RECV_HUMAN_APPROVE in moves
)

#: Requester states that still await the synchronous reply to the `task_request` (the states
#: that accept a `task_confirm`): the reply applies only there, a refusal of the request moves
#: only from there, and a `task_cancel` waits until the task has left them.
AWAITING_REPLY: frozenset[TaskState] = frozenset(
    state
    for state, moves in TRANSITIONS[Role.REQUESTER].items()
    if Event.RECV_TASK_CONFIRM in moves
)


# --- documentation --------------------------------------------------------------------------


def mermaid(role: Role) -> str:
    """A Mermaid state diagram of `role`'s table."""
    lines = ["stateDiagram-v2", f"    [*] --> {S.IDLE.value}"]
    for state, moves in TRANSITIONS[role].items():
        for event, target in moves.items():
            lines.append(f"    {state.value} --> {target.value}: {event.value}")
        if state.is_final:
            lines.append(f"    {state.value} --> [*]")
    return "\n".join(lines)


def table_markdown(role: Role) -> str:
    rows = ["| state | event | next state |", "| --- | --- | --- |"]
    for state, moves in TRANSITIONS[role].items():
        if not moves:
            rows.append(f"| `{state.value}` | — (final) | |")
        for event, target in moves.items():
            rows.append(f"| `{state.value}` | {event.value} | `{target.value}` |")
    return "\n".join(rows)


def render_spec() -> str:
    """The text of `specs/state-machine.md`."""
    parts = [
        "# Task state machine",
        "",
        "Generated from `synapse/p2p/states.py` by `python -m synapse.p2p.states`; do not edit.",
        "A task has one state per side: the requester (R) and the executor (E) each follow their",
        "own table below. A received message that its table does not allow is refused with",
        "`invalid_params` (`details.state`, `details.allowed`), or `task_already_completed` once",
        "the task is final; a refused message changes no state. Final states have no way out.",
        "",
    ]
    for role in Role:
        parts += [
            f"## {role.value.capitalize()}",
            "",
            "```mermaid",
            mermaid(role),
            "```",
            "",
            table_markdown(role),
            "",
        ]
    return "\n".join(parts)


if __name__ == "__main__":  # pragma: no cover
    sys.stdout.write(render_spec())
