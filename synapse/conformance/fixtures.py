"""The fixtures of the pytest plugin: real peers on 127.0.0.1 for a user's own tests.

- `synapse_secret`: the secret the fixtures' peers share (fresh per test).
- `synapse_requester`: a started requester `Peer` ("requester") to drive executors with.
- `synapse_executor`: a factory, `await synapse_executor(handler)`, starting a `Peer` around
  a `TaskHandler` of yours, paired with `synapse_requester` (both register each other with
  `synapse_secret`); stopped after the test.
- `synapse_conformance`: a factory, `await synapse_conformance(peer)`, running the conformance
  kit against a started `Peer` (registering the kit as its partner first) or, given a URL,
  against any running peer that already knows the kit; returns the `Report`.

All on ephemeral ports, all async (they need pytest-asyncio).
"""

from __future__ import annotations

import secrets as _secrets
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pytest
import pytest_asyncio

from synapse.conformance.checks import Timing
from synapse.conformance.fixture_types import ConformanceRunner, ExecutorFactory
from synapse.conformance.kit import DEFAULT_KIT_ID, run_conformance
from synapse.conformance.report import Report
from synapse.p2p.config import P2PConfig
from synapse.runtime.handler import TaskHandler
from synapse.transport.client import SenderMode
from synapse.transport.peer import Peer

#: Quick retries: a test should not wait 2 + 4 + 8 s for a peer that is gone.
FIXTURE_CONFIG = P2PConfig(
    max_retries=2, retry_base_delay=0.05, retry_max_delay=0.5, request_timeout=10.0
)
REQUESTER_ID = "requester"


@pytest.fixture
def synapse_secret() -> str:
    """A fresh secret shared by the fixtures' peers."""
    return _secrets.token_hex(16)


@pytest_asyncio.fixture
async def synapse_requester() -> AsyncIterator[Peer]:
    """A started requester peer; `synapse_executor` pairs each executor with it."""
    # It shares `synapse_secret` with every executor of the test: allowed, as a test fixture.
    async with Peer(REQUESTER_ID, config=FIXTURE_CONFIG, allow_shared_secrets=True) as peer:
        yield peer


@pytest_asyncio.fixture
async def synapse_executor(
    synapse_requester: Peer, synapse_secret: str
) -> AsyncIterator[ExecutorFactory]:
    """`await synapse_executor(handler, agent_id="executor")`: a started peer running
    `handler`, paired with `synapse_requester` under `synapse_secret`."""
    started: list[Peer] = []

    async def factory(
        handler: TaskHandler,
        *,
        agent_id: str = "executor",
        config: P2PConfig | None = None,
        signing_mode: SenderMode = "header",
    ) -> Peer:
        taken = {p.agent_id for p in started} | {REQUESTER_ID}
        if agent_id in taken:
            raise ValueError(f"agent id {agent_id!r} is taken in this test")
        peer = Peer(
            agent_id,
            handler=handler,
            config=config or FIXTURE_CONFIG,
            signing_mode=signing_mode,
        )
        await peer.start()
        started.append(peer)
        peer.add_partner(REQUESTER_ID, synapse_requester.endpoint, (synapse_secret,))
        synapse_requester.add_partner(agent_id, peer.endpoint, (synapse_secret,))
        return peer

    try:
        yield factory
    finally:
        for peer in reversed(started):
            await peer.close()


@pytest_asyncio.fixture
async def synapse_conformance(synapse_secret: str) -> ConformanceRunner:
    """`await synapse_conformance(peer_or_url, ...)`: the conformance kit's `Report`."""

    async def runner(
        target: Peer | str,
        *,
        agent_id: str | None = None,
        secret: str | None = None,
        kit_id: str = DEFAULT_KIT_ID,
        listen: str = "127.0.0.1:0",
        only: Sequence[str] = (),
        timing: Timing | None = None,
        concurrency: int = 0,
    ) -> Report:
        on_listening: Callable[[str], Any] | None = None
        if isinstance(target, Peer):
            peer = target
            # The kit's own secret on the peer: one another partner has would be refused.
            shared = secret or _secrets.token_hex(16)

            def register(url: str) -> None:
                peer.add_partner(kit_id, url, (shared,))

            url, agent, on_listening = peer.endpoint, agent_id or peer.agent_id, register
        else:
            if agent_id is None or secret is None:
                raise ValueError("against a URL, give the target's agent_id and the secret")
            url, agent, shared = target, agent_id, secret
        return await run_conformance(
            url,
            agent,
            shared,
            kit_id=kit_id,
            listen=listen,
            only=only,
            timing=timing,
            concurrency=concurrency,
            on_listening=on_listening,
        )

    return runner


__all__ = [
    "ConformanceRunner",
    "ExecutorFactory",
    "synapse_conformance",
    "synapse_executor",
    "synapse_requester",
    "synapse_secret",
]
