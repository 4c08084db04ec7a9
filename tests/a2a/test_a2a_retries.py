"""A `SendMessage` retried after a network error never starts a second task: deduplicated by
(authenticated principal, `messageId`) on every binding, concurrently, after a restart on a
durable store; a reused `messageId` with another body is refused; anonymous callers are not
deduplicated; and our client retries a cut `SendMessage` with the same `messageId`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2akit import LoopbackRelay, fast_config
from aiohttp import web

from synapse.a2a import enable_a2a
from synapse.a2a.client import A2AClient
from synapse.demo.handler import DemoHandler
from synapse.store import open_store
from synapse.transport.peer import Peer

V1 = {"A2A-Version": "1.0"}
ALICE = {**V1, "Authorization": "Bearer tok-alice"}
BOB = {**V1, "Authorization": "Bearer tok-bob"}
TOKENS = {"tok-alice": "alice", "tok-bob": "bob"}


def send(message_id: str, text: str, **configuration: Any) -> dict[str, Any]:
    message = {"messageId": message_id, "role": "ROLE_USER", "parts": [{"text": text}]}
    return {"message": message, "configuration": configuration}


async def rpc(base: str, method: str, params: Any, headers: dict[str, str]) -> dict[str, Any]:
    request = {"jsonrpc": "2.0", "id": "r", "method": method, "params": params}
    async with httpx.AsyncClient(timeout=10) as http:
        answer: dict[str, Any] = (
            await http.post(f"{base}/a2a", json=request, headers=headers)
        ).json()
    return answer


async def rest_send(base: str, params: Any, headers: dict[str, str]) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as http:
        return await http.post(f"{base}/a2a/message:send", json=params, headers=headers)


async def started_peer(store: str = "memory", *, tokens: bool = True) -> tuple[Peer, str]:
    peer = Peer("agent-d", handler=DemoHandler(), config=fast_config(), store=open_store(store))
    enable_a2a(peer, tokens=TOKENS if tokens else None)
    await peer.start()
    return peer, f"http://127.0.0.1:{peer.port}"


@pytest.fixture
async def guarded() -> AsyncIterator[str]:
    peer, base = await started_peer()
    try:
        yield base
    finally:
        await peer.close(drain_timeout=0.2)


async def task_count(base: str, headers: dict[str, str]) -> int:
    listed = await rpc(base, "ListTasks", {}, headers)
    return len(listed["result"]["tasks"])


async def test_a_retried_send_message_returns_the_task_it_started(guarded: str) -> None:
    first = await rpc(guarded, "SendMessage", send("m-1", "hello"), ALICE)
    again = await rpc(guarded, "SendMessage", send("m-1", "hello"), ALICE)
    task = first["result"]["task"]
    assert again["result"]["task"]["id"] == task["id"]
    assert again["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
    # Over REST too: the same message is the same task, whatever the binding.
    response = await rest_send(guarded, send("m-1", "hello"), ALICE)
    assert response.status_code == 200 and response.json()["task"]["id"] == task["id"]
    assert await task_count(guarded, ALICE) == 1
    # Another principal's messageId is its own: a new task.
    bobs = await rpc(guarded, "SendMessage", send("m-1", "hello"), BOB)
    assert bobs["result"]["task"]["id"] != task["id"]


async def test_a_reused_message_id_with_another_body_is_refused(guarded: str) -> None:
    await rpc(guarded, "SendMessage", send("m-1", "hello"), ALICE)
    answer = await rpc(guarded, "SendMessage", send("m-1", "something else"), ALICE)
    assert answer["error"]["code"] == -32602
    assert "already used for another message" in answer["error"]["message"]
    response = await rest_send(guarded, send("m-1", "something else"), ALICE)
    assert response.status_code == 400
    assert await task_count(guarded, ALICE) == 1


async def test_a_refused_message_is_refused_again_when_retried(guarded: str) -> None:
    """A message refused before any task (no parts, an unknown task type) leaves nothing
    behind: its retry is judged again, and refused the same way, at once."""
    for _ in range(2):
        empty = send("m-empty", "x")
        empty["message"]["parts"] = []
        answer = await asyncio.wait_for(rpc(guarded, "SendMessage", empty, ALICE), 5)
        assert answer["error"]["code"] == -32602
        unknown = send("m-unknown", "x")
        unknown["message"]["metadata"] = {"taskType": "no-such-type"}
        answer = await asyncio.wait_for(rpc(guarded, "SendMessage", unknown, ALICE), 5)
        assert "error" in answer or answer["result"]["task"]["status"]["state"] == (
            "TASK_STATE_REJECTED"
        )
    assert await task_count(guarded, ALICE) <= 1


async def test_concurrent_duplicates_start_one_task(guarded: str) -> None:
    slow = send("m-slow", "wait", returnImmediately=True)
    slow["message"]["metadata"] = {"task_type": "slow"}
    slow["message"]["parts"] = [{"data": {"steps": 5, "delay": 0.02}}]
    answers = await asyncio.gather(*(rpc(guarded, "SendMessage", slow, ALICE) for _ in range(5)))
    assert len({a["result"]["task"]["id"] for a in answers}) == 1
    assert await task_count(guarded, ALICE) == 1


async def test_anonymous_callers_are_not_deduplicated() -> None:
    peer, base = await started_peer(tokens=False)
    try:
        one = await rpc(base, "SendMessage", send("m-1", "hello"), V1)
        two = await rpc(base, "SendMessage", send("m-1", "hello"), V1)
        assert one["result"]["task"]["id"] != two["result"]["task"]["id"]
    finally:
        await peer.close(drain_timeout=0.2)


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_a_retry_after_a_restart_gets_the_stored_task(
    tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    """On SQLite, and on PostgreSQL (the dedup entry is in the database every replica
    shares, looked up off the event loop)."""
    store = str(tmp_path / "a2a.sqlite") if kind == "sqlite" else request.getfixturevalue("pg_url")
    peer, base = await started_peer(store)
    try:
        first = await rpc(base, "SendMessage", send("m-1", "hello"), ALICE)
    finally:
        await peer.close(drain_timeout=0.2)
    peer, base = await started_peer(store)
    try:
        again = await rpc(base, "SendMessage", send("m-1", "hello"), ALICE)
        assert again["result"]["task"]["id"] == first["result"]["task"]["id"]
        refused = await rpc(base, "SendMessage", send("m-1", "other"), ALICE)
        assert refused["error"]["code"] == -32602
        assert await task_count(base, ALICE) == 1
    finally:
        await peer.close(drain_timeout=0.2)


class CuttingProxy(LoopbackRelay):
    """Relays POSTs to the agent, but cuts the connection instead of answering the first
    `SendMessage` (after the agent processed it): the client never sees that answer."""

    def __init__(self, target: str) -> None:
        super().__init__()
        self.target = target
        self.cut = 0
        self.sends = 0

    async def relay(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host",)}
        async with httpx.AsyncClient(timeout=10) as http:
            answer = await http.request(
                request.method, f"{self.target}{request.path_qs}", content=body, headers=headers
            )
        if request.method == "POST" and b"SendMessage" in body:
            self.sends += 1
            if self.cut == 0:
                self.cut += 1
                assert request.transport is not None
                request.transport.close()  # processed, but the answer never arrives
                raise ConnectionResetError("cut")
        return web.Response(
            body=answer.content,
            status=answer.status_code,
            content_type=answer.headers.get("content-type", "application/json").split(";")[0],
        )


async def test_our_client_retries_a_cut_send_message_with_the_same_message_id(
    guarded: str,
) -> None:
    proxy = CuttingProxy(guarded)
    await proxy.start()
    try:
        # The card names the agent's own URL: the client talks to the proxy all the same.
        client = A2AClient(proxy.url, token="tok-alice", bindings=("JSONRPC",))
        await client.discover()
        client.transport.url = f"{proxy.url}/a2a"  # type: ignore[union-attr]
        handle = await client.send("hello", stream=False)
        outcome = await handle.result(timeout=10)
        assert outcome.ok, outcome
        assert proxy.cut == 1 and proxy.sends == 2  # cut once, sent again
        assert await task_count(guarded, ALICE) == 1
        await client.close()
    finally:
        await proxy.close()


async def test_over_grpc_too() -> None:
    grpc = pytest.importorskip("grpc")
    from a2a.types import a2a_pb2, a2a_pb2_grpc

    peer = Peer("agent-g", handler=DemoHandler(), config=fast_config())
    server = enable_a2a(peer, tokens=TOKENS, grpc_port=0)
    await peer.start()
    try:
        assert server.grpc is not None
        metadata = (("a2a-version", "1.0"), ("authorization", "Bearer tok-alice"))

        def request(text: str) -> Any:
            part = a2a_pb2.Part(text=text)
            message = a2a_pb2.Message(message_id="m-1", role=a2a_pb2.ROLE_USER, parts=[part])
            return a2a_pb2.SendMessageRequest(message=message)

        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc.port}") as channel:
            stub = a2a_pb2_grpc.A2AServiceStub(channel)
            first = await stub.SendMessage(request("hello"), metadata=metadata)
            again = await stub.SendMessage(request("hello"), metadata=metadata)
            assert first.task.id and again.task.id == first.task.id
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.SendMessage(request("other"), metadata=metadata)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        # And JSON-RPC sees the same task for the same message.
        base = f"http://127.0.0.1:{peer.port}"
        answer = await rpc(base, "SendMessage", send("m-1", "hello"), ALICE)
        assert answer["result"]["task"]["id"] == first.task.id
    finally:
        await peer.close(drain_timeout=0.2)
