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
    group.add_argument(
        AS.flag,
        dest=AS.dest,
        metavar="AGENT_ID",
        help="our agent id, as the Synapse partners know us ($SYNAPSE_AS)",
    )
    group.add_argument(
        PEER.flag,
        dest=PEER.dest,
        action="append",
        metavar="PARTNER_ID=CALLBACK_URL",
        help="a Synapse partner and the URL it receives POSTs on; repeatable "
        "($SYNAPSE_PEERS, comma-separated)",
    )
    add_secret_options(group)
    group.add_argument(
        LISTEN.flag,
        dest=LISTEN.dest,
        type=LISTEN.argument_type(),
        metavar="HOST:PORT",
        help="where we receive the Synapse partners' callbacks ($SYNAPSE_LISTEN)",
    )
    group.add_argument(
        ENDPOINT.flag,
        dest=ENDPOINT.dest,
        type=ENDPOINT.argument_type(),
        metavar="URL",
        help="our callback URL as the partners have it ($SYNAPSE_ENDPOINT)",
    )
    group.add_argument(
        STORE.flag,
        dest=STORE.dest,
        metavar="PATH|URL|memory",
        help="where our tasks live (default memory; $SYNAPSE_STORE)",
    )
    group.add_argument(
        MCP_A2A_AGENTS.flag,
        dest=MCP_A2A_AGENTS.dest,
        action="append",
        metavar="[NAME=]URL",
        help=MCP_A2A_AGENTS.described(
            "an A2A agent to delegate to (NAME: default its card's name)"
        ),
    )
    group.add_argument(
        A2A_TOKEN.flag,
        dest=A2A_TOKEN.dest,
        metavar="TOKEN",
        help="the bearer token the A2A agents expect ($SYNAPSE_A2A_TOKEN)",
    )
    add_signing_options(group)
    group = mcp.add_argument_group("the MCP side")
    group.add_argument(
        MCP_HTTP.flag,
        dest=MCP_HTTP.dest,
        type=MCP_HTTP.argument_type(),
        metavar="HOST:PORT",
        help="serve streamable HTTP at http://HOST:PORT/mcp instead of stdio ($SYNAPSE_MCP_HTTP)",
    )
    group.add_argument(
        MCP_TOKENS.flag,
        dest=MCP_TOKENS.dest,
        action="append",
        metavar="TOKEN[=NAME]",
        help=MCP_TOKENS.described("a bearer token --http accepts; repeatable"),
    )
    group.add_argument(
        MCP_OAUTH_ISSUER.flag,
        dest=MCP_OAUTH_ISSUER.dest,
        metavar="URL",
        help="accept OAuth 2.0 access tokens (JWTs) of this issuer ($SYNAPSE_MCP_OAUTH_ISSUER)",
    )
    group.add_argument(
        MCP_OAUTH_JWKS.flag,
        dest=MCP_OAUTH_JWKS.dest,
        metavar="URL",
        help="the issuer's signing keys (JWKS) ($SYNAPSE_MCP_OAUTH_JWKS)",
    )
    group.add_argument(
        MCP_OAUTH_AUDIENCE.flag,
        dest=MCP_OAUTH_AUDIENCE.dest,
        metavar="AUDIENCE",
        help="the audience the tokens must name (default: the public URL; "
        "$SYNAPSE_MCP_OAUTH_AUDIENCE)",
    )
    group.add_argument(
        MCP_ALLOW_ANONYMOUS.flag,
        dest=MCP_ALLOW_ANONYMOUS.dest,
        action="store_true",
        default=None,
        help="serve --http beyond loopback with no --mcp-token or issuer: every caller sees "
        "and answers every task ($SYNAPSE_MCP_ALLOW_ANONYMOUS)",
    )
    group.add_argument(
        MCP_PUBLIC_URL.flag,
        dest=MCP_PUBLIC_URL.dest,
        type=MCP_PUBLIC_URL.argument_type(),
        metavar="URL",
        help="the MCP URL as clients reach it (default http://HOST:PORT/mcp; "
        "$SYNAPSE_MCP_PUBLIC_URL)",
    )
    group.add_argument(
        MCP_WAIT.flag,
        dest=MCP_WAIT.dest,
        type=MCP_WAIT.argument_type(),
        metavar="DURATION",
        help="how long a tool call waits for a task before returning its id (default 20s; "
        "$SYNAPSE_MCP_WAIT)",
    )
    add_output_flags(mcp, config_holds=PEER_CONFIG, verbose_logs=PEER_VERBOSE)
    mcp.set_defaults(run=run)
