"""A handler answers some messages itself: `SendMessage` gets A2A's `Message` response, no
task is started; on every binding, streaming or not, to the official SDK's client and ours;
a handler that declines (None) gets a task as usual."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from a2a.client import ClientConfig, ClientFactory
from a2akit import SDK_BINDINGS, collect, fast_config, sdk_message

from synapse.a2a import enable_a2a
from synapse.a2a.client import A2AClient
from synapse.a2a.server.direct import DirectRequest
from synapse.demo.handler import DemoHandler
from synapse.transport.peer import Peer

V1 = {"A2A-Version": "1.0"}


class Greeter(DemoHandler):
    """The demo handler, answering `hello` messages itself (unless asked for a task)."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[DirectRequest] = []

    def get_capabilities(self) -> list[str]:
        return [*super().get_capabilities(), "hello"]

    def immediate_task_types(self) -> list[str]:
        return ["hello"]

    async def answer_message(
        self, task_type: str, payload: dict[str, Any], request: DirectRequest
    ) -> Any:
        self.asked.append(request)
        text = payload.get("text", "")
        if text == "as a task":
            return None
        if text == "data":
            return {"greeting": "hello"}
        return f"hello, {text}"

    async def execute_task(self, ctx: Any, task_type: str, payload: dict[str, Any]) -> Any:
        if task_type == "hello":
            return {"output_type": "text", "output": "hello from a task"}
        return await super().execute_task(ctx, task_type, payload)


@pytest.fixture
async def greeter() -> AsyncIterator[tuple[str, Greeter]]:
    handler = Greeter()
    peer = Peer("agent-h", handler=handler, config=fast_config())
    enable_a2a(peer, grpc_port=0)
    await peer.start()
    try:
        yield f"http://127.0.0.1:{peer.port}", handler
    finally:
        await peer.close(drain_timeout=0.2)


def send(text: str, task_type: str = "hello") -> dict[str, Any]:
    return {
        "message": {
            "messageId": f"m-{text}",
            "role": "ROLE_USER",
            "parts": [{"text": text}],
            "metadata": {"taskType": task_type},
        }
    }


async def rpc(base: str, method: str, params: Any) -> dict[str, Any]:
    request = {"jsonrpc": "2.0", "id": "r", "method": method, "params": params}
    async with httpx.AsyncClient(timeout=10) as http:
        answer: dict[str, Any] = (await http.post(f"{base}/a2a", json=request, headers=V1)).json()
    return answer


async def test_json_rpc_and_rest_answer_with_a_message(greeter: tuple[str, Greeter]) -> None:
    base, handler = greeter
    answer = await rpc(base, "SendMessage", send("ada"))
    message = answer["result"]["message"]
    assert message["role"] == "ROLE_AGENT" and message["messageId"]
    assert message["parts"] == [{"text": "hello, ada"}]
    assert "task" not in answer["result"] and "taskId" not in message
    assert handler.asked[0].message_id == "m-ada" and handler.asked[0].context_id
    async with httpx.AsyncClient(timeout=10) as http:
        rest = await http.post(f"{base}/a2a/message:send", json=send("data"), headers=V1)
    assert rest.status_code == 200
    assert rest.json()["message"]["parts"][0]["data"] == {"greeting": "hello"}
    listed = await rpc(base, "ListTasks", {})
    assert listed["result"]["tasks"] == []  # no task was started
    # Declined: a task, as usual; and other task types are never asked.
    task = (await rpc(base, "SendMessage", send("as a task")))["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    asked = len(handler.asked)
    echoed = (await rpc(base, "SendMessage", send("x", task_type="echo")))["result"]
    assert "task" in echoed and len(handler.asked) == asked


async def test_a_stream_carries_the_one_message(greeter: tuple[str, Greeter]) -> None:
    base, _ = greeter
    request = {"jsonrpc": "2.0", "id": "r", "method": "SendStreamingMessage", "params": send("s")}
    async with httpx.AsyncClient(timeout=10) as http:
        response = await http.post(f"{base}/a2a", json=request, headers=V1)
    events = [line for line in response.text.splitlines() if line.startswith("data: ")]
    assert len(events) == 1
    assert '"message"' in events[0] and "hello, s" in events[0]


@pytest.mark.parametrize("binding", SDK_BINDINGS)
async def test_the_official_sdk_client_gets_the_message(
    greeter: tuple[str, Greeter], binding: str
) -> None:
    base, _ = greeter
    channel_factory = None
    if binding == "GRPC":
        import grpc

        def channel_factory(url: str) -> Any:
            return grpc.aio.insecure_channel(url)

    async with httpx.AsyncClient(timeout=10.0) as http:
        for streaming in (False, True):
            config = ClientConfig(
                streaming=streaming,
                httpx_client=http,
                supported_protocol_bindings=[binding],
                grpc_channel_factory=channel_factory,
            )
            client = await ClientFactory(config).create_from_url(base)
            try:
                message = sdk_message(parts=[{"text": "sdk"}], metadata={"taskType": "hello"})
                events = await collect(client, message)
            finally:
                await client.close()
            assert len(events) == 1, events
            assert events[0]["message"]["parts"] == [{"text": "hello, sdk"}]


@pytest.mark.parametrize("binding", ["JSONRPC", "HTTP+JSON", "GRPC"])
async def test_our_client_gets_the_message(greeter: tuple[str, Greeter], binding: str) -> None:
    base, _ = greeter
    async with A2AClient(base, bindings=[binding]) as client:
        for stream in (False, True):
            handle = await client.send("ours", task_type="hello", stream=stream)
            assert handle.message is not None
            assert handle.message.parts[0].text == "hello, ours"
            assert handle.task_id == ""
