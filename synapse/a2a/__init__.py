"""Linux Foundation A2A v1.0 for Synapse peers: serve a `TaskHandler` to A2A clients
(`enable_a2a`, `A2AServer`) and call A2A agents with the handle API of Synapse tasks
(`A2AClient`, `A2ATaskHandle`). See `docs/a2a.md`.

    peer = Peer("agent-a", handler=DemoHandler(), port=8080)
    enable_a2a(peer, default_task_type="echo", push_allowlist=["https://hooks.example/"])
    await peer.start()          # also serves /.well-known/agent-card.json, POST /a2a (JSON-RPC)
                                # and the REST routes under /a2a (/a2a/message:send …)

    async with A2AClient("http://127.0.0.1:8080") as client:
        handle = await client.send({"text": "hi"}, task_type="echo")
        outcome = await handle
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from synapse.a2a.errors import A2ACode, A2AError, A2AVersionError
from synapse.a2a.wire import AGENT_CARD_PATH, DEFAULT_PATH, PROTOCOL_VERSION, AgentProvider
from synapse.types import LocalProtocolError
from synapse.types.signing import Secret

if TYPE_CHECKING:
    from synapse.a2a.card_signing import CardSignatureError, CardSigner, CardVerifier
    from synapse.a2a.client.auth import ClientCredentials, OAuthClient
    from synapse.a2a.client.core import A2AClient, A2AEvent, A2AOutcome, A2ATaskHandle
    from synapse.a2a.server.app import A2AServer
    from synapse.a2a.server.artifacts import emit_artifact
    from synapse.a2a.server.direct import DirectAnswers, DirectRequest
    from synapse.a2a.server.extensions import Extension, timestamp_extension
    from synapse.a2a.server.follow_ups import answer_messages, follow_up_messages
    from synapse.a2a.server.push import PushAllowlist
    from synapse.a2a.server.related import RelatedTasks, active_extensions, related_tasks
    from synapse.a2a.server.security import CallerIdentity, ExtendedCard, SecurityPolicy
    from synapse.a2a.server.service import A2AService
    from synapse.transport.peer import Peer

#: Where each name of this facade lives, loaded on first use: importing the client (or
#: `from synapse.a2a import A2AClient`) loads none of the server, nor `aiohttp.web`.
_LAZY = {
    "CardSignatureError": "synapse.a2a.card_signing",
    "CardSigner": "synapse.a2a.card_signing",
    "CardVerifier": "synapse.a2a.card_signing",
    "ClientCredentials": "synapse.a2a.client.auth",
    "OAuthClient": "synapse.a2a.client.auth",
    "A2AClient": "synapse.a2a.client.core",
    "A2AEvent": "synapse.a2a.client.core",
    "A2AOutcome": "synapse.a2a.client.core",
    "A2ATaskHandle": "synapse.a2a.client.core",
    "A2AServer": "synapse.a2a.server.app",
    "DirectAnswers": "synapse.a2a.server.direct",
    "DirectRequest": "synapse.a2a.server.direct",
    "answer_messages": "synapse.a2a.server.follow_ups",
    "follow_up_messages": "synapse.a2a.server.follow_ups",
    "PushAllowlist": "synapse.a2a.server.push",
    "emit_artifact": "synapse.a2a.server.artifacts",
    "Extension": "synapse.a2a.server.extensions",
    "timestamp_extension": "synapse.a2a.server.extensions",
    "RelatedTasks": "synapse.a2a.server.related",
    "active_extensions": "synapse.a2a.server.related",
    "related_tasks": "synapse.a2a.server.related",
    "CallerIdentity": "synapse.a2a.server.security",
    "ExtendedCard": "synapse.a2a.server.security",
    "SecurityPolicy": "synapse.a2a.server.security",
    "A2AService": "synapse.a2a.server.service",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'synapse.a2a' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # found once: later reads do not come here
    return value


def enable_a2a(
    peer: Peer,
    *,
    default_task_type: str | None = "echo",
    push_allowlist: Iterable[str] = (),
    push_secret: Secret | None = None,
    tokens: Mapping[str, str] | None = None,
    path: str = DEFAULT_PATH,
    public_url: str | None = None,
    name: str | None = None,
    description: str = "",
    version: str | None = None,
    provider: AgentProvider | None = None,
    security: SecurityPolicy | None = None,
    card_signer: CardSigner | None = None,
    bindings: Sequence[str] | None = None,
    grpc_port: int | None = None,
    grpc_host: str = "127.0.0.1",
    grpc_public_address: str | None = None,
    tenants: Mapping[str, Iterable[str]] | None = None,
    push_disable_after: int | None = None,
    card_v03_members: bool = False,
    extended_card: ExtendedCard | None = None,
    extensions: Sequence[Extension] = (),
) -> A2AServer:
    """Make `peer` speak A2A v1.0 too, on its own aiohttp app. Call before `peer.start()`.

    - `default_task_type`: the task type of a message without `metadata.task_type` (None:
      such a message is refused with -32602).
    - `push_allowlist`: URL prefixes push notifications may go to; empty turns them off
      (and the card says `pushNotifications: false`).
    - `push_secret`: signs every notification body (`X-Synapse-Signature`, HMAC-SHA256).
    - `tokens`: bearer token → principal. When given, every JSON-RPC call must carry one
      (the card declares the scheme) and each principal sees only its own tasks.
    - `public_url`: the base URL clients reach (default: the origin of the peer's endpoint).
    - `security`: the A2A security schemes required (API key, Bearer, Basic, OAuth 2.0,
      OpenID Connect, mTLS; per skill and per method), declared in the card and enforced
      (`synapse.a2a.server.security`; `tokens` alone is a Bearer policy).
    - `card_signer`: signs the served card (`synapse.a2a.card_signing.CardSigner`).
    - `bindings`: the protocol bindings served, in the order of preference the card lists
      them in (default `JSONRPC`, `HTTP+JSON`, then `GRPC` when `grpc_port` is given).
    - `grpc_port`: serve the gRPC binding on this port of `grpc_host` (0: any free port;
      needs the `grpc` extra); `grpc_public_address` is the `host:port` the card gives
      (default: the host of the HTTP interfaces' URL, and that port). It serves TLS (and
      requires client certificates) as the peer's `tls` says, and enforces the same
      `security` as the HTTP bindings.
    - `push_disable_after`: disable a push configuration whose last N delivery attempts
      failed (its later notifications are dropped until it is created again; None: never).
      `A2AServer.push_status(task_id)` says how each configuration's deliveries go.
    - `tenants`: principal → the tenants it may name (`synapse.a2a.server.tenants`); tasks,
      listings, push configurations and retries are per tenant either way.
    - A2A 0.3 clients are served too, over JSON-RPC (`synapse.a2a.v03`); their card is at
      `/.well-known/agent.json`. `card_v03_members`: also put the 0.3 members on the card at
      `/.well-known/agent-card.json`, for 0.3 clients that look only there (as the official
      SDK does; a strict A2A 1.0 validator, the 1.0 TCK's, refuses such a card).
    - `extended_card`: what an authenticated caller sees beyond the public card, on
      `GetExtendedAgentCard`: `(card, caller) → card`, given the public card built afresh and
      the caller's `CallerIdentity` (principal, scheme, scopes, claims); more skills for a
      scope, say. The card then declares `capabilities.extendedAgentCard`. Without it, a
      peer with a security policy serves its public card there; without either, the call
      is refused (-32004).
    - `extensions`: A2A extensions the agent supports (`Extension(uri, description,
      required, params, annotate)`, or `timestamp_extension()`): on the card, activated per
      call by its `A2A-Extensions` header (a required one left out: -32008), said back in the
      answer's header, kept with the tasks they start (`active_extensions(ctx)`), and
      written by their `annotate` hook on what those tasks emit.
    """
    try:
        peer.protocol  # noqa: B018 - raises until the peer is started
    except LocalProtocolError:
        pass
    else:
        raise LocalProtocolError("enable_a2a(peer) must be called before peer.start()")
    from synapse import __version__
    from synapse.a2a.server.app import A2AServer
    from synapse.a2a.server.security import MutualTlsScheme

    if (
        security is not None
        and any(isinstance(scheme, MutualTlsScheme) for scheme in security.schemes.values())
        and (peer.tls is None or not peer.tls.requires_client_cert)
    ):
        # No client certificate could ever be shown: the card would declare a scheme
        # nobody can meet. Said at start, not as a refusal of every call.
        raise ValueError(
            "the mtls security scheme needs a peer that requires client certificates "
            "(TLSConfig client_ca, --tls-client-ca)"
        )
    handler = peer.handler
    server = A2AServer(
        capabilities=(lambda: handler.get_capabilities()) if handler is not None else (lambda: ()),
        config=peer.config,
        default_task_type=default_task_type,
        push_allowlist=push_allowlist,
        push_secret=push_secret,
        tokens=tokens,
        path=path,
        public_url=public_url,
        name=name or peer.agent_id,
        description=description,
        version=version or __version__,
        provider=provider,
        security=security,
        card_signer=card_signer.sign if card_signer is not None else None,
        bindings=bindings,
        grpc_port=grpc_port,
        grpc_host=grpc_host,
        grpc_public_address=grpc_public_address,
        tls=peer.tls,
        tenants=tenants,
        push_disable_after=push_disable_after,
        card_v03_members=card_v03_members,
        extended_card=extended_card,
        extensions=extensions,
    )
    if peer.tls is not None:
        server.pusher.ssl = peer.tls.client_context()
    peer.protocol_hooks.append(server.bind)
    peer.app_hooks.append(server.add_routes)
    return server


__all__ = [
    "AGENT_CARD_PATH",
    "PROTOCOL_VERSION",
    "A2AClient",
    "A2ACode",
    "A2AError",
    "A2AEvent",
    "A2AOutcome",
    "A2AServer",
    "A2AService",
    "A2ATaskHandle",
    "A2AVersionError",
    "AgentProvider",
    "CallerIdentity",
    "CardSignatureError",
    "CardSigner",
    "CardVerifier",
    "ClientCredentials",
    "DirectAnswers",
    "DirectRequest",
    "ExtendedCard",
    "Extension",
    "OAuthClient",
    "PushAllowlist",
    "RelatedTasks",
    "SecurityPolicy",
    "active_extensions",
    "answer_messages",
    "emit_artifact",
    "enable_a2a",
    "follow_up_messages",
    "related_tasks",
    "timestamp_extension",
]
