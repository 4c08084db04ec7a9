"""Durable state: tasks with their history, the outbox of unacknowledged messages, dedup."""

from synapse.store.base import (
    DeadLetter,
    DedupEntry,
    OutboxItem,
    Snapshot,
    StoreUnavailable,
    TaskStore,
)
from synapse.store.dedup import DurableDedupStore
from synapse.store.memory import MemoryStore
from synapse.store.sqlite import SqliteStore


def open_store(spec: str) -> TaskStore:
    """`memory`, or the path of an SQLite file (created if missing)."""
    return MemoryStore() if spec == "memory" else SqliteStore(spec)


__all__ = [
    "DeadLetter",
    "DedupEntry",
    "DurableDedupStore",
    "MemoryStore",
    "OutboxItem",
    "Snapshot",
    "SqliteStore",
    "StoreUnavailable",
    "TaskStore",
    "open_store",
]
