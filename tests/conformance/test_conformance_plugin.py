"""The pytest plugin: its fixtures drive a user's own handler, and run the kit on a peer."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from synapse.conformance.fixtures import ConformanceRunner, ExecutorFactory
from synapse.demo.handler import DemoHandler
from synapse.p2p.engine import Validation
from synapse.runtime.handler import ExecutionContext
from synapse.transport.peer import Peer
from synapse.types import TaskState


class Greeter:
    """A user's own handler: one capability, a progress report, a result."""

    def get_capabilities(self) -> list[str]:
        return ["greet"]

    def validate_task(self, task_type: str, payload: dict[str, Any]) -> Validation:
        return Validation()

    async def execute_task(
        self, ctx: ExecutionContext, task_type: str, payload: dict[str, Any]
    ) -> str:
        await ctx.progress(50, "half way")
        return f"hello {payload['name']}"


async def test_the_fixtures_drive_a_users_own_handler(
    synapse_requester: Peer, synapse_executor: ExecutorFactory
) -> None:
    executor = await synapse_executor(Greeter())
    handle = await synapse_requester.submit(executor.agent_id, "greet", {"name": "Ada"})
    events = [event async for event in handle]
    outcome = await handle.result(timeout=10)
    assert outcome.ok, outcome
    assert outcome.result is not None and outcome.result.output == "hello Ada"
    assert events[-1].state is TaskState.COMPLETED
    caps = await synapse_requester.capabilities(executor.agent_id)
    assert [c.name for c in caps.capabilities] == ["greet"]


async def test_several_executors_in_one_test(
    synapse_requester: Peer, synapse_executor: ExecutorFactory
) -> None:
    first = await synapse_executor(Greeter(), agent_id="first")
    second = await synapse_executor(DemoHandler(), agent_id="second", signing_mode="body")
    with pytest.raises(ValueError, match="taken"):
        await synapse_executor(Greeter(), agent_id="first")
    greeting = await synapse_requester.submit(first.agent_id, "greet", {"name": "Bo"})
    echo = await synapse_requester.submit(second.agent_id, "echo", {"text": "hi"})
    assert (await greeting.result(timeout=10)).ok
    assert (await echo.result(timeout=10)).ok


async def test_synapse_conformance_runs_the_kit_on_a_peer(
    synapse_executor: ExecutorFactory, synapse_conformance: ConformanceRunner
) -> None:
    peer = await synapse_executor(DemoHandler())
    report = await synapse_conformance(peer, only=["flow.*", "rules.*"])
    assert report.ok, report.table()
    assert {r.id for r in report.results} >= {"flow.echo", "flow.cancel", "rules.no_backwards"}


async def test_synapse_conformance_against_a_url_needs_id_and_secret(
    synapse_conformance: ConformanceRunner,
) -> None:
    with pytest.raises(ValueError, match="agent_id"):
        await synapse_conformance("http://127.0.0.1:9/synapse/callback")


def test_the_plugin_is_registered_and_works_in_strict_mode(tmp_path: Path) -> None:
    """A fresh pytest run elsewhere finds the fixtures through the `pytest11` entry point."""
    (tmp_path / "test_user.py").write_text(
        textwrap.dedent(
            """
            import pytest
            from synapse.demo.handler import DemoHandler

            @pytest.mark.asyncio
            async def test_echo(synapse_requester, synapse_executor):
                executor = await synapse_executor(DemoHandler())
                handle = await synapse_requester.submit(executor.agent_id, "echo", {"text": "x"})
                assert (await handle.result(timeout=10)).ok

            @pytest.mark.asyncio
            async def test_kit(synapse_executor, synapse_conformance):
                report = await synapse_conformance(
                    await synapse_executor(DemoHandler()), only=["flow.echo"]
                )
                assert report.ok, report.table()
            """
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_user.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout
