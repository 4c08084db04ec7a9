"""Retention: finished work leaves the store once `P2PConfig.retain` has passed.

A background task of the runtime asks the store, every few seconds, to purge what is older
than the retention: finished tasks with their history and dead letters, and deduplication
records whose window has ended. The store does it in bounded batches away from the event loop
(`TaskStore.purge`), so neither a large backlog nor a slow disk holds the loop.
"""

from __future__ import annotations

import asyncio
from typing import Any

from synapse.logs import get_logger

#: The runtime (`synapse.runtime.protocol.P2PProtocol`), which imports this module: not imported
#: back, so that the import graph has no cycle.
P2PProtocol = Any

log = get_logger("synapse.store")

#: Rows one purge batch may delete (per table); a full batch is followed by another at once.
PURGE_BATCH = 2000


def purge_interval(retain: float) -> float:
    """How often to purge: a fifth of the retention, from 1 s to 60 s."""
    return min(60.0, max(1.0, retain / 5))


async def purge_once(protocol: P2PProtocol, batch: int = PURGE_BATCH) -> int:
    """Purge every batch due now; return the rows removed."""
    total = 0
    while True:
        now = protocol.clock()
        removed: int = await protocol.store.purge(
            finished_before=now - protocol.config.retain, now=now, limit=batch
        )
        total += removed
        if removed < batch:
            return total
        await asyncio.sleep(0)  # let the loop breathe between full batches


async def purge_loop(protocol: P2PProtocol) -> None:
    interval = purge_interval(protocol.config.retain)
    while True:
        await asyncio.sleep(interval)
        try:
            removed = await purge_once(protocol)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a purge that fails is retried at the next interval
            log.warning("purge_failed", error=repr(exc))
            continue
        if removed:
            log.debug("purged", rows=removed, retain=protocol.config.retain)


__all__ = ["PURGE_BATCH", "purge_interval", "purge_loop", "purge_once"]
