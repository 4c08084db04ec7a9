"""The store interface (defined beside the runtime that drives it, in `synapse.p2p`)."""

from synapse.p2p.persistence import (
    DeadLetter,
    DedupEntry,
    OutboxItem,
    Snapshot,
    StoreUnavailable,
    TaskStore,
)

__all__ = ["DeadLetter", "DedupEntry", "OutboxItem", "Snapshot", "StoreUnavailable", "TaskStore"]
