"""OpenTelemetry spans of two peers, captured with the SDK's in-memory exporter."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from aiohttp import web
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from opskit import WAIT, E, R, eventually, peer_pair

from synapse.a2a.client.core import A2AClient
from synapse.ops.tracing import enable_tracing
from synapse.transport.peer import Peer
from synapse.types import TaskState


@pytest.fixture
def exporters() -> Iterator[dict[str, InMemorySpanExporter]]:
    yield {R: InMemorySpanExporter(), E: InMemorySpanExporter()}


def provider(exporter: InMemorySpanExporter) -> TracerProvider:
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    return tracer_provider


def by_name(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


async def test_one_trace_per_task_across_both_peers(
    exporters: dict[str, InMemorySpanExporter],
) -> None:
    def setup(peer: Peer) -> None:
        enable_tracing(peer, tracer_provider=provider(exporters[peer.agent_id]))

    async with peer_pair(setup_r=setup, setup_e=setup) as pair:
        handle = await pair.r.submit(E, "echo", {"text": "traced"})
        outcome = await handle.result(timeout=WAIT)
        assert outcome.state is TaskState.COMPLETED
        failing = await pair.r.submit(E, "fail")
        await failing.result(timeout=WAIT)
        await pair.e.close()  # its last POST's reply is in: every span ended
    r_spans = exporters[R].get_finished_spans()
    e_spans = exporters[E].get_finished_spans()

    def of_task(spans: tuple[ReadableSpan, ...], task_id: str) -> list[ReadableSpan]:
        return [s for s in spans if (s.attributes or {}).get("synapse.task.id") == task_id]

    r_task, e_task = of_task(r_spans, handle.task_id), of_task(e_spans, handle.task_id)
    assert sorted(s.name for s in r_task) == [
        "synapse receive p2p:task_complete",
        "synapse receive p2p:task_status_update",
        "synapse send p2p:task_request",
    ]
    assert sorted(s.name for s in e_task) == [
        "synapse handle echo",
        "synapse receive p2p:task_request",
        "synapse send p2p:task_complete",
        "synapse send p2p:task_status_update",
    ]
    # One trace for the task, on both sides.
    assert len({s.context.trace_id for s in r_task + e_task}) == 1
    (request,) = by_name(tuple(r_task), "synapse send p2p:task_request")
    (received,) = by_name(tuple(e_task), "synapse receive p2p:task_request")
    assert request.kind is SpanKind.CLIENT and received.kind is SpanKind.SERVER
    # E continued the `traceparent` R's POST carried.
    assert received.parent is not None and received.parent.is_remote
    assert received.parent.span_id == request.context.span_id
    # Later spans of the task link back to its first span on that peer.
    for span in e_task:
        if span is not received:
            assert [link.context.span_id for link in span.links] == [received.context.span_id]
            assert span.parent is not None
            assert span.parent.span_id == received.context.span_id
    (handler,) = by_name(tuple(e_task), "synapse handle echo")
    assert handler.attributes is not None
    assert handler.attributes["synapse.handler.outcome"] == "completed"
    assert handler.start_time is not None and handler.end_time is not None
    assert handler.end_time >= handler.start_time
    # The transition a message caused is an event of its span.
    events = [(e.name, dict(e.attributes or {})) for e in received.events]
    assert (
        "synapse.transition",
        {
            "synapse.role": "executor",
            "synapse.from_state": "idle",
            "synapse.to_state": "confirmed",
            "synapse.trigger": "send task_confirm",
        },
    ) in events
    (reply,) = by_name(tuple(r_task), "synapse receive p2p:task_complete")
    assert reply.attributes is not None and reply.attributes["synapse.reply.type"] == "p2p:task_ack"
    # The failing task: its own trace, its handler span in error.
    failed = of_task(e_spans, failing.task_id)
    assert {s.context.trace_id for s in failed}.isdisjoint({request.context.trace_id})
    (failed_handler,) = by_name(tuple(failed), "synapse handle fail")
    assert failed_handler.status.status_code is StatusCode.ERROR


async def test_refused_message_span_is_an_error(
    exporters: dict[str, InMemorySpanExporter],
) -> None:
    def setup(peer: Peer) -> None:
        enable_tracing(peer, tracer_provider=provider(exporters[peer.agent_id]))

    async with peer_pair(setup_r=setup, setup_e=setup) as pair:
        handle = await pair.r.submit(E, "text_generation", {"prompt": "p"})
        await eventually(lambda: handle.state is TaskState.INFO_NEEDED)
        pair.e.protocol.engine.tasks.clear()  # E forgets: the answer is refused
        await handle.provide_info({"style": "x"})
        await eventually(lambda: pair.r.protocol.pending_deliveries == 0)
        await handle.cancel()
        await pair.r.close()
    e_refused = by_name(exporters[E].get_finished_spans(), "synapse receive p2p:task_info_provided")
    assert len(e_refused) == 1
    assert e_refused[0].status.status_code is StatusCode.ERROR
    assert e_refused[0].attributes is not None
    assert e_refused[0].attributes["synapse.nack.code"] == "task_not_found"
    r_sent = by_name(exporters[R].get_finished_spans(), "synapse send p2p:task_info_provided")
    assert r_sent[0].status.status_code is StatusCode.ERROR


async def test_a2a_calls_carry_the_current_traceparent(
    exporters: dict[str, InMemorySpanExporter],
) -> None:
    """An A2A client call made inside a span sends that span's W3C traceparent."""
    seen: list[str | None] = []

    async def card(request: web.Request) -> web.Response:
        seen.append(request.headers.get("traceparent"))
        return web.Response(status=404)

    enable_tracing(Peer("agent-x"), tracer_provider=provider(exporters[R]))
    app = web.Application()
    app.router.add_get("/.well-known/agent-card.json", card)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    tracer = provider(exporters[R]).get_tracer("test")
    try:
        with tracer.start_as_current_span("caller") as caller:
            client = A2AClient(url)
            with pytest.raises(Exception):  # noqa: B017 - the card is missing; we want the header
                await client.discover()
            await client.close()
        context = caller.get_span_context()
    finally:
        await runner.cleanup()
    assert seen, "the A2A client made no request"
    assert seen[0] is not None
    assert seen[0][:-2] == f"00-{context.trace_id:032x}-{context.span_id:016x}-"
    assert int(seen[0][-2:], 16) & 1  # sampled
    assert trace.get_current_span() is trace.INVALID_SPAN


async def test_an_a2a_callers_trace_continues_into_the_task(
    exporters: dict[str, InMemorySpanExporter],
) -> None:
    """A2A in both directions: our A2A client sends the caller's traceparent, and a peer
    serving A2A continues it into the task's spans."""
    from synapse.a2a import enable_a2a
    from synapse.demo.handler import DemoHandler

    peer = Peer("agent-a", handler=DemoHandler())
    enable_a2a(peer, default_task_type="echo")
    enable_tracing(peer, tracer_provider=provider(exporters[E]))
    tracer = provider(exporters[R]).get_tracer("test")
    async with peer:
        with tracer.start_as_current_span("caller") as caller:
            async with A2AClient(f"http://127.0.0.1:{peer.port}", poll_interval=0.05) as client:
                handle = await client.send({"text": "traced"}, task_type="echo", stream=False)
                outcome = await handle.result(WAIT)
        assert outcome.ok
    trace_id = caller.get_span_context().trace_id
    received = by_name(exporters[E].get_finished_spans(), "synapse receive p2p:task_request")
    assert len(received) == 1
    assert received[0].context.trace_id == trace_id
    handled = by_name(exporters[E].get_finished_spans(), "synapse handle echo")
    assert [s.context.trace_id for s in handled] == [trace_id]
