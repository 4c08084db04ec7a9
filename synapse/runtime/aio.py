"""The asyncio side of the sans-IO parts: what the runtime supplies where a core table waits.

The deduplication table (`synapse.p2p.dedup.DedupTable`) hands a retry that arrives while its
original is still being processed a waiter; here that waiter is an asyncio future
(`MemoryDedupStore`). Keeping it here lets `import synapse.p2p.dedup` (like the engine, states,
timers and config) load no asyncio.
"""

from __future__ import annotations

import asyncio
from typing import TypeVar

from synapse.p2p.dedup import DedupTable, StoredReply

T = TypeVar("T")


def future_waiter() -> asyncio.Future[T]:
    """A future of the running loop: one per waiter, so cancelling one cancels only its own."""
    return asyncio.get_running_loop().create_future()


def _reply_waiter() -> asyncio.Future[StoredReply | None]:
    return future_waiter()


class MemoryDedupStore(DedupTable):
    """The in-memory deduplication table of a running peer: retries wait on asyncio futures."""

    def __init__(self, window: float) -> None:
        super().__init__(window, new_waiter=_reply_waiter)


__all__ = ["MemoryDedupStore", "future_waiter"]
