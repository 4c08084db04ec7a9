"""Lint, formatting, types and the documentation build are tests too: `pytest` runs what CI
runs, so the README's one test command checks everything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CODE = ["synapse", "tests", "benchmarks", "examples"]

pytestmark = pytest.mark.slow


def run(*args: str, timeout: float = 600) -> None:
    done = subprocess.run(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]


def test_ruff_finds_nothing() -> None:
    run("ruff", "check", *CODE)


def test_the_code_is_formatted() -> None:
    run("ruff", "format", "--check", *CODE)


def test_the_library_type_checks_strictly() -> None:
    run("mypy", "--strict", "synapse")


def test_the_documentation_builds_without_a_warning(tmp_path: Path) -> None:
    # The API reference comes from the docstrings: a broken reference is a warning.
    run("mkdocs", "build", "--strict", "--quiet", "--site-dir", str(tmp_path / "site"))
