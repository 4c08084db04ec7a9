"""pytest plugin of synapse-agent-p2p (entry point `pytest11`): fixtures for testing your own peers.

    async def test_my_handler(synapse_requester, synapse_executor):
        executor = await synapse_executor(MyHandler())
        handle = await synapse_requester.submit(executor.agent_id, "summarize", {"text": "…"})
        outcome = await handle.result(timeout=10)
        assert outcome.ok

    async def test_my_peer_conforms(synapse_executor, synapse_conformance):
        peer = await synapse_executor(MyDemoCompatibleHandler())
        report = await synapse_conformance(peer)
        assert report.ok, report.table()

See `synapse.conformance.fixtures` for each fixture, and `run_conformance` to check any URL.
The fixtures are async and need pytest-asyncio; without it the plugin offers none (and does not
get in the way of test suites that do not use it).
"""

from __future__ import annotations

from synapse.conformance.kit import run_conformance

try:
    import pytest_asyncio  # noqa: F401
except ImportError:  # pragma: no cover - exercised only where pytest-asyncio is missing
    pass
else:
    from synapse.conformance.fixtures import (
        synapse_conformance,
        synapse_executor,
        synapse_requester,
        synapse_secret,
    )

__all__ = [
    "run_conformance",
    "synapse_conformance",
    "synapse_executor",
    "synapse_requester",
    "synapse_secret",
]
