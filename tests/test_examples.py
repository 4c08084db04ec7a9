"""Every program of examples/ runs as it is, from a shell, and prints what its flow promises:
the Python side of each flow and front a newcomer meets first (quickstart: need_info; the
others: need_human, cancel, A2A server and client; routing_hub: tests/router)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

#: Each example, and lines its output must hold, in order.
PROMISES = {
    "quickstart.py": ["p2p:task_need_info → info_needed", "completed [terse] Synapse peers"],
    "need_human.py": [
        "p2p:task_need_human → need_human",
        "asked: a post goes out under your name ['Sprng is here']",
        "completed published: Spring is here",
    ],
    "cancel.py": ["p2p:task_status_update → executing", "p2p:task_ack → cancelled", "cancelled"],
    "humans.py": [
        "the team is told: synapse.human.notify - a post goes out under your name",
        "the link shows a page: Approve this decision?",
        "approved from the page: 200",
        "completed published: Spring is here",
        "audit: human.link_used by channel:team",
        "audit: approve by channel:team",
    ],
    "pydantic_ai_agent.py": [
        "asked: the agent wants to call book_table {'guests': 4, 'time': '19:30'}",
        "completed Done: a table for 4 at 20:00",
    ],
    "langgraph_graph.py": [
        "asked for: ['dates']",
        "asked: book this trip? {'plan': 'train to Lyon, May 3-5'}",
        "completed {'destination': 'Lyon', 'dates': 'May 3-5', 'plan': 'train to Lyon, May 3-5'}",
    ],
    "openai_agent.py": [
        "asked: the agent wants to call refund {'order': 'A-17', 'euros': 25}",
        "completed Done: refunded 25 EUR on A-17",
    ],
    "a2a.py": [
        "status_update → TASK_STATE_INPUT_REQUIRED",
        "status_update → TASK_STATE_COMPLETED",
        "completed TaskResult(output_type='text', output='Hello, Ada!', metadata={})",
    ],
}


def test_every_example_is_run_here() -> None:
    tested = set(PROMISES) | {"routing_hub.py"}  # routing_hub: tests/router/test_router_example.py
    assert {p.name for p in EXAMPLES.glob("*.py")} == tested


@pytest.mark.parametrize("name", sorted(PROMISES))
def test_the_example_prints_its_flow(name: str) -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=EXAMPLES.parent,
    )
    assert done.returncode == 0, done.stderr
    printed = done.stdout.splitlines()
    at = 0
    for promised in PROMISES[name]:
        found = [i for i, line in enumerate(printed) if i >= at and promised in line]
        assert found, (promised, printed)
        at = found[0] + 1
