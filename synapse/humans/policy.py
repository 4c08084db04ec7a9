"""When to notify, remind, escalate and time out: a pure function of the question's window,
its route, what was done already (read back from the task's audit trail) and `now`.

Sans-IO like the engine: the service asks `due(...)` what is due and when to ask again, and
tests ask it the same on a fake clock.

The window of a question opens when the task starts waiting (`start`) and closes at its
deadline: `task_need_human.deadline` or `task_need_info.required_by`, else the route's
`decide_within`. Level `first` (the question's `escalation_level`, within the route's levels)
is told at the start; each level with a `within` hands over to the next when that time is up,
if the deadline is later; a reminder goes, at each fraction of the window, to the level in
charge then; the deadline itself is the time-out. Each action has a key, kept once done, so
nothing is done twice whatever the restarts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from synapse.humans.config import NotifyRoute

ActionKind = Literal["notify", "remind", "escalate", "timeout"]


@dataclass(frozen=True, slots=True)
class Window:
    start: float
    deadline: float
    #: The level told first (1-based, within the route's levels).
    first: int
    #: When the policy times out (before `deadline`, by the route's margin).
    closes: float


@dataclass(frozen=True, slots=True)
class Due:
    kind: ActionKind
    #: The level told (the level in charge, for a reminder and the time-out).
    level: int
    at: float
    #: Unique within the task's question: `notify:1`, `escalate:2`, `remind:0.5`, `timeout`.
    key: str


def window_of(
    route: NotifyRoute, *, start: float, deadline: float | None, escalation_level: int
) -> Window:
    first = min(max(escalation_level, 1), len(route.levels))
    end = deadline if deadline is not None else start + route.decide_within
    span = max(0.0, end - start)
    margin = route.timeout_margin if route.timeout_margin is not None else min(60.0, span / 10)
    return Window(start, end, first, max(start, end - margin))


def level_starts(route: NotifyRoute, window: Window) -> dict[int, float]:
    """When each level told takes charge (those that come before the deadline)."""
    starts = {window.first: window.start}
    at, level = window.start, window.first
    while level < len(route.levels):
        within = route.levels[level - 1].within
        if within is None or at + within >= window.closes:
            break
        at, level = at + within, level + 1
        starts[level] = at
    return starts


def level_at(starts: dict[int, float], at: float) -> int:
    return max(level for level, start in starts.items() if start <= at)


def schedule(route: NotifyRoute, window: Window) -> list[Due]:
    """Every action of the window, in time order."""
    starts = level_starts(route, window)
    actions = [Due("notify", window.first, window.start, f"notify:{window.first}")]
    actions += [
        Due("escalate", level, at, f"escalate:{level}")
        for level, at in starts.items()
        if level != window.first
    ]
    span = window.deadline - window.start
    for fraction in route.reminders:
        at = window.start + fraction * span
        if at < window.closes:
            actions.append(Due("remind", level_at(starts, at), at, f"remind:{fraction:g}"))
    actions.append(Due("timeout", level_at(starts, window.closes), window.closes, "timeout"))
    return sorted(actions, key=lambda d: (d.at, d.kind != "notify"))


def due(
    route: NotifyRoute, window: Window, done: set[str], now: float
) -> tuple[list[Due], float | None]:
    """The actions due by `now` not yet done, in order; and when the next one falls due."""
    ready: list[Due] = []
    later: list[float] = []
    for action in schedule(route, window):
        if action.key in done:
            continue
        if action.at <= now:
            ready.append(action)
        else:
            later.append(action.at)
    if any(action.kind == "timeout" for action in ready):
        # Past the deadline (a peer down meanwhile), what was not told is moot: time out.
        ready = [action for action in ready if action.kind == "timeout"]
    return ready, min(later) if later else None


__all__ = [
    "ActionKind",
    "Due",
    "Window",
    "due",
    "level_at",
    "level_starts",
    "schedule",
    "window_of",
]
