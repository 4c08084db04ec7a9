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


__all__ = ["MIGRATION_LOCK", "Migration", "latest_version", "migrations"]
