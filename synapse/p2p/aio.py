"""The asyncio side of the sans-IO parts: what the runtime supplies where a core table waits.

The deduplication table (`synapse.p2p.dedup`) hands a retry that arrives while its original is
still being processed a waiter; the runtime makes that waiter an asyncio future. Keeping it here
lets `import synapse.p2p.dedup` (like the engine, states, timers and config) load no asyncio.
"""

from __future__ import annotations

import asyncio
from typing import TypeVar

T = TypeVar("T")


def future_waiter() -> asyncio.Future[T]:
    """A future of the running loop: one per waiter, so cancelling one cancels only its own."""
    return asyncio.get_running_loop().create_future()


__all__ = ["future_waiter"]
