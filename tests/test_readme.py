"""The README's promises: its two commands, and its Python example, which is a real program."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
EXAMPLE = ROOT / "examples" / "quickstart.py"


def test_first_lines_are_the_demo_and_the_test_commands() -> None:
    lines = README.splitlines()
    block = lines[lines.index("```sh") + 1 : lines.index("```sh") + 3]
    assert block[0].endswith("pip install -e . && synapse demo")
    assert block[1].endswith("pip install -e '.[dev]' && pytest -q")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "pip install -q -e '.[dev]'" in ci
    assert "pytest -q" in ci


def test_the_readme_shows_the_example_as_it_is() -> None:
    body = EXAMPLE.read_text(encoding="utf-8").split('"""', 2)[2].lstrip("\n")
    assert body in README


def test_the_example_runs_to_completion() -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "p2p:task_need_info → info_needed"
    assert lines[-1] == "completed [terse] Synapse peers delegate tasks."
