"""Fixtures of the A2A tests: a demo peer speaking A2A, official SDK clients, an SDK agent.

Everything listens on 127.0.0.1 with ephemeral ports and stops at teardown.
"""

from __future__ import annotations

import importlib.util

import pytest

#: The interop tests need the official SDK (`a2a-sdk[http-server]`) and uvicorn, test
#: dependencies only; without them they are not collected (`test_a2a_units.py` says so).
SDK_PRESENT = all(
    importlib.util.find_spec(name) is not None for name in ("a2a", "uvicorn", "httpx")
)

if not SDK_PRESENT:
    collect_ignore_glob = [
        "test_a2a_sdk_client.py",
        "test_a2a_binding.py",
        "test_a2a_push.py",
        "test_a2a_client.py",
        "test_a2a_interop.py",
        "test_a2a_rest_grpc.py",
        "test_a2a_js_sdk.py",
        "test_a2a_parts.py",
    ]
else:
    from collections.abc import AsyncIterator, Iterator

    import httpx
    from a2a.client import Client
    from a2akit import (
        GRPC_PRESENT,
        PUSH_SECRET,
        SDK_BINDINGS,
        A2APeer,
        SdkClientFactory,
        UvicornThread,
        fast_config,
        free_port,
        open_sdk_client,
        reserved_port,
    )

    from synapse.a2a import enable_a2a
    from synapse.demo.handler import DemoHandler
    from synapse.transport.peer import Peer

    @pytest.fixture
    async def a2a_peer() -> AsyncIterator[A2APeer]:
        """The demo handler served over A2A; push allowed to /hooks on a reserved port (held
        until the test ends: a webhook receiver may bind it at any time)."""
        placeholder = reserved_port()
        hook_port = placeholder.getsockname()[1]
        peer = Peer("agent-a", handler=DemoHandler(), config=fast_config())
        server = enable_a2a(
            peer,
            default_task_type="echo",
            push_allowlist=[f"http://127.0.0.1:{hook_port}/hooks/"],
            push_secret=PUSH_SECRET,
            grpc_port=0 if GRPC_PRESENT else None,
        )
        await peer.start()
        try:
            yield A2APeer(peer, server, f"http://127.0.0.1:{peer.port}", hook_port)
        finally:
            await peer.close(drain_timeout=0.5)
            placeholder.close()

    @pytest.fixture(params=SDK_BINDINGS)
    async def sdk_client(
        a2a_peer: A2APeer, request: pytest.FixtureRequest
    ) -> AsyncIterator[SdkClientFactory]:
        """Official SDK clients of `a2a_peer` (discovered from its card), over each binding."""
        made: list[tuple[Client, httpx.AsyncClient]] = []
        binding: str = request.param

        async def make(*, streaming: bool = True, headers: dict[str, str] | None = None) -> Client:
            http = httpx.AsyncClient(timeout=10.0, headers=headers or {})
            client = await open_sdk_client(a2a_peer.base_url, binding, http, streaming=streaming)
            made.append((client, http))
            return client

        yield make
        for client, http in made:
            await client.close()
            await http.aclose()

    @pytest.fixture(params=SDK_BINDINGS)
    def sdk_agent(request: pytest.FixtureRequest) -> Iterator[str]:
        """The base URL of an echo agent built with the SDK (see `a2a_sdk_agent.py`),
        serving every binding, its card preferring each in turn."""
        from a2a_sdk_agent import build_app

        grpc_port = free_port() if GRPC_PRESENT else None
        first: str = request.param

        def build(port: int) -> object:
            return build_app(port, grpc_port, first)

        with UvicornThread(build) as runner:
            yield runner.url
