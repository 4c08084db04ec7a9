"""Random walks through the model, beyond the checker's bounds: long histories with many
failed commits on both roles (and losses, duplicates, retries past the deduplication window),
every invariant checked at every step. The checker is exhaustive within small bounds; these
go deep where it cannot (the engine, after each failed commit, equal to one that never saw
the message: `a_failed_commit_changes_nothing`)."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from synapse.model import Bounds
from synapse.model.checker import ended
from synapse.model.invariants import STATE_INVARIANTS, STEP_INVARIANTS
from synapse.model.world import Move, World

#: Minutes of exploration or a real browser: left out of the quick loop (`pytest -m "not slow"`).
pytestmark = pytest.mark.slow

#: Deep bounds: what a walk may draw (the checker could never explore them all).
DEEP = Bounds(
    losses=3, stalls=2, failures=8, waits=2, cancels=1, exhaustions=1, lates=2, questions=2
)
FAILING = "deliver, commit failing"


def walk(choices: list[int], fail_bias: int) -> tuple[list[str], list[str]]:
    """Follow `choices` from the first state (each picks one of the moves there; a failing
    commit is picked `fail_bias` times as often). Returns the violations met and the sides
    whose commits failed."""
    world = World.initial(DEEP)
    met: list[str] = []
    failed_at: list[str] = []
    for choice in choices:
        moves = list(world.moves())
        if not moves or ended(world):
            break
        weighted: list[Move] = []
        for move in moves:
            weighted += [move] * (fail_bias if move.kind == FAILING else 1)
        move = weighted[choice % len(weighted)]
        if move.kind == FAILING:
            failed_at.append(world.net[move.item].sender)  # type: ignore[union-attr]
        after = world.after(move)
        met += [f"{name}: {text}" for name, text in after.violations]
        met += [f"{name}: {t}" for name, c in STEP_INVARIANTS.items() if (t := c(after, world))]
        met += [f"{name}: {t}" for name, c in STATE_INVARIANTS.items() if (t := c(after))]
        world = after
    return met, failed_at


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    choices=st.lists(st.integers(min_value=0, max_value=10_000), min_size=10, max_size=120),
    fail_bias=st.integers(min_value=1, max_value=6),
)
def test_long_histories_with_failed_commits_hold(choices: list[int], fail_bias: int) -> None:
    met, _ = walk(choices, fail_bias)
    assert not met, "\n".join(met)


def test_the_walks_fail_commits_on_both_roles() -> None:
    """The walks above are not vacuous: seeded the same way, they fail commits at the
    requester and at the executor, many times in one history."""
    rng = random.Random(29)
    senders: set[str] = set()
    most = 0
    for _ in range(60):
        met, failed_at = walk([rng.randrange(10_000) for _ in range(120)], fail_bias=4)
        assert not met, "\n".join(met)
        senders.update(failed_at)
        most = max(most, len(failed_at))
    # A POST from E fails at R's commit, one from R at E's.
    assert senders == {"r", "e"}
    assert most >= 3
