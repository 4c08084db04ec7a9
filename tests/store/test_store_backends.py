"""One kit, every backend: the store kit's checks (`synapse.store.kit.STORE_CHECKS`, the
`TaskStore` contract) on memory, SQLite and PostgreSQL, as any new backend runs them.

The PostgreSQL case runs against a real server (`pgserver`); it is skipped, naming the package
to install, on a machine without one (and fails under CI=true).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from synapse.store import SqliteStore
from synapse.store.base import TaskStore
from synapse.store.kit import STORE_CHECKS, StoreBackend, StoreCheck, store_checks
from synapse.store.memory import MemoryStore


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[StoreBackend]:
    make: Callable[[], TaskStore]
    if request.param == "memory":
        make = MemoryStore
    elif request.param == "sqlite":
        path = tmp_path / "store.sqlite"

        def make() -> TaskStore:
            return SqliteStore(path)
    else:
        from synapse.store.postgres import PostgresStore

        url = request.getfixturevalue("pg_url")

        def make() -> TaskStore:
            return PostgresStore(url)

    backend = StoreBackend(request.param, make, durable=request.param != "memory")
    yield backend
    await backend.close()


@pytest.mark.parametrize("check", STORE_CHECKS, ids=lambda c: c.name.replace(" ", "-"))
async def test_the_backend_passes_the_store_kit(backend: StoreBackend, check: StoreCheck) -> None:
    if check not in store_checks(durable=backend.durable):
        pytest.skip(f"{check.name}: a memory store keeps nothing across a restart")
    await check.run(backend)


def test_a_backend_that_forgets_fails_the_kit() -> None:
    """The kit finds a broken backend: a store that loses what it committed on reopening."""
    import asyncio

    class Forgetful(MemoryStore):
        pass

    backend = StoreBackend("forgetful", Forgetful, durable=True)  # claims what it lacks
    [check] = [c for c in STORE_CHECKS if c.name == "outbox across a restart"]
    with pytest.raises(AssertionError):
        asyncio.run(check.run(backend))


def test_the_durability_guides_kit_module_runs_against_sqlite(tmp_path: Path) -> None:
    """docs/durability.md's ten lines, with SQLite as "your" store, pass under pytest."""
    import subprocess
    import sys

    doc = (Path(__file__).resolve().parents[2] / "docs" / "durability.md").read_text("utf-8")
    section = doc.split("## A backend of your own", 1)[1].split("\n## ", 1)[0]
    for block in section.split("```python\n")[1:]:
        source = block.split("```", 1)[0]
        name = source.splitlines()[0].removeprefix("# ")  # my_store.py, test_my_store.py
        (tmp_path / name).write_text(source, encoding="utf-8")
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert f"{len(STORE_CHECKS)} passed" in done.stdout, done.stdout[-1000:]


async def test_only_a_store_replicas_can_share_is_a_shared_store(tmp_path: Path) -> None:
    """`synapse serve` runs replicas on a store that implements `SharedStore`, whatever its
    backend (the PostgreSQL store is one: tests/store/test_store_postgres.py); memory and
    SQLite are single-process stores."""
    from synapse.store.shared import SharedStore

    assert not isinstance(MemoryStore(), SharedStore)
    sqlite = SqliteStore(tmp_path / "one.sqlite")
    try:
        assert not isinstance(sqlite, SharedStore)
    finally:
        await sqlite.close()
