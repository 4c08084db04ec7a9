"""Shared test kits live beside this file (`rawpost`: raw, hand-signed envelopes); having a
conftest here puts this folder on `sys.path` so every test folder can import them."""

import headstart
import pytest

# A real PostgreSQL server, started once per session by the tests that ask for it.
from pgserver import pg_url, postgres_server  # noqa: F401

#: Lines the verification tests report (states, seeds, seconds): printed at the end of the run.
FIGURES = pytest.StashKey[list[str]]()


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> list[str]:
    """Lines for the run's summary (the model checker's and the simulation's figures)."""
    return request.config.stash.setdefault(FIGURES, [])


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    lines = terminalreporter.config.stash.get(FIGURES, [])
    if lines:
        terminalreporter.section("verification figures")
        for line in lines:
            terminalreporter.write_line(line)


def pytest_collection_finish(session: pytest.Session) -> None:
    # The long CPU-bound checks start now, beside the rest of the run (tests/headstart.py).
    headstart.start(item.nodeid for item in session.items)


def pytest_sessionfinish(session: pytest.Session) -> None:
    headstart.stop()
