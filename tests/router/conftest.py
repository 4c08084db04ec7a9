"""Fixtures of the router's tests: the hub with four spokes (`routerkit.py`)."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import pytest

#: The A2A spoke needs the official SDK and uvicorn (test dependencies).
SDK_PRESENT = all(importlib.util.find_spec(n) is not None for n in ("a2a", "uvicorn", "httpx"))

#: What to install when they are missing (the `dev` extra has them).
NEEDED = "a2a-sdk[http-server], uvicorn and httpx (pip install -e '.[dev]')"

if not SDK_PRESENT and os.environ.get("CI") == "true":
    raise RuntimeError(f"tests/router need {NEEDED}")
if not SDK_PRESENT:
    # Outside CI they are skipped; test_router_pool.py says why (test_the_sdk_is_installed).
    collect_ignore_glob = [
        "test_router_hub.py",
        "test_router_fanout.py",
        "test_router_trust_flows.py",
        "test_router_a2a_binding.py",
    ]
else:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent.parent / "a2a"))
    from a2akit import UvicornThread
    from routerkit import FAST, SECRET, CountingHandler, Hub, pool_config, spoke_partner
    from sdk_spoke import SpokeExecutor, build

    from synapse.a2a import enable_a2a
    from synapse.demo.handler import DemoHandler
    from synapse.p2p.config import P2PConfig
    from synapse.router import Router
    from synapse.transport.partners import Partner
    from synapse.transport.peer import Peer

    HubFactory = Callable[..., Any]

    @pytest.fixture
    def make_hub() -> HubFactory:
        """`async with make_hub(pin=..., **pool_settings) as hub:` (see routerkit.Hub)."""

        @asynccontextmanager
        async def factory(
            router_kw: dict[str, Any] | None = None,
            sdk_signature: str | None = None,
            sdk_host: str = "127.0.0.1",
            extra_a2a: tuple[Any, ...] = (),
            hub_config: P2PConfig = FAST,
            hub_a2a: bool = False,
            **pool: Any,
        ) -> AsyncIterator[Hub]:
            async with AsyncExitStack() as stack:
                executor = SpokeExecutor()
                sdk = stack.enter_context(UvicornThread(build(executor, sdk_signature)))
                handlers = {
                    "lacking": CountingHandler(["echo", "fail"]),
                    "busy": CountingHandler(),
                    "flaky": CountingHandler(),
                }
                configs = {
                    "lacking": FAST,
                    "busy": P2PConfig(
                        max_retries=1,
                        retry_base_delay=0.02,
                        heartbeat_interval=0.2,
                        missed_heartbeat_limit=2,
                        max_concurrent_tasks=1,
                        capacity_retry_after=1,
                    ),
                    "flaky": FAST,
                }
                spokes = {
                    name: Peer(name, handler=handlers[name], config=configs[name])
                    for name in handlers
                }
                for spoke in spokes.values():
                    await stack.enter_async_context(spoke)
                occupy = await stack.enter_async_context(
                    Peer("occupy", handler=DemoHandler(), config=FAST)
                )
                client = await stack.enter_async_context(Peer("client", config=FAST))
                hub = Peer(
                    "hub",
                    config=hub_config,
                    partners=[Partner("client", client.endpoint, (SECRET,))],
                )
                sdk_url = sdk.url.replace("127.0.0.1", sdk_host)
                config = pool_config(spokes, sdk_url, extra_a2a, **pool)
                router = Router(hub, config, **(router_kw or {}))
                if hub_a2a:
                    enable_a2a(hub, default_task_type=None)  # A2A clients reach the router too
                await stack.enter_async_context(hub)  # the peer first: spokes must know it
                for spoke in spokes.values():
                    spoke.partners.add(spoke_partner(hub))
                spokes["busy"].add_partner("occupy", occupy.endpoint, (SECRET,))
                occupy.add_partner("busy", spokes["busy"].endpoint, (SECRET,))
                client.add_partner("hub", hub.endpoint, (SECRET,))
                await stack.enter_async_context(router)
                yield Hub(client, hub, router, spokes, handlers, executor, occupy)

        return factory
