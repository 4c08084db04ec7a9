"""Calling A2A v1.0 agents from Synapse code, with the handle API of Synapse tasks.

    async with A2AClient("https://agent.example") as client:     # discovers the card
        handle = await client.send({"prompt": "spring"}, task_type="text_generation")
        async for event in handle:                                # follows the stream
            if event.state == wire.INPUT_REQUIRED:
                await handle.provide_info({"style": "modern"})
        outcome = await handle                                    # A2AOutcome
        print(outcome.state, outcome.result)

`A2ATaskHandle` mirrors `synapse.runtime.protocol.TaskHandle`: await it for the outcome, iterate
its events, answer INPUT_REQUIRED with `provide_info` / `approve` / `reject`, `cancel` it. A
stream that breaks before the task ends is resumed with `SubscribeToTask` (which replays the
task's current state first); an agent without streaming is polled with `GetTask`.

The client speaks A2A 1.0 (`A2A-Version: 1.0`), and 0.3 to an agent whose card offers no 1.x
interface but a 0.3 JSON-RPC or HTTP+JSON one (`synapse.a2a.client.legacy`); any other card is
refused (`A2AVersionError`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl as ssl_module
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, TypeVar

import aiohttp
import msgspec

from synapse._distribution import NAME
from synapse.a2a import mapping, wire
from synapse.a2a.card_signing import CardSignatureError, CardVerifier
from synapse.a2a.client import legacy
from synapse.a2a.client.auth import ClientCredentials, RequestAuth
from synapse.a2a.client.transports import (
    JsonRpcTransport,
    RestTransport,
    StreamBroken,
    Transport,
    describe_failure,
)
from synapse.a2a.client.values import (
    A2AEvent,
    A2AOutcome,
    card_major,
    content_of,
    content_parts,
    convert_wire,
    merge_artifact,
    parse_card,
    user_message,
)
from synapse.a2a.errors import A2ACode, A2AError, A2AVersionError
from synapse.logs import get_logger
from synapse.p2p.config import P2PConfig
from synapse.runtime.stream import EventStream
from synapse.transport.client import TRACE_CONFIGS
from synapse.transport.retry import backoff_delay
from synapse.transport.tls import TLSConfig
from synapse.types import DecisionAction

log = get_logger("synapse.a2a.client.core")

T = TypeVar("T")
USER_AGENT = f"{NAME}-a2a/0.1"


# --- the client ---------------------------------------------------------------------------------


class A2AClient:
    """A client of one A2A agent (A2A 1.0), over the binding its card prefers among
    JSON-RPC, HTTP+JSON/REST and gRPC (`bindings` narrows what this client may use)."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float = 30.0,
        config: P2PConfig | None = None,
        session: aiohttp.ClientSession | None = None,
        poll_interval: float = 0.5,
        bindings: Sequence[str] | None = None,
        extensions: Sequence[str] = (),
        credentials: ClientCredentials | None = None,
        card_verifier: CardVerifier | None = None,
        require_signed_card: bool = False,
        ssl: ssl_module.SSLContext | None = None,
        tls: TLSConfig | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.config = config or P2PConfig()
        self.timeout = timeout
        self.poll_interval = poll_interval
        self.headers = {
            wire.VERSION_HEADER: wire.PROTOCOL_VERSION,
            "User-Agent": USER_AGENT,
            **(headers or {}),
        }
        if token is not None:
            self.headers["Authorization"] = f"Bearer {token}"
        self._session = session
        self._own_session = session is None
        self.card: wire.AgentCard | None = None
        self.transport: Transport | None = None
        speaks = [b for b in wire.BINDINGS if b != wire.GRPC_BINDING or wire.grpc_available()]
        #: The bindings this client may use; which one is the card's choice (its order).
        self.bindings = tuple(b for b in (bindings or speaks) if b in wire.BINDINGS)
        if not self.bindings:
            raise ValueError(f"bindings must name some of {', '.join(wire.BINDINGS)}")
        #: Extension URIs to request (`A2A-Extensions`).
        self.extensions = tuple(extensions)
        if self.extensions:
            self.headers["A2A-Extensions"] = ",".join(self.extensions)
        #: task id → the id of the push configuration this client last created for it.
        self._push_ids: dict[str, str] = {}
        #: What we present where the card asks (synapse.a2a.client.auth).
        self.credentials = credentials
        if credentials is not None and tls is not None and tls.client_cert is not None:
            credentials.client_certificate = True  # the TLS settings present one
        #: Checks the card's signatures (synapse.a2a.card_signing); with
        #: `require_signed_card`, a card that does not verify is refused.
        self.card_verifier = card_verifier
        self.require_signed_card = require_signed_card
        if require_signed_card and card_verifier is None:
            raise ValueError("require_signed_card needs a card_verifier (pinned keys or JWKS)")
        #: True once the card's signature verified under a trusted key.
        self.card_verified = False
        #: Our certificates (`synapse.transport.tls`): the HTTP bindings use its client
        #: context unless `ssl` is given; the gRPC binding reads its files (gRPC's TLS is
        #: not Python's), so a private CA or a client certificate over gRPC needs `tls`.
        self.tls = tls
        self._ssl = ssl if ssl is not None or tls is None else tls.client_context()
        if credentials is not None and credentials.ssl is True and self._ssl is not None:
            credentials.ssl = self._ssl  # the token endpoint is verified as the agent is

    async def __aenter__(self) -> A2AClient:
        try:
            await self.discover()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        transport, self.transport = self.transport, None
        if transport is not None:
            await transport.close()
        session, self._session = self._session, None
        if self._own_session and session is not None and not session.closed:
            await session.close()

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(ssl=self._ssl) if self._ssl is not None else None
            self._session = aiohttp.ClientSession(
                headers=self.headers,
                connector=connector,
                trace_configs=list(TRACE_CONFIGS) or None,
            )
            self._own_session = True
        return self._session

    # --- discovery ---------------------------------------------------------------------------

    async def discover(self) -> wire.AgentCard:
        """Fetch the agent card and pick its A2A 1.x JSON-RPC interface."""
        url = self.url if self.url.endswith(".json") else self.url + wire.AGENT_CARD_PATH
        try:
            async with self._http().get(
                url, timeout=aiohttp.ClientTimeout(total=self.timeout)
            ) as response:
                if response.status != 200:
                    raise A2AError(
                        A2ACode.INTERNAL_ERROR,
                        f"no agent card at {url}: HTTP {response.status}",
                        http_status=response.status,
                    )
                raw = await response.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise A2AError(
                A2ACode.INTERNAL_ERROR, f"cannot fetch {url}: {describe_failure(exc, self.timeout)}"
            ) from exc
        card = parse_card(raw)
        await self._check_signature(raw, card)
        await self.use_card(card)
        return card

    async def _check_signature(self, raw: bytes, card: wire.AgentCard) -> None:
        self.card_verified = False
        if self.card_verifier is None:
            return
        try:
            await self.card_verifier.verify(raw)
        except CardSignatureError as exc:
            if self.require_signed_card:
                raise
            log.warning("agent_card_unverified", agent=card.name, reason=exc.reason)
            return
        self.card_verified = True

    async def _auth(self, method: str, params: Any) -> RequestAuth:
        """The credentials this call needs (a new task's skill may need more)."""
        if self.credentials is None or self.card is None:
            return RequestAuth()
        skill: str | None = None
        message = params.get("message") if isinstance(params, dict) else None
        if method in ("SendMessage", "SendStreamingMessage") and isinstance(message, dict):
            metadata = message.get("metadata") or {}
            if not message.get("taskId") and isinstance(metadata, dict):
                found = metadata.get(mapping.TASK_TYPE_KEY)
                skill = found if isinstance(found, str) else None
        return await self.credentials.for_card(self.card, skill=skill)

    async def use_card(
        self, card: wire.AgentCard, interface: wire.AgentInterface | None = None
    ) -> None:
        """Talk to the agent through `card` (one fetched and judged elsewhere), over
        `interface` (one of its interfaces), else the one `pick` takes."""
        chosen = interface if interface is not None else self.pick(card)
        if self.transport is not None:
            await self.transport.close()
        self.card = card
        self.transport = self._make_transport(chosen)

    def pick(self, card: wire.AgentCard) -> wire.AgentInterface:
        """The card's first A2A 1.x interface on one of our bindings, else a 0.3 one."""
        ours = [i for i in card.supported_interfaces if i.protocol_binding in self.bindings]
        found = next((i for i in ours if card_major(i) == 1), None)
        if found := found or legacy.legacy_interface(ours):
            return found
        offered = ", ".join(
            f"{i.protocol_binding} {i.protocol_version or '?'}" for i in card.supported_interfaces
        )
        raise A2AVersionError(
            f"agent {card.name!r} offers no A2A 1.x interface over {', '.join(self.bindings)}, "
            f"nor 0.3 over JSON-RPC or HTTP+JSON (offers: {offered or 'none'}); this "
            f"client speaks A2A {wire.PROTOCOL_VERSION} and 0.3",
            {"offered": offered},
        )

    def _make_transport(self, interface: wire.AgentInterface) -> Transport:
        binding = interface.protocol_binding
        if binding == wire.GRPC_BINDING:
            if self._ssl is not None and self.tls is None:
                # grpcio cannot use an ssl.SSLContext: its default roots verify the server.
                log.warning("a2a_grpc_without_tls_files", url=interface.url, hint="pass tls=")
            grpc = legacy.grpc_kind(interface)(
                interface.url,
                self.headers,
                self.timeout,
                self.extensions,
                secure=self.url.startswith("https://"),
                tls=self.tls,
            )
            grpc.auth = self._auth
            return grpc
        rest = binding == wire.REST_BINDING
        kind = legacy.kind_of(interface) or (RestTransport if rest else JsonRpcTransport)
        http = kind(interface.url, self._http, self.timeout)
        http.auth = self._auth
        return http

    @property
    def rpc_url(self) -> str | None:
        """The URL of the interface in use (after discovery)."""
        return self.transport.url if self.transport is not None else None

    @rpc_url.setter
    def rpc_url(self, url: str | None) -> None:
        # Pointing the binding in use elsewhere (an HTTP one; a test's unreachable agent).
        if self.transport is not None and url is not None:
            self.transport.url = url

    @property
    def binding(self) -> str | None:
        """The protocol binding in use (after discovery)."""
        return self.transport.binding if self.transport is not None else None

    @property
    def streaming(self) -> bool:
        return self.card is not None and self.card.capabilities.streaming

    # --- the binding ------------------------------------------------------------------------

    async def _transport_now(self) -> Transport:
        if self.transport is None:
            await self.discover()
        assert self.transport is not None
        return self.transport

    async def call(self, method: str, params: Any) -> Any:
        """One call of an A2A operation (its request as proto JSON), over the binding the
        card offered; the answer as proto JSON, or `A2AError`. A `SendMessage` whose answer
        was lost (connection cut, timeout) is sent again with the same `messageId`, up to
        `config.max_retries` times, when this client is authenticated: the agent answers a
        retry with the task the first attempt started (an anonymous caller's would start
        another)."""
        transport = await self._transport_now()
        identified = "Authorization" in self.headers or self.credentials is not None
        retries = self.config.max_retries if method == "SendMessage" and identified else 0
        for attempt in range(retries + 1):
            try:
                return await self._call_once(transport, method, params)
            except A2AError as exc:
                lost = isinstance(exc.__cause__, aiohttp.ClientError | TimeoutError)
                if attempt == retries or not lost:
                    raise
            await asyncio.sleep(backoff_delay(attempt + 1, self.config))

    async def _call_once(self, transport: Transport, method: str, params: Any) -> Any:
        try:
            return await transport.call(method, params)
        except A2AError as exc:
            # A token we obtained was refused (expired early, keys rotated): a new one, once.
            refused = exc.code == A2ACode.AUTHENTICATION_FAILED
            if not (refused and self.credentials is not None and self.credentials.forget()):
                raise
        return await transport.call(method, params)

    async def stream(self, method: str, params: Any) -> AsyncIterator[wire.StreamResponse]:
        """A streaming call: each event as a `StreamResponse`."""
        transport = await self._transport_now()
        started = False
        try:
            async for value in transport.stream(method, params):
                started = True
                yield convert_wire(value, wire.StreamResponse)
            return
        except A2AError as exc:
            # Refused before any event: a token we obtained may be stale; a new one, once.
            refused = exc.code == A2ACode.AUTHENTICATION_FAILED and not started
            if not (refused and self.credentials is not None and self.credentials.forget()):
                raise
        async for value in transport.stream(method, params):
            yield convert_wire(value, wire.StreamResponse)

    # --- the methods of A2A v1.0 -------------------------------------------------------------

    async def send_message(
        self,
        message: wire.Message,
        *,
        configuration: wire.SendMessageConfiguration | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> wire.SendMessageResponse:
        request = wire.SendMessageRequest(
            message=message, configuration=configuration, metadata=metadata
        )
        result = await self.call("SendMessage", wire.to_builtins(request))
        return convert_wire(result, wire.SendMessageResponse)

    def send_streaming_message(
        self,
        message: wire.Message,
        *,
        configuration: wire.SendMessageConfiguration | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> AsyncIterator[wire.StreamResponse]:
        request = wire.SendMessageRequest(
            message=message, configuration=configuration, metadata=metadata
        )
        return self.stream("SendStreamingMessage", wire.to_builtins(request))

    async def get_task(self, task_id: str, *, history_length: int | None = None) -> wire.Task:
        params = wire.to_builtins(wire.GetTaskRequest(id=task_id, history_length=history_length))
        return convert_wire(await self.call("GetTask", params), wire.Task)

    async def list_tasks(
        self,
        *,
        context_id: str = "",
        status: str = "",
        page_size: int | None = None,
        page_token: str = "",
        history_length: int | None = None,
        include_artifacts: bool = False,
    ) -> wire.ListTasksResponse:
        request = wire.ListTasksRequest(
            context_id=context_id,
            status=status,
            page_size=page_size,
            page_token=page_token,
            history_length=history_length,
            include_artifacts=include_artifacts,
        )
        result = await self.call("ListTasks", wire.to_builtins(request))
        return convert_wire(result, wire.ListTasksResponse)

    async def cancel_task(
        self, task_id: str, *, metadata: dict[str, Any] | None = None
    ) -> wire.Task:
        params = wire.to_builtins(wire.CancelTaskRequest(id=task_id, metadata=metadata))
        return convert_wire(await self.call("CancelTask", params), wire.Task)

    def subscribe(self, task_id: str) -> AsyncIterator[wire.StreamResponse]:
        """`SubscribeToTask`: the task's current state first, then its live events."""
        return self.stream("SubscribeToTask", {"id": task_id})

    async def create_push_config(
        self,
        task_id: str,
        url: str,
        *,
        token: str = "",
        config_id: str = "",
        authentication: wire.AuthenticationInfo | None = None,
    ) -> wire.TaskPushNotificationConfig:
        config = wire.TaskPushNotificationConfig(
            task_id=task_id, url=url, token=token, id=config_id, authentication=authentication
        )
        result = await self.call("CreateTaskPushNotificationConfig", wire.to_builtins(config))
        created = convert_wire(result, wire.TaskPushNotificationConfig)
        # The agent chooses the id of a configuration created without one: remember it.
        self._push_ids[task_id] = created.id
        return created

    def _push_id(self, task_id: str, config_id: str) -> str:
        found = config_id or self._push_ids.get(task_id, "")
        if not found:
            raise ValueError(
                f"config_id is required: no push configuration of task {task_id} was created "
                "through this client (its id is the one CreateTaskPushNotificationConfig "
                "returned, or one ListTaskPushNotificationConfigs lists)"
            )
        return found

    async def get_push_config(
        self, task_id: str, config_id: str = ""
    ) -> wire.TaskPushNotificationConfig:
        """One push configuration (default: the last one this client created for the task)."""
        params = {"taskId": task_id, "id": self._push_id(task_id, config_id)}
        result = await self.call("GetTaskPushNotificationConfig", params)
        return convert_wire(result, wire.TaskPushNotificationConfig)

    async def list_push_configs(self, task_id: str) -> list[wire.TaskPushNotificationConfig]:
        result = await self.call("ListTaskPushNotificationConfigs", {"taskId": task_id})
        return convert_wire(result, wire.ListTaskPushNotificationConfigsResponse).configs

    async def delete_push_config(self, task_id: str, config_id: str = "") -> None:
        """Delete a push configuration (default: the last one this client created for it)."""
        params = {"taskId": task_id, "id": self._push_id(task_id, config_id)}
        await self.call("DeleteTaskPushNotificationConfig", params)
        if self._push_ids.get(task_id) == params["id"]:
            del self._push_ids[task_id]

    async def get_extended_card(self) -> wire.AgentCard:
        """The authenticated extended card, its signatures checked as the public card's are
        (with `require_signed_card`, an unsigned or badly signed one is refused)."""
        raw = wire.encode(await self.call("GetExtendedAgentCard", {}))
        card = parse_card(raw)
        if self.card_verifier is not None:
            try:
                await self.card_verifier.verify(raw)
            except CardSignatureError as exc:
                if self.require_signed_card:
                    raise
                log.warning("agent_card_unverified", agent=card.name, reason=exc.reason)
        return card

    # --- tasks as handles ---------------------------------------------------------------------

    async def send(
        self,
        payload: Mapping[str, Any] | str | None = None,
        *,
        task_type: str | None = None,
        context_id: str = "",
        references: Sequence[str] = (),
        message: wire.Message | None = None,
        push: wire.TaskPushNotificationConfig | None = None,
        stream: bool | None = None,
    ) -> A2ATaskHandle:
        """Send a message and follow the task it starts. `payload`: a mapping becomes a data
        part, a string a text part; `task_type` goes to `metadata.taskType` (a Synapse skill
        id); `references` to `referenceTaskIds`; or pass a ready `message`. `stream`: use
        `SendStreamingMessage` (default: when the card says it streams)."""
        if self.card is None:
            await self.discover()
        if message is None:
            message = user_message(payload, task_type, context_id, references=references)
        handle = A2ATaskHandle(self)
        configuration = wire.SendMessageConfiguration(task_push_notification_config=push)
        await handle.begin(message, configuration, self.streaming if stream is None else stream)
        return handle

    async def attach(self, task_id: str) -> A2ATaskHandle:
        """A handle on an existing task (its state now, then its events)."""
        if self.card is None:
            await self.discover()
        handle = A2ATaskHandle(self)
        handle.apply_response(wire.StreamResponse(task=await self.get_task(task_id)))
        if not handle.settle_if_final():
            handle.follow(None)
        return handle


class A2ATaskHandle(EventStream[A2AEvent, "A2AOutcome"]):
    """An A2A task we started: await it, iterate its events, answer it, cancel it."""

    def __init__(self, client: A2AClient) -> None:
        super().__init__()
        self.client = client
        self.task: wire.Task | None = None
        self.message: wire.Message | None = None
        self._ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._follower: asyncio.Task[None] | None = None
        #: Follow with streams (else by polling `GetTask`).
        self._streaming = client.streaming
        #: The interrupted status our last reply answered: (timestamp, message id). Until the
        #: status changes (a newer timestamp, another message), it no longer waits for us.
        self._answered: tuple[str, str] | None = None

    @property
    def task_id(self) -> str:
        return self.task.id if self.task is not None else ""

    @property
    def context_id(self) -> str:
        return self.task.context_id if self.task is not None else ""

    @property
    def state(self) -> str:
        """The task's A2A state as last seen."""
        if self.task is None:
            return wire.COMPLETED if self.message is not None else wire.SUBMITTED
        return self.task.status.state

    @property
    def status_message(self) -> wire.Message | None:
        return self.task.status.message if self.task is not None else None

    def _status_key(self) -> tuple[str, str]:
        status = self.task.status if self.task is not None else None
        if status is None:
            return ("", "")
        return (status.timestamp or "", status.message.message_id if status.message else "")

    @property
    def _stale(self) -> bool:
        """The task reports the interrupted status we already answered."""
        return self._answered is not None and self._status_key() == self._answered

    @property
    def _waiting(self) -> bool:
        """The task waits for us (INPUT_REQUIRED, or AUTH_REQUIRED): stop following it.

        After a reply, the same interrupted status does not count again: only a changed
        status (newer timestamp, or another message) is a new question."""
        return self.state in wire.INTERRUPTED_STATES and not self._stale

    @property
    def input_required(self) -> wire.Message | None:
        """What the agent asks for, while the task is INPUT_REQUIRED (and not answered)."""
        if self.state == wire.INPUT_REQUIRED and not self._stale:
            return self.status_message
        return None

    # --- outcome and events ---------------------------------------------------------------------

    def _is_last(self, event: A2AEvent) -> bool:
        return event.final or event.kind == "message"

    # --- answers ----------------------------------------------------------------------------------

    async def reply(self, payload: Mapping[str, Any] | str) -> None:
        """Send a follow-up message on this task (any content) and follow what it starts."""
        if not self.task_id:
            raise A2AError(A2ACode.UNSUPPORTED_OPERATION, "the agent answered with no task")
        if self._follower is not None and not self._follower.done():
            self._follower.cancel()
            with contextlib.suppress(asyncio.CancelledError, A2AError):
                await self._follower
        message = user_message(payload, context_id=self.context_id, task_id=self.task_id)
        configuration = wire.SendMessageConfiguration()
        if self.state in wire.INTERRUPTED_STATES:
            self._answered = self._status_key()
        await self.begin(message, configuration, self._streaming)

    async def provide_info(
        self, fields: Mapping[str, Any], notes: str | None = None, **_: Any
    ) -> None:
        """Answer INPUT_REQUIRED with the missing fields (a data part). (The keywords of
        `TaskHandle.provide_info` that say who answered are not A2A's to carry.)"""
        await self.reply(dict(fields))

    async def start_deciding(self) -> None:
        """A2A has no state for it: kept for the shape of `TaskHandle`."""

    async def decide(
        self,
        action: DecisionAction,
        *,
        approved_fields: Mapping[str, Any] | None = None,
        rejection_reason: str = "",
        notes: str = "",
        **_: Any,
    ) -> None:
        """Answer a person's decision (`{"action": "approve" | "reject", ...}`)."""
        await self.reply(
            {
                "action": action.value,
                "approved_fields": dict(approved_fields or {}),
                "rejection_reason": rejection_reason,
                "notes": notes,
            }
        )

    async def approve(self, approved_fields: Mapping[str, Any] | None = None, **kw: Any) -> None:
        await self.decide(DecisionAction.APPROVE, approved_fields=approved_fields, **kw)

    async def reject(self, reason: str = "", **kw: Any) -> None:
        await self.decide(DecisionAction.REJECT, rejection_reason=reason, **kw)

    async def cancel(self, reason: str | None = None) -> None:
        """`CancelTask`; await `result()` for the end."""
        if not self.task_id or self.settled:
            return
        metadata = {"reason": reason} if reason else None
        try:
            task = await self.client.cancel_task(self.task_id, metadata=metadata)
        except A2AError as exc:
            if exc.code != A2ACode.TASK_NOT_CANCELABLE:
                raise
            task = await self.client.get_task(self.task_id)  # it ended first
        self.apply_response(wire.StreamResponse(task=task))
        self.settle_if_final()

    # --- following the task -------------------------------------------------------------

    async def begin(
        self, message: wire.Message, configuration: wire.SendMessageConfiguration, stream: bool
    ) -> None:
        self._streaming = stream
        if stream:
            events = self.client.send_streaming_message(message, configuration=configuration)
            self.follow(events)
            # The first event names the task (or is the whole answer): errors surface here.
            await asyncio.shield(self._ready)
            return
        configuration = msgspec.structs.replace(configuration, return_immediately=True)
        response = await self.client.send_message(message, configuration=configuration)
        self.apply_response(wire.StreamResponse(task=response.task, message=response.message))
        if not self.settle_if_final() and not self._waiting:
            self.follow(None)

    def follow(self, events: AsyncIterator[wire.StreamResponse] | None) -> None:
        self._ready = asyncio.get_running_loop().create_future()
        if events is None:
            self._ready.set_result(None)
        self._follower = asyncio.create_task(self._run(events), name=f"a2a-follow-{self.task_id}")

    async def _run(self, events: AsyncIterator[wire.StreamResponse] | None) -> None:
        attempt = 0
        try:
            while True:
                if events is None:
                    if not self._streaming:
                        await self._poll()
                        return
                    events = self.client.subscribe(self.task_id)
                try:
                    async for event in events:
                        attempt = 0
                        self.apply_response(event)
                        if not self._ready.done():
                            self._ready.set_result(None)
                        if self.settle_if_final() or self._waiting:
                            return
                    if self.message is not None or self.settle_if_final():
                        return
                    if self._waiting:
                        return
                except StreamBroken as exc:
                    if not self.task_id:
                        raise
                    log.info("a2a_stream_broken", task_id=self.task_id, error=str(exc))
                except A2AError as exc:
                    if not self.task_id or exc.code != A2ACode.UNSUPPORTED_OPERATION:
                        raise
                    # Subscribing to a task that just ended: read its end instead.
                    self.apply_response(
                        wire.StreamResponse(task=await self.client.get_task(self.task_id))
                    )
                    if self.settle_if_final():
                        return
                # The stream ended before the task did: resume it (its state comes first).
                attempt += 1
                if attempt > self.client.config.max_retries + 1:
                    raise A2AError(
                        A2ACode.INTERNAL_ERROR,
                        f"lost the stream of task {self.task_id} and could not resume it",
                    )
                if attempt > 1:
                    await asyncio.sleep(backoff_delay(attempt - 1, self.client.config))
                events = None
                self.push(A2AEvent("reconnected", self.state, self.task_id, raw=None))
        except asyncio.CancelledError:
            raise
        except A2AError as exc:
            if not self._ready.done():
                self._ready.set_exception(exc)
            else:
                self.fail_with(exc)
        except Exception as exc:  # a bug or an unexpected answer must not vanish silently
            error = A2AError(A2ACode.INVALID_AGENT_RESPONSE, f"{type(exc).__name__}: {exc}")
            if not self._ready.done():
                self._ready.set_exception(error)
            else:
                self.fail_with(error)

    async def _poll(self) -> None:
        while True:
            task = await self.client.get_task(self.task_id)
            before = (self.state, len(self.task.artifacts) if self.task else 0)
            self.apply_response(
                wire.StreamResponse(task=task),
                quiet=before == (task.status.state, len(task.artifacts)),
            )
            if self.settle_if_final() or self._waiting:
                return
            await asyncio.sleep(self.client.poll_interval)

    def apply_response(self, event: wire.StreamResponse, *, quiet: bool = False) -> None:
        kind = "task"
        text, data = "", None
        if event.task is not None:
            self.task = event.task
            text, data = content_of(event.task.status.message)
        elif event.message is not None:
            kind, self.message = "message", event.message
            text, data = content_of(event.message)
        elif event.status_update is not None:
            kind = "status_update"
            update = event.status_update
            self._ensure_task(update.task_id, update.context_id)
            assert self.task is not None
            self.task.status = update.status
            text, data = content_of(update.status.message)
        elif event.artifact_update is not None:
            kind = "artifact_update"
            update2 = event.artifact_update
            self._ensure_task(update2.task_id, update2.context_id)
            assert self.task is not None
            merge_artifact(self.task, update2)
            text, data = content_parts(update2.artifact.parts)
        else:
            return
        if self.state not in wire.INTERRUPTED_STATES:
            self._answered = None  # the status moved on: the next interruption is new
        if not quiet:
            answered = self._stale and self.state in wire.INTERRUPTED_STATES
            self.push(A2AEvent(kind, self.state, self.task_id, text, data, event, answered))

    def _ensure_task(self, task_id: str, context_id: str) -> None:
        if self.task is None:
            self.task = wire.Task(
                id=task_id, context_id=context_id, status=wire.TaskStatus(state=wire.SUBMITTED)
            )

    def settle_if_final(self) -> bool:
        if self.settled:
            return True
        if self.task is None and self.message is not None:
            self.settle_with(A2AOutcome(wire.COMPLETED, None, self.message))
            return True
        if self.task is not None and wire.is_terminal(self.task.status.state):
            self.settle_with(A2AOutcome(self.task.status.state, self.task, None))
            return True
        return False

    async def close(self) -> None:
        """Stop following the task (it goes on at the agent)."""
        if self._follower is not None and not self._follower.done():
            self._follower.cancel()
            with contextlib.suppress(asyncio.CancelledError, A2AError):
                await self._follower


# --- helpers --------------------------------------------------------------------------------------


__all__ = [
    "A2AClient",
    "A2AEvent",
    "A2AOutcome",
    "A2ATaskHandle",
    "describe_failure",
    "parse_card",
    "user_message",
]
