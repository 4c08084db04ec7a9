"""A router process killed mid-task (SIGKILL) and started again on its SQLite store: the task
it was routing goes on, its sub-task (at a Synapse partner, or at an A2A agent) followed again
to its end, never started a second time."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from routerkit import FAST, SECRET, WAIT, CountingHandler, secret_of, until

from benchmarks.ports import free_port
from synapse.transport.peer import Peer
from synapse.types import TaskState


class RouterProcess:
    """`synapse serve --route … --store …` as a child process, started again on demand."""

    def __init__(self, argv: list[str]) -> None:
        self.argv = argv
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SYNAPSE_")}
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "synapse.cli.main",
            *self.argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env={**env, "PYTHONUNBUFFERED": "1"},
        )
        assert self.proc.stderr is not None
        async with asyncio.timeout(WAIT):
            while True:
                line = await self.proc.stderr.readline()
                assert line, "the router exited before serving"
                if json.loads(line).get("event") == "serving_routes":
                    break
        asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        with contextlib.suppress(Exception):
            while await self.proc.stderr.readline():
                pass

    async def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        await asyncio.wait_for(self.proc.wait(), WAIT)

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), WAIT)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


@pytest.fixture
async def spoke() -> AsyncIterator[tuple[Peer, CountingHandler]]:
    handler = CountingHandler()
    async with Peer("spoke", handler=handler, config=FAST) as peer:
        yield peer, handler


def hub_process(tmp_path: Path, hub_port: int, client: Peer, pool: Path) -> RouterProcess:
    return RouterProcess(
        [
            "serve",
            "--agent-id",
            "hub",
            "--port",
            str(hub_port),
            "--secret",
            SECRET,
            "--peer",
            f"client={client.endpoint}",
            "--route",
            str(pool),
            "--store",
            str(tmp_path / "hub.sqlite"),
            "--log-json",
        ]
    )


@contextlib.asynccontextmanager
async def routed_to_spoke(tmp_path: Path, spoke: Peer) -> AsyncIterator[tuple[Peer, RouterProcess]]:
    """A client, and a router process (`hub`) whose pool is the spoke; stopped at the end."""
    hub_port = free_port()
    hub_url = f"http://127.0.0.1:{hub_port}/synapse/callback"
    async with Peer("client", config=FAST) as client:
        client.add_partner("hub", hub_url, (SECRET,))
        spoke.add_partner("hub", hub_url, (secret_of("spoke"),))
        pool = tmp_path / "pool.toml"
        pool.write_text(
            f'[[partner]]\nagent_id = "spoke"\nendpoint = "{spoke.endpoint}"\n'
            f'secret = "{secret_of("spoke")}"\n'
        )
        hub = hub_process(tmp_path, hub_port, client, pool)
        await hub.start()
        try:
            yield client, hub
        finally:
            await hub.stop()


async def test_a_restarted_router_follows_its_synapse_sub_task_again(
    tmp_path: Path, spoke: tuple[Peer, CountingHandler]
) -> None:
    spoke_peer, handler = spoke
    async with routed_to_spoke(tmp_path, spoke_peer) as (client, hub):
        handle = await client.submit("hub", "slow", {"steps": 40, "delay": 0.1})
        await until(lambda: handler.starts[handle.task_id] == 1, "the spoke's start")
        await hub.kill()  # no drain, no goodbye
        await hub.start()
        outcome = await handle.result(WAIT)
        assert outcome.state is TaskState.COMPLETED, outcome
        assert outcome.result is not None and outcome.result.output == "done after 40 steps"
        assert handler.starts[handle.task_id] == 1  # followed again, not started again
        assert handle.task_id not in handler.cancelled


async def test_a_restarted_router_follows_its_a2a_sub_task_again(tmp_path: Path) -> None:
    """The A2A agent's task is noted with the original task; after the router's SIGKILL the
    new process attaches to it and relays its outcome. The agent ran one task, ever."""
    from synapse.a2a import enable_a2a
    from synapse.demo.handler import DemoHandler

    agent = Peer("agent-a2a", handler=DemoHandler(), config=FAST)
    server = enable_a2a(agent)
    hub_port = free_port()
    hub_url = f"http://127.0.0.1:{hub_port}/synapse/callback"
    async with agent, Peer("client", config=FAST) as client:
        client.add_partner("hub", hub_url, (SECRET,))
        pool = tmp_path / "pool.toml"
        pool.write_text(f'[[a2a]]\nname = "painter"\nurl = "http://127.0.0.1:{agent.port}"\n')
        hub = hub_process(tmp_path, hub_port, client, pool)
        await hub.start()
        try:
            handle = await client.submit("hub", "slow", {"steps": 40, "delay": 0.1})
            await until(lambda: len(server.service.tasks) == 1, "the A2A agent's task")
            await until(lambda: (handle.record.progress or 0) > 0, "the first progress")
            await hub.kill()
            await hub.start()
            outcome = await handle.result(WAIT)
            assert outcome.state is TaskState.COMPLETED, outcome
            assert outcome.result is not None
            assert "done after 40 steps" in str(outcome.result.output)
            kept = [key for key in agent.protocol.list_tasks() if key.startswith("a2a:")]
            assert len(kept) == 1  # one A2A task at the agent, ever: followed again
        finally:
            await hub.stop()


async def test_a_question_waiting_through_a_router_restart_is_answered_once(
    tmp_path: Path, spoke: tuple[Peer, CountingHandler]
) -> None:
    """SIGKILL the router while the task it routed waits on the partner's `need_human`: after
    the restart the task still waits on that question (it does not fail "interrupted by
    restart", its sub-task is not cancelled), and the requester's answer reaches the partner,
    which finishes the task it started once."""
    spoke_peer, handler = spoke
    async with routed_to_spoke(tmp_path, spoke_peer) as (client, hub):
        handle = await client.submit("hub", "portrait", {"subject": "Ada"})
        await until(lambda: handle.state is TaskState.NEED_HUMAN, "the question relayed")
        await hub.kill()
        await hub.start()
        assert handle.state is TaskState.NEED_HUMAN
        said = await handle.approve({"authorized": True}, notes="the estate agreed")
        assert said == "sent"
        outcome = await handle.result(WAIT)
        assert outcome.state is TaskState.COMPLETED, outcome
        assert outcome.result is not None and outcome.result.output == "portrait of Ada"
        assert handler.starts[handle.task_id] == 1
        assert handle.task_id not in handler.cancelled
