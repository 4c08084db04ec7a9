"""specs/protocol.md, 'Task states' judged from outside: the executor's graph and the ordering of
observations."""

from __future__ import annotations

import pytest

from synapse.conformance.kit import parse_listen
from synapse.conformance.report import CheckResult, Report, Status
from synapse.conformance.rules import FINAL, REACHABLE, UNAIDED, Observation, backwards
from synapse.types import TaskState


def obs(state: str, start: int, end: int | None = None) -> Observation:
    return Observation(state, start, start if end is None else end, f"{state}@{start}")


def ack(state: str, start: int, end: int) -> Observation:
    """The task_ack to a message of the kit's (info, decision, cancel)."""
    return Observation(state, start, end, f"task_ack {state}", by_requester=True)


def test_the_graph_knows_every_executor_state_and_final_states_lead_nowhere() -> None:
    executor_states = set(TaskState) - {TaskState.IDLE, TaskState.PENDING, TaskState.HUMAN_DECIDING}
    assert set(REACHABLE) == {s.value for s in executor_states}
    for state in FINAL:
        assert REACHABLE[state] == {state}
    assert "confirmed" not in REACHABLE["executing"]
    assert {"executing", "completed", "cancelled"} <= REACHABLE["info_needed"]
    assert REACHABLE["human_rejected"] == {"human_rejected", "failed", "cancelled"}
    # Without a message of the requester's, a waiting task can only wait or fail.
    assert UNAIDED["need_human"] == {"need_human", "failed"}
    assert UNAIDED["info_needed"] == {"info_needed", "failed"}
    assert "cancelled" not in UNAIDED["executing"]


@pytest.mark.parametrize(
    "states",
    [
        ["confirmed", "executing", "executing", "completed"],
        ["info_needed", "info_provided", "executing", "completed"],
        ["confirmed", "executing", "need_human", "human_approved", "executing", "completed"],
        ["confirmed", "executing", "need_human", "human_rejected", "failed"],
        ["confirmed", "executing", "cancelled"],
        ["rejected"],
    ],
)
def test_the_seed_flows_never_go_backwards(states: list[str]) -> None:
    kit_moves = {"info_provided", "human_approved", "human_rejected", "cancelled"}
    observed = [
        ack(s, 2 * i, 2 * i + 1) if s in kit_moves else obs(s, 2 * i)
        for i, s in enumerate(states, 1)
    ]
    assert backwards(observed) == []


@pytest.mark.parametrize(
    ("states", "problem"),
    [
        (["confirmed", "executing", "confirmed"], "executing"),
        (["need_human", "executing"], "no message of the requester"),
        (["info_needed", "completed"], "no message of the requester"),
        (["executing", "cancelled"], "no message of the requester"),
        (["human_rejected", "executing"], "human_rejected"),
        (["confirmed", "waiting"], "names no executor state"),
    ],
)
def test_a_state_that_cannot_follow_is_reported(states: list[str], problem: str) -> None:
    problems = backwards([obs(s, i) for i, s in enumerate(states, 1)])
    assert problems and problem in problems[0]


def test_a_reply_overlapping_a_callback_may_come_in_either_order() -> None:
    # task_ack{human_approved} for a decision sent at 1 and answered at 4; the executing
    # status update that followed the approval crossed it, arriving at 3.
    crossing = [obs("need_human", 0), ack("human_approved", 1, 4), obs("executing", 3)]
    assert backwards(crossing) == []
    # Had the status update arrived before the decision was even sent, it would be backwards.
    early = [obs("need_human", 0), obs("executing", 1), ack("human_approved", 2, 4)]
    assert backwards(early) == [
        "need_human (need_human@0) then executing (executing@1) "
        "with no message of the requester in between"
    ]


def test_only_states_up_to_the_first_final_one_count() -> None:
    # What comes after a final state is the business of rules.nothing_after_final.
    assert backwards([obs("executing", 1), obs("completed", 2), obs("executing", 3)]) == []


def test_parse_listen() -> None:
    assert parse_listen("127.0.0.1:8766") == ("127.0.0.1", 8766)
    assert parse_listen("[::1]:0") == ("::1", 0)
    for bad in ("8766", "host:", ":80", "h:99999", "h:x"):
        with pytest.raises(ValueError):
            parse_listen(bad)


def test_a_report_is_ok_only_without_failures() -> None:
    passed = CheckResult("a", "A", "specs/protocol.md, 'Envelope'", Status.PASS)
    failed = CheckResult("b", "B", "specs/protocol.md, 'Payloads'", Status.FAIL, "it broke")
    skipped = CheckResult("c", "C", "specs/protocol.md, 'Signatures'", Status.SKIP, "not run")
    assert Report("u", "t", "k", "cb", [passed, skipped]).ok
    assert not Report("u", "t", "k", "cb", [passed, failed]).ok
    assert not Report("u", "t", "k", "cb", []).ok
    table = Report("u", "t", "k", "cb", [passed, failed, skipped]).table()
    assert "↳ it broke" in table and "NOT CONFORMANT" in table
