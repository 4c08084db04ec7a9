"""Fixtures of the command-line tests: one `synapse serve` executor per module."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import structlog
from clikit import Server, executor_args, free_port, serve


@pytest.fixture(scope="module")
def requester_port() -> int:
    """The port `send` listens on as `req` (the executor has it as req's callback URL)."""
    return free_port()


@pytest.fixture(scope="module")
def executor(requester_port: int) -> Iterator[Server]:
    """A `synapse serve` running the demo handler, agent `exec`, partner `req`; at debug, so
    that tests can see every message it received and answered."""
    with serve(*executor_args(requester_port, "--log-level", "debug")) as server:
        yield server


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """Commands run in this process configure structlog and logging: undo it afterwards."""
    saved = structlog.get_config()
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    structlog.configure(**saved)
    root.handlers, root.level = handlers, level
    logging.captureWarnings(False)
