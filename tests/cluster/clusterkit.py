"""Replicas of one executor agent (`synapse serve` processes on one PostgreSQL database),
nginx in front of them, and an in-test requester peer that records every callback.

Every process is started on 127.0.0.1 and a free port, and stopped by its PID.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lbserver import Nginx
from pgserver import free_port

from synapse.p2p.config import P2PConfig
from synapse.runtime.listener import OnMessage
from synapse.runtime.protocol import MessageEvent
from synapse.transport.peer import Peer

R, E = "agent-r", "agent-e"
SECRET = "cluster-secret-r-e-0123456789abc"
PATH = "/synapse/callback"
#: The requester retries fast: a replica that dies mid-exchange costs little.
R_CONFIG = P2PConfig(
    max_retries=30,
    retry_base_delay=0.05,
    retry_max_delay=0.5,
    request_timeout=8,
    max_concurrent_tasks=5000,
)


def replica_config(path: Path, lease_ttl: float, extra: str = "") -> Path:
    """The replicas' TOML; `extra`: more `[p2p]` lines (`input_timeout = 4`, ...)."""
    path.write_text(
        "[p2p]\n"
        "max_retries = 30\nretry_base_delay = 0.05\nretry_max_delay = 0.5\n"
        "request_timeout = 8\nmax_concurrent_tasks = 5000\n"
        f"lease_ttl = {lease_ttl}\n{extra}"
    )
    return path


@dataclass
class Replica:
    """One `synapse serve` replica of agent-e."""

    name: str
    store: str
    endpoint: str
    requester_url: str
    config: Path
    log_dir: Path
    port: int = field(default_factory=free_port)
    proc: asyncio.subprocess.Process | None = None
    starts: int = 0
    #: `MODULE:ATTR` of the handler (a module of tests/cluster), or the demo handler.
    handler: str | None = None
    #: More `synapse serve` flags (`--a2a`, …).
    args: tuple[str, ...] = ()
    #: The address it listens on (and other replicas forward to).
    host: str = "127.0.0.1"
    #: The network namespace it runs in (`ip netns exec`), if not this process's.
    netns: str | None = None
    #: More environment variables for the process.
    env: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}{PATH}"

    @property
    def hostport(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def log(self) -> Path:
        return self.log_dir / f"{self.name}.log"

    async def start(self, timeout: float = 30.0) -> None:
        self.starts += 1
        # `ip netns exec` execs the command: the PID is the replica's own.
        argv = ["ip", "netns", "exec", self.netns] if self.netns else []
        argv += [
            sys.executable, "-m", "synapse.cli.main", "serve",
            "--agent-id", E, "--host", self.host, "--port", str(self.port),
            "--endpoint", self.endpoint, "--store", self.store,
            "--peer", f"{R}={self.requester_url}", "--secret", SECRET,
            "--config", str(self.config), "--log-json",
        ]  # fmt: skip
        if self.handler is not None:
            argv += ["--handler", self.handler]
        argv += self.args
        env = {k: v for k, v in os.environ.items() if not k.startswith("SYNAPSE_")}
        env["PYTHONUNBUFFERED"] = "1"
        env.update(self.env)
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(Path(__file__).parent), env.get("PYTHONPATH")])
        )
        with self.log.open("ab") as log:
            log.write(f"--- start {self.starts}\n".encode())
        self.proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        assert self.proc.stderr is not None
        stream = self.proc.stderr

        async def until_listening() -> None:
            with self.log.open("ab") as log:
                while line := await stream.readline():
                    log.write(line)
                    if b'"listening"' in line:
                        return
            raise AssertionError(f"{self.name} exited: {self.tail()}")

        await asyncio.wait_for(until_listening(), timeout)
        asyncio.get_running_loop().create_task(self._drain_log(stream))

    async def _drain_log(self, stream: asyncio.StreamReader) -> None:
        with self.log.open("ab") as log:
            while line := await stream.readline():
                log.write(line)
                log.flush()  # tests read the log while the replica runs

    def tail(self, lines: int = 20) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def signal(self, signum: signal.Signals) -> None:
        assert self.proc is not None and self.proc.returncode is None
        os.kill(self.proc.pid, signum)

    async def state_dump(self, timeout: float = 5.0) -> str:
        """What the replica is waiting on (`synapse serve` on SIGUSR1), read from its log:
        for a failure report. Empty if it is not running or does not answer in time."""
        if self.proc is None or self.proc.returncode is not None:
            return ""
        before = self.log.stat().st_size
        os.kill(self.proc.pid, signal.SIGCONT)  # a paused replica answers too
        os.kill(self.proc.pid, signal.SIGUSR1)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log.read_bytes()[before:].decode(errors="replace")
            start, end = text.find("=== synapse state dump"), text.find("=== end of dump ===")
            if start >= 0 and end > start:
                return text[start : end + len("=== end of dump ===")]
            await asyncio.sleep(0.05)  # the log is another process's file: polled
        return ""

    async def kill(self) -> None:
        """SIGKILL, and wait for the exit."""
        self.signal(signal.SIGKILL)
        assert self.proc is not None
        await self.proc.wait()

    async def close(self) -> None:
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGCONT)
            os.kill(proc.pid, signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), 10)


class Requester:
    """An in-test requester peer; every callback it receives is kept, per task, in order."""

    def __init__(
        self, executor_url: str, *, host: str = "127.0.0.1", advertised: str = "127.0.0.1"
    ) -> None:
        self.port = free_port()
        self.advertised = advertised
        self.peer = Peer(R, host=host, port=self.port, config=R_CONFIG, endpoint=self.url)
        self.executor_url = executor_url
        #: task id -> message types received from the executor, in arrival order
        self.inbound: dict[str, list[str]] = defaultdict(list)
        #: task id -> the progress of each status update that carried one, in arrival order
        self.progress: dict[str, list[float]] = defaultdict(list)

    @property
    def url(self) -> str:
        return f"http://{self.advertised}:{self.port}{PATH}"

    async def start(self) -> None:
        await self.peer.start()
        self.peer.add_partner(E, self.executor_url, (SECRET,))
        self.peer.protocol.listeners.append(OnMessage(self._observe))

    def _observe(self, event: MessageEvent) -> None:
        if event.direction != "in":
            return
        payload: Any = event.message.payload
        task_id = getattr(payload, "task_id", None)
        if isinstance(task_id, str):
            kind = event.message.message_type.value
            state = getattr(payload, "status", None)
            if state is not None:  # task_status_update: which state it reports
                kind += f":{getattr(state, 'value', state)}"
            self.inbound[task_id].append(kind)
            progress = getattr(payload, "progress", None)
            if progress is not None:
                self.progress[task_id].append(float(progress))

    async def pause(self) -> None:
        """Stop listening (an outage): POSTs to our port are refused until `resume`."""
        runner = self.peer._runner
        assert runner is not None
        for site in list(runner.sites):
            await site.stop()

    async def resume(self) -> None:
        from aiohttp import web

        runner = self.peer._runner
        assert runner is not None
        await web.TCPSite(runner, "127.0.0.1", self.port, reuse_address=True).start()

    async def close(self) -> None:
        await self.peer.close(drain_timeout=0)


#: The callbacks that end a task on the executor's side (a cancellation is confirmed by a
#: status update in state `cancelled`).
FINAL_CALLBACKS = {"p2p:task_complete", "p2p:task_failed", "p2p:task_status_update:cancelled"}


def finals(seen: list[str]) -> list[str]:
    return [kind for kind in seen if kind in FINAL_CALLBACKS]


@dataclass
class Cluster:
    replicas: list[Replica]
    nginx: Nginx
    requester: Requester
    store: str


#: `await make_cluster(count, lease_ttl=..., read_timeout=...)` (tests/cluster/conftest.py)
ClusterFactory = Callable[..., Awaitable[Cluster]]
