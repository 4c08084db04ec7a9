"""`synapse demo`: every flow of specs/protocol.md, 'Flows', a failure and a rejection, as a
deterministic timeline."""

from __future__ import annotations

import re
import subprocess
import time

import pytest
from clikit import run


@pytest.fixture(scope="module")
def demo() -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    result = run("demo", timeout=30)
    result.elapsed = time.monotonic() - started  # type: ignore[attr-defined]
    return result


def section(output: str, number: int) -> str:
    """The text of flow `number` (`N. …` up to the next title)."""
    match = re.search(rf"^{number}\. .*?(?=^\d+\. |^Summary)", output, re.M | re.S)
    assert match, output
    return match.group(0)


def test_demo_runs_quickly_and_exits_0(demo: subprocess.CompletedProcess[str]) -> None:
    assert demo.returncode == 0, demo.stderr
    assert demo.stderr == ""
    assert demo.elapsed < 10  # type: ignore[attr-defined]


def test_demo_ends_with_where_to_go_next(demo: subprocess.CompletedProcess[str]) -> None:
    after = demo.stdout.split("\nWhat next\n", 1)[1]
    for pointer in ("synapse serve", "synapse send", "docs/handlers.md", "(recoverable)"):
        assert pointer in after, pointer


def test_demo_is_the_same_every_time(demo: subprocess.CompletedProcess[str]) -> None:
    again = run("demo", "--signing", "body", timeout=30)
    assert again.returncode == 0, again.stderr
    assert again.stdout == demo.stdout.replace("(header mode)", "(body mode)")
    assert not re.search(r"msg-|[0-9a-f]{16}|\d{4}-\d\d-\d\dT|:\d{4,5}/", demo.stdout)


def test_normal_flow(demo: subprocess.CompletedProcess[str]) -> None:
    text = section(demo.stdout, 1)
    assert "1  R → E  task_request" in text
    assert "R (alice) idle → pending" in text
    assert "E (bob) idle → confirmed → executing" in text
    assert "2  E → R  ↳ task_confirm (sync reply)" in text
    assert "R (alice) pending → confirmed" in text
    assert "E → R  task_complete" in text
    assert "R (alice) executing → completed   E (bob) executing → completed" in text
    assert "R → E  ↳ task_ack (sync reply)" in text
    assert "outcome at alice: completed: hello, bob" in text
    progress = section(demo.stdout, 2)
    for step in ("33% step 1/3", "66% step 2/3", "100% step 3/3"):
        assert f"task_status_update           demo-slow  executing {step}" in progress


def test_need_info_flow(demo: subprocess.CompletedProcess[str]) -> None:
    text = section(demo.stdout, 3)
    assert "↳ task_need_info (sync reply)" in text
    assert 'missing style (suggested "古典"; or "现代", "浪漫")' in text
    assert "R → E  task_info_provided" in text
    assert "E (bob) info_needed → info_provided → executing" in text
    assert "↳ task_confirm" not in text
    assert "outcome at alice: completed: “spring”, written in the 现代 style" in text
    assert "现代 (modern)" in text  # the demo's own answer is one of the styles it offers


def test_need_human_flow(demo: subprocess.CompletedProcess[str]) -> None:
    text = section(demo.stdout, 4)
    assert "E → R  task_need_human" in text
    assert "ethical_decision; option authorized = true" in text
    assert "R (alice) need_human → human_deciding → human_approved" in text
    assert "E (bob) need_human → human_approved → executing" in text
    assert "outcome at alice: completed: portrait of Ada Lovelace" in text


def test_cancel_flow(demo: subprocess.CompletedProcess[str]) -> None:
    text = section(demo.stdout, 5)
    assert "R → E  task_cancel" in text
    assert "E (bob) executing → cancelled" in text
    assert "state cancelled" in text
    assert "R (alice) executing → cancelled" in text
    assert text.rstrip().endswith("outcome at alice: cancelled")
    # Nothing more about the task after bob acknowledged the cancel.
    lines = text.splitlines()
    ack = next(i for i, line in enumerate(lines) if "↳ task_ack" in line)
    assert not any(re.match(r"\s+\d+  ", line) for line in lines[ack + 1 :])


def test_failure_and_rejection(demo: subprocess.CompletedProcess[str]) -> None:
    failure = section(demo.stdout, 6)
    assert "E → R  task_failed" in failure
    assert "execution_failed: the demo task `fail` always fails (recoverable)" in failure
    rejection = section(demo.stdout, 7)
    assert "↳ task_reject (sync reply)" in rejection
    assert "E (bob) idle → rejected" in rejection
    assert "capability_lacking" in rejection
    summary = demo.stdout[demo.stdout.index("Summary") : demo.stdout.index("What next")].split()
    assert summary[1:] == [
        "demo-echo", "echo", "completed",
        "demo-slow", "slow", "completed",
        "demo-text", "text_generation", "completed",
        "demo-portrait", "portrait", "completed",
        "demo-cancel", "slow", "cancelled",
        "demo-fail", "fail", "failed",
        "demo-reject", "translate", "rejected",
    ]  # fmt: skip
