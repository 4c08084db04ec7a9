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


def test_the_library_is_quiet_until_the_program_configures_logging() -> None:
    """Used from Python, Synapse prints nothing of its own: the example's output is its own
    7 prints, and nothing reaches stderr. Its events go to `logging`, at the level the
    program sets (here, info: each task's outcome, the peers' start)."""
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=60, check=False
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert len(done.stdout.splitlines()) == 7
    configured = (
        "import logging, runpy, sys; logging.basicConfig(level=logging.INFO, stream=sys.stderr);"
        f" runpy.run_path({str(EXAMPLE)!r}, run_name='__main__')"
    )
    done = subprocess.run(
        [sys.executable, "-c", configured], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 7
    logged = done.stderr.splitlines()
    assert any(line.startswith("INFO:synapse.peer:listening url=") for line in logged), logged
    assert any("transition" in line and "to_state='completed'" in line for line in logged)
    assert not any("message_in" in line for line in logged)  # per message: debug


def _python_blocks(text: str) -> list[str]:
    blocks = text.split("```python\n")[1:]
    return [block.split("```", 1)[0] for block in blocks]


def test_the_plugin_snippet_passes_under_pytest_asyncio_default_mode(tmp_path: Path) -> None:
    """The README's pytest example, copied into a project of its own with no asyncio_mode set."""
    (snippet,) = [b for b in _python_blocks(README) if "synapse_executor" in b]
    (tmp_path / "test_snippet.py").write_text(snippet, encoding="utf-8")
    (tmp_path / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")  # strict: the default
    _pytest_passes_one(tmp_path)
    # With the line the README gives, pytest-asyncio has nothing to warn of.
    ini = README.split("```ini\n", 1)[1].split("```", 1)[0]
    (tmp_path / "pytest.ini").write_text(ini, encoding="utf-8")
    said = _pytest_passes_one(tmp_path)
    assert "asyncio_default_fixture_loop_scope" not in said


def _pytest_passes_one(project: Path) -> str:
    """pytest run in `project`: one test passes; what it printed."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(project)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=project,
    )
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout + done.stderr
    return done.stdout + done.stderr


SEVEN_TASKS = """
import asyncio
from synapse import Peer
from synapse.demo.handler import DemoHandler

async def main():
    e, r = Peer("agent-e", port=0, handler=DemoHandler()), Peer("agent-r", port=0)
    async with e, r:
        e.add_partner("agent-r", r.endpoint, ("s3cret",))
        r.add_partner("agent-e", e.endpoint, ("s3cret",))
        handles = [await r.submit("agent-e", "echo", {"text": str(n)}) for n in range(7)]
        outcomes = [await h for h in handles]
        assert all(o.ok for o in outcomes)

asyncio.run(main())
"""


def test_a_seven_task_script_prints_nothing() -> None:
    """Once 261 lines: a program embedding Synapse that configures no logging gets none."""
    done = subprocess.run(
        [sys.executable, "-c", SEVEN_TASKS], capture_output=True, text=True, timeout=60, check=False
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_the_quick_loop_the_readme_names_leaves_the_long_runs_out() -> None:
    """`pytest -m "not slow"`: the marker is registered, and the long runs carry it."""
    assert 'pytest -q -m "not slow"' in README
    pyproject = (ROOT / "pyproject.toml").read_text("utf-8")
    assert '"slow: ' in pyproject
    for module in (
        "tests/model/test_model_checker.py",
        "tests/model/test_random_walks.py",
        "tests/simulation/test_simulation.py",
        "tests/humans/test_humans_browser.py",
        "tests/ops/test_ops_console_browser.py",
    ):
        assert "pytestmark = pytest.mark.slow" in (ROOT / module).read_text("utf-8"), module
