"""What must hold in every state the checker reaches, each rule a named function.

The rules a single move can break are checked where the move happens (`synapse.model.world`:
`transitions_in_the_table`, `messages_sent_legally`, `nothing_after_a_cancel`,
`a_refusal_changes_nothing`, `a_failed_commit_changes_nothing`, `a_retry_is_answered_alike`,
`outcome_reported_once`, `no_local_protocol_error`); the rules about a state are here, and
`synapse.model.checker` checks liveness over the whole graph.
"""

from __future__ import annotations

from collections.abc import Callable

from synapse.model.world import World
from synapse.p2p.engine import TaskRecord
from synapse.p2p.states import Event, TransitionError, next_state
from synapse.types import TaskState

S = TaskState


def records_agree(r: TaskRecord | None, e: TaskRecord | None) -> str | None:
    """The requester's record `r` and the executor's `e` of one task, once both are final
    (or `e` never made), do not contradict each other.

    R completed only if E completed, R cancelled only if E cancelled (R moves there on E's
    acknowledgement), R rejected only if E rejected, R failed by E's `task_failed` only if E
    failed; R's own giving up (silence, deadline, an undeliverable request) may meet any end
    at E, and a request E never saw meets none. (E completed only if R completed or gave up
    follows.)"""
    if r is None or not r.is_final or (e is not None and not e.is_final):
        return None
    gave_up = bool(r.history) and r.history[-1].event is Event.GIVE_UP
    if e is None:
        if r.state in (S.REJECTED, S.FAILED) or gave_up:
            return None
        return f"R {r.state.value}, E never had the task"
    if gave_up or e.state is r.state:
        return None
    return f"R {r.state.value}, E {e.state.value}"


def applied_once(rec: TaskRecord | None) -> str | None:
    """No message id appears twice in one task's history (a duplicate or a replay never
    moves a task twice)."""
    seen: set[str] = set()
    for transition in rec.history if rec is not None else ():
        mid = transition.message_id
        if mid is not None:
            if mid in seen:
                return mid
            seen.add(mid)
    return None


def history_in_the_table(rec: TaskRecord | None) -> str | None:
    """Each transition of a task's history is one of its role's table, each starts where
    the one before ended, and none leaves a final state."""
    if rec is None:
        return None
    state = TaskState.IDLE
    for t in rec.history:
        if t.from_state is not state:
            return f"{t.event.value} from {t.from_state.value}, but the task was {state.value}"
        if state.is_final:
            return f"{t.event.value} left the final state {state.value}"
        try:
            allowed = next_state(t.role, t.from_state, t.event)
        except TransitionError:
            allowed = None
        if allowed is not t.to_state:
            return (
                f"{t.from_state.value} --{t.event.value}--> {t.to_state.value} is not in the table"
            )
        state = t.to_state
    if state is not rec.state:
        return f"the history ends in {state.value}, the record says {rec.state.value}"
    return None


def final_states_agree(world: World) -> str | None:
    """The two sides never reach contradictory final states (`records_agree`)."""
    return records_agree(world.r.record(), world.e.record())


def each_message_applied_once(world: World) -> str | None:
    """A duplicate or a replay never moves a task twice: each message id a side applied
    appears once in its task's history."""
    for side in (world.r, world.e):
        twice = applied_once(side.record())
        if twice is not None:
            return f"{side.name} applied {world.names.get(twice, twice)} twice"
    return None


def final_states_stay(world: World, before: World) -> str | None:
    """A final state is never left."""
    for name in ("r", "e"):
        was, now = getattr(before, name).state(), getattr(world, name).state()
        if was is not None and was.is_final and now is not was:
            return f"{name.upper()} left {was.value} for {now.value if now else 'nothing'}"
    return None


#: The state invariants, by name.
STATE_INVARIANTS: dict[str, Callable[[World], str | None]] = {
    f.__name__: f for f in (final_states_agree, each_message_applied_once)
}
#: The invariants of a move, from the state before to the state after.
STEP_INVARIANTS: dict[str, Callable[[World, World], str | None]] = {
    f.__name__: f for f in (final_states_stay,)
}

__all__ = [
    "STATE_INVARIANTS",
    "STEP_INVARIANTS",
    "applied_once",
    "history_in_the_table",
    "records_agree",
]
