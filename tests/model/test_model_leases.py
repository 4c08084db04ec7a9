"""The lease protocol of replicas in the model checker (`synapse.model.leases`): every state
with every fix holds; each of the three defects found in replicas is found again, with the
invariant it breaks, when its fix is taken out."""

from __future__ import annotations

import pytest

from synapse.model.leases import INVARIANTS, LeaseFixes, explore_leases

#: Seconds of exploration: left out of the quick loop (`pytest -m "not slow"`).
pytestmark = pytest.mark.slow


def test_every_state_of_the_lease_protocol_holds(figures: list[str]) -> None:
    result = explore_leases()
    figures.append(f"lease model: {result.summary()}")
    assert result.violations == {}, result.violations
    assert result.states > 5_000  # a broken move generator finds little


@pytest.mark.parametrize(
    ("fix", "broken"),
    [
        # A takeover that read the task while the old owner's fenced commit was landing,
        # then overwrote it: a message acknowledged is gone from the stored task.
        ("takeover_waits_for_fenced_commit", "acknowledged_messages_are_kept"),
        # A callback's removal left to the next commit: an idle replica never sends the
        # next one.
        ("removal_committed_at_once", "every_message_acknowledged_and_callback_delivered"),
        # A fenced-out commit that kept its own task held on that replica for ever.
        ("fenced_out_releases_its_task", "held_only_while_committing"),
    ],
)
def test_each_replica_defect_is_found_without_its_fix(fix: str, broken: str) -> None:
    result = explore_leases(LeaseFixes(**{fix: False}))
    assert broken in result.violations, result.summary()
    trace = result.violations[broken]
    assert trace and all(isinstance(step, str) for step in trace)


def test_each_invariant_sees_what_it_forbids() -> None:
    """A state made by hand for each invariant breaks that one only."""
    from synapse.model.leases import _Replica, _World

    fenced_stale = _Replica(held=1, memory=("m1",), commit=(("m1",), 1, "m1", True), hold=True)
    broken = {
        "acknowledged_messages_are_kept": _World(row=("m1",), acked=frozenset({"m1", "m2"})),
        "each_message_applied_once": _World(row=("m1", "m1")),
        "one_writer_at_a_time": _World(lease=(1, 2, 1), replicas=(fenced_stale, _Replica())),
        "held_only_while_committing": _World(replicas=(_Replica(hold=True), _Replica())),
    }
    assert set(broken) == set(INVARIANTS)
    for name, world in broken.items():
        found = {n for n, check in INVARIANTS.items() if check(world)}
        assert found == {name}, (name, found)
    assert not any(check(_World()) for check in INVARIANTS.values())
