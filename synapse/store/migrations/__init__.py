"""Versioned schema migrations of the PostgreSQL store.

Each migration is a module `mNNNN_<name>.py` with a `SQL` string; its version is NNNN. They
are applied in order, each version once, in one transaction under an advisory lock, so that
replicas starting together against one database never apply one twice (`apply`). A database
whose schema is newer than this code knows is refused rather than written to.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # psycopg is the postgres extra's: imported where a database is opened
    import psycopg

#: Key of the advisory lock that serializes migrations across processes ("synapse" in hex).
MIGRATION_LOCK = 0x73796E61707365


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


def migrations() -> list[Migration]:
    """Every migration this code ships, oldest first."""
    found: list[Migration] = []
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("m") or "_" not in info.name:
            continue
        number, name = info.name[1:].split("_", 1)
        module = importlib.import_module(f"{__name__}.{info.name}")
        found.append(Migration(int(number), name, str(module.SQL)))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise RuntimeError(f"migrations are not numbered 1..n: {versions}")
    return found


def latest_version() -> int:
    return len(migrations())


def _ensure_history_table(conn: psycopg.Connection[Any]) -> None:
    conn.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, "
        "name TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
    )


def schema_version(conn: psycopg.Connection[Any]) -> int:
    """The highest migration applied to the database (0 for an empty one)."""
    row = conn.execute("SELECT to_regclass('schema_migrations') IS NOT NULL").fetchone()
    if row is None or not row[0]:
        return 0
    row = conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_migrations").fetchone()
    return int(row[0]) if row is not None else 0


def apply_migrations(conn: psycopg.Connection[Any]) -> list[Migration]:
    """Bring the database's schema up to date, in one transaction; returns what was applied.

    The advisory lock makes concurrent callers (replicas starting together) wait for each
    other: the second one finds the work done. A schema newer than this code is refused.
    """
    known = migrations()
    applied: list[Migration] = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        _ensure_history_table(conn)
        row = conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_migrations").fetchone()
        current = int(row[0]) if row is not None else 0
        if current > len(known):
            raise RuntimeError(
                f"store schema version {current} is newer than this version of synapse "
                f"reads ({len(known)}): upgrade synapse"
            )
        for migration in known[current:]:
            conn.execute(migration.sql.encode())
            conn.execute(
                "INSERT INTO schema_migrations (version, name) VALUES (%s, %s)",
                (migration.version, migration.name),
            )
            applied.append(migration)
    return applied


def migrate(url: str) -> tuple[int, list[Migration]]:
    """Apply the missing migrations to the database at `url` (`synapse migrate`).
    Returns the version found before and the migrations applied."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        before = schema_version(conn)
        return before, apply_migrations(conn)


__all__ = [
    "MIGRATION_LOCK",
    "Migration",
    "apply_migrations",
    "latest_version",
    "migrate",
    "migrations",
    "schema_version",
]
