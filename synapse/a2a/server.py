"""The A2A v1.0 server binding of a Synapse peer: its `TaskHandler` served to A2A clients.

An A2A `SendMessage` becomes a Synapse executor task in the peer's own engine, requested by a
virtual partner `a2a:<principal>` (the authenticated caller, or `a2a:anonymous`). The binding
builds the `task_request` envelope and hands it to `P2PProtocol.handle_message` in-process; the
engine's callbacks to that partner travel through the outbox as usual (in order, durably,
acknowledged) and reach `A2AServer` (via `P2PProtocol.route_local`) instead of HTTP. Each one
updates the task's A2A view — status, history, artifacts — which `GetTask` / `ListTasks`
read, streams receive as events and push configurations receive as notifications, and is
acknowledged with the `ack` / `task_ack` the engine expects. A follow-up message on the same
task answers `task_need_info` (`task_info_provided`) or `task_need_human`
(`human_decision`); `CancelTask` is a `task_cancel`. The engine's state machine, timeouts,
heartbeats and durability keep working unchanged.

Served on the peer's aiohttp app: `GET /.well-known/agent-card.json` and JSON-RPC 2.0 at
`path` (default `/a2a`). See `docs/a2a.md` for every mapping.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import json
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar
from urllib.parse import urlsplit

import msgspec
import structlog
from aiohttp import web

from synapse.a2a import mapping, wire
from synapse.a2a.card import build_card
from synapse.a2a.errors import (
    A2ACode,
    A2AError,
    invalid_params,
    task_not_found,
    unsupported,
)
from synapse.a2a.listing import store_page
from synapse.a2a.push import PUSH_PREFIX, PushAllowlist, PushSender, push_partner
from synapse.p2p.config import P2PConfig
from synapse.p2p.engine import Outgoing, Step, TaskKey, TaskRecord
from synapse.p2p.protocol import P2PProtocol
from synapse.p2p.states import Role
from synapse.types import (
    Ack,
    AckPayload,
    Capability,
    DecidedBy,
    Decision,
    DecisionAction,
    ErrorCode,
    Heartbeat,
    HeartbeatPayload,
    HumanDecision,
    HumanDecisionPayload,
    Message,
    Nack,
    NackPayload,
    Sender,
    SynapseError,
    TaskAck,
    TaskAckPayload,
    TaskCancel,
    TaskCancelPayload,
    TaskComplete,
    TaskConfirm,
    TaskContext,
    TaskFailed,
    TaskInfoProvided,
    TaskInfoProvidedPayload,
    TaskNeedHuman,
    TaskNeedInfo,
    TaskReject,
    TaskRequest,
    TaskRequestPayload,
    TaskSpec,
    TaskState,
    TaskStatusUpdate,
    TaskStatusUpdatePayload,
    new_message_id,
)
from synapse.types import build_message_now as build_message  # the wall clock: an edge
from synapse.types import build_reply_now as build_reply
from synapse.types.signing import Secret

log = structlog.get_logger("synapse.a2a")

#: Agent-id prefix of the virtual requesters that stand for A2A callers.
REQUESTER_PREFIX = "a2a:"
#: The principal of callers when the binding enforces no authentication.
ANONYMOUS = "anonymous"
#: `from.endpoint` of the in-process envelopes (they never travel over HTTP).
IN_PROCESS = "a2a://in-process"
DEFAULT_PATH = "/a2a"
DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 100
#: Where the binding keeps its own data in `task_request.context.metadata` (made durable
#: with the task): the principal, the first message and the push configurations.
CONTEXT_KEY = "a2a"

S = TypeVar("S")

#: One item of a stream subscription: (sequence number, event), or None to end it.
Queued = tuple[int, wire.StreamResponse] | None
#: A JSON-RPC method: (server, HTTP request, JSON-RPC id, principal, params) → response.
_Method = Callable[["A2AServer", web.Request, Any, str, Any], Awaitable[web.StreamResponse]]


class A2ATask:
    """The A2A view of one Synapse executor task requested over A2A."""

    def __init__(
        self,
        *,
        key: TaskKey,
        principal: str,
        context_id: str,
        task_type: str,
    ) -> None:
        self.key = key
        self.principal = principal
        self.context_id = context_id
        self.task_type = task_type
        self.state = wire.SUBMITTED
        self.status_message: wire.Message | None = None
        self.timestamp = wire.timestamp()
        self.history: list[wire.Message] = []
        self.artifacts: list[wire.Artifact] = []
        self.push: dict[str, wire.TaskPushNotificationConfig] = {}
        self.seq = 0
        self.applied: set[str] = set()
        self._subscribers: set[asyncio.Queue[Queued]] = set()

    @property
    def id(self) -> str:
        return self.key.task_id

    @property
    def ids(self) -> mapping.TaskIds:
        return {"task_id": self.id, "context_id": self.context_id}

    @property
    def is_terminal(self) -> bool:
        return wire.is_terminal(self.state)

    def status(self) -> wire.TaskStatus:
        return wire.TaskStatus(
            state=self.state, message=self.status_message, timestamp=self.timestamp
        )

    def snapshot(
        self, *, history_length: int | None = None, include_artifacts: bool = True
    ) -> wire.Task:
        history = list(self.history)
        if history_length is not None:
            history = history[-history_length:] if history_length > 0 else []
        return wire.Task(
            id=self.id,
            context_id=self.context_id,
            status=self.status(),
            artifacts=list(self.artifacts) if include_artifacts else [],
            history=history,
            metadata={"task_type": self.task_type},
        )

    # --- changes ----------------------------------------------------------------------------

    def set_status(self, state: str, message: wire.Message | None = None) -> wire.StreamResponse:
        """Move to `state` (the previous status message goes to the history)."""
        if self.status_message is not None:
            self.history.append(self.status_message)
        self.state, self.status_message, self.timestamp = state, message, wire.timestamp()
        event = wire.StreamResponse(
            status_update=wire.TaskStatusUpdateEvent(
                task_id=self.id, context_id=self.context_id, status=self.status()
            )
        )
        self.publish(event)
        return event

    def add_artifact(self, artifact: wire.Artifact) -> wire.StreamResponse:
        self.artifacts.append(artifact)
        event = wire.StreamResponse(
            artifact_update=wire.TaskArtifactUpdateEvent(
                task_id=self.id,
                context_id=self.context_id,
                artifact=artifact,
                last_chunk=True,
            )
        )
        self.publish(event)
        return event

    # --- subscribers --------------------------------------------------------------------------

    def publish(self, event: wire.StreamResponse) -> None:
        self.seq += 1
        for queue in self._subscribers:
            queue.put_nowait((self.seq, event))

    def subscribe(self) -> asyncio.Queue[Queued]:
        queue: asyncio.Queue[Queued] = asyncio.Queue()
        self._subscribers.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[Queued]) -> None:
        self._subscribers.discard(queue)

    def close_streams(self) -> None:
        for queue in self._subscribers:
            queue.put_nowait(None)


class A2AServer:
    """The A2A binding of one peer: agent card, JSON-RPC methods, streams, push notifications.

    Make it with `enable_a2a(peer, ...)` (before `peer.start()`), or by hand: `bind(protocol)`
    once the runtime exists and `add_routes(app)` on the aiohttp app that serves.
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
    ) -> None:
        if not path.startswith("/"):
            raise ValueError("the JSON-RPC path must start with '/'")
        self.capabilities = capabilities
        self.config = config or P2PConfig()
        self.default_task_type = default_task_type
        self.allowlist = PushAllowlist(push_allowlist)
        self.tokens = dict(tokens or {})
        self.path = path
        self._public_url = public_url
        self.name = name
        self.description = description
        self.version = version
        self.provider = provider
        self.documentation_url = documentation_url
        self.keepalive = keepalive
        self.pusher = PushSender(self, self.config, secret=push_secret)
        self.tasks: dict[str, A2ATask] = {}
        self._protocol: P2PProtocol | None = None
        self._rebuilt = False
        self._streams: set[asyncio.Task[Any]] = set()

    # --- wiring -------------------------------------------------------------------------------

    @property
    def protocol(self) -> P2PProtocol:
        if self._protocol is None:
            raise A2AError(A2ACode.AGENT_NOT_READY, "the agent is starting", {"reason": "starting"})
        return self._protocol

    def bind(self, protocol: P2PProtocol) -> None:
        """Route the virtual partners' messages to this binding (before tasks are restored)."""
        self._protocol = protocol
        self._rebuilt = False
        protocol.route_local(REQUESTER_PREFIX, _RequesterSink(self))
        protocol.route_local(PUSH_PREFIX, self.pusher)

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get(wire.AGENT_CARD_PATH, self.handle_card)
        app.router.add_post(self.path, self.handle_rpc)
        app.on_shutdown.append(self._on_shutdown)
        app.on_cleanup.append(self._on_cleanup)

    async def _on_shutdown(self, _app: web.Application) -> None:
        for task in self.tasks.values():
            task.close_streams()

    async def _on_cleanup(self, _app: web.Application) -> None:
        await self.pusher.close()

    @property
    def url(self) -> str:
        """The JSON-RPC URL (the card's interface URL)."""
        base = self._public_url() if callable(self._public_url) else self._public_url
        if base is None and self._protocol is not None:
            parts = urlsplit(self._protocol.engine.endpoint)
            base = f"{parts.scheme}://{parts.netloc}"
        if base is None:
            raise A2AError(A2ACode.AGENT_NOT_READY, "the agent is starting", {"reason": "starting"})
        return base.rstrip("/") + self.path

    @property
    def push_enabled(self) -> bool:
        return bool(self.allowlist)

    def card(self) -> wire.AgentCard:
        caps = [c if isinstance(c, Capability) else Capability(name=c) for c in self.capabilities()]
        return build_card(
            caps,
            name=self.name,
            description=self.description,
            url=self.url,
            version=self.version,
            default_task_type=self.default_task_type,
            push_notifications=self.push_enabled,
            bearer=bool(self.tokens),
            provider=self.provider,
            documentation_url=self.documentation_url,
        )

    # --- HTTP ---------------------------------------------------------------------------------

    async def handle_card(self, request: web.Request) -> web.Response:
        try:
            card = self.card()
        except A2AError:
            return web.Response(status=503, text="starting", headers={"Retry-After": "1"})
        return web.Response(
            body=wire.encode(card),
            content_type="application/json",
            headers={"Cache-Control": "no-cache"},
        )

    async def handle_rpc(self, request: web.Request) -> web.StreamResponse:
        rpc_id: str | int | None = None
        try:
            principal = self._authenticate(request)
            body = await self._read_json(request)
            rpc_id = _rpc_id(body)
            method, params = _parse_rpc(body)
            handler = self._methods.get(method)
            if handler is None:
                raise A2AError(A2ACode.METHOD_NOT_FOUND, f"Method {method!r} not found")
            _check_version(request)
            return await handler(self, request, rpc_id, principal, params)
        except A2AError as exc:
            if exc.code in (A2ACode.INTERNAL_ERROR, A2ACode.AGENT_NOT_READY):
                log.warning("a2a_error", code=exc.code, message=exc.message)
            else:
                log.info("a2a_refused", code=exc.code, message=exc.message)
            return _error_response(rpc_id, exc)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # never a bare 500 or a traceback
            log.exception("a2a_internal_error", error=repr(exc))
            return _error_response(rpc_id, A2AError(A2ACode.INTERNAL_ERROR, "internal error"))

    def _authenticate(self, request: web.Request) -> str:
        if not self.tokens:
            return ANONYMOUS
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        principal: str | None = None
        if scheme.lower() == "bearer" and token:
            given = token.strip().encode("utf-8", "backslashreplace")
            for candidate, name in self.tokens.items():
                # No early exit: the time taken does not tell which token matched.
                if hmac.compare_digest(given, candidate.encode("utf-8")):
                    principal = name
        if principal is None:
            raise A2AError(
                A2ACode.AUTHENTICATION_FAILED,
                "a valid bearer token is required (see the agent card's securitySchemes)",
                http_status=401,
            )
        return principal

    async def _read_json(self, request: web.Request) -> Any:
        limit = self.config.max_body_size
        if request.content_length is not None and request.content_length > limit:
            raise A2AError(A2ACode.INVALID_REQUEST, "Payload too large")
        raw = bytearray()
        async for chunk in request.content.iter_chunked(65536):
            raw += chunk
            if len(raw) > limit:
                raise A2AError(A2ACode.INVALID_REQUEST, "Payload too large")
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise A2AError(A2ACode.PARSE_ERROR, f"Parse error: {exc}") from None

    # --- JSON-RPC methods -----------------------------------------------------------------------

    async def _send_message(
        self, request: web.Request, rpc_id: Any, principal: str, params: Any
    ) -> web.StreamResponse:
        req = _convert(params, wire.SendMessageRequest)
        configuration = req.configuration or wire.SendMessageConfiguration()
        _check_history_length(configuration.history_length)
        view, queue = await self.submit(req, principal)
        try:
            if not configuration.return_immediately:
                while not wire.ends_stream(view.state):
                    if await queue.get() is None:
                        break
        finally:
            view.unsubscribe(queue)
        task = view.snapshot(history_length=configuration.history_length)
        return _result(rpc_id, wire.SendMessageResponse(task=task))

    async def _send_streaming_message(
        self, request: web.Request, rpc_id: Any, principal: str, params: Any
    ) -> web.StreamResponse:
        req = _convert(params, wire.SendMessageRequest)
        configuration = req.configuration or wire.SendMessageConfiguration()
        _check_history_length(configuration.history_length)
        view, queue = await self.submit(req, principal)
        # The snapshot holds every event published so far: the stream goes on after them.
        first = view.snapshot(history_length=configuration.history_length)
        return await self._stream(request, rpc_id, view, queue, first, view.seq, end_on_first=True)

    async def _subscribe_to_task(
        self, request: web.Request, rpc_id: Any, principal: str, params: Any
    ) -> web.StreamResponse:
        req = _convert(params, wire.SubscribeToTaskRequest)
        view = self._owned(req.id, principal)
        if view.is_terminal:
            raise unsupported(f"Task {view.id} is in terminal state: {view.state}", taskId=view.id)
        # Subscribe and take the snapshot in one step: nothing falls between them.
        queue = view.subscribe()
        first = view.snapshot()
        return await self._stream(request, rpc_id, view, queue, first, view.seq, end_on_first=False)

    async def _get_task(
        self, request: web.Request, rpc_id: Any, principal: str, params: Any
    ) -> web.StreamResponse:
        req = _convert(params, wire.GetTaskRequest)
        _check_history_length(req.history_length)
        view = self._owned(req.id, principal)
        return _result(rpc_id, view.snapshot(history_length=req.history_length))

    async def _list_tasks(
        self, request: web.Request, rpc_id: Any, principal: str, params: Any
    ) -> web.StreamResponse:
        req = _convert(params, wire.ListTasksRequest)
        _check_history_length(req.history_length)
        page_size = DEFAULT_PAGE_SIZE if req.page_size is None else req.page_size
        if not 1 <= page_size <= MAX_PAGE_SIZE:
            raise invalid_params(f"pageSize must be from 1 to {MAX_PAGE_SIZE}", path="pageSize")
        if req.status and req.status != wire.UNSPECIFIED and req.status not in wire.TASK_STATES:
            raise invalid_params(f"unknown task state {req.status!r}", path="status")
        after: datetime | None = None
        if req.status_timestamp_after:
            try:
                after = wire.parse_timestamp(req.status_timestamp_after)
            except ValueError:
                raise invalid_params(
                    "statusTimestampAfter is not an RFC 3339 time", path="statusTimestampAfter"
                ) from None
        if self.protocol.store.durable and not req.context_id:
            # Through the store's indexes, one page at a time (synapse/a2a/listing.py).
            return _result(rpc_id, store_page(self, req, principal, page_size, after))
        views = [v for v in self._all() if v.principal == principal]
        if req.context_id:
            views = [v for v in views if v.context_id == req.context_id]
        if req.status and req.status != wire.UNSPECIFIED:
            views = [v for v in views if v.state == req.status]
        if after is not None:
            views = [v for v in views if wire.parse_timestamp(v.timestamp) >= after]
        views.sort(key=lambda v: (v.timestamp, v.id), reverse=True)
        total = len(views)
        if req.page_token:
            cursor = _decode_cursor(req.page_token)
            views = [v for v in views if (v.timestamp, v.id) < cursor]
        page, rest = views[:page_size], views[page_size:]
        token = _encode_cursor(page[-1].timestamp, page[-1].id) if rest and page else ""
        tasks = [
            v.snapshot(history_length=req.history_length, include_artifacts=req.include_artifacts)
            for v in page
        ]
        response = wire.ListTasksResponse(
            tasks=tasks, next_page_token=token, page_size=page_size, total_size=total
        )
        return _result(rpc_id, response)

    async def _cancel_task(
        self, request: web.Request, rpc_id: Any, principal: str, params: Any
    ) -> web.StreamResponse:
        req = _convert(params, wire.CancelTaskRequest)
        view = self._owned(req.id, principal)
        return _result(rpc_id, await self.cancel(view, req.metadata))

    async def _create_push_config(
        self, request: web.Request, rpc_id: Any, principal: str, params: Any
    ) -> web.StreamResponse:
        req = _convert(params, wire.TaskPushNotificationConfig)
        if not req.task_id:
            raise invalid_params("taskId is required", path="taskId")
        view = self._owned(req.task_id, principal)
        config = self._check_push(req, view.id)
        view.push[config.id] = config
        await self._persist(view)
        return _result(rpc_id, config)

    async def _get_push_config(
        self, request: web.Request, rpc_id: Any, principal: str, params: Any
    ) -> web.StreamResponse:
        req = _convert(params, wire.TaskPushConfigRef)
        self._require_push()
        view = self._owned(req.task_id, principal)
        config = view.push.get(req.id or view.id)
        if config is None:
            raise A2AError(
                A2ACode.TASK_NOT_FOUND,
                f"no push notification config {req.id!r} for task {view.id}",
                {"taskId": view.id, "configId": req.id},
            )
        return _result(rpc_id, config)

    async def _list_push_configs(
        self, request: web.Request, rpc_id: Any, principal: str, params: Any
    ) -> web.StreamResponse:
        req = _convert(params, wire.ListTaskPushNotificationConfigsRequest)
        self._require_push()
        view = self._owned(req.task_id, principal)
        configs = list(view.push.values())
        return _result(rpc_id, wire.ListTaskPushNotificationConfigsResponse(configs=configs))

    async def _delete_push_config(
        self, request: web.Request, rpc_id: Any, principal: str, params: Any
    ) -> web.StreamResponse:
        req = _convert(params, wire.TaskPushConfigRef)
        self._require_push()
        view = self._owned(req.task_id, principal)
        if view.push.pop(req.id or view.id, None) is not None:
            await self._persist(view)
        return _result(rpc_id, None)

    async def _get_extended_card(
        self, request: web.Request, rpc_id: Any, principal: str, params: Any
    ) -> web.StreamResponse:
        _convert(params, wire.GetExtendedAgentCardRequest)
        if not self.tokens:
            raise unsupported("The agent does not support authenticated extended cards")
        # The caller is authenticated: the extended card is the full card.
        return _result(rpc_id, self.card())

    _methods: Mapping[str, _Method] = {
        "SendMessage": _send_message,
        "SendStreamingMessage": _send_streaming_message,
        "GetTask": _get_task,
        "ListTasks": _list_tasks,
        "CancelTask": _cancel_task,
        "SubscribeToTask": _subscribe_to_task,
        "CreateTaskPushNotificationConfig": _create_push_config,
        "GetTaskPushNotificationConfig": _get_push_config,
        "ListTaskPushNotificationConfigs": _list_push_configs,
        "DeleteTaskPushNotificationConfig": _delete_push_config,
        "GetExtendedAgentCard": _get_extended_card,
    }

    # --- streams --------------------------------------------------------------------------------

    async def _stream(
        self,
        request: web.Request,
        rpc_id: Any,
        view: A2ATask,
        queue: asyncio.Queue[Queued],
        first: wire.Task,
        after: int,
        *,
        end_on_first: bool,
    ) -> web.StreamResponse:
        """Server-sent events: `first` (the task now), then every later event of the task,
        until one reports a terminal or interrupted state."""
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-store",
                "X-Accel-Buffering": "no",
            }
        )
        try:
            await response.prepare(request)
            await _write_event(response, rpc_id, wire.StreamResponse(task=first))
            if end_on_first and wire.ends_stream(first.status.state):
                return response
            while True:
                try:
                    item = await asyncio.wait_for(queue.get(), self.keepalive)
                except TimeoutError:
                    await response.write(b": keepalive\n\n")
                    continue
                if item is None:
                    break
                seq, event = item
                if seq <= after:
                    continue  # already in the snapshot
                await _write_event(response, rpc_id, event)
                state = event.state
                if state is not None and wire.ends_stream(state):
                    break
        except (ConnectionResetError, ConnectionError):
            log.info("a2a_stream_closed_by_client", task_id=view.id)
        finally:
            view.unsubscribe(queue)
        return response

    # --- tasks ------------------------------------------------------------------------------------

    def _envelope(self, cls: type[S], payload: Any, principal: str) -> S:
        sender = Sender(agent_id=REQUESTER_PREFIX + principal, endpoint=IN_PROCESS)
        message: Any = build_message(
            cls,  # type: ignore[type-var]
            payload,
            sender=sender,
            to=self.protocol.engine.agent_id,
        )
        result: S = message
        return result

    async def submit(
        self, req: wire.SendMessageRequest, principal: str
    ) -> tuple[A2ATask, asyncio.Queue[Queued]]:
        """Start a task, or continue one (`message.taskId`); return its view (its state the
        answer to this message) and a subscription to its later events."""
        message = req.message
        if message.task_id:
            return await self._follow_up(req, principal)
        protocol = self.protocol
        task_type = mapping.task_type_of(message, self.default_task_type)
        payload = mapping.payload_of(message)
        configuration = req.configuration or wire.SendMessageConfiguration()
        push = configuration.task_push_notification_config
        task_id = mapping.new_id()
        context_id = message.context_id or mapping.new_id()
        if push is not None:
            push = self._check_push(push, task_id)
        first = msgspec.structs.replace(message, task_id=task_id, context_id=context_id)
        partner = REQUESTER_PREFIX + principal
        view = A2ATask(
            key=TaskKey(partner, task_id),
            principal=principal,
            context_id=context_id,
            task_type=task_type,
        )
        view.history.append(first)
        if push is not None:
            view.push[push.id] = push
        context = TaskContext(
            session_id=context_id,
            metadata={CONTEXT_KEY: self._context_data(view)},
        )
        spec = TaskSpec(id=task_id, type=task_type, payload=payload)
        envelope = self._envelope(
            TaskRequest, TaskRequestPayload(task=spec, context=context), principal
        )
        self.tasks[task_id] = view
        queue = view.subscribe()
        try:
            reply = await protocol.handle_message(envelope)
        except SynapseError as exc:
            view.unsubscribe(queue)
            del self.tasks[task_id]
            raise _from_synapse(exc, task_id) from None
        self._apply_decision(view, reply)
        log.info(
            "a2a_task",
            task_id=task_id,
            context_id=context_id,
            task_type=task_type,
            principal=principal,
            state=view.state,
        )
        return view, queue

    def _apply_decision(self, view: A2ATask, reply: Message) -> None:
        ids = view.ids
        if isinstance(reply, TaskReject):
            view.set_status(wire.REJECTED, mapping.reject_message(reply.payload, **ids))
            self._push(
                view, self._synthetic(view, TaskState.REJECTED, reply.payload.reason.message)
            )
        elif isinstance(reply, TaskNeedInfo):
            view.set_status(wire.INPUT_REQUIRED, mapping.need_info_message(reply.payload, **ids))
            self._push(view, reply)
        elif isinstance(reply, TaskConfirm):
            pass  # SUBMITTED already; `executing` follows as a callback

    async def _follow_up(
        self, req: wire.SendMessageRequest, principal: str
    ) -> tuple[A2ATask, asyncio.Queue[Queued]]:
        message = req.message
        view = self._owned(message.task_id, principal)
        if message.context_id and message.context_id != view.context_id:
            raise invalid_params(
                f"Context {message.context_id} does not match context {view.context_id} "
                f"of task {view.id}",
                path="message.contextId",
            )
        if view.is_terminal:
            raise unsupported(f"Task {view.id} is in terminal state: {view.state}", taskId=view.id)
        rec = self._record(view)
        envelope: Message
        if rec.state is TaskState.INFO_NEEDED:
            fields = mapping.info_fields(message, rec.need_info)
            payload = TaskInfoProvidedPayload(task_id=view.id, fields=fields)
            envelope = self._envelope(TaskInfoProvided, payload, principal)
        elif rec.state in (TaskState.NEED_HUMAN, TaskState.HUMAN_DECIDING):
            approve, fields, reason, notes = mapping.decision_of(message)
            if rec.need_human_id is None:
                raise unsupported(f"Task {view.id} has no pending decision", taskId=view.id)
            decision = HumanDecisionPayload(
                task_id=view.id,
                decision_id=f"dec-{new_message_id()[4:]}",
                reply_to=rec.need_human_id,
                decided_by=DecidedBy(user_id=principal),
                decision=Decision(
                    action=DecisionAction.APPROVE if approve else DecisionAction.REJECT,
                    approved_fields=fields,
                    rejection_reason=reason,
                ),
                notes=notes,
                timestamp=datetime.now(UTC),
            )
            envelope = self._envelope(HumanDecision, decision, principal)
        else:
            raise unsupported(
                f"Task {view.id} is not waiting for input (state {view.state})", taskId=view.id
            )
        view.history.append(
            msgspec.structs.replace(message, task_id=view.id, context_id=view.context_id)
        )
        queue = view.subscribe()
        try:
            reply = await self.protocol.handle_message(envelope)
        except SynapseError as exc:
            view.unsubscribe(queue)
            raise _from_synapse(exc, view.id) from None
        if isinstance(reply, TaskAck) and not view.is_terminal:
            state = reply.payload.state
            ids = view.ids
            if state is TaskState.HUMAN_REJECTED:
                # The engine fails the task (permission_denied) as it acknowledges: say so
                # now, the task_failed callback that follows only confirms it.
                rec = self._record(view)
                if rec.error is not None:
                    view.set_status(wire.FAILED, mapping.error_message(rec.error, **ids))
            elif not state.is_final:
                view.set_status(mapping.a2a_state(state))
        return view, queue

    async def cancel(self, view: A2ATask, metadata: Mapping[str, Any] | None = None) -> wire.Task:
        if view.is_terminal:
            raise A2AError(
                A2ACode.TASK_NOT_CANCELABLE,
                f"Task {view.id} is in terminal state: {view.state}",
                {"taskId": view.id},
            )
        reason = (metadata or {}).get("reason")
        payload = TaskCancelPayload(task_id=view.id, reason=str(reason) if reason else None)
        envelope = self._envelope(TaskCancel, payload, view.principal)
        try:
            await self.protocol.handle_message(envelope)
        except SynapseError as exc:
            if exc.code is ErrorCode.TASK_ALREADY_COMPLETED:
                raise A2AError(
                    A2ACode.TASK_NOT_CANCELABLE,
                    f"Task {view.id} already finished",
                    {"taskId": view.id},
                ) from None
            raise _from_synapse(exc, view.id) from None
        if not view.is_terminal:
            text = f"cancelled: {reason}" if reason else "cancelled"
            message = mapping.agent_message(text, task_id=view.id, context_id=view.context_id)
            view.set_status(wire.CANCELED, message)
            self._push(view, self._synthetic(view, TaskState.CANCELLED, text))
        return view.snapshot()

    # --- callbacks from the engine (the virtual requester) ----------------------------------

    def on_callback(self, partner: str, message: Message) -> Message:
        """Apply one callback of the engine to the task's A2A view; return the reply."""
        me = Sender(agent_id=partner, endpoint=IN_PROCESS)
        if isinstance(message, Heartbeat):
            payload = HeartbeatPayload(active_tasks=0)
            return build_reply(Heartbeat, payload, request=message, sender=me)
        task_id: Any = getattr(message.payload, "task_id", None)
        view = self._find(task_id) if isinstance(task_id, str) else None
        if view is None or view.key.requester != partner:
            log.warning("a2a_callback_unknown_task", task_id=task_id, type=message.type.value)
            nack = NackPayload(
                code=ErrorCode.TASK_NOT_FOUND.value, message=f"no A2A task {task_id!r}"
            )
            return build_reply(Nack, nack, request=message, sender=me)
        if message.id not in view.applied:
            view.applied.add(message.id)
            if view.state != wire.CANCELED:
                if not view.is_terminal:
                    self._apply_callback(view, message)
                self._push(view, message)
        if isinstance(message, TaskComplete | TaskFailed):
            state = TaskState.COMPLETED if isinstance(message, TaskComplete) else TaskState.FAILED
            ack = TaskAckPayload(task_id=view.id, state=state)
            return build_reply(TaskAck, ack, request=message, sender=me)
        return build_reply(Ack, AckPayload(), request=message, sender=me)

    def _apply_callback(self, view: A2ATask, message: Message) -> None:
        ids = view.ids
        if isinstance(message, TaskStatusUpdate):
            update = message.payload
            text = update.message
            data: dict[str, Any] = {}
            if update.progress is not None:
                data["progress"] = update.progress
                text = text or f"{update.progress}%"
            if update.intermediate_result is not None:
                data["intermediate_result"] = update.intermediate_result
            status_message = (
                mapping.agent_message(text, data if data else msgspec.UNSET, **ids)
                if text or data
                else None
            )
            state = mapping.a2a_state(update.status)
            view.set_status(state if not wire.is_terminal(state) else wire.WORKING, status_message)
        elif isinstance(message, TaskNeedInfo):
            view.set_status(wire.INPUT_REQUIRED, mapping.need_info_message(message.payload, **ids))
        elif isinstance(message, TaskNeedHuman):
            view.set_status(wire.INPUT_REQUIRED, mapping.need_human_message(message.payload, **ids))
        elif isinstance(message, TaskComplete):
            done = message.payload
            view.add_artifact(
                mapping.result_artifact(done.result, name=view.task_type, summary=done.summary)
            )
            summary = mapping.agent_message(done.summary, **ids) if done.summary else None
            view.set_status(wire.COMPLETED, summary)
        elif isinstance(message, TaskFailed):
            view.set_status(wire.FAILED, mapping.error_message(message.payload.error, **ids))

    # --- push notifications -----------------------------------------------------------------

    def _require_push(self) -> None:
        if not self.push_enabled:
            raise A2AError(
                A2ACode.PUSH_NOTIFICATION_NOT_SUPPORTED,
                "Push notifications are not enabled on this agent (no allowed URLs)",
            )

    def _check_push(
        self, config: wire.TaskPushNotificationConfig, task_id: str
    ) -> wire.TaskPushNotificationConfig:
        self._require_push()
        if not self.allowlist.allows(config.url):
            raise invalid_params(
                "Invalid push notification URL: not allowed by this agent's operator",
                path="url",
                reason="push_url_not_allowed",
            )
        return msgspec.structs.replace(config, task_id=task_id, id=config.id or task_id)

    def _synthetic(self, view: A2ATask, state: TaskState, text: str) -> TaskStatusUpdate:
        """A status message standing for what no callback carries (a reject, a cancel)."""
        payload = TaskStatusUpdatePayload(task_id=view.id, status=state, message=text)
        message: TaskStatusUpdate = build_message(
            TaskStatusUpdate,
            payload,
            sender=self.protocol.engine.sender,
            to=view.key.requester,
        )
        return message

    def _push(self, view: A2ATask, message: Message) -> None:
        """Queue `message` in the outbox once per push configuration of the task."""
        if not view.push or self._protocol is None:
            return
        outgoing = []
        for config_id in view.push:
            partner = push_partner(view.id, config_id)
            copy = build_message(
                type(message),
                message.payload,
                sender=self._protocol.engine.sender,
                to=partner,
            )
            outgoing.append(Outgoing(partner, copy, TaskKey(partner, view.id)))
        self._protocol.apply(Step(outgoing=outgoing))

    def push_target(
        self, partner: str, message: Message
    ) -> tuple[wire.TaskPushNotificationConfig, wire.StreamResponse] | None:
        """The configuration `partner` stands for, and the notification `message` becomes."""
        task_id: Any = getattr(message.payload, "task_id", None)
        if not isinstance(task_id, str):
            return None
        view = self._find(task_id)
        prefix = push_partner(task_id, "")
        if view is None or not partner.startswith(prefix):
            return None
        config = view.push.get(partner[len(prefix) :])
        if config is None:
            return None
        return config, self._notification(view, message)

    def _notification(self, view: A2ATask, message: Message) -> wire.StreamResponse:
        ids = view.ids
        if isinstance(message, TaskComplete | TaskFailed):
            return wire.StreamResponse(task=view.snapshot())
        if isinstance(message, TaskStatusUpdate) and message.payload.status.is_final:
            return wire.StreamResponse(task=view.snapshot())
        status: wire.TaskStatus
        if isinstance(message, TaskNeedInfo):
            status = wire.TaskStatus(
                state=wire.INPUT_REQUIRED,
                message=mapping.need_info_message(message.payload, **ids),
            )
        elif isinstance(message, TaskNeedHuman):
            status = wire.TaskStatus(
                state=wire.INPUT_REQUIRED,
                message=mapping.need_human_message(message.payload, **ids),
            )
        elif isinstance(message, TaskStatusUpdate):
            update = message.payload
            text = update.message or (f"{update.progress}%" if update.progress is not None else "")
            data: Any = (
                {"progress": update.progress} if update.progress is not None else msgspec.UNSET
            )
            status = wire.TaskStatus(
                state=mapping.a2a_state(update.status),
                message=mapping.agent_message(text, data, **ids) if text else None,
            )
        else:
            status = view.status()
        status.timestamp = wire.timestamp(message.timestamp)
        return wire.StreamResponse(
            status_update=wire.TaskStatusUpdateEvent(
                task_id=view.id, context_id=view.context_id, status=status
            )
        )

    # --- lookup, durability -----------------------------------------------------------------

    def _record(self, view: A2ATask) -> TaskRecord:
        rec = self.protocol.engine.get(view.key)
        if rec is None:
            raise task_not_found(view.id)
        return rec

    def _owned(self, task_id: str, principal: str) -> A2ATask:
        view = self.tasks.get(task_id)
        if view is None and self._protocol is not None and self._protocol.store.durable:
            # One lookup by key in the store, not a rebuild of every task it keeps.
            rec = self._protocol.engine.get(TaskKey(REQUESTER_PREFIX + principal, task_id))
            if rec is not None and rec.role is Role.EXECUTOR:
                view = self._rebuild(rec)
                if not view.is_terminal:
                    self.tasks[task_id] = view  # callbacks will move it on
        if view is None:
            view = self._find(task_id)
        if view is None or view.principal != principal:
            raise task_not_found(task_id)
        return view

    def _find(self, task_id: str) -> A2ATask | None:
        view = self.tasks.get(task_id)
        if view is None and not self._rebuilt:
            self._rebuild_all()
            view = self.tasks.get(task_id)
        return view

    def _all(self) -> list[A2ATask]:
        if not self._rebuilt:
            self._rebuild_all()
        return list(self.tasks.values())

    def _rebuild_all(self) -> None:
        """Views of the A2A tasks the store kept (after a restart): from their records."""
        if self._protocol is None:
            return
        self._rebuilt = True
        # In flight and finished alike: finished tasks live in the store, not the engine.
        engine = self._protocol.engine
        for name in self._protocol.list_tasks():
            requester, _, task_id = name.partition("/")
            if not requester.startswith(REQUESTER_PREFIX):
                continue
            rec = engine.get(TaskKey(requester, task_id))
            if (
                rec is not None
                and rec.role is Role.EXECUTOR
                and rec.partner.startswith(REQUESTER_PREFIX)
                and rec.task_id not in self.tasks
            ):
                self.tasks[rec.task_id] = self._rebuild(rec)

    def _rebuild(self, rec: TaskRecord) -> A2ATask:
        meta: dict[str, Any] = {}
        if rec.context is not None:
            found = rec.context.metadata.get(CONTEXT_KEY)
            meta = found if isinstance(found, dict) else {}
        context_id = (rec.context.session_id if rec.context else None) or mapping.new_id()
        view = A2ATask(
            key=rec.key,
            principal=rec.partner[len(REQUESTER_PREFIX) :],
            context_id=context_id,
            task_type=rec.task.type,
        )
        try:
            first = msgspec.convert(meta.get("message"), wire.Message)
            view.history.append(first)
        except msgspec.ValidationError:
            pass
        for raw in meta.get("push") or []:
            try:
                config = msgspec.convert(raw, wire.TaskPushNotificationConfig)
            except msgspec.ValidationError:
                continue
            view.push[config.id] = config
        ids = view.ids
        view.state = mapping.a2a_state(rec.state)
        if rec.result is not None:
            view.artifacts.append(mapping.result_artifact(rec.result, name=view.task_type))
        if rec.state is TaskState.INFO_NEEDED and rec.need_info is not None:
            view.status_message = mapping.need_info_message(rec.need_info, **ids)
        elif rec.state is TaskState.NEED_HUMAN and rec.need_human is not None:
            view.status_message = mapping.need_human_message(rec.need_human, **ids)
        elif rec.error is not None and view.is_terminal:
            view.status_message = mapping.error_message(rec.error, **ids)
        elif rec.reject is not None:
            view.status_message = mapping.reject_message(rec.reject, **ids)
        view.timestamp = wire.timestamp(datetime.fromtimestamp(rec.updated_at or time.time(), UTC))
        return view

    def _context_data(self, view: A2ATask) -> dict[str, Any]:
        return {
            "principal": view.principal,
            "message": wire.to_builtins(view.history[0]) if view.history else None,
            "push": [wire.to_builtins(c) for c in view.push.values()],
        }

    async def _persist(self, view: A2ATask) -> None:
        """Keep the view's push configurations with the task's record (durably)."""
        rec = self.protocol.engine.get(view.key)
        if rec is None or rec.context is None:
            return
        metadata = {**rec.context.metadata, CONTEXT_KEY: self._context_data(view)}
        rec.context = msgspec.structs.replace(rec.context, metadata=metadata)
        self.protocol.store.put_task(rec, [])
        await self.protocol.commit()


class _RequesterSink:
    """The `CallbackSender` for `a2a:` partners: the engine's callbacks end here."""

    def __init__(self, server: A2AServer) -> None:
        self.server = server

    async def send_callback(self, partner: str, message: Message, *, retry: bool = True) -> Message:
        return self.server.on_callback(partner, message)


# --- JSON-RPC plumbing ----------------------------------------------------------------------------


def _rpc_id(body: Any) -> str | int | None:
    """The request's id if it is a valid one (errors answer it), else None."""
    raw = body.get("id") if isinstance(body, dict) else None
    if isinstance(raw, str) or (isinstance(raw, int) and not isinstance(raw, bool)):
        return raw
    return None


def _parse_rpc(body: Any) -> tuple[str, dict[str, Any]]:
    """(method, params) of a JSON-RPC 2.0 request, or the -32600 / -32602 error."""
    if isinstance(body, list):
        raise A2AError(A2ACode.INVALID_REQUEST, "Batch requests are not supported")
    if not isinstance(body, dict):
        raise A2AError(A2ACode.INVALID_REQUEST, "Invalid Request: not a JSON-RPC object")
    if body.get("id") is not None and _rpc_id(body) is None:
        raise A2AError(
            A2ACode.INVALID_REQUEST, "Invalid request: id must be a string, integer, or null"
        )
    if body.get("jsonrpc") != "2.0":
        raise A2AError(A2ACode.INVALID_REQUEST, "Invalid request: 'jsonrpc' must be exactly '2.0'")
    method = body.get("method")
    if not isinstance(method, str) or not method:
        raise A2AError(A2ACode.INVALID_REQUEST, "Method is required")
    params = body.get("params")
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise invalid_params("params must be an object", path="params")
    return method, params


def _check_version(request: web.Request) -> None:
    given = request.headers.get(wire.VERSION_HEADER, "").strip()
    version = given or wire.VERSION_WITHOUT_HEADER
    if wire.major(version) != 1:
        told = f"A2A-Version {given!r}" if given else "no A2A-Version header (that is A2A 0.3)"
        raise A2AError(
            A2ACode.VERSION_NOT_SUPPORTED,
            f"{told} is not supported: this agent speaks A2A {wire.PROTOCOL_VERSION} only; "
            f"send '{wire.VERSION_HEADER}: {wire.PROTOCOL_VERSION}'",
            {"supportedVersions": wire.PROTOCOL_VERSION, "requestedVersion": version},
        )


def _convert(params: Any, cls: type[S]) -> S:
    try:
        return msgspec.convert(params, cls)
    except msgspec.ValidationError as exc:
        raise invalid_params(f"Invalid params: {exc}") from None


def _check_history_length(value: int | None) -> None:
    if value is not None and value < 0:
        raise invalid_params("history length must be non-negative", path="historyLength")


def _encode_cursor(stamp: str, task_id: str) -> str:
    raw = json.dumps({"ts": stamp, "id": task_id}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(token: str) -> tuple[str, str]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except (binascii.Error, ValueError):
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("ts"), str):
        raise invalid_params("pageToken is not a token this agent issued", path="pageToken")
    if not isinstance(data.get("id"), str):
        raise invalid_params("pageToken is not a token this agent issued", path="pageToken")
    return data["ts"], data["id"]


def _from_synapse(exc: SynapseError, task_id: str) -> A2AError:
    """A Synapse refusal of an in-process message, as an A2A error."""
    meta = {"synapseCode": exc.code.value, "taskId": task_id}
    if exc.code is ErrorCode.AGENT_NOT_READY:
        return A2AError(A2ACode.AGENT_NOT_READY, exc.message, meta)
    if exc.code is ErrorCode.TASK_NOT_FOUND:
        return A2AError(A2ACode.TASK_NOT_FOUND, exc.message, meta)
    if exc.code is ErrorCode.TASK_ALREADY_COMPLETED:
        return A2AError(A2ACode.UNSUPPORTED_OPERATION, f"Task {task_id} already finished", meta)
    if exc.code is ErrorCode.INVALID_PARAMS and (exc.details or {}).get("state"):
        return A2AError(A2ACode.UNSUPPORTED_OPERATION, exc.message, meta)
    if exc.code in (ErrorCode.INVALID_PARAMS, ErrorCode.MESSAGE_FORMAT_INVALID):
        return A2AError(A2ACode.INVALID_PARAMS, exc.message, meta)
    return A2AError(A2ACode.INTERNAL_ERROR, exc.message, meta)


def _jsonrpc(rpc_id: Any, *, result: Any = None, error: A2AError | None = None) -> bytes:
    body: dict[str, Any] = {"jsonrpc": "2.0", "id": rpc_id}
    if error is not None:
        body["error"] = error.to_json()
    else:
        body["result"] = result
    return wire.encode(body)


def _result(rpc_id: Any, result: Any) -> web.Response:
    return web.Response(body=_jsonrpc(rpc_id, result=result), content_type="application/json")


def _error_response(rpc_id: Any, error: A2AError) -> web.Response:
    headers = {}
    if error.http_status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="a2a"'
    return web.Response(
        status=error.http_status,
        body=_jsonrpc(rpc_id, error=error),
        content_type="application/json",
        headers=headers,
    )


async def _write_event(
    response: web.StreamResponse, rpc_id: Any, event: wire.StreamResponse
) -> None:
    await response.write(b"data: " + _jsonrpc(rpc_id, result=event) + b"\n\n")


__all__ = ["ANONYMOUS", "DEFAULT_PATH", "REQUESTER_PREFIX", "A2AServer", "A2ATask"]
