"""The A2A v1.0 server of a Synapse peer: its `TaskHandler` served to A2A clients.

`A2AServer` is the HTTP front: the agent card, authentication, and the routes of each
binding (`synapse.a2a.server.jsonrpc`), all on one `A2AService`
(`synapse.a2a.server.service`), which holds the operations, the task views and the bridge to
the runtime.

Served on the peer's aiohttp app: `GET /.well-known/agent-card.json`, JSON-RPC 2.0 at
`path` (default `/a2a`) and the HTTP+JSON/REST routes under it (`/a2a/message:send` …);
gRPC on a port of its own when `grpc_port` is given. See `docs/a2a.md` for every mapping.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from email.utils import formatdate, parsedate_to_datetime
from typing import Any
from urllib.parse import urlsplit

import msgspec
from aiohttp import web

from synapse._distribution import install
from synapse.a2a import v03, wire
from synapse.a2a.card import build_card
from synapse.a2a.errors import A2ACode, A2AError
from synapse.a2a.mapping import LEGACY_TASK_TYPE_KEY, TASK_TYPE_KEY, meta_value
from synapse.a2a.server.extensions import (
    ACTIVE_EXTENSIONS,
    HEADER,
    LEGACY_HEADER,
    Extension,
    Extensions,
)
from synapse.a2a.server.jsonrpc import JsonRpcBinding
from synapse.a2a.server.push_health import register_push_metrics
from synapse.a2a.server.rest import RestBinding
from synapse.a2a.server.security import (
    CURRENT_CALLER,
    REQUEST_KEY,
    CallerIdentity,
    ExtendedCard,
    MutualTlsScheme,
    Presented,
    SecurityPolicy,
)
from synapse.a2a.server.service import ANONYMOUS, REQUESTER_PREFIX, A2AService
from synapse.a2a.server.tenants import Tenants
from synapse.a2a.server.view import A2ATask
from synapse.a2a.wire import DEFAULT_PATH, grpc_available
from synapse.p2p.config import P2PConfig
from synapse.runtime.protocol import P2PProtocol
from synapse.transport.tls import TLSConfig
from synapse.types import Capability
from synapse.types.signing import Secret


def declare_client_certificates(card: wire.AgentCard) -> wire.AgentCard:
    """`card` saying what the TLS handshake already demands of every caller: a client
    certificate from the CA the operator trusts (`--tls-client-ca`). The mutual-TLS scheme is
    added (unless a scheme declares it already) and joins every security requirement, card and
    skills alike, as each call must meet it whatever else it presents."""
    schemes = dict(card.security_schemes or {})
    declared = [name for name, entry in schemes.items() if "mtlsSecurityScheme" in entry]
    name = declared[0] if declared else "mtls"
    if not declared:
        while name in schemes:
            name += "_"
        schemes[name] = MutualTlsScheme().card_entry()

    def with_mtls(
        requirements: list[wire.SecurityRequirement] | None,
    ) -> list[wire.SecurityRequirement]:
        if not requirements:
            return [wire.SecurityRequirement(schemes={name: wire.StringList()})]
        return [
            r
            if name in r.schemes
            else wire.SecurityRequirement(schemes={**r.schemes, name: wire.StringList()})
            for r in requirements
        ]

    skills = [
        msgspec.structs.replace(skill, security_requirements=with_mtls(skill.security_requirements))
        if skill.security_requirements
        else skill
        for skill in card.skills or []
    ]
    return msgspec.structs.replace(
        card,
        security_schemes=schemes,
        security_requirements=with_mtls(card.security_requirements),
        skills=skills,
    )


class A2AServer:
    """The A2A binding of one peer: agent card, JSON-RPC methods, streams, push notifications.

    Make it with `enable_a2a(peer, ...)` (before `peer.start()`), or by hand: `bind(protocol)`
    once the runtime exists and `add_routes(app)` on the aiohttp app that serves (by hand,
    pass the app's `tls` too: the gRPC port serves TLS only with it).
    """

    def __init__(
        self,
        *,
        capabilities: Callable[[], Sequence[str | Capability]],
        config: P2PConfig | None = None,
        default_task_type: str | None = "echo",
        push_allowlist: Iterable[str] = (),
        push_secret: Secret | None = None,
        tokens: Mapping[str, str] | None = None,
        path: str = DEFAULT_PATH,
        public_url: str | Callable[[], str] | None = None,
        name: str = "synapse-peer",
        description: str = "",
        version: str = "0.1.0",
        provider: wire.AgentProvider | None = None,
        documentation_url: str | None = None,
        keepalive: float = 15.0,
        card_max_age: int = 300,
        bindings: Sequence[str] | None = None,
        grpc_port: int | None = None,
        grpc_host: str = "127.0.0.1",
        grpc_public_address: str | None = None,
        security: SecurityPolicy | None = None,
        card_signer: Callable[[wire.AgentCard], wire.AgentCard] | None = None,
        tls: TLSConfig | None = None,
        tenants: Mapping[str, Iterable[str]] | None = None,
        push_disable_after: int | None = None,
        card_v03_members: bool = False,
        extended_card: ExtendedCard | None = None,
        extensions: Sequence[Extension] = (),
    ) -> None:
        if not path.startswith("/"):
            raise ValueError("the JSON-RPC path must start with '/'")
        order = list(bindings) if bindings is not None else list(wire.BINDINGS)
        unknown = [b for b in order if b not in wire.BINDINGS]
        if unknown or len(set(order)) != len(order) or not order:
            raise ValueError(
                f"bindings must be distinct names among {', '.join(wire.BINDINGS)}: {order}"
            )
        if grpc_port is None and wire.GRPC_BINDING in order:
            if bindings is not None:
                raise ValueError("the GRPC binding needs a grpc_port (0: any free port)")
            order.remove(wire.GRPC_BINDING)
        if wire.GRPC_BINDING in order and not grpc_available():
            raise ValueError(
                "the GRPC binding needs the grpc extra (a2a-sdk's generated modules and "
                f"grpcio): {install('grpc')}"
            )
        #: The bindings served, in the order of preference the card lists them in.
        self.bindings = order
        self.capabilities = capabilities
        self.config = config or P2PConfig()
        self.default_task_type = default_task_type
        if security is not None and tokens:
            raise ValueError("give either tokens or security (tokens: an HttpBearerScheme in it)")
        self.tokens = dict(tokens or {})
        #: Who may call, and how (synapse.a2a.server.security); `tokens` alone is a bearer policy.
        self.security = security or (SecurityPolicy.bearer_tokens(self.tokens) if tokens else None)
        #: Signs each card served (synapse.a2a.card_signing.CardSigner.sign).
        self.card_signer = card_signer
        self.path = path
        self._public_url = public_url
        self.name = name
        self.description = description
        self.version = version
        self.provider = provider
        self.documentation_url = documentation_url
        self.keepalive = keepalive
        #: How long clients may cache the agent card (seconds, `Cache-Control: max-age`).
        self.card_max_age = card_max_age
        #: Also put the 0.3 members (`url`, `protocolVersion` …) on the card at its 1.0 path,
        #: for 0.3 clients that look only there (a strict 1.0 validator refuses them).
        self.card_v03_members = card_v03_members
        self._card_etag = ""
        self._card_modified = 0.0
        #: What an authenticated caller sees beyond the public card (None: the same card).
        self.extended_card = extended_card
        #: The A2A extensions declared on the card and negotiated per call (ours too).
        self.extensions = Extensions(extensions, builtin=(wire.TASK_TYPES_EXTENSION,))
        if len(self.extensions.declared) != len(extensions) or any(
            e.uri == wire.TASK_TYPES_EXTENSION for e in extensions
        ):
            raise ValueError("each extension is declared once, and not as Synapse's own")
        self.service = A2AService(
            config=self.config,
            default_task_type=default_task_type,
            push_allowlist=push_allowlist,
            push_secret=push_secret,
            extended_card=self.extended_card_for,
            extensions=self.extensions,
            tenants=Tenants(tenants),
            push_disable_after=push_disable_after,
        )
        self.pusher = self.service.pusher
        self.jsonrpc = JsonRpcBinding(self)
        self.rest = RestBinding(self)
        self.grpc_host = grpc_host
        self.grpc_port = grpc_port
        self.grpc_public_address = grpc_public_address
        self.grpc: Any = None  # synapse.a2a.server.grpc_binding.GrpcBinding, once started
        #: The peer's certificates: the gRPC port serves TLS (and mTLS) with them too.
        self.tls = tls

    # --- wiring -------------------------------------------------------------------------------

    @property
    def tasks(self) -> dict[str, A2ATask]:
        return self.service.tasks

    @property
    def protocol(self) -> P2PProtocol:
        return self.service.protocol

    def bind(self, protocol: P2PProtocol) -> None:
        """Route the virtual partners' messages to this binding (before tasks are restored)."""
        self.service.bind(protocol)

    def add_routes(self, app: web.Application) -> None:
        app.on_response_prepare.append(_say_activated_extensions)
        app.router.add_get(wire.AGENT_CARD_PATH, self.handle_card)
        if wire.JSONRPC_BINDING in self.bindings:  # A2A 0.3 clients look here, for 0.3
            app.router.add_get(v03.AGENT_CARD_PATH_03, self.handle_card_v03)
        if wire.JSONRPC_BINDING in self.bindings:
            app.router.add_post(self.path, self.jsonrpc.handle)
            # The card's URL with a slash added, as HTTP clients that join "/" onto a base URL
            # (httpx's `base_url`, the A2A TCK's client) POST it: the same endpoint.
            app.router.add_post(self.path.rstrip("/") + "/", self.jsonrpc.handle)
        if wire.REST_BINDING in self.bindings:
            self.rest.add_routes(app, self.path)
        if wire.GRPC_BINDING in self.bindings:
            app.on_startup.append(self._start_grpc)
        app.on_shutdown.append(self._on_shutdown)
        app.on_cleanup.append(self._on_cleanup)

    async def _start_grpc(self, _app: web.Application) -> None:
        # Imported here: protobuf and grpcio are needed only when the binding is served.
        from synapse.a2a.server.grpc_binding import GrpcBinding

        assert self.grpc_port is not None
        self.grpc = GrpcBinding(self)
        await self.grpc.start(self.grpc_host, self.grpc_port)

    async def _on_shutdown(self, _app: web.Application) -> None:
        self.service.close_streams()
        if self.grpc is not None:
            await self.grpc.stop(grace=0.5)

    async def _on_cleanup(self, _app: web.Application) -> None:
        await self.service.close()

    def interfaces(self) -> list[wire.AgentInterface]:
        """The card's interfaces: one per binding served, in the order of preference."""
        found = []
        for binding in self.bindings:
            if binding == wire.GRPC_BINDING:
                if self.grpc is None or self.grpc.port is None:
                    continue  # not listening yet
                url = self.grpc_public_address or self._grpc_address(self.grpc.port)
            else:
                url = self.url
            found.append(
                wire.AgentInterface(
                    url=url, protocol_binding=binding, protocol_version=wire.PROTOCOL_VERSION
                )
            )
        return found

    def _grpc_address(self, port: int) -> str:
        """`host:port` of the gRPC interface: the host clients reach the HTTP ones at (the
        public URL's, else the endpoint's), not the address it listens on (0.0.0.0 …)."""
        host = urlsplit(self.url).hostname or self.grpc_host
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    @property
    def url(self) -> str:
        """The URL of the HTTP interfaces (JSON-RPC at it, REST routes under it)."""
        base = self._public_url() if callable(self._public_url) else self._public_url
        protocol = self.service.bound
        if base is None and protocol is not None:
            parts = urlsplit(protocol.view.endpoint)
            base = f"{parts.scheme}://{parts.netloc}"
        if base is None:
            raise A2AError(A2ACode.AGENT_NOT_READY, "the agent is starting", {"reason": "starting"})
        return base.rstrip("/") + self.path

    def register_metrics(self, registry: Any) -> None:
        """Count push deliveries in a Prometheus `registry` (`enable_metrics(peer).registry`)."""
        register_push_metrics(self.pusher.health, registry)

    def push_status(self, task_id: str) -> dict[str, dict[str, object]]:
        """How the deliveries to each push configuration of task `task_id` went, by
        configuration id (`synapse.a2a.server.push_health`)."""
        return {c: r.as_dict() for c, r in self.pusher.health.status(task_id).items()}

    @property
    def push_enabled(self) -> bool:
        return self.service.push_enabled

    def card(self) -> wire.AgentCard:
        card = self._unsigned_card()
        return self.card_signer(card) if self.card_signer is not None else card

    def extended_card_for(self, principal: str) -> wire.AgentCard | None:
        """The card the caller of this call (`CURRENT_CALLER`, authenticated by the
        security policy) sees: the public card, changed by `extended_card` if given, and
        signed as the public one is. None when the agent offers no extended card (no
        security policy and no `extended_card`)."""
        if self.security is None and self.extended_card is None:
            return None
        card = self._unsigned_card()  # built afresh: the hook may change it freely
        if self.extended_card is not None:
            caller = CURRENT_CALLER.get() or CallerIdentity(principal, "none")
            card = self.extended_card(card, caller)
            card.capabilities.extended_agent_card = True
        return self.card_signer(card) if self.card_signer is not None else card

    def _unsigned_card(self) -> wire.AgentCard:
        caps = [c if isinstance(c, Capability) else Capability(name=c) for c in self.capabilities()]
        card = build_card(
            caps,
            name=self.name,
            description=self.description,
            interfaces=self.interfaces(),
            version=self.version,
            default_task_type=self.default_task_type,
            push_notifications=self.push_enabled,
            bearer=False,
            provider=self.provider,
            documentation_url=self.documentation_url,
        )
        if self.security is not None:
            card = self.security.declare(card)
        if self.tls is not None and self.tls.requires_client_cert:
            card = declare_client_certificates(card)
        if self.extended_card is not None:
            card.capabilities.extended_agent_card = True
        card.capabilities.extensions += [e.card_entry() for e in self.extensions.declared.values()]
        return card

    # --- HTTP ---------------------------------------------------------------------------------

    async def handle_card(self, request: web.Request) -> web.Response:
        """The card, cacheable: a strong `ETag` (its body's hash), `Last-Modified` (when
        this body was first served), `Cache-Control: max-age`; a matching `If-None-Match`
        (or, without one, an `If-Modified-Since` not older) is answered 304."""
        try:
            card = self.card()
        except A2AError:
            return web.Response(status=503, text="starting", headers={"Retry-After": "1"})
        if self.card_v03_members and not card.signatures:
            # The members an A2A 0.3 client reads too, as the official SDK serves them. A
            # signed card stays as signed (0.3 clients find theirs at /.well-known/agent.json).
            body = wire.encode(v03.with_v03_members(wire.to_builtins(card)))
        else:
            body = wire.encode(card)
        etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
        if etag != self._card_etag:
            # Whole seconds: HTTP dates have no finer resolution.
            self._card_etag, self._card_modified = etag, float(int(time.time()))
        headers = {
            "ETag": etag,
            "Last-Modified": formatdate(self._card_modified, usegmt=True),
            "Cache-Control": f"public, max-age={self.card_max_age}",
        }
        if _not_modified(request, etag, self._card_modified):
            return web.Response(status=304, headers=headers)
        return web.Response(body=body, content_type="application/json", headers=headers)

    async def handle_card_v03(self, request: web.Request) -> web.Response:
        """The card as an A2A 0.3 client reads it (`/.well-known/agent.json`)."""
        try:
            card = self.card()
        except A2AError:
            return web.Response(status=503, text="starting", headers={"Retry-After": "1"})
        body = wire.encode(v03.card_to_v03(wire.to_builtins(card)))
        headers = {"Cache-Control": f"public, max-age={self.card_max_age}"}
        return web.Response(body=body, content_type="application/json", headers=headers)

    def presented(self, request: web.Request) -> Presented:
        """What an HTTP request presents (made once per request, shared by its checks)."""
        found: Presented | None = request.get(REQUEST_KEY)
        if found is None:
            found = Presented.from_http(request)
            request[REQUEST_KEY] = found
        return found

    async def authenticate(self, request: web.Request) -> str:
        """The caller's principal under the security policy (the HTTP bindings' hook)."""
        return await self.authenticate_call(self.presented(request))

    async def authenticate_call(self, presented: Presented) -> str:
        """The caller's principal, whatever the binding (`SecurityPolicy` decides)."""
        ACTIVE_EXTENSIONS.set(())  # a kept-alive connection's task served other calls before
        if self.security is None:
            CURRENT_CALLER.set(CallerIdentity(ANONYMOUS, "none"))
            return ANONYMOUS
        identity = await self.security.authenticate(presented)
        # For what this call reads of its caller beyond the principal (the extended card's
        # hook): the binding's task runs the operation in this context.
        CURRENT_CALLER.set(identity)
        return identity.principal

    async def authorize(self, request: web.Request | Presented, method: str, params: Any) -> None:
        """Refuse a method whose scopes, or a new task whose skill, the caller lacks, or a
        call that leaves out a required extension; activate the extensions it asks for."""
        if isinstance(request, web.Request):
            # Only the extension headers: no `Presented` (its TLS lookup) without a policy.
            asked = {h.lower(): ",".join(request.headers.getall(h, ())) for h in EXTENSION_HEADERS}
            request[EXTENSIONS_KEY] = self.extensions.activate(asked)  # for the answer's header
        else:
            self.extensions.activate(request.headers)
        if self.security is None:
            return
        presented = request if isinstance(request, Presented) else self.presented(request)
        self.security.authorize_method(presented, method)
        message = params.get("message") if isinstance(params, dict) else None
        if method in ("SendMessage", "SendStreamingMessage") and isinstance(message, dict):
            if message.get("taskId"):
                return
            metadata = message.get("metadata")
            # Read as the service reads it (`mapping.task_type_of`): the skill judged is the
            # task type the task will have (a value it would refuse is refused there).
            skill = meta_value(
                metadata if isinstance(metadata, dict) else None,
                TASK_TYPE_KEY,
                LEGACY_TASK_TYPE_KEY,
            )
            skill = skill if isinstance(skill, str) and skill else self.default_task_type
            await self.security.authorize_skill(presented, skill)


def _not_modified(request: web.Request, etag: str, modified: float) -> bool:
    match = request.headers.get("If-None-Match")
    if match is not None:
        tags = {t.strip().removeprefix("W/") for t in match.split(",")}
        return "*" in tags or etag in tags
    since = request.headers.get("If-Modified-Since")
    if since is None:
        return False
    try:
        return parsedate_to_datetime(since).timestamp() >= modified
    except (TypeError, ValueError):
        return False


#: The request headers that name the extensions a call asks for.
EXTENSION_HEADERS = (HEADER, LEGACY_HEADER)
#: Where an HTTP request keeps the extensions its call activated, for its answer's header.
EXTENSIONS_KEY: web.RequestKey[tuple[str, ...]] = web.RequestKey("a2a_extensions", tuple)


async def _say_activated_extensions(request: web.Request, response: web.StreamResponse) -> None:
    """Name the extensions an A2A call activated in its answer's `A2A-Extensions` header."""
    active = request.get(EXTENSIONS_KEY)
    if active:
        response.headers[HEADER] = ", ".join(active)


__all__ = ["ANONYMOUS", "DEFAULT_PATH", "REQUESTER_PREFIX", "A2AServer", "A2ATask"]
