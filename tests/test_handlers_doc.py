"""docs/handlers.md, "Writing a handler": its code blocks run as shown and print what it says."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

DOC = (Path(__file__).resolve().parent.parent / "docs" / "handlers.md").read_text("utf-8")


def _blocks(fence: str) -> list[str]:
    return [part.split("\n```", 1)[0] for part in DOC.split(f"```{fence}\n")[1:]]


def test_the_guide_runs_and_prints_what_it_shows(tmp_path: Path) -> None:
    handler, driver = _blocks("python")
    program = tmp_path / "studio.py"
    quiet = "import logging, structlog\n" + (
        "structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))\n"
    )
    program.write_text(quiet + handler + "\n\n" + driver, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(program)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    shown = DOC.split("It prints:\n\n```\n", 1)[1].split("\n```", 1)[0]
    assert done.stdout.strip() == shown.strip()
