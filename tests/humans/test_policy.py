"""The notification policy on a fake clock: the first level told at the start, reminders at
their fractions to the level in charge, escalation when a level's time is up, the time-out at
the deadline; nothing done twice; past the deadline, only the time-out."""

from __future__ import annotations

import pytest

from synapse.humans.config import Level, NotifyRoute
from synapse.humans.policy import due, level_starts, schedule, window_of

ROUTE = NotifyRoute(
    name="portraits",
    levels=(
        Level(reviewers=("alice",), channels=("mail",), within=40.0),
        Level(reviewers=("bob",), channels=("mail",), within=40.0),
        Level(reviewers=("carol",), channels=("mail",)),
    ),
    reminders=(0.5, 0.9),
    timeout_margin=0.0,
)


def test_the_whole_schedule_of_a_window() -> None:
    window = window_of(ROUTE, start=1000.0, deadline=1100.0, escalation_level=1)
    assert level_starts(ROUTE, window) == {1: 1000.0, 2: 1040.0, 3: 1080.0}
    plan = [(d.kind, d.level, d.at, d.key) for d in schedule(ROUTE, window)]
    assert plan == [
        ("notify", 1, 1000.0, "notify:1"),
        ("escalate", 2, 1040.0, "escalate:2"),
        ("remind", 2, 1050.0, "remind:0.5"),
        ("escalate", 3, 1080.0, "escalate:3"),
        ("remind", 3, 1090.0, "remind:0.9"),
        ("timeout", 3, 1100.0, "timeout"),
    ]


def test_due_walks_the_schedule_on_a_fake_clock_and_never_twice() -> None:
    window = window_of(ROUTE, start=0.0, deadline=100.0, escalation_level=1)
    done: set[str] = set()
    seen = []
    now = 0.0
    while True:
        ready, next_at = due(ROUTE, window, done, now)
        for action in ready:
            seen.append((now, action.key))
            done.add(action.key)
        assert due(ROUTE, window, done, now)[0] == []  # done: not due again
        if next_at is None:
            break
        assert next_at > now
        now = next_at
    assert seen == [
        (0.0, "notify:1"),
        (40.0, "escalate:2"),
        (50.0, "remind:0.5"),
        (80.0, "escalate:3"),
        (90.0, "remind:0.9"),
        (100.0, "timeout"),
    ]


def test_a_question_that_starts_at_level_two_tells_level_two_first() -> None:
    window = window_of(ROUTE, start=0.0, deadline=100.0, escalation_level=2)
    plan = [d.key for d in schedule(ROUTE, window)]
    assert plan[0] == "notify:2" and "escalate:2" not in plan and "escalate:3" in plan
    beyond = window_of(ROUTE, start=0.0, deadline=100.0, escalation_level=9)
    assert beyond.first == 3  # within the route's levels


def test_a_level_whose_time_ends_after_the_deadline_is_not_escalated_from() -> None:
    window = window_of(ROUTE, start=0.0, deadline=30.0, escalation_level=1)
    assert [d.key for d in schedule(ROUTE, window) if d.kind == "escalate"] == []


def test_no_deadline_means_the_routes_decide_within() -> None:
    route = NotifyRoute(name="r", levels=(Level(channels=("mail",)),), decide_within=600.0)
    window = window_of(route, start=50.0, deadline=None, escalation_level=1)
    assert window.deadline == 650.0


def test_past_the_deadline_only_the_time_out_is_due() -> None:
    window = window_of(ROUTE, start=0.0, deadline=100.0, escalation_level=1)
    ready, next_at = due(ROUTE, window, set(), 500.0)  # a peer that was down meanwhile
    assert [d.key for d in ready] == ["timeout"] and next_at is None


@pytest.mark.parametrize("now", [0.0, 39.9, 40.0, 99.9])
def test_what_is_due_at_any_time_is_what_the_schedule_puts_before_it(now: float) -> None:
    window = window_of(ROUTE, start=0.0, deadline=100.0, escalation_level=1)
    ready, _ = due(ROUTE, window, set(), now)
    assert [d.key for d in ready] == [d.key for d in schedule(ROUTE, window) if d.at <= now]


def test_the_time_out_falls_a_margin_before_the_deadline() -> None:
    """The executor fails the task at the deadline: the policy acts before, by default a
    tenth of the window (at most a minute); what would fall after it is not planned."""
    route = NotifyRoute(name="r", levels=ROUTE.levels, reminders=(0.5, 0.95))
    window = window_of(route, start=0.0, deadline=100.0, escalation_level=1)
    assert window.closes == 90.0
    plan = {d.key: d.at for d in schedule(route, window)}
    assert plan["timeout"] == 90.0 and "remind:0.95" not in plan
    long = window_of(route, start=0.0, deadline=86400.0, escalation_level=1)
    assert long.closes == 86400.0 - 60.0
