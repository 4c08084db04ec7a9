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
from synapse.p2p.states import Event
from synapse.types import TaskState

S = TaskState


def final_states_agree(world: World) -> str | None:
    """The two sides never reach contradictory final states.

    Once both are final: R completed only if E completed, R cancelled only if E cancelled
    (R moves there on E's acknowledgement), R failed by E's `task_failed` only if E failed;
    R's own giving up (silence, deadline, an undeliverable request) may meet any end at E, and
    a request E never saw meets none. E completed only if R completed or gave up."""
    r, e = world.r.record(), world.e.record()
    if r is None or not r.is_final or (e is not None and not e.is_final):
        return None
    gave_up = bool(r.history) and r.history[-1].event is Event.GIVE_UP
    if e is None:
        if r.state in (S.REJECTED, S.FAILED) or gave_up:
            return None
        return f"R {r.state.value}, E never had the task"
    pairs = {
        S.COMPLETED: {S.COMPLETED},
        S.CANCELLED: {S.CANCELLED},
        S.REJECTED: {S.REJECTED},
        S.FAILED: {S.FAILED},
    }
    if gave_up:
        return None
    if e.state not in pairs[r.state]:
        return f"R {r.state.value}, E {e.state.value}"
    return None


def each_message_applied_once(world: World) -> str | None:
    """A duplicate or a replay never moves a task twice: each message id a side applied
    appears once in its task's history."""
    for side in (world.r, world.e):
        rec = side.record()
        if rec is None:
            continue
        seen: set[str] = set()
        for transition in rec.history:
            mid = transition.message_id
            if mid is None:
                continue
            if mid in seen:
                return f"{side.name} applied {world.names.get(mid, mid)} twice"
            seen.add(mid)
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

__all__ = ["STATE_INVARIANTS", "STEP_INVARIANTS"]
