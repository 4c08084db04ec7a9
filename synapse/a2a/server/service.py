"""The binding-independent A2A service of a Synapse peer: the operations of A2A v1.0 on typed
requests and the caller's principal, and the bridge between A2A tasks and the engine.

An A2A `SendMessage` becomes a Synapse executor task in the peer's own engine, requested by a
virtual partner `a2a:<principal>` (the authenticated caller, or `a2a:anonymous`). The service
builds the `task_request` envelope and hands it to `P2PProtocol.handle_message` in-process; the
engine's callbacks to that partner travel through the outbox as usual (in order, durably,
acknowledged) and reach the service (via `P2PProtocol.route_local`) instead of HTTP. Each one
updates the task's A2A view (`A2ATask`) — status, history, artifacts — which `get_task` /
`list_tasks` read, streams receive as events and push configurations receive as
notifications, and is acknowledged with the `ack` / `task_ack` the engine expects. A follow-up
message on the same task answers whatever the executor's transition table lets the task's
state receive (`task_info_provided` for `task_need_info`, `human_decision` for
`task_need_human`), and a working task that asked nothing keeps it for its handler
(`synapse.a2a.server.follow_ups`); `cancel_task` is a `task_cancel`.

The bindings (`synapse.a2a.server.jsonrpc`, …) only parse their framing into the typed requests of
`synapse.a2a.wire`, call these operations and render the results and `A2AError`s in their own
framing. See `docs/a2a.md` for every mapping.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any, TypeVar

import msgspec

from synapse.a2a import mapping, wire
from synapse.a2a.errors import (
    A2ACode,
    A2AError,
    a2a_error_of,
    invalid_params,
    task_not_found,
    unsupported,
)
from synapse.a2a.server import follow_ups, related
from synapse.a2a.server.direct import DirectStream, direct_answer
from synapse.a2a.server.elsewhere import ViewFollower
from synapse.a2a.server.extensions import ACTIVE_EXTENSIONS, Extensions
from synapse.a2a.server.push import (
    MAX_PUSH_URL,
    PUSH_PREFIX,
    PushAllowlist,
    PushSender,
    normalize_url,
    push_partner,
)
from synapse.a2a.server.requests import check_history_length
from synapse.a2a.server.retries import SentMessages, fingerprint
from synapse.a2a.server.tenants import Tenants, requester_of, unscoped
from synapse.a2a.server.view import (
    CONTEXT_KEY,
    LAST_EVENT_ID,
    REQUESTER_PREFIX,
    A2ATask,
    Queued,
    Subscription,
    apply_callback,
    context_data,
    notification_of,
    view_of_record,
)
from synapse.logs import get_logger
from synapse.p2p.config import P2PConfig
from synapse.p2p.engine import Outgoing, Step, TaskKey, TaskRecord
from synapse.p2p.states import Role
from synapse.runtime.listener import RuntimeListener
from synapse.runtime.protocol import P2PProtocol
from synapse.store.base import TaskFilter
from synapse.types import (
    Ack,
    AckPayload,
    ErrorCode,
    Heartbeat,
    HeartbeatPayload,
    Message,
    Nack,
    NackError,
    NackPayload,
    Sender,
    TaskAck,
    TaskAckPayload,
    TaskCancel,
    TaskCancelPayload,
    TaskComplete,
    TaskConfirm,
    TaskContext,
    TaskFailed,
    TaskNeedInfo,
    TaskReject,
    TaskRequest,
    TaskRequestPayload,
    TaskSpec,
    TaskState,
    TaskStatusUpdate,
    TaskStatusUpdatePayload,
)
from synapse.types import build_message_now as build_message  # the wall clock: an edge
from synapse.types import build_reply_now as build_reply
from synapse.types.signing import Secret

log = get_logger("synapse.a2a")

#: The principal of callers when the binding enforces no authentication.
ANONYMOUS = "anonymous"
#: `from.endpoint` of the in-process envelopes (they never travel over HTTP).
IN_PROCESS = "a2a://in-process"
DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 100

S = TypeVar("S")


#: Finished tasks' views kept sealed in memory (about 0.4 KB each): as many as the memory
#: store keeps finished tasks.
MAX_KEPT_VIEWS = 10_000


class A2AService:
    """The A2A operations of one peer, whatever binding carries them.

    Every operation takes the typed request of `synapse.a2a.wire` and the caller's principal
    and returns the typed result, or raises `A2AError`.
    """

    #: Its tasks' requester is this prefix and the caller's principal.
    requester_prefix = REQUESTER_PREFIX

    def __init__(
        self,
        *,
        config: P2PConfig | None = None,
        default_task_type: str | None = "echo",
        push_allowlist: Iterable[str] = (),
        push_secret: Secret | None = None,
        extended_card: Callable[[str], wire.AgentCard | None] = lambda principal: None,
        tenants: Tenants | None = None,
        push_disable_after: int | None = None,
        extensions: Extensions | None = None,
    ) -> None:
        self.config = config or P2PConfig()
        #: Which tenants each principal may name (`synapse.a2a.server.tenants`).
        self.tenants = tenants or Tenants()
        self.default_task_type = default_task_type
        self.allowlist = PushAllowlist(push_allowlist)
        self._extended_card = extended_card
        #: The extensions the agent declares: which of them write on what a task emits.
        self.extensions = extensions or Extensions(())
        self.pusher = PushSender(
            self, self.config, secret=push_secret, disable_after=push_disable_after
        )
        self.tasks: dict[str, A2ATask] = {}
        #: Views of finished tasks that left `tasks` while push notifications about them were
        #: still queued: kept until those are delivered (`_sweep_pushing`), so that they go
        #: out as the task was, not as a rebuild from its record.
        self._pushing: dict[str, A2ATask] = {}
        #: The last views of finished tasks that left memory, sealed (one bytes each), oldest
        #: first: GetTask and ListTasks answer for them exactly as when the task ended (a view
        #: rebuilt from the record knows only the first message and the result). Bounded;
        #: older ones are rebuilt from the store.
        self._kept: OrderedDict[str, A2ATask] = OrderedDict()
        self.max_kept_views = MAX_KEPT_VIEWS
        self._protocol: P2PProtocol | None = None
        self._rebuilt = False
        #: New messages by (principal, messageId): a retry gets the task its first started.
        self.sent = SentMessages(self.config.dedup_window)
        #: Replicas: views of tasks another replica holds, kept in step with the store.
        self.elsewhere = ViewFollower(self, self.config.lease_ttl / 5)

    # --- wiring -------------------------------------------------------------------------------

    @property
    def protocol(self) -> P2PProtocol:
        if self._protocol is None:
            raise A2AError(A2ACode.AGENT_NOT_READY, "the agent is starting", {"reason": "starting"})
        return self._protocol

    @property
    def bound(self) -> P2PProtocol | None:
        return self._protocol

    def bind(self, protocol: P2PProtocol) -> None:
        """Route the virtual partners' messages to this service (before tasks are restored)."""
        self._protocol = protocol
        self._rebuilt = False
        related.register(protocol, self)  # its handlers' `related_tasks(ctx)` read through us
        if not any(isinstance(x, _ViewEviction) for x in protocol.listeners):
            protocol.listeners.append(_ViewEviction(self))
        protocol.route_local(REQUESTER_PREFIX, _RequesterSink(self))
        protocol.route_local(PUSH_PREFIX, self.pusher)

    def close_streams(self) -> None:
        for task in self.tasks.values():
            task.close_streams()

    async def close(self) -> None:
        await self.elsewhere.close()
        await self.pusher.close()

    @property
    def push_enabled(self) -> bool:
        return bool(self.allowlist)

    # --- operations ---------------------------------------------------------------------------

    async def send_message(
        self, req: wire.SendMessageRequest, principal: str
    ) -> wire.SendMessageResponse:
        configuration = req.configuration or wire.SendMessageConfiguration()
        check_history_length(configuration.history_length)
        direct = await direct_answer(self, req.message, principal)
        if direct is not None:  # answered by the handler itself, without a task
            return wire.SendMessageResponse(message=direct)
        view, queue = await self.submit(req, principal)
        try:
            if not configuration.return_immediately:
                while not wire.ends_stream(view.state):
                    if await queue.get() is None:
                        break
        finally:
            view.unsubscribe(queue)
        task = view.snapshot(history_length=configuration.history_length)
        return wire.SendMessageResponse(task=task)

    async def send_streaming_message(
        self, req: wire.SendMessageRequest, principal: str
    ) -> Subscription | DirectStream:
        configuration = req.configuration or wire.SendMessageConfiguration()
        check_history_length(configuration.history_length)
        direct = await direct_answer(self, req.message, principal)
        if direct is not None:
            return DirectStream(direct)
        view, queue = await self.submit(req, principal)
        # The snapshot holds every event published so far: the stream goes on after them.
        first = view.snapshot(history_length=configuration.history_length)
        return Subscription(view, queue, first, view.seq, end_on_first=True)

    def subscribe_to_task(self, req: wire.SubscribeToTaskRequest, principal: str) -> Subscription:
        view = self._owned(req.id, principal)
        # A stream that resumes gets what it missed (or the whole task), even once it ended.
        last = LAST_EVENT_ID.get()
        if view.is_terminal and last is None:
            raise unsupported(f"Task {view.id} is in terminal state: {view.state}", taskId=view.id)
        # Subscribe and take the snapshot in one step: nothing falls between them.
        queue, first, ended = view.subscribe(), view.snapshot(), view.is_terminal
        return Subscription(view, queue, first, view.seq, ended, replay=view.missed(last))

    def get_task(self, req: wire.GetTaskRequest, principal: str) -> wire.Task:
        check_history_length(req.history_length)
        view = self._owned(req.id, principal)
        return view.snapshot(history_length=req.history_length)

    def list_tasks(self, req: wire.ListTasksRequest, principal: str) -> wire.ListTasksResponse:
        check_history_length(req.history_length)
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
        # Through the store's indexes, one page at a time (synapse/a2a/server/listing.py).
        from synapse.a2a.server.listing import store_page

        return store_page(self, req, principal, page_size, after)

    async def cancel_task(self, req: wire.CancelTaskRequest, principal: str) -> wire.Task:
        view = self._owned(req.id, principal)
        return await self.cancel(view, req.metadata)

    async def create_push_config(
        self, req: wire.TaskPushNotificationConfig, principal: str
    ) -> wire.TaskPushNotificationConfig:
        self._require_push()  # before looking at the task, as Get / List / Delete do
        if not req.task_id:
            raise invalid_params("taskId is required", path="taskId")
        view = self._owned(req.task_id, principal)
        config = self._check_push(req, view.id, taken=view.push)
        view.push[config.id] = config
        self.pusher.health.reset(view.id, config.id)  # (again): enabled, a clean record
        await self._persist(view)
        return config

    def get_push_config(
        self, req: wire.TaskPushConfigRef, principal: str
    ) -> wire.TaskPushNotificationConfig:
        self._require_push()
        view = self._owned(req.task_id, principal)
        config = view.push.get(req.id or view.id)
        if config is None:
            raise A2AError(
                A2ACode.TASK_NOT_FOUND,
                f"no push notification config {req.id!r} for task {view.id}",
                {"taskId": view.id, "configId": req.id},
            )
        return config

    def list_push_configs(
        self, req: wire.ListTaskPushNotificationConfigsRequest, principal: str
    ) -> wire.ListTaskPushNotificationConfigsResponse:
        self._require_push()
        view = self._owned(req.task_id, principal)
        configs = list(view.push.values())
        return wire.ListTaskPushNotificationConfigsResponse(configs=configs)

    async def delete_push_config(self, req: wire.TaskPushConfigRef, principal: str) -> None:
        self._require_push()
        view = self._owned(req.task_id, principal)
        if view.push.pop(req.id or view.id, None) is not None:
            await self._persist(view)

    def get_extended_card(
        self, req: wire.GetExtendedAgentCardRequest, principal: str
    ) -> wire.AgentCard:
        card = self._extended_card(principal)  # the caller is authenticated already
        if card is None:
            raise unsupported("The agent does not support authenticated extended cards")
        return card

    # --- tasks ------------------------------------------------------------------------------------

    def _envelope(self, cls: type[S], payload: Any, principal: str) -> S:
        sender = Sender(agent_id=requester_of(principal), endpoint=IN_PROCESS)
        message: Any = build_message(
            cls,  # type: ignore[type-var]
            payload,
            sender=sender,
            to=self.protocol.view.agent_id,
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
            push = self._check_push(push, task_id, taken=())
        first = msgspec.structs.replace(message, task_id=task_id, context_id=context_id)
        partner = requester_of(principal)
        view = A2ATask(
            key=TaskKey(partner, task_id),
            principal=principal,
            context_id=context_id,
            task_type=task_type,
        )
        self._equip(view, ACTIVE_EXTENSIONS.get())  # those the call that starts it activated
        view.history.append(first)
        if push is not None:
            view.push[push.id] = push
        context = TaskContext(
            session_id=context_id,
            metadata={CONTEXT_KEY: context_data(view)},
        )
        spec = TaskSpec(id=task_id, type=task_type, payload=payload)
        envelope = self._envelope(
            TaskRequest, TaskRequestPayload(task=spec, context=context), principal
        )
        # The message is good: a retry of it gets the task its first attempt started.
        sent, print_ = None, fingerprint(message)
        if unscoped(principal) != ANONYMOUS:  # see `synapse.a2a.server.retries`
            sent = self.sent.key(requester_of(principal), message)
            started = await self.sent.begin(protocol.store, sent, print_)
            if started is not None:
                view = self._owned(started, principal)
                return view, view.subscribe()
        self.tasks[task_id] = view
        queue = view.subscribe()
        if sent is not None:  # committed with the task
            self.sent.record(protocol.store, sent, print_, task_id)
        try:
            reply = await protocol.handle_message(envelope)
        except BaseException as exc:
            # Refused, or failed while being created: the engine, its capacity and the store
            # were rolled back by `handle_message`; leave no view behind either.
            view.unsubscribe(queue)
            del self.tasks[task_id]
            if sent is not None:
                self.sent.failed(sent, protocol.store)
            if isinstance(exc, NackError):
                raise a2a_error_of(exc, task_id) from None
            raise
        if sent is not None:
            self.sent.started(sent, task_id)
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
        message = msgspec.structs.replace(message, task_id=view.id, context_id=view.context_id)
        build = follow_ups.answer_builder(rec.state)
        if build is None:  # working, and asked nothing: the task keeps the message
            await self._keep_message(view, rec, message)
            return view, view.subscribe()
        if follow_ups.answered_already(rec, message):
            return view, view.subscribe()  # a retry of an answer received already
        cls, payload = build(view, rec, message, principal)
        follow_ups.check(rec, payload)
        envelope = self._envelope(cls, payload, principal)
        # Noted durably before it is applied: the handler it resumes reads it at once
        # (`answer_messages(ctx)`), and the task's history keeps it across a restart.
        detail = {"message": wire.to_builtins(message)}
        await self.protocol.note_task(view.key, follow_ups.ANSWER_NOTE, detail)
        view.history.append(message)
        queue = view.subscribe()
        try:
            reply = await self.protocol.handle_message(envelope)
        except NackError as exc:
            view.unsubscribe(queue)
            with contextlib.suppress(ValueError):
                view.history.remove(message)
            refused = {"messageId": message.message_id}
            await self.protocol.note_task(view.key, follow_ups.ANSWER_REFUSED_NOTE, refused)
            raise a2a_error_of(exc, view.id) from None
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

    async def _keep_message(self, view: A2ATask, rec: TaskRecord, message: wire.Message) -> None:
        """Keep a follow-up to a working task: durably, in its audit trail, before answering."""
        if not follow_ups.to_keep(view, rec, message):
            return  # a retry of a message kept already
        detail = {"message": wire.to_builtins(message)}
        await self.protocol.note_task(view.key, follow_ups.FOLLOW_UP_NOTE, detail)
        if not view.is_terminal:
            view.history.append(message)

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
        except NackError as exc:
            if exc.code is ErrorCode.TASK_ALREADY_COMPLETED:
                raise A2AError(
                    A2ACode.TASK_NOT_CANCELABLE,
                    f"Task {view.id} already finished",
                    {"taskId": view.id},
                ) from None
            raise a2a_error_of(exc, view.id) from None
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
        view = self._view(TaskKey(partner, task_id)) if isinstance(task_id, str) else None
        if view is None:
            log.warning("a2a_callback_unknown_task", task_id=task_id, type=message.type.value)
            nack = NackPayload(
                code=ErrorCode.TASK_NOT_FOUND.value, message=f"no A2A task {task_id!r}"
            )
            return build_reply(Nack, nack, request=message, sender=me)
        if view.is_terminal and self.tasks.get(view.id) is not view:
            # Rebuilt from the store: the task ended and its view left memory once its last
            # callback was answered, so this one was applied (and pushed) already.
            pass
        elif message.id not in view.applied:
            view.applied.add(message.id)
            if view.state != wire.CANCELED:
                if not view.is_terminal:
                    apply_callback(view, message)
                self._push(view, message)
        view.seal_soon()  # a late callback to a finished view unsealed it
        if isinstance(message, TaskComplete | TaskFailed):
            state = TaskState.COMPLETED if isinstance(message, TaskComplete) else TaskState.FAILED
            ack = TaskAckPayload(task_id=view.id, state=state)
            return build_reply(TaskAck, ack, request=message, sender=me)
        return build_reply(Ack, AckPayload(), request=message, sender=me)

    # --- push notifications -----------------------------------------------------------------

    def _require_push(self) -> None:
        if not self.push_enabled:
            raise A2AError(
                A2ACode.PUSH_NOTIFICATION_NOT_SUPPORTED,
                "Push notifications are not enabled on this agent (no allowed URLs)",
            )

    def _check_push(
        self, config: wire.TaskPushNotificationConfig, task_id: str, *, taken: Iterable[str]
    ) -> wire.TaskPushNotificationConfig:
        """`config` allowed, for `task_id`, with an id: its own, else the task id for the
        task's first configuration (as the SDK does), else a new one — a configuration
        created without an id never replaces another (`taken`: the ids in use)."""
        self._require_push()
        if len(config.url) > MAX_PUSH_URL:
            raise invalid_params(
                f"Invalid push notification URL: longer than {MAX_PUSH_URL} characters",
                path="url",
                reason="push_url_too_long",
            )
        # Compared, kept and POSTed to in its RFC 3986 normal form: "/hooks/../admin" is
        # "/admin", whatever the spelling.
        url = normalize_url(config.url)
        if url is None or not self.allowlist.allows(url):
            raise invalid_params(
                "Invalid push notification URL: not allowed by this agent's operator",
                path="url",
                reason="push_url_not_allowed",
            )
        config_id = config.id
        if not config_id:
            config_id = task_id if task_id not in set(taken) else mapping.new_id()
        return msgspec.structs.replace(config, url=url, task_id=task_id, id=config_id)

    def _synthetic(self, view: A2ATask, state: TaskState, text: str) -> TaskStatusUpdate:
        """A status message standing for what no callback carries (a reject, a cancel)."""
        payload = TaskStatusUpdatePayload(task_id=view.id, status=state, message=text)
        message: TaskStatusUpdate = build_message(
            TaskStatusUpdate,
            payload,
            sender=self.protocol.view.sender,
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
                sender=self._protocol.view.sender,
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
        self._sweep_pushing()
        view = self._pushing.get(task_id) or self._view_by_id(task_id)
        prefix = push_partner(task_id, "")
        if view is None or not partner.startswith(prefix):
            return None
        config = view.push.get(partner[len(prefix) :])
        if config is None:
            return None
        return config, notification_of(view, message)

    # --- lookup, durability -----------------------------------------------------------------

    def _record(self, view: A2ATask) -> TaskRecord:
        rec = self.protocol.view.get(view.key)
        if rec is None:
            raise task_not_found(view.id)
        return rec

    def _owned(self, task_id: str, principal: str) -> A2ATask:
        view = self._view(TaskKey(requester_of(principal), task_id))
        if view is None or view.principal != principal:
            raise task_not_found(task_id)
        return view

    def _view(self, key: TaskKey) -> A2ATask | None:
        """The view of the A2A task `key`: the one in memory while the task is in flight (or
        not yet let go of), else one rebuilt from its record (a point lookup by key)."""
        if not self._rebuilt:
            self._rebuild_live()
        # A finished one waiting aside for its notifications is still the one to change (a
        # push configuration rotated meanwhile is the one they go out with).
        view = self.tasks.get(key.task_id) or self._pushing.get(key.task_id)
        if view is not None:
            return view if view.key == key else None
        if self._protocol is None or not key.requester.startswith(REQUESTER_PREFIX):
            return None
        rec = self._protocol.view.get(key)
        kept = self._kept.get(key.task_id)
        if kept is not None and kept.key == key:
            if rec is None:  # purged from the store (retention): its view goes too
                del self._kept[key.task_id]
                return None
            return kept
        if rec is None or rec.role is not Role.EXECUTOR:
            return None
        view = view_of_record(rec)
        self._equip(view, view.extensions)
        if not view.is_terminal:
            self.tasks[key.task_id] = view  # callbacks will move it on
            if not self._protocol.view.holds(key):  # ... at the replica holding it
                self.elsewhere.follow(view)
        return view

    def _equip(self, view: A2ATask, active: tuple[str, ...]) -> None:
        """Give `view` the extensions active for its task, and their hooks."""
        view.extensions = active
        view.annotators = self.extensions.annotators(active)

    def _view_by_id(self, task_id: str) -> A2ATask | None:
        """The view of the A2A task `task_id`, whoever asked for it (push deliveries know
        the task, not the caller): in memory, else found by id in the store (an index)."""
        view = self.tasks.get(task_id)
        if view is not None or self._protocol is None:
            return view
        kept = self._kept.get(task_id)
        if kept is not None:
            return self._view(kept.key)
        for row in self._protocol.store.list_tasks(limit=5, where=TaskFilter(task_id=task_id)):
            if row.key.requester.startswith(REQUESTER_PREFIX):
                return self._view(row.key)
        return None

    def _rebuild_live(self) -> None:
        """Views of the A2A tasks in flight that the engine recovered (after a restart):
        from their records. Finished ones stay in the store until asked for."""
        if self._protocol is None:
            return
        self._rebuilt = True
        for rec in self._protocol.view.records():
            if (
                rec.key.requester.startswith(REQUESTER_PREFIX)
                and rec.role is Role.EXECUTOR
                and rec.partner.startswith(REQUESTER_PREFIX)
                and not rec.is_final
                and rec.task_id not in self.tasks
            ):
                view = self.tasks[rec.task_id] = view_of_record(rec)
                self._equip(view, view.extensions)
                view.seal()  # if finished: kept packed, as it would be had it run here

    def evicted(self, key: TaskKey) -> None:
        """The engine let the final task `key` go (durable, its last callback answered):
        its view goes too. A stream still following it holds it until it ends."""
        view = self.tasks.get(key.task_id)
        if view is not None and view.key == key:
            del self.tasks[key.task_id]
            if self._pushes_queued(view):
                self._pushing[view.id] = view
            self._keep(view)
        self._sweep_pushing()

    def _keep(self, view: A2ATask) -> None:
        view.seal()
        kept = self._kept
        kept[view.id] = view
        kept.move_to_end(view.id)
        while len(kept) > self.max_kept_views:
            kept.popitem(last=False)

    def _pushes_queued(self, view: A2ATask) -> bool:
        protocol = self._protocol
        return protocol is not None and any(
            protocol.delivering(TaskKey(push_partner(view.id, config_id), view.id))
            for config_id in view.push
        )

    def _sweep_pushing(self) -> None:
        for task_id in [t for t, v in self._pushing.items() if not self._pushes_queued(v)]:
            del self._pushing[task_id]

    async def _persist(self, view: A2ATask) -> None:
        """Keep the view's push configurations with the task's record (durably)."""
        rec = self.protocol.view.get(view.key)
        if rec is None or rec.context is None:
            return
        metadata = {**rec.context.metadata, CONTEXT_KEY: context_data(view)}
        rec.context = msgspec.structs.replace(rec.context, metadata=metadata)
        self.protocol.store.put_task(rec, [])
        await self.protocol.commit()


class _ViewEviction(RuntimeListener):
    """Views of finished A2A tasks leave memory with their tasks (`A2AService.evicted`)."""

    def __init__(self, server: A2AService) -> None:
        self.server = server

    def on_evicted(self, key: TaskKey) -> None:
        if key.requester.startswith(REQUESTER_PREFIX):
            self.server.evicted(key)

    def on_released(self, key: TaskKey) -> None:
        view = self.server.tasks.get(key.task_id)
        if view is not None and view.key == key:
            self.server.elsewhere.follow(view)  # its callbacks go to its new holder


class _RequesterSink:
    """The `CallbackSender` for `a2a:` partners: the engine's callbacks end here."""

    def __init__(self, server: A2AService) -> None:
        self.server = server

    async def send_callback(self, partner: str, message: Message, *, retry: bool = True) -> Message:
        return self.server.on_callback(partner, message)


__all__ = [
    "ANONYMOUS",
    "CONTEXT_KEY",
    "REQUESTER_PREFIX",
    "A2AService",
    "Subscription",
]
