"""Issue 16: `synapse serve` chooses its event loop and collector thresholds; the library,
used from Python, changes neither."""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import json
import subprocess
import sys

import pytest
from clikit import executor_args, free_port, serve

from synapse.cli import speed

UVLOOP = importlib.util.find_spec("uvloop") is not None


def test_serve_runs_on_uvloop_when_installed_and_says_so() -> None:
    with serve(*executor_args(free_port()), "--log-json") as server:
        assert server.stop() == 0
    [serving] = [json.loads(line) for line in server.lines if '"serving"' in line]
    assert serving["event_loop"] == ("uvloop" if UVLOOP else "asyncio.unix_events")


def test_without_uvloop_serve_falls_back_to_asyncio(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # `import uvloop` raises ImportError
    assert speed.loop_factory() is None

    async def loop_module() -> str:
        return type(asyncio.get_running_loop()).__module__

    saved = gc.get_threshold()
    try:
        assert speed.run_server(loop_module()).startswith("asyncio")
        assert gc.get_threshold() == speed.GC_THRESHOLDS
    finally:
        gc.set_threshold(*saved)


@pytest.mark.skipif(not UVLOOP, reason="uvloop (pip install 'synapse-agent-p2p[speed]')")
def test_with_uvloop_the_factory_is_uvloops() -> None:
    import uvloop

    assert speed.loop_factory() is uvloop.new_event_loop


def test_the_library_leaves_the_collector_and_the_loop_alone() -> None:
    """An embedding program's gc thresholds and event loop stay its own after a whole task."""
    program = """
import asyncio, gc
gc.set_threshold(1234, 5, 6)
from synapse import Peer
from synapse.demo.handler import DemoHandler

async def main():
    e = Peer("agent-e", port=0, handler=DemoHandler())
    r = Peer("agent-r", port=0)
    async with e, r:
        e.add_partner("agent-r", r.endpoint, ["s"])
        r.add_partner("agent-e", e.endpoint, ["s"])
        outcome = await (await r.submit("agent-e", "echo", {"text": "hi"}))
        assert outcome.ok, outcome
    return type(asyncio.get_running_loop()).__module__

print(asyncio.run(main()), gc.get_threshold())
"""
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=False
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.strip() == "asyncio.unix_events (1234, 5, 6)"
