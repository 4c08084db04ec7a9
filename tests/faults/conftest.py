"""Fixtures of the fault tests: child peers that are always stopped, and a figures report."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from faultkit import PeerProcess

#: Lines printed at the end of the session (`report` fixture): the measured figures.
FIGURES: list[str] = []


@pytest.fixture
def report() -> Iterator[Callable[[str], None]]:
    yield FIGURES.append


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if FIGURES:
        terminalreporter.section("fault test figures")
        for line in FIGURES:
            terminalreporter.write_line(line)


@pytest.fixture
async def spawn(tmp_path: Path) -> AsyncIterator[Callable[..., PeerProcess]]:
    """Make `PeerProcess`es in `tmp_path`; every one is stopped at the end of the test."""
    made: list[PeerProcess] = []

    def make(
        agent_id: str,
        port: int,
        peers: Mapping[str, str],
        *,
        store: str | None = None,
        options: Sequence[str] = ("--fast",),
    ) -> PeerProcess:
        proc = PeerProcess(
            agent_id=agent_id,
            port=port,
            store=store or str(tmp_path / f"{agent_id}.sqlite"),
            peers=dict(peers),
            workdir=tmp_path,
            options=tuple(options),
        )
        made.append(proc)
        return proc

    yield make
    for proc in made:
        await proc.close()
