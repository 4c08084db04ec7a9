"""A router process killed mid-task (SIGKILL) and started again on its SQLite store: the task
it was routing fails for its requester ("interrupted by restart"), and the partner's sub-task
is cancelled rather than left running for nobody."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from routerkit import FAST, SECRET, WAIT, CountingHandler, until

from synapse.transport.peer import Peer
from synapse.types import ErrorCode, TaskState


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


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


async def test_a_restarted_router_cancels_what_it_was_routing(
    tmp_path: Path, spoke: tuple[Peer, CountingHandler]
) -> None:
    spoke_peer, handler = spoke
    hub_port = free_port()
    hub_url = f"http://127.0.0.1:{hub_port}/synapse/callback"
    async with Peer("client", config=FAST) as client:
        client.add_partner("hub", hub_url, (SECRET,))
        spoke_peer.add_partner("hub", hub_url, (SECRET,))
        pool = tmp_path / "pool.toml"
        pool.write_text(
            f'[[partner]]\nagent_id = "spoke"\nendpoint = "{spoke_peer.endpoint}"\n'
            f'secret = "{SECRET}"\n'
        )
        hub = RouterProcess(
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
        await hub.start()
        try:
            handle = await client.submit("hub", "slow", {"steps": 1000, "delay": 0.05})
            await until(lambda: handler.starts[handle.task_id] == 1, "the spoke's start")
            await hub.kill()  # no drain, no goodbye
            await hub.start()
            outcome = await handle.result(WAIT)
            assert outcome.state is TaskState.FAILED
            assert outcome.error is not None
            assert outcome.error.code == ErrorCode.EXECUTION_FAILED.value
            assert "restart" in outcome.error.message
            await until(lambda: handle.task_id in handler.cancelled, "the sub-task's cancel")
            assert handler.starts[handle.task_id] == 1  # not started again anywhere
        finally:
            await hub.stop()
