"""OpenTelemetry tracing of a peer (the optional `otel` extra).

Install it with `pip install 'synapse-agent-p2p[otel]'`.

A span per message received (`synapse receive p2p:…`, SERVER) and sent (`synapse send p2p:…`,
CLIENT) and per handler run (`synapse handle TYPE`, INTERNAL). The spans of one task form one
trace across both peers: the first span of a task anchors it, later spans of the task are its
children and carry a link to it, and every POST carries the W3C `traceparent` of its send span,
which the receiving peer continues. A2A calls and push notifications made by our HTTP clients
carry the `traceparent` of the span current when they are made.

    from opentelemetry.sdk.trace import TracerProvider
    enable_tracing(peer, tracer_provider=TracerProvider(...))   # before peer.start()
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, Span, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from synapse.runtime.listener import RuntimeListener
from synapse.transport import client as http_client
from synapse.types import EXECUTOR_TO_REQUESTER, Message, Nack, NackError

if TYPE_CHECKING:
    from synapse.p2p.engine import TaskKey, Transition
    from synapse.runtime.protocol import MessageEvent
    from synapse.runtime.sender import DeliveryError
    from synapse.transport.peer import Peer

#: The W3C Trace Context propagator, whatever the process-wide default propagator is:
#: the `traceparent` header is part of what we promise partners.
PROPAGATOR = TraceContextTextMapPropagator()
#: Tasks and exchanges remembered at once; the oldest are forgotten past this.
_TRACKED = 10_000

Handler = Any


def task_of(message: Message) -> tuple[str, str] | None:
    """(requester, task id) of the task `message` is about, if any."""
    payload: Any = message.payload
    task = getattr(payload, "task", None)
    task_id = task.id if task is not None else getattr(payload, "task_id", None)
    if not isinstance(task_id, str):
        return None
    if message.message_type in EXECUTOR_TO_REQUESTER:
        return (message.to.agent_id, task_id)
    return (message.from_.agent_id, task_id)


def _bounded_put(table: OrderedDict[Any, Any], key: Any, value: Any) -> None:
    table[key] = value
    table.move_to_end(key)
    if len(table) > _TRACKED:
        table.popitem(last=False)


class PeerTracing(RuntimeListener):
    """Spans of one peer (see `enable_tracing`)."""

    def __init__(self, agent_id: str, tracer_provider: trace.TracerProvider | None = None) -> None:
        self.agent_id = agent_id
        self.tracer = trace.get_tracer("synapse", tracer_provider=tracer_provider)
        self._received: OrderedDict[str, Span] = OrderedDict()
        self._sent: OrderedDict[str, Span] = OrderedDict()
        #: (requester, task id) → the span context anchoring the task's trace.
        self._tasks: OrderedDict[tuple[str, str], SpanContext] = OrderedDict()

    # --- spans ----------------------------------------------------------------------------

    def _start(
        self,
        name: str,
        kind: SpanKind,
        task: tuple[str, str] | None,
        attributes: dict[str, Any],
        *,
        remote_parent: bool = False,
        start_time: int | None = None,
    ) -> Span:
        anchor = self._tasks.get(task) if task is not None else None
        current = trace.get_current_span().get_span_context()
        if remote_parent and current.is_valid:
            parent = otel_context.get_current()  # the partner's traceparent
        elif anchor is not None:
            parent = trace.set_span_in_context(trace.NonRecordingSpan(anchor))
        else:
            parent = otel_context.get_current()
        links = [Link(anchor, {"synapse.link": "task"})] if anchor is not None else []
        if task is not None:
            attributes |= {"synapse.task.requester": task[0], "synapse.task.id": task[1]}
        span = self.tracer.start_span(
            name,
            context=parent,
            kind=kind,
            attributes={"synapse.agent_id": self.agent_id, **attributes},
            links=links,
            start_time=start_time,
        )
        if task is not None and anchor is None:
            _bounded_put(self._tasks, task, span.get_span_context())
        return span

    def _message_attributes(self, message: Message, partner: str) -> dict[str, Any]:
        return {
            "synapse.message.id": message.id,
            "synapse.message.type": message.message_type.value,
            "synapse.partner": partner,
        }

    # --- RuntimeListener --------------------------------------------------------------------

    def on_message(self, event: MessageEvent) -> None:
        message = event.message
        span: Span | None
        if event.direction == "in":
            span = self._start(
                f"synapse receive {message.message_type.value}",
                SpanKind.SERVER,
                task_of(message),
                self._message_attributes(message, event.partner),
                remote_parent=True,
            )
            _bounded_put(self._received, message.id, span)
        elif event.direction == "reply_out":
            span = self._received.pop(message.reply_to or "", None)
            if span is not None:
                span.set_attribute("synapse.reply.type", message.message_type.value)
                span.set_status(Status(StatusCode.OK))
                span.end()
        elif event.direction == "out":
            span = self._start(
                f"synapse send {message.message_type.value}",
                SpanKind.CLIENT,
                task_of(message),
                self._message_attributes(message, event.partner),
            )
            _bounded_put(self._sent, message.id, span)
        else:  # reply_in
            span = self._sent.pop(message.reply_to or "", None)
            if span is not None:
                span.set_attribute("synapse.reply.type", message.message_type.value)
                if isinstance(message, Nack):
                    span.set_attribute("synapse.nack.code", message.payload.code)
                    span.set_status(Status(StatusCode.ERROR, message.payload.message))
                else:
                    span.set_status(Status(StatusCode.OK))
                span.end()

    def on_refused(self, message: Message, error: NackError) -> None:
        span = self._received.pop(message.id, None)
        if span is not None:
            span.set_attribute("synapse.nack.code", error.code.value)
            span.set_status(Status(StatusCode.ERROR, error.message))
            span.end()

    def on_delivery_failed(self, message: Message, partner: str, error: DeliveryError) -> None:
        span = self._sent.pop(message.id, None)
        if span is not None:
            span.set_attribute("synapse.delivery.retryable", error.retryable)
            span.set_status(Status(StatusCode.ERROR, str(error)))
            span.end()

    def on_handler_done(
        self, key: TaskKey, task_type: str, started: float, seconds: float, outcome: str
    ) -> None:
        start_ns = int(started * 1e9)
        span = self._start(
            f"synapse handle {task_type}",
            SpanKind.INTERNAL,
            (key.requester, key.task_id),
            {"synapse.task.type": task_type, "synapse.handler.outcome": outcome},
            start_time=start_ns,
        )
        if outcome == "failed":
            span.set_status(Status(StatusCode.ERROR, "the handler raised"))
        span.end(end_time=start_ns + int(seconds * 1e9))

    def on_transition(self, transition: Transition) -> None:
        # On the span of the message that caused it (received, or sent by us), if it is open.
        mid = transition.message_id or ""
        span = self._received.get(mid) or self._sent.get(mid)
        if span is not None and span.is_recording():
            span.add_event(
                "synapse.transition",
                {
                    "synapse.role": transition.role.value,
                    "synapse.from_state": transition.from_state.value,
                    "synapse.to_state": transition.to_state.value,
                    "synapse.trigger": transition.event.value,
                },
            )

    # --- propagation ----------------------------------------------------------------------

    def headers_for(self, message: Any) -> Mapping[str, str]:
        """The `traceparent` of the send span of `message` (an `HttpClient` header hook)."""
        span = self._sent.get(message.id)
        carrier: dict[str, str] = {}
        if span is not None:
            PROPAGATOR.inject(carrier, trace.set_span_in_context(span))
        return carrier

    def middleware(self) -> Any:
        """Continue the trace of an incoming request's `traceparent` while it is handled."""

        @web.middleware
        async def traced(request: web.Request, handler: Handler) -> web.StreamResponse:
            if "traceparent" not in request.headers:
                response: web.StreamResponse = await handler(request)
                return response
            token = otel_context.attach(PROPAGATOR.extract(request.headers))
            try:
                response = await handler(request)
                return response
            finally:
                otel_context.detach(token)

        return traced


async def _inject_traceparent(
    session: aiohttp.ClientSession,
    trace_config_ctx: SimpleNamespace,
    params: aiohttp.TraceRequestStartParams,
) -> None:
    if "traceparent" not in params.headers:
        PROPAGATOR.inject(params.headers)


_INSTRUMENTED: list[aiohttp.TraceConfig] = []


def instrument_http_clients() -> None:
    """Give every HTTP client session we create from now on (the A2A client, push
    notifications, peers' clients) the W3C `traceparent` of the current span."""
    if _INSTRUMENTED:
        return
    config = aiohttp.TraceConfig()
    config.on_request_start.append(_inject_traceparent)
    _INSTRUMENTED.append(config)
    http_client.TRACE_CONFIGS.append(config)


def enable_tracing(
    peer: Peer, *, tracer_provider: trace.TracerProvider | None = None
) -> PeerTracing:
    """Trace `peer`'s messages and handler runs (call before `start()` / `attach()`).

    Spans go to `tracer_provider`, or to the process-wide one (`trace.set_tracer_provider`).
    """
    tracing = PeerTracing(peer.agent_id, tracer_provider)
    instrument_http_clients()
    peer.protocol_hooks.append(lambda protocol: protocol.listeners.append(tracing))
    peer.app_hooks.append(lambda app: app.middlewares.append(tracing.middleware()))
    peer.client.header_hooks.append(tracing.headers_for)
    return tracing


__all__ = ["PROPAGATOR", "PeerTracing", "enable_tracing", "instrument_http_clients", "task_of"]
