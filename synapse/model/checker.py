"""Breadth-first exploration of every state within the bounds, with state hashing.

Every move of every reached state is taken; a state reached again (same fingerprint) is not
explored twice. Breadth first, so the first time an invariant breaks is at the fewest moves
from the start: that path is the violation's trace, replayed move by move into words.

Liveness under fairness: once every state is known, each must reach a state where the task
has ended on both sides (the requester's final, the executor's final or never made) with
nothing left to send, by moves that are not faults (no loss, stall, failed commit, long
wait, exhausted retries) and that people need not make (a cancel): a state that cannot is a
task that would wait forever.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from synapse.model.bounds import Bounds
from synapse.model.fingerprint import fingerprint
from synapse.model.invariants import STATE_INVARIANTS, STEP_INVARIANTS
from synapse.model.world import FAULTS, OPTIONAL, Move, World


@dataclass(frozen=True, slots=True)
class Violation:
    """An invariant that broke, why, and the shortest way there."""

    invariant: str
    text: str
    trace: tuple[str, ...]

    def __str__(self) -> str:
        steps = "\n".join(f"  {n:2}. {step}" for n, step in enumerate(self.trace, 1))
        return f"{self.invariant}: {self.text}\n{steps}"


@dataclass(slots=True)
class Result:
    bounds: Bounds
    states: int = 0
    transitions: int = 0
    seconds: float = 0.0
    #: True when every state within the bounds was explored (no `max_states` cut).
    complete: bool = True
    violations: dict[str, Violation] = field(default_factory=dict)

    def summary(self) -> str:
        verdict = "no violation" if not self.violations else f"{len(self.violations)} violated"
        return (
            f"{self.states:,} states, {self.transitions:,} transitions in {self.seconds:.1f} s "
            f"({'every state' if self.complete else 'cut short'}; {self.bounds.describe()}): "
            f"{verdict}"
        )


def ended(world: World) -> bool:
    """The task has ended on both sides and nothing is left to send."""
    r, e = world.r.record(), world.e.record()
    return (
        r is not None
        and r.is_final
        and (e is None or e.is_final)
        and not world.r.queue
        and not world.e.queue
    )


def reaching(goals: list[int], fair_into: list[list[int]]) -> set[int]:
    """Liveness: the states that reach one of `goals` by fair moves (a backward search
    over `fair_into`, each state's fair predecessors)."""
    live = set(goals)
    todo = deque(goals)
    while todo:
        for before in fair_into[todo.popleft()]:
            if before not in live:
                live.add(before)
                todo.append(before)
    return live


def replay(bounds: Bounds, moves: list[Move]) -> tuple[list[str], World]:
    """The moves, from the first state, in words, and the state they lead to (its messages
    named, its last move's violations with it)."""
    world = World.initial(bounds, naming=True)
    words = []
    for move in moves:
        words.append(move.describe(world))
        world = world.after(move)
    return words, world


def follow(bounds: Bounds, trace: Sequence[str]) -> tuple[World, list[tuple[str, str]]]:
    """Take the moves of a trace in words (as `Violation.trace` prints them) from the first
    state, checking each as the checker does: the state reached, and every violation met
    on the way. Raises `ValueError` at a step that is not a move of the state it is in."""
    world = World.initial(bounds, naming=True)
    met: list[tuple[str, str]] = []
    for n, words in enumerate(trace, 1):
        options = {move.describe(world): move for move in world.moves()}
        move = options.get(words)
        if move is None:
            raise ValueError(f"step {n}, {words!r}, is not a move here: one of {sorted(options)}")
        before, world = world, world.after(move)
        met += world.violations
        for name, step_check in STEP_INVARIANTS.items():
            text = step_check(world, before)
            if text:
                met.append((name, text))
        for name, check in STATE_INVARIANTS.items():
            text = check(world)
            if text:
                met.append((name, text))
    return world, met


def explore(
    bounds: Bounds, *, max_states: int | None = None, stop_at_violation: bool = False
) -> Result:
    """Every state within `bounds` (or the first `max_states`), checked; with
    `stop_at_violation`, only up to the first violation (its trace still the shortest)."""
    started = time.monotonic()
    result = Result(bounds)
    initial = World.initial(bounds)
    # Hash compaction: a state is known by the 64-bit hash of its fingerprint, not the
    # fingerprint itself (a tenth of the memory). Two states sharing a hash would leave one
    # unexplored; among five million states the chance of it is below one in a million.
    index: dict[int, int] = {hash(fingerprint(initial)): 0}
    parents: list[tuple[int, Move | None]] = [(-1, None)]
    #: For each state, the states that reach it by a move liveness counts.
    fair_into: list[list[int]] = [[]]
    finished: list[int] = []
    frontier: deque[tuple[int, World]] = deque([(0, initial)])

    def path(state: int, last: Move | None = None) -> list[Move]:
        moves: list[Move] = [] if last is None else [last]
        while state > 0:
            state, move = parents[state]
            assert move is not None
            moves.append(move)
        return moves[::-1]

    def record(invariant: str, text: str, state: int, last: Move | None = None) -> None:
        if invariant in result.violations:
            return
        words, end = replay(bounds, path(state, last))
        # The same violation, told with the replay's message names.
        named = [t for i, t in end.violations if i == invariant]
        check = STATE_INVARIANTS.get(invariant)
        if named:
            text = named[0]
        elif check is not None:
            text = check(end) or text
        result.violations[invariant] = Violation(invariant, text, tuple(words))

    for name, check in STATE_INVARIANTS.items():
        text = check(initial)
        if text:
            record(name, text, 0)
    while frontier:
        if stop_at_violation and result.violations:
            result.complete = False
            break
        state, world = frontier.popleft()
        if ended(world):
            finished.append(state)
        for move in world.moves():
            after = world.after(move)
            result.transitions += 1
            for invariant, text in after.violations:
                record(invariant, text, state, move)
            for name, step_check in STEP_INVARIANTS.items():
                text = step_check(after, world)
                if text:
                    record(name, text, state, move)
            seen = hash(fingerprint(after))
            reached = index.get(seen)
            if reached is None:
                if max_states is not None and len(parents) >= max_states:
                    result.complete = False
                    continue
                reached = index[seen] = len(parents)
                parents.append((state, move))
                fair_into.append([])
                for name, check in STATE_INVARIANTS.items():
                    text = check(after)
                    if text:
                        record(name, text, reached)
                frontier.append((reached, after))
            if move.kind not in FAULTS and move.kind not in OPTIONAL:
                fair_into[reached].append(state)
    result.states = len(parents)
    live = reaching(finished, fair_into)
    if result.complete:
        stuck = next((s for s in range(result.states) if s not in live), None)
        if stuck is not None:
            record(
                "every_task_ends",
                "from here no path without faults ends the task on both sides",
                stuck,
            )
    result.seconds = time.monotonic() - started
    return result


__all__ = ["Result", "Violation", "ended", "explore", "follow", "reaching", "replay"]
