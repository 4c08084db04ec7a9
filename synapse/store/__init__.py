"""Durable state: tasks with their history, the outbox of unacknowledged messages, dedup."""

from synapse._distribution import install
from synapse.store.base import (
    DeadLetter,
    DedupEntry,
    OutboxItem,
    Snapshot,
    StoreUnavailable,
    TaskStore,
)
from synapse.store.dedup import DurableDedupStore
from synapse.store.holding import StoreInUse
from synapse.store.memory import MemoryStore
from synapse.store.sqlite import SqliteStore


def is_postgres_url(spec: str) -> bool:
    """Whether a store spec names a PostgreSQL database (rather than an SQLite file)."""
    return spec.startswith(("postgresql://", "postgres://"))


def open_store(spec: str) -> TaskStore:
    """`memory`, a `postgresql://USER@HOST:PORT/DB` URL (the `postgres` extra; its schema
    migrations are applied), or the path of an SQLite file (created if missing)."""
    if spec == "memory":
        return MemoryStore()
    if is_postgres_url(spec):
        try:
            from synapse.store.postgres import PostgresStore
        except ImportError as exc:  # the optional dependency is missing
            raise RuntimeError(
                f"the PostgreSQL store needs psycopg: {install('postgres')} ({exc})"
            ) from exc
        return PostgresStore(spec)
    return SqliteStore(spec)


__all__ = [
    "DeadLetter",
    "DedupEntry",
    "DurableDedupStore",
    "MemoryStore",
    "OutboxItem",
    "Snapshot",
    "SqliteStore",
    "StoreInUse",
    "StoreUnavailable",
    "TaskStore",
    "is_postgres_url",
    "open_store",
]
