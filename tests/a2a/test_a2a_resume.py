"""Streams that resume without loss: every server-sent event carries its number (`id:`); a
client that reconnects with `Last-Event-ID` gets the events it missed, in order, then the live
ones (the whole task instead when they are no longer all kept); our client resumes that way
by itself after a cut."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from a2akit import LoopbackRelay, fast_config
from aiohttp import web
from rawpost import eventually

from synapse.a2a import A2AServer, enable_a2a
from synapse.a2a.client import A2AClient
from synapse.a2a.server.view import RECENT_EVENTS
from synapse.demo.handler import DemoHandler
from synapse.transport.peer import Peer

V1 = {"A2A-Version": "1.0"}


@pytest.fixture
async def agent() -> AsyncIterator[tuple[str, A2AServer]]:
    peer = Peer("agent-s", handler=DemoHandler(), config=fast_config())
    server = enable_a2a(peer)
    await peer.start()
    try:
        yield f"http://127.0.0.1:{peer.port}", server
    finally:
        await peer.close(drain_timeout=0.2)


def slow(steps: int, delay: float = 0.02) -> dict[str, Any]:
    return {
        "messageId": f"m-{steps}-{delay}",
        "role": "ROLE_USER",
        "parts": [{"data": {"steps": steps, "delay": delay}}],
        "metadata": {"taskType": "slow"},
    }


Event = tuple[int, dict[str, Any]]


async def read_events(response: httpx.Response, limit: int | None = None) -> list[Event]:
    """(id, event) of each server-sent event, up to `limit` of them."""
    events: list[Event] = []
    event_id = 0
    async for line in response.aiter_lines():
        if line.startswith("id: "):
            event_id = int(line[4:])
        elif line.startswith("data: "):
            body = json.loads(line[6:])
            events.append((event_id, body.get("result", body)))
            if limit is not None and len(events) >= limit:
                break
    return events


def kind(event: dict[str, Any]) -> str:
    return next(k for k in ("task", "statusUpdate", "artifactUpdate", "message") if k in event)


def terminal(event: dict[str, Any]) -> bool:
    inner = event.get("task") or event.get("statusUpdate") or {}
    return inner.get("status", {}).get("state") in ("TASK_STATE_COMPLETED", "TASK_STATE_FAILED")


async def stream(http: httpx.AsyncClient, base: str, binding: str, last: int | None = None,
                 task_id: str = "", message: dict[str, Any] | None = None) -> Any:  # fmt: skip
    headers = {**V1, **({"Last-Event-ID": str(last)} if last is not None else {})}
    if binding == "JSONRPC":
        method = "SendStreamingMessage" if message else "SubscribeToTask"
        params = {"message": message} if message else {"id": task_id}
        body = {"jsonrpc": "2.0", "id": "r", "method": method, "params": params}
        return http.stream("POST", f"{base}/a2a", json=body, headers=headers)
    if message:
        return http.stream("POST", f"{base}/a2a/message:stream", json={"message": message},
                           headers=headers)  # fmt: skip
    return http.stream("GET", f"{base}/a2a/tasks/{task_id}:subscribe", headers=headers)


@pytest.mark.parametrize("binding", ["JSONRPC", "HTTP+JSON"])
async def test_a_cut_stream_resumes_where_it_stopped(
    agent: tuple[str, A2AServer], binding: str
) -> None:
    base, _ = agent
    async with httpx.AsyncClient(timeout=20) as http:
        async with await stream(http, base, binding, message=slow(12)) as first:
            before = await read_events(first, limit=4)
        task_id = before[0][1]["task"]["id"]
        last = before[-1][0]
        async with await stream(http, base, binding, last, task_id) as second:
            after = await read_events(second)
    assert kind(before[0][1]) == "task"  # a stream starts with the whole task
    assert kind(after[0][1]) != "task"  # a resumed one with what it missed
    ids = [i for i, _ in before[1:] + after]
    assert ids == list(range(ids[0], ids[0] + len(ids)))  # nothing lost, nothing twice
    assert terminal(after[-1][1])


async def test_a_resume_after_the_end_gets_the_last_events(agent: tuple[str, A2AServer]) -> None:
    base, server = agent
    async with httpx.AsyncClient(timeout=20) as http:
        async with await stream(http, base, "JSONRPC", message=slow(3)) as first:
            before = await read_events(first, limit=2)
        task_id = before[0][1]["task"]["id"]
        await eventually(lambda: server.service.tasks.get(task_id) is None or
                         server.service.tasks[task_id].is_terminal, timeout=10)  # fmt: skip
        async with await stream(http, base, "JSONRPC", before[-1][0], task_id) as second:
            after = await read_events(second)
    # What it missed if still kept, else the whole task as it ended: its final state.
    assert after and terminal(after[-1][1])
    assert kind(after[0][1]) != "task" or len(after) == 1


async def test_a_resume_with_nothing_missed_after_the_end_ends_at_once(
    agent: tuple[str, A2AServer],
) -> None:
    base, _ = agent
    async with httpx.AsyncClient(timeout=20) as http:
        async with await stream(http, base, "HTTP+JSON", message=slow(2)) as first:
            events = await read_events(first)
        assert terminal(events[-1][1])
        task_id = events[0][1]["task"]["id"]
        async with await stream(http, base, "HTTP+JSON", events[-1][0], task_id) as second:
            after = await read_events(second)
    assert len(after) <= 1  # the ended task as a whole if its events are gone; then the end


async def test_events_no_longer_kept_give_the_whole_task(agent: tuple[str, A2AServer]) -> None:
    base, server = agent
    steps = RECENT_EVENTS + 40
    async with httpx.AsyncClient(timeout=30) as http:
        async with await stream(http, base, "JSONRPC", message=slow(steps, 0.03)) as first:
            before = await read_events(first, limit=2)
        task_id = before[0][1]["task"]["id"]
        view = server.service.tasks[task_id]
        await eventually(lambda: view.seq > before[-1][0] + RECENT_EVENTS + 1, timeout=20)
        async with await stream(http, base, "JSONRPC", before[-1][0], task_id) as second:
            after = await read_events(second, limit=1)
        # Without a number, or with one too old: the whole task first, as a new stream.
        async with await stream(http, base, "HTTP+JSON", None, task_id) as third:
            fresh = await read_events(third, limit=1)
    assert kind(after[0][1]) == "task" and kind(fresh[0][1]) == "task"
    await http.aclose()


class CuttingProxy(LoopbackRelay):
    """Relays to the agent; cuts the first SSE stream it relays after `after` events, and
    records the `Last-Event-ID` of each request."""

    def __init__(self, target: str, after: int) -> None:
        super().__init__()
        self.target, self.after = target, after
        self.last_event_ids: list[str | None] = []
        self.cut = False

    async def relay(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.last_event_ids.append(request.headers.get("Last-Event-ID"))
        headers = {k: v for k, v in request.headers.items() if k.lower() != "host"}
        async with (
            httpx.AsyncClient(timeout=30) as http,
            http.stream(
                request.method, f"{self.target}{request.path_qs}", content=body, headers=headers
            ) as upstream,  # fmt: skip
        ):
            response = web.StreamResponse(status=upstream.status_code)
            response.content_type = upstream.headers.get("content-type", "").split(";")[0]
            await response.prepare(request)
            events = 0
            async for chunk in upstream.aiter_raw():
                await response.write(chunk)
                events += chunk.count(b"\n\n")
                if (
                    not self.cut
                    and "event-stream" in response.content_type
                    and (events >= self.after)
                ):
                    self.cut = True
                    assert request.transport is not None
                    request.transport.close()
                    return response
            await response.write_eof()
            return response


async def test_our_client_resumes_a_cut_stream_from_where_it_stopped(
    agent: tuple[str, A2AServer],
) -> None:
    base, _ = agent
    proxy = CuttingProxy(base, after=3)
    await proxy.start()
    try:
        client = A2AClient(proxy.url, bindings=("JSONRPC",))
        await client.discover()
        client.transport.url = f"{proxy.url}/a2a"  # type: ignore[union-attr]
        handle = await client.send({"steps": 10, "delay": 0.03}, task_type="slow", stream=True)
        outcome = await handle.result(timeout=20)
        await client.close()
    finally:
        await proxy.close()
    assert outcome.ok, outcome
    assert proxy.cut
    resumed = [value for value in proxy.last_event_ids if value is not None]
    assert resumed and int(resumed[0]) >= 2  # the number of the last event it received
