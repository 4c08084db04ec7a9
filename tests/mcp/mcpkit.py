"""Starting `synapse mcp` for the official MCP client, and reading what its tools answer."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import mcp_types as types
from clikit import EXECUTOR, REQUESTER, SECRET, Server, clean_env
from mcp import StdioServerParameters

ROOT = Path(__file__).resolve().parents[2]


def mcp_args(executor: Server, requester_port: int, *extra: str) -> list[str]:
    """`synapse mcp`'s flags: as `req`, with `exec` (the executor) as its partner."""
    return [
        "mcp",
        "--as",
        REQUESTER,
        "--peer",
        f"{EXECUTOR}={executor.url}",
        "--secret",
        SECRET,
        "--listen",
        f"127.0.0.1:{requester_port}",
        *extra,
    ]


def mcp_stdio(executor: Server, requester_port: int, *extra: str) -> StdioServerParameters:
    """`synapse mcp` over stdio, started by the MCP client."""
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "synapse.cli.main", *mcp_args(executor, requester_port, *extra)],
        env=clean_env(),
        cwd=str(ROOT),
    )


def structured(result: types.CallToolResult) -> dict[str, Any]:
    """A tool's structured result; a tool error fails the test with its text."""
    assert not result.is_error, text(result)
    assert result.structured_content is not None
    return result.structured_content


def text(result: types.CallToolResult) -> str:
    return "".join(c.text for c in result.content if isinstance(c, types.TextContent))


def resource_json(result: types.ReadResourceResult) -> Any:
    content = result.contents[0]
    assert isinstance(content, types.TextResourceContents)
    return json.loads(content.text)
