"""The model checker: every state within the CI's bounds holds, and the defects it found stay
found: each one's trace replayed on today's engines, and the checker shown to find it again
when the fix is taken out."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor

import headstart
import pytest

from synapse.model import Bounds, Result, explore
from synapse.model.bounds import CI, LARGER, from_environment
from synapse.model.checker import follow
from synapse.p2p.engine import Engine, EngineTimer, Step, TaskEvent, TaskNote
from synapse.p2p.states import Role, StateTimer
from synapse.types import TaskState

#: Minutes of exploration or a real browser: left out of the quick loop (`pytest -m "not slow"`).
pytestmark = pytest.mark.slow


def explore_all(bounds: dict[str, Bounds]) -> dict[str, Result]:
    """`explore` each of `bounds`, as many at once as there are cores (each in a process of
    its own: the checker is pure Python)."""
    context = multiprocessing.get_context("spawn")  # no fork of a process with threads
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 1, mp_context=context) as pool:
        results = pool.map(explore, bounds.values())
        return dict(zip(bounds, results, strict=True))


def check_all(bounds: dict[str, Bounds], label: str, figures: list[str]) -> None:
    report(explore_all(bounds), label, figures)


def report(results: dict[str, Result], label: str, figures: list[str]) -> None:
    for name, result in results.items():
        figures.append(f"{label}, {name}: {result.summary()}")
    total = sum(r.states for r in results.values())
    figures.append(f"{label}: {total:,} states in all")
    for name, result in results.items():
        assert result.complete, name
        assert not result.violations, f"{name}:\n" + "\n\n".join(
            str(v) for v in result.violations.values()
        )
        # The bound explores something worth the name (a broken move generator finds little).
        assert result.states > 10_000, name


def test_every_state_within_the_ci_bounds_holds(figures: list[str]) -> None:
    """CI's bounds (or each changed as `SYNAPSE_MODEL=losses=2,...` says), explored in a
    process of their own from the start of the run."""
    report(headstart.outcome("model"), "model", figures)


@pytest.mark.skipif(
    os.environ.get("SYNAPSE_MODEL", "") != "larger", reason="SYNAPSE_MODEL=larger runs it"
)
def test_every_state_within_the_larger_bounds_holds(figures: list[str]) -> None:
    check_all(LARGER, "model (larger)", figures)


def test_the_environment_chooses_the_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SYNAPSE_MODEL", raising=False)
    assert from_environment() == CI
    monkeypatch.setenv("SYNAPSE_MODEL", "larger")
    assert from_environment() == LARGER
    monkeypatch.setenv("SYNAPSE_MODEL", "losses=2")
    assert all(b.losses == 2 for b in from_environment().values())
    monkeypatch.setenv("SYNAPSE_MODEL", "lossez=2")
    with pytest.raises(ValueError, match="no bound 'lossez'"):
        from_environment()


# --- the defects it found, and their traces ------------------------------------------------

#: A status update whose reply was lost is retried past the deduplication window: it was
#: answered `nack task_already_completed` instead of the `ack` it got the first time.
ANSWERED_DIFFERENTLY = (
    "deliver requester POST R task_request #1 (accept)",
    "executor stall",
    "deliver executor POST E task_status_update #1",
    "wait past dedup",
    "deliver executor POST E task_status_update #1",
)
#: A task_info_provided retried past the window moved the executor's task a second time.
APPLIED_TWICE = (
    "deliver requester POST R task_request #1 (need_info)",
    "receive reply task_need_info to requester's R task_request #1",
    "requester provide info",
    "requester stall",
    "deliver requester POST R task_info_provided #1 (need_info)",
    "wait past dedup",
    "deliver requester POST R task_info_provided #1 (accept)",
)
#: A requester whose commit of a callback failed was rolled back without its silence timer
#: (with the rollback's checkpoint made to forget the requester's own timers, as it once did).
ROLLED_BACK_WITHOUT_TIMERS = (
    "deliver requester POST R task_request #1 (accept)",
    "deliver, commit failing executor POST E task_status_update #1",
)
#: A requester that gave up, whose task_cancel's retries then ran out, told its outcome twice.
OUTCOME_TOLD_TWICE = (
    "deliver requester POST R task_request #1 (accept)",
    "deliver executor POST E task_status_update #1",
    "executor ask for information",
    "timer, messages late",
    "requester exhaust",
)

DUPLICATE_PAST_WINDOW = CI["a duplicate past the window"]
EXHAUSTION = CI["retries running out"].with_("questions=1")


def test_a_retry_past_the_window_is_answered_as_it_was() -> None:
    world, met = follow(DUPLICATE_PAST_WINDOW, ANSWERED_DIFFERENTLY)
    assert met == []
    # Both copies got `ack`: the checker records each message's first final answer.
    assert {kind for (side, _), kind in world.answers.items() if side == "r"} == {"ack"}


def test_a_retry_past_the_window_is_applied_once() -> None:
    world, met = follow(DUPLICATE_PAST_WINDOW, APPLIED_TWICE)
    assert met == []
    rec = world.e.record()
    assert rec is not None
    events = [t.event.value for t in rec.history]
    assert events.count("recv task_info_provided") == 1


def test_a_failed_commit_gives_the_requester_its_timers_back() -> None:
    before, _ = follow(CI["a commit failing"], ROLLED_BACK_WITHOUT_TIMERS[:-1])
    world, met = follow(CI["a commit failing"], ROLLED_BACK_WITHOUT_TIMERS)
    assert met == []
    rec = world.r.record()
    assert rec is not None and rec.state is TaskState.PENDING  # as if it never came
    # Its silence timer is the one it had, not the one the refused callback set.
    assert world.r.engine.timer_deadlines() == before.r.engine.timer_deadlines()
    assert (StateTimer.SILENCE, rec.key) in world.r.engine.timer_deadlines()


def test_an_undeliverable_cancel_after_giving_up_is_no_second_outcome() -> None:
    world, met = follow(EXHAUSTION, OUTCOME_TOLD_TWICE)
    assert met == []
    assert world.r.outcomes == 1


def test_a_trace_step_that_is_no_move_is_named() -> None:
    with pytest.raises(ValueError, match="step 2, 'executor fly'"):
        follow(DUPLICATE_PAST_WINDOW, (ANSWERED_DIFFERENTLY[0], "executor fly"))


# --- without each fix, the checker finds it again ----------------------------------------------


@pytest.fixture
def without_answering_alike(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(Engine, "_answered_before", lambda self, rec, msg, now, step: False)
    yield


@pytest.fixture
def without_timers_in_the_checkpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    checkpoint = Engine.checkpoint

    def forgetful(self: Engine, message: object) -> object:
        saved = checkpoint(self, message)  # type: ignore[arg-type]
        own = (StateTimer.SILENCE, EngineTimer.REQUESTER_DEADLINE)
        for key in [key for key in saved.timers if key[0] in own]:
            del saved.timers[key]
        return saved

    monkeypatch.setattr(Engine, "checkpoint", forgetful)
    yield


@pytest.fixture
def telling_final_tasks_undeliverable(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    undeliverable = Engine.on_undeliverable

    def talkative(self: Engine, sent: object, now: float, cause: str = "") -> Step:
        step = undeliverable(self, sent, now, cause)  # type: ignore[arg-type]
        key = self._key_of(sent)  # type: ignore[arg-type]
        rec = self.tasks.get(key) if key is not None else None
        if rec is not None and rec.role is Role.REQUESTER and rec.is_final and not step.actions:
            event = TaskEvent(rec.key, TaskNote.UNDELIVERABLE, rec.state, sent, "")  # type: ignore[arg-type]
            step.actions.append(event)
        return step

    monkeypatch.setattr(Engine, "on_undeliverable", talkative)
    yield


def shortest(bounds: Bounds, invariant: str) -> tuple[str, ...]:
    result = explore(bounds, stop_at_violation=invariant != "each_message_applied_once")
    assert invariant in result.violations, result.summary()
    return result.violations[invariant].trace


@pytest.mark.usefixtures("without_answering_alike")
def test_the_checker_finds_a_retry_answered_differently() -> None:
    assert shortest(DUPLICATE_PAST_WINDOW, "a_retry_is_answered_alike") == ANSWERED_DIFFERENTLY
    _, met = follow(DUPLICATE_PAST_WINDOW, ANSWERED_DIFFERENTLY)
    assert [name for name, _ in met] == ["a_retry_is_answered_alike"]


@pytest.mark.usefixtures("without_answering_alike")
def test_the_checker_finds_a_retry_applied_twice() -> None:
    _, met = follow(DUPLICATE_PAST_WINDOW, APPLIED_TWICE)
    assert "each_message_applied_once" in [name for name, _ in met]


@pytest.mark.usefixtures("without_timers_in_the_checkpoint")
def test_the_checker_finds_a_rollback_without_timers() -> None:
    trace = shortest(CI["a commit failing"], "a_failed_commit_changes_nothing")
    assert trace == ROLLED_BACK_WITHOUT_TIMERS


@pytest.mark.usefixtures("telling_final_tasks_undeliverable")
def test_the_checker_finds_an_outcome_told_twice() -> None:
    _, met = follow(EXHAUSTION, OUTCOME_TOLD_TWICE)
    assert [name for name, _ in met] == ["outcome_reported_once"]


def test_the_checker_finds_a_task_that_waits_forever(monkeypatch: pytest.MonkeyPatch) -> None:
    """Liveness: with no timers and a handler whose result is lost, nothing ever ends."""
    monkeypatch.setattr(Engine, "on_timer", lambda self, now: Step())
    monkeypatch.setattr(Engine, "_complete", lambda self, command, now: Step())
    quiet = Bounds(
        losses=0, stalls=0, failures=0, waits=0, cancels=0, lates=0, progress=0, questions=0
    ).with_("decisions=0")
    result = explore(quiet)
    assert result.complete
    assert "every_task_ends" in result.violations
    assert result.violations["every_task_ends"].trace  # the way to the stuck state
