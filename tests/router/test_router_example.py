"""examples/routing_hub.py is a real program: it runs, and says what the router did."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "routing_hub.py"


def test_the_routing_example_runs_to_completion() -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # the warnings it means to hide stay hidden
    assert done.stdout.splitlines() == [
        "hub offers: echo, echo_all, fail, portrait, slow, text_generation",
        "text_generation: completed “spring”, written in the modern style",
        "portrait: completed portrait of Ada",
        "echo_all: completed one two three",
        "slow after an outage: completed",
        "  writer-1: reachable=True",
        "  writer-2: reachable=False",
        "  echoer: reachable=True",
    ]
