"""Fixtures of the command-line tests: one `synapse serve` executor per module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from clikit import Server, executor_args, free_port, serve


@pytest.fixture(scope="module")
def requester_port() -> int:
    """The port `send` listens on as `req` (the executor has it as req's callback URL)."""
    return free_port()


@pytest.fixture(scope="module")
def executor(requester_port: int) -> Iterator[Server]:
    """A `synapse serve` running the demo handler, agent `exec`, partner `req`."""
    with serve(*executor_args(requester_port)) as server:
        yield server
