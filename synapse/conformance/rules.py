"""The rules of specs/protocol.md, 'Task states' judged from outside: states never go backwards,
nothing after final.

The kit sees the executor's state of a task only through what it says: the synchronous decision
(`task_confirm` → confirmed, `task_need_info` → info_needed, `task_reject` → rejected), each
callback (`task_status_update.status`, `task_need_info` → info_needed, `task_need_human` →
need_human, `task_complete` → completed, `task_failed` → failed) and each `task_ack.state`.
Each observation has an interval on the kit's event clock: a callback is a point (when it
arrived), a synchronous reply spans from the POST to its reply, since the target applied the
request somewhere in between and a callback may cross it.

"Never backwards" over a graph with loops (executing → info_needed → info_provided →
executing) means: whenever one observation certainly precedes another, the later state is
reachable from the earlier one in the executor's graph below (specs/protocol.md, 'Task states') —
through
the moves that need a message of the requester's (info, decision, cancel) only if the kit sent
one in between. The graph is the kit's own, written from specs/protocol.md, not imported from the
engine it may be checking.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: The executor's moves (specs/protocol.md, 'Task states'). `failed` is reachable from every live
#: state
#: (a timeout or an error), `cancelled` likewise (R cancels).
EXECUTOR_MOVES: Mapping[str, frozenset[str]] = {
    "confirmed": frozenset({"executing"}),
    "executing": frozenset({"executing", "info_needed", "need_human", "completed"}),
    "info_needed": frozenset({"info_provided"}),
    "info_provided": frozenset({"executing", "info_needed"}),
    "need_human": frozenset({"human_approved", "human_rejected"}),
    "human_approved": frozenset({"executing"}),
    "human_rejected": frozenset(),
    "completed": frozenset(),
    "failed": frozenset(),
    "cancelled": frozenset(),
    "rejected": frozenset(),
}
FINAL = frozenset({"completed", "failed", "cancelled", "rejected"})
_EXITS = frozenset({"failed", "cancelled"})


#: Moves the executor makes only on a message of the requester's (`task_info_provided`,
#: `human_decision`, `task_cancel`): between two observations without any such message from
#: the kit in between, they cannot have happened.
REQUESTER_MOVES: frozenset[tuple[str, str]] = frozenset(
    {
        ("info_needed", "info_provided"),
        ("need_human", "human_approved"),
        ("need_human", "human_rejected"),
    }
    | {(state, "cancelled") for state in EXECUTOR_MOVES if state not in FINAL}
)


def _closure(*, aided: bool) -> dict[str, frozenset[str]]:
    moves = {
        state: frozenset(
            target
            for target in (targets | _EXITS if state not in FINAL else targets)
            if aided or (state, target) not in REQUESTER_MOVES
        )
        for state, targets in EXECUTOR_MOVES.items()
    }
    reach: dict[str, frozenset[str]] = {}
    for start in moves:
        seen = {start}
        todo = [start]
        while todo:
            for nxt in moves[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        reach[start] = frozenset(seen)
    return reach


#: `REACHABLE[a]`: every state the executor may be in at some time after being in `a`
#: (`a` itself included).
REACHABLE: Mapping[str, frozenset[str]] = _closure(aided=True)
#: `UNAIDED[a]`: the same without any message from the requester meanwhile.
UNAIDED: Mapping[str, frozenset[str]] = _closure(aided=False)

#: The state a callback type says the executor is in (`task_status_update` says it itself).
CALLBACK_STATES: Mapping[str, str] = {
    "p2p:task_need_info": "info_needed",
    "p2p:task_need_human": "need_human",
    "p2p:task_complete": "completed",
    "p2p:task_failed": "failed",
}
#: The state a synchronous answer to `task_request` says the executor is in.
DECISION_STATES: Mapping[str, str] = {
    "p2p:task_confirm": "confirmed",
    "p2p:task_need_info": "info_needed",
    "p2p:task_reject": "rejected",
}


@dataclass(frozen=True, slots=True)
class Observation:
    """The executor's state of one task as one message told it, on the kit's event clock."""

    state: str
    #: When the kit sent the request this answers (= `end` for a callback).
    start: int
    #: When the kit received it.
    end: int
    #: What told it, for reasons ("task_ack to task_cancel", "task_status_update").
    source: str
    #: True for the `task_ack` to a message of the kit's own (info, decision, cancel): the
    #: executor applied that message between `start` and `end`.
    by_requester: bool = False

    @property
    def is_final(self) -> bool:
        return self.state in FINAL


def backwards(observations: Sequence[Observation]) -> list[str]:
    """Pairs where a state certainly observed later cannot follow the earlier one.

    Only the observations up to the first final one count: what comes after a final state is
    judged apart (the listener records the callbacks that arrive once a task is final). An
    unknown state name is a problem of its own.
    """
    problems: list[str] = []
    ordered = sorted(observations, key=lambda o: (o.end, o.start))
    first_final = next((o for o in ordered if o.is_final), None)
    considered = [
        o for o in ordered if first_final is None or o is first_final or o.end < first_final.end
    ]
    for obs in considered:
        if obs.state not in REACHABLE:
            problems.append(f"{obs.source} names no executor state: {obs.state!r}")
    aids = [o for o in observations if o.by_requester]
    for i, earlier in enumerate(considered):
        for later in considered[i + 1 :]:
            if earlier.end >= later.start or earlier.state not in REACHABLE:
                continue  # they overlap: either order is possible
            # Could one of the kit's messages have been applied between the two?
            aided = any(o.end > earlier.start and o.start < later.end for o in aids)
            reach = REACHABLE if aided else UNAIDED
            if later.state not in reach[earlier.state]:
                problems.append(
                    f"{earlier.state} ({earlier.source}) then {later.state} ({later.source})"
                    + ("" if aided else " with no message of the requester in between")
                )
    return problems


__all__ = [
    "CALLBACK_STATES",
    "DECISION_STATES",
    "EXECUTOR_MOVES",
    "FINAL",
    "REACHABLE",
    "REQUESTER_MOVES",
    "UNAIDED",
    "Observation",
    "backwards",
]
