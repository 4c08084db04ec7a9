"""The in-memory store: nothing survives a restart."""

from synapse.p2p.persistence import MemoryStore

__all__ = ["MemoryStore"]
