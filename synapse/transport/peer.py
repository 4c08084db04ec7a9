"""`Peer`: engine, transport, partners and handler wired into one object.

    async with Peer("agent-a", partners=[Partner("agent-b", url, ("secret",))],
                    handler=MyHandler()) as peer:
        handle = await peer.submit("agent-b", "echo", {"text": "hi"})
        outcome = await handle

A peer both serves its `TaskHandler` (on `POST /synapse/callback`) and submits tasks to its
partners. It only ever POSTs to registered partner endpoints.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable, Mapping
from datetime import datetime
from typing import Any, Protocol

from aiohttp import web
from multidict import CIMultiDict

from synapse.frameworks import as_handler
from synapse.logs import get_logger
from synapse.p2p.commands import Submit
from synapse.p2p.config import P2PConfig
from synapse.p2p.dedup import DedupStore, StoredReply
from synapse.p2p.engine import TaskKey
from synapse.runtime.handler import TaskHandler
from synapse.runtime.protocol import P2PProtocol, TaskHandle
from synapse.store.base import TaskStore
from synapse.store.memory import MemoryStore
from synapse.transport.admission import admission_middleware, expect_handler
from synapse.transport.client import HttpClient, SenderMode
from synapse.transport.guard import GuardedSite, HttpLimits
from synapse.transport.http1_server import LEAN_CALLBACKS, CallbackRoute
from synapse.transport.inbound import encode_reply, nack_for
from synapse.transport.partners import Partner, PartnerRegistry
from synapse.transport.server import DEFAULT_PATH, SynapseServer
from synapse.transport.tls import TLSConfig, refresh_crls
from synapse.types import (
    CapabilityResponsePayload,
    HeartbeatPayload,
    LocalProtocolError,
    Message,
    NackError,
    NotReady,
    Priority,
    TaskContext,
)
from synapse.types.codec import IdFactory
from synapse.types.signing import Secrets, secrets_of

#: What the app's body limit adds to the callback route's (an A2A request's JSON-RPC frame).
_APP_BODY_MARGIN = 1024

log = get_logger("synapse.peer")


class HttpSender:
    """The runtime's `CallbackSender` over HTTP: registered partners only, retries included."""

    def __init__(
        self, client: HttpClient, partners: PartnerRegistry, mode: SenderMode = "header"
    ) -> None:
        self.client = client
        self.partners = partners
        self.mode = mode

    async def send_callback(self, partner: str, message: Message, *, retry: bool = True) -> Message:
        registered = self.partners.get(partner)
        if registered is None:
            raise LocalProtocolError(f"{partner!r} is not a registered partner")
        # A DeliveryError (the one class, raised by the client) propagates as it is.
        reply = await self.client.exchange(
            registered, message, sender_mode=self.mode, retries=None if retry else 0
        )
        return reply.message


class TaskOwners(Protocol):
    """Replicas of one agent, as the peer's own pages and APIs see them."""

    async def answer_at_owner(
        self, request: web.Request, key: TaskKey, *, user: str | None = None
    ) -> web.StreamResponse | NackError | None:
        """None: answer `request` here; else the response of the replica that works on the
        task `key`, or a refusal to retry (its owner cannot be reached). `user`: whom this
        replica signed in for the request, vouched for to the owner."""
        ...

    async def vouched(self, request: web.Request) -> str | None:
        """The user another replica vouches for on a request it passed on here, if any."""
        ...


class Peer:
    """One Synapse peer: an HTTP server for its handler and a client to its partners."""

    def __init__(
        self,
        agent_id: str,
        *,
        partners: Iterable[Partner] | PartnerRegistry = (),
        handler: TaskHandler | object | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        path: str = DEFAULT_PATH,
        endpoint: str | None = None,
        config: P2PConfig | None = None,
        signing_mode: SenderMode = "header",
        dedup: DedupStore | None = None,
        rate_limit: float | None = None,
        store: TaskStore | None = None,
        serve: bool = True,
        tls: TLSConfig | None = None,
        allow_shared_secrets: bool = False,
        http_limits: HttpLimits | None = None,
        ids: IdFactory | None = None,
    ) -> None:
        self.agent_id = agent_id
        self.partners = (
            partners if isinstance(partners, PartnerRegistry) else PartnerRegistry(partners)
        )
        #: A `TaskHandler`; an agent of another framework is served through its adapter
        #: (`synapse.frameworks.as_handler`: a Pydantic AI or OpenAI Agents SDK `Agent`, a
        #: compiled LangGraph graph).
        self.handler = (
            handler if handler is None or isinstance(handler, TaskHandler) else as_handler(handler)
        )
        self.host = host
        self.port = port
        self.path = path
        self._endpoint = endpoint
        self.config = config or P2PConfig()
        self.signing_mode: SenderMode = signing_mode
        self.serve = serve
        self._dedup = dedup
        self._rate_limit = rate_limit
        self.store: TaskStore = store or MemoryStore()
        #: Certificates of what we serve and of our calls (`synapse.transport.tls`).
        self.tls = tls
        self._crl_refresh: asyncio.Task[None] | None = None
        #: Partners sharing a secret can sign as each other: refused at start unless allowed.
        self.allow_shared_secrets = allow_shared_secrets
        #: Timeouts and connection cap of the server (see `synapse.transport.guard`).
        self.http_limits = http_limits or HttpLimits()
        #: Where message and task ids come from (random by default; `CountingIds` makes a
        #: run repeatable, as the simulation's).
        self.ids = ids
        self.client = HttpClient(self.config, tls=tls)
        self._runner: web.AppRunner | None = None
        self._site: GuardedSite | None = None
        self._protocol: P2PProtocol | None = None
        self._server: SynapseServer | None = None
        self._recovering = False
        self._ready_after_recovery = True
        #: Called with the aiohttp app before it serves (`start()` or `attach()`): mount
        #: extra routes here (the A2A binding does).
        self.app_hooks: list[Callable[[web.Application], None]] = []
        #: Called with the runtime as soon as it is built, before restored tasks resume.
        self.protocol_hooks: list[Callable[[P2PProtocol], None]] = []
        #: Called with the transport server as soon as it is built (replicas set its
        #: routing hook there).
        self.server_hooks: list[Callable[[SynapseServer], None]] = []
        #: Where a task is worked on, when this peer is one of several replicas
        #: (`enable_replicas` sets it): pages and APIs about one task go there.
        self.task_owners: TaskOwners | None = None

    # --- wiring -----------------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """The URL this peer receives POSTs on (`from.endpoint`)."""
        if self._endpoint is None:
            raise LocalProtocolError("the endpoint is known once the peer is started")
        return self._endpoint

    @property
    def protocol(self) -> P2PProtocol:
        if self._protocol is None:
            raise LocalProtocolError("start the peer first")
        return self._protocol

    @property
    def server(self) -> SynapseServer:
        if self._server is None:
            raise LocalProtocolError("start the peer first")
        return self._server

    def add_partner(self, agent_id: str, endpoint: str, secrets: Secrets = ()) -> Partner:
        """Register a partner: its agent id, the URL it receives POSTs on, and the secrets
        shared with it, newest first (a tuple or a list: `("s3cret",)` for one)."""
        partner = Partner(agent_id, endpoint, secrets_of(secrets, repr(agent_id)))
        previous = self.partners.get(agent_id)
        self.partners.add(partner)
        try:
            self.partners.check_distinct_secrets(allow_shared=self.allow_shared_secrets)
        except ValueError:
            self.partners.remove(agent_id)
            if previous is not None:
                self.partners.add(previous)
            raise
        return partner

    def _build(self, endpoint: str) -> None:
        self._endpoint = endpoint
        self._protocol = P2PProtocol(
            agent_id=self.agent_id,
            endpoint=endpoint,
            config=self.config,
            handler=self.handler,
            sender=HttpSender(self.client, self.partners, self.signing_mode),
            store=self.store,
            ids=self.ids,
            listeners=self.client.listeners,
        )
        for protocol_hook in self.protocol_hooks:
            protocol_hook(self._protocol)
        dedup = self._dedup
        if dedup is None and self.store.durable:
            from synapse.store.dedup import DurableDedupStore

            dedup = DurableDedupStore(self.config.dedup_window, self.store)
        self._server = SynapseServer(
            self._protocol,
            self.partners,
            dedup=dedup,
            rate_limit=self._rate_limit,
            body_timeout=self.http_limits.body_timeout,
        )
        for server_hook in self.server_hooks:
            server_hook(self._server)
        # Until the store is loaded (`start`), every request is answered 503 agent_not_ready;
        # then readiness is what it was (a protocol hook, the router's, may hold it back).
        self._ready_after_recovery = self._protocol.ready
        self._protocol.ready = False
        self._recovering = True

    def attach(self, app: web.Application, endpoint: str) -> None:
        """Mount this peer into an existing aiohttp `app` instead of serving on its own.

        `endpoint` is the public URL of `self.path` in that app. Call `start()` afterwards.
        """
        self.serve = False
        self._build(endpoint)
        self.server.add_routes(app, self.path)
        for app_hook in self.app_hooks:
            app_hook(app)

    @property
    def _scheme(self) -> str:
        return "https" if self.tls is not None and self.tls.serves_tls else "http"

    async def start(self) -> None:
        """Start serving (and the runtime). A peer that cannot start (its port in use, a bad
        address) raises one `OSError` saying where, and leaves nothing open behind it."""
        try:
            await self._start()
        except BaseException as exc:
            await self._abandon_start()
            if isinstance(exc, OSError) and self.serve:
                raise OSError(
                    exc.errno, f"cannot listen on {self.host}:{self.port}: {exc.strerror or exc}"
                ) from exc
            raise

    async def _abandon_start(self) -> None:
        with contextlib.suppress(Exception):
            if self._runner is not None:
                await self._runner.cleanup()
        self._runner = self._site = None
        with contextlib.suppress(Exception):
            await self.client.close()

    async def _start(self) -> None:
        self.partners.check_distinct_secrets(allow_shared=self.allow_shared_secrets)
        await self.client.start()
        if self.serve and self._runner is None:
            # Bind first: with port 0 the endpoint is known only once bound.
            app = web.Application(
                client_max_size=self.config.max_body_size + _APP_BODY_MARGIN,
                # The admission table's rules aiohttp's parser does not enforce (the lean
                # callback server applies them itself).
                middlewares=[admission_middleware(self._framing_refusal, lambda _r: None)],
            )
            app.router.add_post(
                self.path,
                self._dispatch,
                expect_handler=expect_handler(self._framing_refusal, self._body_limit),
            )
            for app_hook in self.app_hooks:
                app_hook(app)
            self._runner = web.AppRunner(
                app, access_log=None, handle_signals=False, **self.http_limits.runner_kwargs()
            )
            await self._runner.setup()
            ssl_context = self.tls.server_context() if self.tls is not None else None
            site = GuardedSite(
                self._runner,
                self.host,
                self.port,
                limits=self.http_limits,
                refusal=self._framing_refusal,
                ssl_context=ssl_context,
                callbacks=self._callback_route(app),
            )
            await site.start()
            self._site = site
            addresses = self._runner.addresses
            self.port = int(addresses[0][1]) if addresses else self.port
            if self._protocol is None:
                self._build(
                    self._endpoint or f"{self._scheme}://{self.host}:{self.port}{self.path}"
                )
            listening = True
        else:
            listening = False
            if self._protocol is None:
                self._build(
                    self._endpoint or f"{self._scheme}://{self.host}:{self.port}{self.path}"
                )
        # One process serves a store (replicas of one agent share theirs: the protocol's
        # hooks, just run, made this one a replica if it is one): a second process stops
        # here, before it reads a task (`synapse.store.holding`).
        await asyncio.to_thread(self.store.hold)
        if self._recovering:
            # Off the loop: the port answers 503 agent_not_ready while the store is read.
            snapshot = await asyncio.to_thread(self.store.load)
        if listening:
            # Once recovery is done, so that whoever waits for this line finds us ready
            # (what follows up to `ready` does not await: no request falls in between).
            # The address bound (with --port 0, the port the system chose), beside the
            # endpoint partners are told, which may name a proxy in front of it.
            log.info(
                "listening",
                url=self.endpoint,
                agent_id=self.agent_id,
                host=self.host,
                port=self.port,
            )
        if self._recovering:
            self.protocol.restore(snapshot)
            self._recovering = False
            self.protocol.ready = self._ready_after_recovery
        await self.protocol.start()
        if self.tls is not None and self.tls.crl is not None and self._crl_refresh is None:
            # A renewed CRL is picked up while the peer runs (synapse.transport.tls).
            self._crl_refresh = asyncio.create_task(refresh_crls(), name="synapse-crl-refresh")

    def _callback_route(self, app: web.Application) -> CallbackRoute | None:
        """The callback route for the lean server (`synapse.transport.http1_server`), or None
        if a middleware of `app` must see every request (it does not carry `LEAN_CALLBACKS`)."""
        if not all(hasattr(middleware, LEAN_CALLBACKS) for middleware in app.middlewares):
            return None

        def answer(
            body: bytes, headers: CIMultiDict[str], transport: asyncio.BaseTransport
        ) -> Awaitable[StoredReply]:
            return self.server.answer(body, headers, transport)

        def enabled() -> bool:
            return self._server is not None and self._server.serves_callbacks_itself

        route = CallbackRoute(
            self.path,
            answer,
            max_body=self.config.max_body_size,
            limits=self.http_limits,
            timeout_reply=lambda: self.server.body_timeout_reply(),
            enabled=enabled,
        )
        route.listeners = self.client.listeners  # the runtime's, once built (see `_build`)
        return route

    def _framing_refusal(
        self, status: int, message: str, details: dict[str, Any] | None = None
    ) -> bytes:
        if self._server is None:  # bound, not yet built: the peer is starting
            endpoint = self._endpoint or f"{self._scheme}://{self.host}:{self.port}{self.path}"
            error = NotReady(message, {"reason": "starting"})
            nack = nack_for(
                error, agent_id=self.agent_id, endpoint=endpoint, request_id=None, to=None
            )
            return encode_reply(nack, None)[0]
        return self._server.framing_refusal(status, message, details)

    def _body_limit(self, request: web.Request) -> int:
        """The body limit of `request`'s route: the callback route's, else the app's."""
        limit = self.config.max_body_size
        return limit if request.path == self.path else limit + _APP_BODY_MARGIN

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        return await self.server.handle(request)

    async def close(self, drain_timeout: float = 2.0) -> None:
        """Refuse new tasks, give queued callbacks `drain_timeout` s to go, then stop."""
        if self._protocol is not None:
            await self._protocol.drain(drain_timeout)
            await self._protocol.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._crl_refresh is not None:
            self._crl_refresh.cancel()
            self._crl_refresh = None
        await self.client.close()
        await self.store.close()

    async def shutdown(
        self,
        drain_timeout: float | None = None,
        outbox_grace: float | None = None,
        *,
        now: asyncio.Event | None = None,
    ) -> bool:
        """Stop gracefully (see `synapse.runtime.shutdown`), then close; False if `now` (a second
        signal) cut the drain short."""
        graceful = True
        if self._protocol is not None:
            graceful = await self._protocol.shutdown(drain_timeout, outbox_grace, now=now)
        await self.close(drain_timeout=0)
        return graceful

    async def __aenter__(self) -> Peer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # --- requester API ----------------------------------------------------------------------

    async def submit(
        self,
        partner: str,
        task_type: str,
        payload: Mapping[str, Any] | None = None,
        *,
        task_id: str | None = None,
        priority: Priority = Priority.NORMAL,
        deadline: datetime | None = None,
        context: TaskContext | None = None,
    ) -> TaskHandle:
        """Request a task of `partner`; the handle follows it to its end."""
        if partner not in self.partners:
            raise LocalProtocolError(f"{partner!r} is not a registered partner")
        return await self.protocol.submit(
            Submit(
                partner,
                task_type,
                payload,
                task_id=task_id,
                priority=priority,
                deadline=deadline,
                context=context,
            )
        )

    async def capabilities(
        self, partner: str, task_type: str | None = None
    ) -> CapabilityResponsePayload:
        return await self.protocol.query_capabilities(partner, task_type)

    async def ping(self, partner: str) -> tuple[HeartbeatPayload, float]:
        return await self.protocol.ping(partner)


__all__ = ["HttpSender", "Peer"]
