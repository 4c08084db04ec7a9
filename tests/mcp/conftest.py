"""Fixtures of the MCP tests: a real `synapse serve` executor (the demo handler), and
`synapse mcp` started over stdio by the official MCP client in front of it."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("mcp", reason="the MCP tests need the MCP SDK: pip install -e '.[dev]'")

sys.path.insert(0, str(Path(__file__).parent.parent / "cli"))

from clikit import Server, executor_args, free_port, serve


@pytest.fixture(scope="module")
def requester_port() -> int:
    """The port `synapse mcp` receives the executor's callbacks on, as partner `req`."""
    return free_port()


@pytest.fixture(scope="module")
def executor(requester_port: int) -> Iterator[Server]:
    """`synapse serve`: agent `exec`, the demo handler, partner `req` (the MCP server)."""
    with serve(*executor_args(requester_port)) as server:
        yield server
