"""MCP for Synapse: an MCP server that delegates tasks to Synapse peers and A2A agents
(`synapse mcp`), and MCP servers' tools as a `TaskHandler` (`McpToolsHandler`). See
`docs/mcp.md`. Needs the `mcp` extra (the official MCP Python SDK)."""

from __future__ import annotations

from synapse.mcp.gateway import A2APartner, Gateway, GatewayError
from synapse.mcp.handler import McpToolsHandler
from synapse.mcp.server import SynapseMcp, TaskView

__all__ = [
    "A2APartner",
    "Gateway",
    "GatewayError",
    "McpToolsHandler",
    "SynapseMcp",
    "TaskView",
]
