"""What the framework tests share: two real peers over loopback HTTP, bounded in time, and
`synapse serve` with a framework's agent as its handler, on SQLite, to SIGKILL."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from synapse import Peer
from synapse.p2p.config import P2PConfig

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "cli"))
from clikit import free_port, serve, url

HERE = Path(__file__).resolve().parent
SECRET = "frameworks-test-secret-0123456789abcdef"
CONFIG = P2PConfig(heartbeat_interval=3600.0)
#: Seconds a test's flow may take: a regression that leaves a question unanswered fails it.
BOUND = 30.0


class Forever:
    """Work that runs until it is cancelled (a tool, a node), saying when it started and
    when it was cancelled: what the cancel tests wait on."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()

    async def run(self) -> None:
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


@asynccontextmanager
async def pair(handler: object) -> AsyncIterator[tuple[Peer, Peer]]:
    """agent-r asking agent-e, whose handler is `handler` as given."""
    executor = Peer("agent-e", handler=handler, config=CONFIG)
    requester = Peer("agent-r", config=CONFIG)
    async with executor, requester, asyncio.timeout(BOUND):
        executor.add_partner("agent-r", requester.endpoint, (SECRET,))
        requester.add_partner("agent-e", executor.endpoint, (SECRET,))
        yield requester, executor


@asynccontextmanager
async def requester_of_serve(
    tmp_path: Path, handler: str
) -> AsyncIterator[tuple[Peer, tuple[str, ...], int]]:
    """agent-r, the arguments of a `synapse serve` (agent-e, SQLite in `tmp_path`, the
    handler `MODULE:ATTR` of this folder) that answers it, and the port to serve on."""
    secret = tmp_path / "synapse.secret"
    secret.write_text(SECRET)
    port = free_port()
    requester = Peer("agent-r", config=CONFIG)
    async with requester, asyncio.timeout(BOUND):
        requester.add_partner("agent-e", url(port), (SECRET,))
        args = (
            "--agent-id", "agent-e", "--secret-file", str(secret),
            "--peer", f"agent-r={requester.endpoint}", "--store", str(tmp_path / "e.sqlite"),
            "--handler", handler,
        )  # fmt: skip
        yield requester, args, port


__all__ = ["BOUND", "CONFIG", "HERE", "SECRET", "Forever", "pair", "requester_of_serve", "serve"]
