"""`TimerQueue`: one heap for every timer, with replacement, cancellation and compaction."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from synapse.p2p.timers import TimerQueue


def test_empty() -> None:
    q: TimerQueue[str] = TimerQueue()
    assert q.next_deadline() is None
    assert list(q.pop_due(1e18)) == []
    assert len(q) == 0 and "a" not in q


def test_pop_order_is_by_deadline_then_by_arming() -> None:
    q: TimerQueue[str] = TimerQueue()
    for key, when in (("c", 3.0), ("a", 1.0), ("b2", 2.0), ("b1", 2.0)):
        q.set(key, when)
    assert q.next_deadline() == 1.0
    assert list(q.pop_due(0.5)) == []
    assert list(q.pop_due(2.0)) == ["a", "b2", "b1"]  # ties keep the order they were set in
    assert q.next_deadline() == 3.0 and len(q) == 1
    assert list(q.pop_due(10.0)) == ["c"]
    assert q.next_deadline() is None and len(q) == 0


def test_a_deadline_equal_to_now_is_due() -> None:
    q: TimerQueue[str] = TimerQueue()
    q.set("a", 5.0)
    assert list(q.pop_due(5.0)) == ["a"]


def test_set_again_replaces() -> None:
    q: TimerQueue[str] = TimerQueue()
    q.set("a", 1.0)
    q.set("a", 10.0)
    assert len(q) == 1 and q.next_deadline() == 10.0
    assert list(q.pop_due(5.0)) == []
    q.set("a", 2.0)  # earlier again
    assert q.next_deadline() == 2.0
    assert list(q.pop_due(100.0)) == ["a"]  # once, not once per set


def test_cancel() -> None:
    q: TimerQueue[str] = TimerQueue()
    q.set("a", 1.0)
    q.set("b", 2.0)
    q.cancel("a")
    q.cancel("never-set")  # harmless
    assert "a" not in q and "b" in q and len(q) == 1
    assert q.next_deadline() == 2.0
    assert list(q.pop_due(10.0)) == ["b"]
    assert "b" not in q  # popping disarms


def test_keys_can_be_tuples_of_kind_and_target() -> None:
    q: TimerQueue[tuple[str, str]] = TimerQueue()
    q.set(("timeout", "t1"), 5.0)
    q.set(("deadline", "t1"), 3.0)
    q.cancel(("deadline", "t1"))
    assert list(q.pop_due(10.0)) == [("timeout", "t1")]


def test_a_key_set_while_popping_is_not_popped_in_the_same_pass_if_later() -> None:
    q: TimerQueue[str] = TimerQueue()
    q.set("beat", 1.0)
    popped = []
    for key in q.pop_due(1.0):
        popped.append(key)
        q.set(key, 2.0)  # re-armed for later, like a heartbeat
    assert popped == ["beat"] and q.next_deadline() == 2.0


def test_compaction_keeps_memory_bounded_when_one_key_is_reset_forever() -> None:
    q: TimerQueue[str] = TimerQueue()
    for i in range(10_000):
        q.set("heartbeat", float(i))
        assert len(q._heap) <= 65
    assert len(q) == 1 and q.next_deadline() == 9_999.0


def test_compaction_keeps_memory_bounded_under_churn() -> None:
    q: TimerQueue[int] = TimerQueue()
    live = set(range(50))
    for k in live:
        q.set(k, 1e9 + k)
    for i in range(20_000):
        key = 1_000 + i
        q.set(key, float(i))
        q.cancel(key)
        # Compaction runs on `set`: at most 4 entries per live timer (counting the one just
        # set and cancelled), plus the one that triggered it.
        assert len(q._heap) <= max(65, 4 * (len(q) + 1) + 1)
    assert len(q) == 50
    assert list(q.pop_due(2e9)) == sorted(live)


OPS = st.lists(
    st.tuples(
        st.sampled_from(["set", "cancel", "pop"]),
        st.integers(0, 9),
        st.integers(0, 100),
    ),
    max_size=200,
)


@settings(max_examples=150, deadline=None)
@given(OPS)
def test_matches_a_dict_model(ops: list[tuple[str, int, int]]) -> None:
    """Against a plain dict of key → deadline: same pops, same order, same next deadline."""
    q: TimerQueue[int] = TimerQueue()
    model: dict[int, tuple[int, int]] = {}  # key → (deadline, arming order)
    order = 0
    for op, key, when in ops:
        if op == "set":
            q.set(key, float(when))
            model[key] = (when, order)
            order += 1
        elif op == "cancel":
            q.cancel(key)
            model.pop(key, None)
        else:
            due = sorted((v, k) for k, v in model.items() if v[0] <= when)
            assert list(q.pop_due(float(when))) == [k for _, k in due]
            for _, k in due:
                del model[k]
        assert len(q) == len(model)
        assert set(model) == {k for k in range(10) if k in q}
        expected = min((v[0] for v in model.values()), default=None)
        assert q.next_deadline() == (None if expected is None else float(expected))
        assert len(q._heap) <= max(65, 4 * len(model) + 1)
