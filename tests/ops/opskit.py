"""Helpers of the operations tests: peers with metrics/health/console on 127.0.0.1, waits."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from synapse.demo.handler import DemoHandler
from synapse.p2p.config import P2PConfig
from synapse.store import TaskStore
from synapse.transport.peer import Peer

R, E = "agent-r", "agent-e"
SECRET = "ops-secret-r-e-0123456789abcdefg"
FAST = P2PConfig(max_retries=2, retry_base_delay=0.02, retry_max_delay=0.1, request_timeout=5)
WAIT = 10.0


@dataclass
class Pair:
    r: Peer
    e: Peer


@asynccontextmanager
async def peer_pair(
    *,
    setup_r: Callable[[Peer], object] | None = None,
    setup_e: Callable[[Peer], object] | None = None,
    config: P2PConfig = FAST,
    r_store: TaskStore | None = None,
) -> AsyncIterator[Pair]:
    """Requester R and executor E (the demo handler), each set up before it starts."""
    r = Peer(R, handler=DemoHandler(), config=config, store=r_store)
    e = Peer(E, handler=DemoHandler(), config=config)
    if setup_r is not None:
        setup_r(r)
    if setup_e is not None:
        setup_e(e)
    async with r, e:
        r.add_partner(E, e.endpoint, (SECRET,))
        e.add_partner(R, r.endpoint, (SECRET,))
        yield Pair(r, e)


def base_url(peer: Peer) -> str:
    return f"http://{peer.host}:{peer.port}"


async def scrape(
    peer: Peer, token: str | None = None
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """GET /metrics, parsed by prometheus_client's parser: (sample name, labels) → value."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        aiohttp.ClientSession() as session,
        session.get(base_url(peer) + "/metrics", headers=headers) as response,
    ):
        assert response.status == 200, response.status
        assert response.headers["Content-Type"].startswith("text/plain; version=")
        text = await response.text()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    """One sample's value (0 if absent: a counter never incremented is not exposed)."""
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def eventually(predicate: Callable[[], bool], timeout: float = WAIT) -> None:
    async def until() -> None:
        # The state lives in other tasks' objects; a short poll is the plain way to watch it.
        while not predicate():  # noqa: ASYNC110
            await asyncio.sleep(0.01)

    await asyncio.wait_for(until(), timeout)


CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def chromium_missing() -> bool:
    return not os.path.exists(CHROMIUM)


@asynccontextmanager
async def chromium() -> AsyncIterator[Any]:
    """Debian's headless Chromium driven by Playwright; skipped without it (failed in CI)."""
    if chromium_missing():
        import pytest

        message = f"needs Debian's chromium at {CHROMIUM} (apt-get install chromium)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True
        )
        try:
            yield browser
        finally:
            await browser.close()
