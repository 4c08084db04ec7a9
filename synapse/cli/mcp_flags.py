"""The flags of `synapse mcp`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from synapse.cli.flags import (
    EXAMPLES,
    PEER_CONFIG,
    PEER_VERBOSE,
    HelpFormatter,
    add_output_flags,
    add_secret_options,
    add_signing_options,
    epilog,
)
from synapse.cli.options import (
    A2A_TOKEN,
    AS,
    ENDPOINT,
    LISTEN,
    MCP_A2A_AGENTS,
    MCP_ALLOW_ANONYMOUS,
    MCP_HTTP,
    MCP_OAUTH_AUDIENCE,
    MCP_OAUTH_ISSUER,
    MCP_OAUTH_JWKS,
    MCP_PUBLIC_URL,
    MCP_TOKENS,
    MCP_WAIT,
    PEER,
    STORE,
    add_setting,
)


def add_mcp_parser(commands: Any, run: Callable[[Any], int]) -> None:
    mcp = commands.add_parser(
        "mcp",
        help="serve MCP: let MCP clients delegate tasks to Synapse peers and A2A agents",
        description="An MCP server (stdio by default, streamable HTTP with --http) whose tools "
        "list the partners, delegate tasks to them, follow, answer and cancel them. Synapse "
        "partners are --peer (or [[peer]] tables) reached as --as, A2A agents --a2a-agent. "
        "Logs go to stderr.",
        epilog=epilog(
            "Exit status: 0 the client closed stdio or SIGINT/SIGTERM, 2 usage error.",
            EXAMPLES["mcp"],
        ),
        formatter_class=HelpFormatter,
    )
    group = mcp.add_argument_group("who talks to whom")
    add_setting(group, AS, help="our agent id, as the Synapse partners know us")
    add_setting(group, PEER, help="a Synapse partner and the URL it receives POSTs on; repeatable")
    add_secret_options(group)
    add_setting(group, LISTEN)
    add_setting(group, ENDPOINT, help="our callback URL as the partners have it")
    add_setting(group, STORE, help="where our tasks live (default memory)")
    add_setting(group, MCP_A2A_AGENTS)
    add_setting(group, A2A_TOKEN, help="the bearer token the A2A agents expect")
    add_signing_options(group)
    group = mcp.add_argument_group("the MCP side")
    add_setting(group, MCP_HTTP)
    add_setting(group, MCP_TOKENS)
    add_setting(group, MCP_OAUTH_ISSUER)
    add_setting(group, MCP_OAUTH_JWKS)
    add_setting(group, MCP_OAUTH_AUDIENCE)
    add_setting(group, MCP_ALLOW_ANONYMOUS)
    add_setting(group, MCP_PUBLIC_URL)
    add_setting(group, MCP_WAIT)
    add_output_flags(mcp, config_holds=PEER_CONFIG, verbose_logs=PEER_VERBOSE)
    mcp.set_defaults(run=run)
