"""`synapse mcp`: the MCP server of `synapse.mcp` in front of Synapse peers and A2A agents.

Synapse partners are configured as for `serve` (`--peer`, `[[peer]]`, their secrets) and
reached as `--as`, receiving callbacks on `--listen`; A2A agents are `--a2a-agent [NAME=]URL`.
Over stdio (the default) stdout carries MCP only: every log line goes to stderr.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from dataclasses import dataclass
from typing import Any, TextIO
from urllib.parse import urlsplit

from synapse._distribution import install
from synapse.cli.client import CLIENT_P2P, start_peer
from synapse.cli.errors import CliError
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
    SIGNING,
    STORE,
)
from synapse.cli.parsers import is_loopback
from synapse.cli.settings import Missing, Settings, callback_url
from synapse.logs import get_logger
from synapse.p2p.config import P2PConfig
from synapse.transport.partners import Partner
from synapse.transport.peer import Peer

#: The engine's retry budget here: short, as for `send` (an unreachable partner is told to
#: the MCP client in seconds, not after a minute of retries).
MCP_P2P: dict[str, Any] = CLIENT_P2P


log = get_logger("synapse.mcp")


@dataclass(frozen=True, slots=True)
class McpOptions:
    me: str | None
    partners: list[Partner]
    listen: tuple[str, int] | None
    endpoint: str | None
    store: str
    signing: str
    config: P2PConfig
    a2a_agents: list[tuple[str, str]]
    a2a_token: str | None
    http: tuple[str, int] | None
    tokens: dict[str, str]
    oauth: tuple[str, str, str | None] | None
    public_url: str | None
    wait: float


def mcp_options(s: Settings) -> McpOptions:
    """`synapse mcp`'s settings, checked: one line for what is missing or wrong."""
    partners = s.partners()
    agents = [_agent(text) for text in s.get_list(MCP_A2A_AGENTS)]
    if not partners and not agents:
        raise CliError(
            "no partners: give Synapse peers (--peer ID=URL, [[peer]]) or A2A agents "
            "(--a2a-agent [NAME=]URL)"
        )
    me, listen, endpoint = s.get(AS), s.get(LISTEN), s.get(ENDPOINT)
    missing = Missing()
    if partners and me is None:
        missing.add("--as AGENT_ID (our agent id, as the Synapse partners know us)")
    if partners and listen is None:
        missing.add(
            "--listen HOST:PORT (where the Synapse partners reach us: their --peer "
            "for us must name this address)"
        )
    missing.check()
    http = s.get(MCP_HTTP)
    tokens = {token: name for token, name in s.get_list(MCP_TOKENS)}
    for name in tokens.values():
        if name and "#" in name:
            raise CliError(
                f"--mcp-token name {name!r} may not contain '#' (ISSUER#SUBJECT names an "
                "OAuth principal)"
            )
    issuer, jwks = s.get(MCP_OAUTH_ISSUER), s.get(MCP_OAUTH_JWKS)
    if (issuer is None) != (jwks is None):
        raise CliError("--mcp-oauth-issuer and --mcp-oauth-jwks go together")
    oauth = (issuer, jwks, s.get(MCP_OAUTH_AUDIENCE)) if issuer and jwks else None
    if (tokens or oauth) and http is None:
        raise CliError("--mcp-token and --mcp-oauth-* protect --http; stdio needs none")
    reachable = http is not None and not is_loopback(http[0])
    if reachable and not tokens and not oauth and not s.get(MCP_ALLOW_ANONYMOUS):
        assert http is not None
        raise CliError(
            f"--http {http[0]} is reachable from other machines and nobody would be checked: "
            "give --mcp-token TOKEN=NAME or --mcp-oauth-issuer with --mcp-oauth-jwks "
            "(or --mcp-allow-anonymous to serve every task to every caller)"
        )
    signing = s.get(SIGNING) or "header"
    return McpOptions(
        me=me,
        partners=partners,
        listen=listen,
        endpoint=endpoint,
        store=s.get(STORE) or "memory",
        signing=signing,
        config=s.p2p_config(**MCP_P2P),
        a2a_agents=agents,
        a2a_token=s.get(A2A_TOKEN),
        http=http,
        tokens=tokens,
        oauth=oauth,
        public_url=s.get(MCP_PUBLIC_URL),
        wait=s.get(MCP_WAIT, 20.0) or 20.0,
    )


def _agent(text: str) -> tuple[str, str]:
    """`NAME=URL` or `URL` (named by its card later: empty name)."""
    name, sep, url = text.partition("=")
    if not sep or "://" in name:
        name, url = "", text
    if urlsplit(url).scheme not in ("http", "https"):
        raise CliError(f"bad --a2a-agent {text!r}: expected [NAME=]http(s)://…")
    return name.strip(), url.strip()


async def run_mcp(options: McpOptions, *, err: TextIO) -> int:
    try:
        from synapse.mcp import A2APartner, Gateway, SynapseMcp
    except ImportError as exc:
        raise CliError(f"synapse mcp needs the MCP SDK: {install('mcp')} ({exc})") from exc
    from synapse.a2a import A2AClient

    peer: Peer | None = None
    if options.partners:
        peer = _peer(options)
        await start_peer(peer, options.listen)
    a2a = []
    for name, url in options.a2a_agents:
        client = A2AClient(url, token=options.a2a_token, config=options.config)
        a2a.append(A2APartner(name or await _card_name(client, url), url, client))
    gateway = Gateway(peer, a2a)
    sock = _bind(options.http) if options.http is not None else None
    public_url = options.public_url
    if sock is not None and public_url is None:
        host, port = sock.getsockname()[:2]
        public_url = f"http://{host}:{port}/mcp"
    verifier = _verifier(options, public_url)
    issuer = options.oauth[0] if options.oauth else None
    mcp = SynapseMcp(
        gateway, wait=options.wait, token_verifier=verifier, public_url=public_url, issuer=issuer
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    stuck = False
    try:
        if sock is None:
            err.write("synapse mcp: serving MCP on stdio\n")
            err.flush()
            stuck = await _until(mcp.run_stdio(), stop)
        else:
            err.write(f"synapse mcp: serving MCP at {public_url}\n")
            if verifier is None:
                # Said where the operator looks, every start: nobody is checked.
                err.write(
                    "synapse mcp: warning: no --mcp-token or --mcp-oauth-issuer: every caller "
                    "sees, answers and cancels every task\n"
                )
                log.warning("mcp_anonymous", url=public_url)
            err.flush()
            await mcp.run_http(sock, options.http[0] if options.http else "127.0.0.1", stop=stop)
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
        await gateway.close()
        if peer is not None:
            await peer.close(drain_timeout=1.0)
    if stuck:
        # The SDK reads stdin in a thread no cancellation reaches: everything is closed and
        # durable by now, so leave without waiting for a line that may never come.
        err.flush()
        os._exit(0)
    return 0


def _peer(options: McpOptions) -> Peer:
    from synapse.cli.serve import open_task_store

    assert options.me is not None and options.listen is not None
    host, port = options.listen
    return Peer(
        options.me,
        partners=options.partners,
        host=host,
        port=port,
        endpoint=options.endpoint or callback_url(host, port),
        config=options.config,
        signing_mode="body" if options.signing == "body" else "header",
        store=open_task_store(options.store),
    )


async def _card_name(client: Any, url: str) -> str:
    """An A2A agent given by URL alone is named by its card (by its address if unreachable)."""
    try:
        card = await client.discover()
    except Exception:  # unreachable now: list_partners says so later
        return urlsplit(url).netloc
    return str(card.name) or urlsplit(url).netloc


def _bind(address: tuple[str, int]) -> socket.socket:
    host, port = address
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    sock.listen(128)
    sock.setblocking(False)
    return sock


def _verifier(options: McpOptions, public_url: str | None) -> Any:
    from synapse.mcp.auth import AnyOf, JwtTokens, StaticTokens

    verifiers: list[Any] = []
    if options.tokens:
        verifiers.append(StaticTokens(options.tokens))
    if options.oauth is not None:
        from synapse.a2a.server.security import JwksSource, JwtValidator

        issuer, jwks, audience = options.oauth
        validator = JwtValidator(
            issuer=issuer, audience=audience or public_url or "", jwks=JwksSource(jwks)
        )
        verifiers.append(JwtTokens(validator))
    if not verifiers:
        return None
    return verifiers[0] if len(verifiers) == 1 else AnyOf(*verifiers)


async def _until(serving: Any, stop: asyncio.Event) -> bool:
    """Run `serving` until it ends (the client closed stdio) or `stop` is set; whether it is
    still running then (stuck in a read of stdin that cancelling does not interrupt)."""
    task = asyncio.ensure_future(serving)
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if task.done():
        task.result()
        return False
    task.cancel()
    await asyncio.wait({task}, timeout=2.0)
    return not task.done()


__all__ = ["McpOptions", "mcp_options", "run_mcp"]
