"""A `Peer` mounted into an existing aiohttp application (`Peer.attach`) serves every flow,
next to the application's own routes."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import pytest
from aiohttp import web
from flowkit import FAST, WAIT, collect

from synapse.demo.handler import DemoHandler
from synapse.p2p.engine import TaskEvent
from synapse.transport.client import SenderMode
from synapse.transport.peer import Peer
from synapse.types import TaskState

SECRET = "attach-secret-0123456789abcdefgh"


def loopback_socket() -> tuple[socket.socket, str]:
    """A socket bound to 127.0.0.1 on an ephemeral port, and its base URL: the URLs of an app
    must be known before it is frozen, so bind first, serve afterwards."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    return sock, f"http://127.0.0.1:{sock.getsockname()[1]}"


@asynccontextmanager
async def served(app: web.Application, sock: socket.socket) -> AsyncIterator[None]:
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    try:
        await runner.setup()
        await web.SockSite(runner, sock).start()
        yield
    finally:
        await runner.cleanup()
        sock.close()


async def health(_: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def run_flows(requester: Peer, executor: str) -> None:
    """Every demo flow, requested by `requester` of `executor`."""
    echo = await requester.submit(executor, "echo", {"text": "mounted"})
    assert (await asyncio.wait_for(echo, WAIT)).ok

    info = await requester.submit(executor, "text_generation", {"prompt": "p"})

    async def answer(event: TaskEvent) -> None:
        if event.kind == "p2p:task_need_info":
            await info.provide_info({"style": "古典"})

    await collect(info, answer)
    outcome = await asyncio.wait_for(info, WAIT)
    assert outcome.result is not None and "古典" in outcome.result.output

    human = await requester.submit(executor, "portrait", {"subject": "s"})

    async def decide(event: TaskEvent) -> None:
        if event.kind == "p2p:task_need_human":
            await human.start_deciding()
            await human.approve()

    await collect(human, decide)
    assert (await asyncio.wait_for(human, WAIT)).ok

    slow = await requester.submit(executor, "slow", {"steps": 50, "delay": 0.02})

    async def cancel(event: TaskEvent) -> None:
        if event.kind == "p2p:task_status_update":
            await slow.cancel()

    await collect(slow, cancel)
    assert (await asyncio.wait_for(slow, WAIT)).state is TaskState.CANCELLED

    failing = await requester.submit(executor, "fail", {})
    assert (await asyncio.wait_for(failing, WAIT)).state is TaskState.FAILED


@pytest.mark.parametrize("mode", ["header", "body"])
async def test_a_peer_mounted_in_an_app_serves_every_flow(mode: SenderMode) -> None:
    sock, base = loopback_socket()
    app = web.Application()
    app.router.add_get("/health", health)
    inbox = f"{base}/agents/e/inbox"
    mounted = Peer(
        "agent-e", handler=DemoHandler(), config=FAST, signing_mode=mode, path="/agents/e/inbox"
    )
    mounted.attach(app, inbox)
    standalone = Peer("agent-r", handler=DemoHandler(), config=FAST, signing_mode=mode)
    async with served(app, sock), mounted, standalone:
        assert mounted.endpoint == inbox
        mounted.add_partner("agent-r", standalone.endpoint, (SECRET,))
        standalone.add_partner("agent-e", inbox, (SECRET,))
        await run_flows(standalone, "agent-e")  # the mounted peer executes
        await run_flows(mounted, "agent-r")  # and requests
        assert mounted.protocol.list_tasks() == standalone.protocol.list_tasks()
        assert len(mounted.protocol.list_tasks()) == 10
        caps = await asyncio.wait_for(standalone.capabilities("agent-e", "echo"), WAIT)
        assert [c.name for c in caps.capabilities] == ["echo"]
        # The application's own routes are still its own.
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT)) as session,
            session.get(f"{base}/health") as response,
        ):
            assert response.status == 200 and await response.json() == {"ok": True}


async def test_two_peers_mounted_in_one_app_talk_to_each_other() -> None:
    sock, base = loopback_socket()
    app = web.Application()
    a = Peer("agent-a", handler=DemoHandler(), config=FAST, path="/a")
    b = Peer("agent-b", handler=DemoHandler(), config=FAST, path="/b", signing_mode="body")
    a.attach(app, f"{base}/a")
    b.attach(app, f"{base}/b")
    a.add_partner("agent-b", f"{base}/b", (SECRET,))
    b.add_partner("agent-a", f"{base}/a", (SECRET,))
    async with served(app, sock), a, b:
        await run_flows(a, "agent-b")
        await run_flows(b, "agent-a")
        assert len(a.protocol.list_tasks()) == 10
        assert a.protocol.list_tasks() == b.protocol.list_tasks()
