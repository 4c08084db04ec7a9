"""Fixtures of the fuzz tests: one live peer for the session, and the count of inputs tried."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fuzzkit import COUNTS, LivePeer


@pytest.fixture(scope="session")
def live() -> Iterator[LivePeer]:
    peer = LivePeer()
    peer.start()
    yield peer
    peer.stop()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not COUNTS:
        return
    terminalreporter.section("fuzz inputs tried")
    for name, count in sorted(COUNTS.items()):
        terminalreporter.write_line(f"{count:>8,}  {name}")
    terminalreporter.write_line(f"{sum(COUNTS.values()):>8,}  in all")
