"""A2A 0.3 beside 1.0, both directions: the official SDK's 0.3 client (its compatibility
layer, `CompatJsonRpcTransport`) against a Synapse agent, 0.3 requests on the wire, the card
both versions read, and our client against an A2A 0.3 agent built with the official SDK."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from a2a.client import ClientConfig, ClientFactory
from a2a.types.a2a_pb2 import (
    AuthenticationInfo,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    TaskPushNotificationConfig,
    TaskState,
)
from a2akit import (
    GRPC_PRESENT,
    A2APeer,
    UvicornThread,
    collect,
    sdk_message,
    state_of,
    task_id_of,
    texts,
)

from synapse.a2a import A2AClient, v03, wire
from synapse.a2a.client.legacy import JsonRpc03Transport, Rest03Transport
from synapse.a2a.errors import A2ACode, A2AError

COMPLETED = "TASK_STATE_COMPLETED"
INPUT_REQUIRED = "TASK_STATE_INPUT_REQUIRED"


#: The 0.3 bindings served, and the official SDK's 0.3 transport for each.
BINDINGS_03 = {"JSONRPC": "CompatJsonRpcTransport", "HTTP+JSON": "CompatRestTransport"}


@pytest.fixture(params=list(BINDINGS_03))
async def sdk_03_client(a2a_peer: A2APeer, request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    """The official SDK's client, reading our 0.3 card: it speaks 0.3 to us, over each
    binding that speaks 0.3."""
    http = httpx.AsyncClient(timeout=10.0)
    made: list[Any] = []
    binding: str = request.param

    async def make(streaming: bool = True) -> Any:
        config = ClientConfig(
            streaming=streaming, httpx_client=http, supported_protocol_bindings=[binding]
        )
        client = await ClientFactory(config).create_from_url(
            a2a_peer.base_url, relative_card_path=v03.AGENT_CARD_PATH_03
        )
        made.append(client)
        return client

    yield make
    for client in made:
        await client.close()
    await http.aclose()


async def rpc(url: str, method: str, params: Any, **headers: str) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=10.0) as http:
        body = {"jsonrpc": "2.0", "id": 7, "method": method, "params": params}
        answer: dict[str, Any] = (await http.post(url, json=body, headers=headers)).json()
        return answer


# --- the official SDK's 0.3 client against us ------------------------------------------------


@pytest.mark.parametrize("streaming", [True, False], ids=["stream", "blocking"])
async def test_the_sdk_03_client_runs_tasks(sdk_03_client: Any, streaming: bool) -> None:
    client = await sdk_03_client(streaming)
    assert type(client._transport).__name__ in BINDINGS_03.values()  # it speaks 0.3
    events = await collect(client, sdk_message(parts=[{"text": "hello 0.3"}]))
    assert state_of(events[-1]) == COMPLETED
    assert "hello 0.3" in texts(events)
    asked = await collect(
        client,
        sdk_message(parts=[{"data": {"prompt": "春"}}], metadata={"taskType": "text_generation"}),
    )
    assert state_of(asked[-1]) == INPUT_REQUIRED
    task_id = task_id_of(asked)
    done = await collect(client, sdk_message(taskId=task_id, parts=[{"data": {"style": "现代"}}]))
    assert state_of(done[-1]) == COMPLETED
    assert any("现代" in t for t in texts(done))
    task = await client.get_task(GetTaskRequest(id=task_id))
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    assert task.history[0].message_id == asked[0]["task"]["history"][0]["messageId"]


async def test_the_sdk_03_client_cancels(sdk_03_client: Any) -> None:
    client = await sdk_03_client(False)
    started = await collect(
        client,
        sdk_message(parts=[{"data": {"steps": 100, "delay": 0.1}}], metadata={"taskType": "slow"}),
        returnImmediately=True,
    )
    task = await client.cancel_task(CancelTaskRequest(id=task_id_of(started)))
    assert task.status.state == TaskState.TASK_STATE_CANCELED


async def test_the_sdk_03_client_manages_push_configs(
    sdk_03_client: Any, a2a_peer: A2APeer
) -> None:
    client = await sdk_03_client(False)
    started = await collect(
        client,
        sdk_message(parts=[{"data": {"steps": 100, "delay": 0.1}}], metadata={"taskType": "slow"}),
        returnImmediately=True,
    )
    task_id = task_id_of(started)
    hook = f"http://127.0.0.1:{a2a_peer.hook_port}/hooks/v03"
    created = await client.create_task_push_notification_config(
        TaskPushNotificationConfig(
            task_id=task_id,
            id="c-03",
            url=hook,
            token="tok",
            authentication=AuthenticationInfo(scheme="Bearer", credentials="cred"),
        )
    )
    assert (created.id, created.url, created.task_id) == ("c-03", hook, task_id)
    got = await client.get_task_push_notification_config(
        GetTaskPushNotificationConfigRequest(task_id=task_id, id="c-03")
    )
    assert got.token == "tok" and got.authentication.scheme == "Bearer"
    if type(client._transport).__name__ == "CompatJsonRpcTransport":  # REST: not in its client
        listed = await client.list_task_push_notification_configs(
            ListTaskPushNotificationConfigsRequest(task_id=task_id)
        )
        assert [c.id for c in listed.configs] == ["c-03"]
        await client.delete_task_push_notification_config(
            DeleteTaskPushNotificationConfigRequest(task_id=task_id, id="c-03")
        )
        listed = await client.list_task_push_notification_configs(
            ListTaskPushNotificationConfigsRequest(task_id=task_id)
        )
        assert list(listed.configs) == []
    await client.cancel_task(CancelTaskRequest(id=task_id))


# --- the wire ------------------------------------------------------------------------------------


async def test_0_3_shapes_on_the_wire(a2a_peer: A2APeer) -> None:
    url = f"{a2a_peer.base_url}/a2a"
    message = {
        "kind": "message",
        "messageId": "m-03-shapes",
        "role": "user",
        "parts": [{"kind": "data", "data": {"prompt": "x"}}],
        "metadata": {"taskType": "text_generation"},
    }
    sent = (await rpc(url, "message/send", {"message": message}))["result"]
    assert sent["kind"] == "task"
    assert sent["status"]["state"] == "input-required"
    question = sent["status"]["message"]
    assert question["kind"] == "message" and question["role"] == "agent"
    assert {p["kind"] for p in question["parts"]} == {"text", "data"}
    got = (await rpc(url, "tasks/get", {"id": sent["id"], "historyLength": 1}))["result"]
    assert got["id"] == sent["id"] and len(got["history"]) == 1
    missing = await rpc(url, "tasks/get", {"id": "no-such-task"})
    assert missing["error"]["code"] == -32001
    # A 0.3 method asked as 1.0 is no method of 1.0; a 1.0 method without a version header
    # is still refused as a version the agent does not speak for it.
    as_v1 = await rpc(url, "message/send", {"message": message}, **{"A2A-Version": "1.0"})
    assert as_v1["error"]["code"] == -32601
    v1_without_header = await rpc(url, "GetTask", {"id": sent["id"]})
    assert v1_without_header["error"]["code"] == -32009
    explicit = await rpc(url, "tasks/get", {"id": sent["id"]}, **{"A2A-Version": "0.3"})
    assert explicit["result"]["id"] == sent["id"]


async def test_0_3_push_config_asked_without_its_id(a2a_peer: A2APeer) -> None:
    """A 0.3 client may ask for the task's configuration without an id, or as `default`:
    the one set without an id, unless one is named `default`; a named one by its name."""
    url = f"{a2a_peer.base_url}/a2a"
    hook = f"http://127.0.0.1:{a2a_peer.hook_port}/hooks/03"
    message = {
        "kind": "message",
        "messageId": "m-03-push",
        "role": "user",
        "parts": [{"kind": "data", "data": {"prompt": "x"}}],
        "metadata": {"taskType": "text_generation"},
    }
    task_id = (await rpc(url, "message/send", {"message": message}))["result"]["id"]

    async def get(**config_id: str) -> dict[str, Any]:
        params = {"id": task_id, **config_id}
        return await rpc(url, "tasks/pushNotificationConfig/get", params)

    assert (await get())["error"]["code"] == -32001  # none yet
    for config in ({"url": hook}, {"id": "named", "url": hook + "/named"}):
        params = {"taskId": task_id, "pushNotificationConfig": config}
        assert "result" in await rpc(url, "tasks/pushNotificationConfig/set", params)
    for asked in ({}, {"pushNotificationConfigId": "default"}):
        found = (await get(**asked))["result"]
        assert found["taskId"] == task_id
        assert found["pushNotificationConfig"] == {"id": task_id, "url": hook}
    named = (await get(pushNotificationConfigId="named"))["result"]
    assert named["pushNotificationConfig"]["url"] == hook + "/named"
    assert (await get(pushNotificationConfigId="other"))["error"]["code"] == -32001
    params = {"taskId": task_id, "pushNotificationConfig": {"id": "default", "url": hook + "/d"}}
    await rpc(url, "tasks/pushNotificationConfig/set", params)
    found = (await get(pushNotificationConfigId="default"))["result"]
    assert found["pushNotificationConfig"]["url"] == hook + "/d"


async def test_a_0_3_follow_up_to_a_working_task_is_kept(a2a_peer: A2APeer) -> None:
    url = f"{a2a_peer.base_url}/a2a"
    slow = {
        "kind": "message",
        "messageId": "m-03-slow",
        "role": "user",
        "parts": [{"kind": "data", "data": {"steps": 200, "delay": 0.05}}],
        "metadata": {"taskType": "slow"},
    }
    params = {"message": slow, "configuration": {"blocking": False}}
    task = (await rpc(url, "message/send", params))["result"]
    more = {
        "kind": "message",
        "messageId": "m-03-more",
        "role": "user",
        "taskId": task["id"],
        "contextId": task["contextId"],
        "parts": [{"kind": "text", "text": "and also this"}],
    }
    kept = await rpc(url, "message/send", {"message": more, "configuration": {"blocking": False}})
    assert kept["result"]["status"]["state"] in ("submitted", "working")
    assert kept["result"]["history"][-1]["parts"] == [{"kind": "text", "text": "and also this"}]
    cancelled = (await rpc(url, "tasks/cancel", {"id": task["id"]}))["result"]
    assert cancelled["status"]["state"] == "canceled"


async def test_0_3_rest_shapes_on_the_wire(a2a_peer: A2APeer) -> None:
    """0.3's REST bodies: `content` parts, `data.data`, enum names, `TASK_STATE_CANCELLED`,
    push configurations by resource name; read in camelCase or snake_case."""
    base = f"{a2a_peer.base_url}/a2a"
    message = {
        "message_id": "m-03-rest",
        "role": "ROLE_USER",
        "content": [{"data": {"data": {"steps": 100, "delay": 0.1}}}],
        "metadata": {"taskType": "slow"},
    }
    hook = f"http://127.0.0.1:{a2a_peer.hook_port}/hooks/rest03"
    async with httpx.AsyncClient(timeout=10.0) as http:
        sent = (await http.post(f"{base}/v1/message:send", json={"request": message})).json()
        task = sent["task"]
        assert task["status"]["state"] in ("TASK_STATE_SUBMITTED", "TASK_STATE_WORKING")
        assert task["history"][0]["content"] == [{"data": {"data": {"steps": 100, "delay": 0.1}}}]
        assert task["history"][0]["role"] == "ROLE_USER"
        task_id = task["id"]
        config = {"name": "", "pushNotificationConfig": {"id": "r1", "url": hook}}
        made = await http.post(
            f"{base}/v1/tasks/{task_id}/pushNotificationConfigs", json={"config": config}
        )
        assert made.json() == {
            "name": f"tasks/{task_id}/pushNotificationConfigs/r1",
            "pushNotificationConfig": {"id": "r1", "url": hook},
        }
        listed = (await http.get(f"{base}/v1/tasks/{task_id}/pushNotificationConfigs")).json()
        assert [c["pushNotificationConfig"]["id"] for c in listed["configs"]] == ["r1"]
        gone = await http.delete(f"{base}/v1/tasks/{task_id}/pushNotificationConfigs/r1")
        assert gone.status_code == 200
        cancelled = (await http.post(f"{base}/v1/tasks/{task_id}:cancel")).json()
        assert cancelled["status"]["state"] == "TASK_STATE_CANCELLED"
        got = (await http.get(f"{base}/v1/tasks/{task_id}", params={"historyLength": 1})).json()
        assert got["status"]["state"] == "TASK_STATE_CANCELLED" and len(got["history"]) == 1
        missing = await http.get(f"{base}/v1/tasks/no-such-task")
        assert missing.status_code == 404
        # With A2A-Version 1.0, /v1/… is a 1.0 path (tenant "v1"), not a 0.3 route.
        as_v1 = await http.get(f"{base}/v1/tasks/{task_id}", headers={"A2A-Version": "1.0"})
        assert as_v1.status_code == 404


async def test_a_0_3_stream_ends_with_a_final_status_update(a2a_peer: A2APeer) -> None:
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "message/stream",
        "params": {
            "message": {
                "kind": "message",
                "messageId": "m-03-stream",
                "role": "user",
                "parts": [{"kind": "text", "text": "streamed"}],
            }
        },
    }
    async with (
        httpx.AsyncClient(timeout=10.0) as http,
        http.stream("POST", f"{a2a_peer.base_url}/a2a", json=body) as response,
    ):
        events = [
            json.loads(line[6:])["result"]
            async for line in response.aiter_lines()
            if line.startswith("data: ")
        ]
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "task"
    assert "artifact-update" in kinds
    last = events[-1]
    assert (last["kind"], last["status"]["state"], last["final"]) == (
        "status-update",
        "completed",
        True,
    )
    assert all(e["final"] is False for e in events[:-1] if e["kind"] == "status-update")


async def test_the_cards_of_both_versions(a2a_peer: A2APeer) -> None:
    async with httpx.AsyncClient() as http:
        card = (await http.get(f"{a2a_peer.base_url}{wire.AGENT_CARD_PATH}")).json()
        legacy = (await http.get(f"{a2a_peer.base_url}{v03.AGENT_CARD_PATH_03}")).json()
    # The 1.0 card is a 1.0 card only (strict validators refuse other members) …
    assert card["supportedInterfaces"][0]["protocolVersion"] == "1.0"
    assert not {"url", "protocolVersion", "preferredTransport"} & set(card)
    assert legacy["protocolVersion"] == "0.3.0"
    assert legacy["url"] == f"{a2a_peer.base_url}/a2a"
    assert legacy["preferredTransport"] == "JSONRPC"
    assert all("tags" in s for s in legacy["skills"])
    # The 0.3 card alone: what this agent speaks 0.3 on (gRPC too: the 0.3 service is on the
    # gRPC port beside 1.0's).
    assert "supportedInterfaces" not in legacy
    grpc_03 = (
        [{"url": f"http://127.0.0.1:{a2a_peer.a2a.grpc.port}", "transport": "GRPC"}]
        if a2a_peer.a2a.grpc is not None
        else []
    )
    assert legacy["additionalInterfaces"] == [
        {"url": f"{a2a_peer.base_url}/a2a", "transport": "JSONRPC"},
        {"url": f"{a2a_peer.base_url}/a2a", "transport": "HTTP+JSON"},
        *grpc_03,
    ]
    assert legacy["capabilities"]["streaming"] is True
    # A 1.0 client speaks 1.0 here.
    async with A2AClient(a2a_peer.base_url) as ours:
        assert ours.transport is not None
        assert not isinstance(ours.transport, JsonRpc03Transport)


# --- our client against an A2A 0.3 agent ----------------------------------------------------------


#: The binding a 0.3 agent of the official SDK offers, and our transport for it.
LEGACY_TRANSPORTS = {"JSONRPC": JsonRpc03Transport, "HTTP+JSON": Rest03Transport}


@pytest.fixture(params=list(LEGACY_TRANSPORTS))
def sdk_03_agent(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """An A2A 0.3 agent of the official SDK whose card offers one binding: (URL, binding)."""
    from a2a_sdk_agent import build_app

    binding: str = request.param
    with UvicornThread(lambda port: build_app(port, first=binding, legacy=True)) as runner:
        yield runner.url, binding


async def test_our_client_speaks_0_3_to_a_0_3_agent(sdk_03_agent: tuple[str, str]) -> None:
    url, binding = sdk_03_agent
    async with A2AClient(url) as client:
        card = await client.discover()
        assert type(client.transport) is LEGACY_TRANSPORTS[binding]
        assert card.supported_interfaces[0].protocol_version == "0.3"
        assert card.supported_interfaces[0].protocol_binding == binding
        done = await (await client.send("echo me")).result(10)
        assert done.ok and done.text == "echo me"
        handle = await client.send("ask me")
        states = []
        async for event in handle.events():
            states.append(event.state)
            if event.state == wire.INPUT_REQUIRED:
                break
        assert states == [wire.SUBMITTED, wire.WORKING, wire.INPUT_REQUIRED]
        await handle.reply("Ada")
        answered = await handle.result(10)
        assert answered.ok and answered.text == "hello Ada"
        task = await client.get_task(handle.task_id, history_length=1)
        assert task.status.state == wire.COMPLETED and len(task.history) == 1
        slow = await client.send("slow", stream=False)
        await slow.cancel()
        assert (await slow.result(10)).a2a_state == wire.CANCELED
        with pytest.raises(A2AError) as missing:
            await client.get_task("no-such-task")
        assert missing.value.code == A2ACode.TASK_NOT_FOUND


async def test_our_0_3_rest_client_against_our_0_3_rest_server(a2a_peer: A2APeer) -> None:
    """Every operation 0.3 has, over REST both ways: tasks, a question, cancel, push
    configurations, and the errors."""
    rest = wire.AgentInterface(
        url=a2a_peer.base_url + "/a2a", protocol_binding="HTTP+JSON", protocol_version="0.3"
    )
    hook = f"http://127.0.0.1:{a2a_peer.hook_port}/hooks/rest-client-03"
    async with A2AClient(a2a_peer.base_url) as client:
        card = await client.discover()
        await client.use_card(card, rest)
        assert isinstance(client.transport, Rest03Transport)
        done = await (await client.send({"text": "over 0.3 REST"}, task_type="echo")).result(10)
        assert done.ok and "over 0.3 REST" in done.text
        asked = await client.send({"prompt": "p"}, task_type="text_generation")
        async for event in asked.events():
            if event.state == wire.INPUT_REQUIRED:
                break
        await asked.provide_info({"style": "modern"})
        assert (await asked.result(10)).ok
        slow = await client.send({"steps": 200, "delay": 0.05}, task_type="slow", stream=False)
        created = await client.create_push_config(slow.task_id, hook, config_id="r03")
        assert created.id == "r03" and created.url == hook
        assert (await client.get_push_config(slow.task_id, "r03")).url == hook
        assert [c.id for c in await client.list_push_configs(slow.task_id)] == ["r03"]
        await client.delete_push_config(slow.task_id, "r03")
        assert await client.list_push_configs(slow.task_id) == []
        await slow.cancel()
        assert (await slow.result(10)).a2a_state == wire.CANCELED
        with pytest.raises(A2AError) as missing:
            await client.get_task("no-such-task")
        assert missing.value.code == A2ACode.TASK_NOT_FOUND
        with pytest.raises(A2AError) as unsupported:
            await client.list_tasks()
        assert unsupported.value.code == A2ACode.UNSUPPORTED_OPERATION


async def test_our_client_reads_a_0_3_card_at_the_old_path(a2a_peer: A2APeer) -> None:
    """A card with no `supportedInterfaces` (0.3 only): the client speaks 0.3 to it."""
    async with A2AClient(a2a_peer.base_url + v03.AGENT_CARD_PATH_03) as client:
        assert isinstance(client.transport, JsonRpc03Transport)
        outcome = await (await client.send({"text": "via 0.3"}, task_type="echo")).result(10)
    assert outcome.ok and "via 0.3" in outcome.text


async def test_the_0_3_members_on_the_1_0_card_when_asked() -> None:
    """`card_v03_members`: one card both versions' clients read at the 1.0 path, as the
    official SDK serves it."""
    from synapse import Peer
    from synapse.a2a import enable_a2a
    from synapse.demo.handler import DemoHandler

    peer = Peer("both", handler=DemoHandler())
    enable_a2a(peer, tokens={"token-a": "alice"}, card_v03_members=True)
    await peer.start()
    try:
        async with httpx.AsyncClient() as http:
            url = f"http://127.0.0.1:{peer.port}{wire.AGENT_CARD_PATH}"
            card = (await http.get(url)).json()
    finally:
        await peer.close(drain_timeout=0)
    assert card["supportedInterfaces"][0]["protocolVersion"] == "1.0"
    assert card["protocolVersion"] == "0.3.0"
    assert card["url"] == f"http://127.0.0.1:{peer.port}/a2a"
    bearer = card["securitySchemes"]["bearer"]
    assert bearer["httpAuthSecurityScheme"]["scheme"] == "Bearer"  # 1.0
    assert (bearer["type"], bearer["scheme"]) == ("http", "Bearer")  # and 0.3, beside
    assert card["security"] == [{"bearer": []}]


def test_serve_a2a_v03_card_puts_the_0_3_members_on_the_card(tmp_path: Any) -> None:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent.parent / "cli"))
    from clikit import free_port, serve

    port = free_port()
    with serve("--agent-id", "agent", "--a2a", "--a2a-v03-card", port=port):
        card = httpx.get(f"http://127.0.0.1:{port}{wire.AGENT_CARD_PATH}").json()
    with serve("--agent-id", "agent", "--a2a", port=port):
        plain = httpx.get(f"http://127.0.0.1:{port}{wire.AGENT_CARD_PATH}").json()
    assert card["protocolVersion"] == "0.3.0" and card["supportedInterfaces"]
    assert "protocolVersion" not in plain


@pytest.mark.skipif(
    not GRPC_PRESENT, reason="gRPC needs the grpc extra: pip install 'synapse-agent-p2p[grpc]'"
)
async def test_a_03_grpc_client_of_the_official_sdk_is_served_beside_1_0(a2a_peer: A2APeer) -> None:
    """The SDK's 0.3 gRPC transport against the gRPC port that serves 1.0: send, stream, get,
    cancel, push configurations and the card, each in 0.3's protobuf form."""
    import grpc
    from a2a.compat.v0_3.grpc_transport import CompatGrpcTransport
    from a2a.types.a2a_pb2 import (
        CancelTaskRequest,
        DeleteTaskPushNotificationConfigRequest,
        GetExtendedAgentCardRequest,
        GetTaskPushNotificationConfigRequest,
        GetTaskRequest,
        ListTaskPushNotificationConfigsRequest,
        SendMessageConfiguration,
        SendMessageRequest,
        TaskPushNotificationConfig,
        TaskState,
    )

    assert a2a_peer.a2a.grpc is not None
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{a2a_peer.a2a.grpc.port}")
    transport = CompatGrpcTransport(channel, None)
    try:
        # A configuration asks to wait for the outcome (0.3's `blocking`); without one, 0.3
        # returns at once.
        sent = await transport.send_message(
            SendMessageRequest(
                message=sdk_message(parts=[{"text": "over 0.3 gRPC"}]),
                configuration=SendMessageConfiguration(),
            )
        )
        assert sent.task.status.state == TaskState.TASK_STATE_COMPLETED
        texts = [p.text for a in sent.task.artifacts for p in a.parts if p.text]
        assert texts == ["over 0.3 gRPC"]
        got = await transport.get_task(GetTaskRequest(id=sent.task.id))
        assert got.id == sent.task.id and got.status.state == TaskState.TASK_STATE_COMPLETED
        streamed = [
            e
            async for e in transport.send_message_streaming(
                SendMessageRequest(
                    message=sdk_message(
                        parts=[{"data": {"steps": 2, "delay": 0.05}}],
                        metadata={"taskType": "slow"},
                    )
                )
            )
        ]
        kinds = [e.WhichOneof("payload") for e in streamed]
        assert kinds[0] == "task" and "status_update" in kinds
        slow = await transport.send_message(
            SendMessageRequest(
                message=sdk_message(
                    parts=[{"data": {"steps": 50, "delay": 0.1}}], metadata={"taskType": "slow"}
                ),
            )
        )
        config = await transport.create_task_push_notification_config(
            TaskPushNotificationConfig(task_id=slow.task.id, id="hook-1", url=a2a_peer.hook_url)
        )
        assert config.id == "hook-1" and config.url == a2a_peer.hook_url
        again = await transport.get_task_push_notification_config(
            GetTaskPushNotificationConfigRequest(task_id=slow.task.id, id="hook-1")
        )
        assert again.url == a2a_peer.hook_url
        listed = await transport.list_task_push_notification_configs(
            ListTaskPushNotificationConfigsRequest(task_id=slow.task.id)
        )
        assert [c.id for c in listed.configs] == ["hook-1"]
        await transport.delete_task_push_notification_config(
            DeleteTaskPushNotificationConfigRequest(task_id=slow.task.id, id="hook-1")
        )
        cancelled = await transport.cancel_task(CancelTaskRequest(id=slow.task.id))
        assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
        card = await transport.get_extended_agent_card(GetExtendedAgentCardRequest())
        assert card.name == "agent-a"
    finally:
        await transport.close()


@pytest.mark.skipif(
    not GRPC_PRESENT, reason="gRPC needs the grpc extra: pip install 'synapse-agent-p2p[grpc]'"
)
async def test_our_client_speaks_03_over_grpc_from_a_03_card(a2a_peer: A2APeer) -> None:
    """A2AClient given a 0.3 card and its gRPC interface: send (blocking and streamed), get,
    push configurations, cancel and the card go to the 0.3 service."""
    import httpx

    from synapse.a2a.client.grpc03 import Grpc03Transport
    from synapse.a2a.client.values import parse_card

    async with httpx.AsyncClient(timeout=10) as http:
        raw = (await http.get(f"{a2a_peer.base_url}/.well-known/agent.json")).content
    card = parse_card(raw)
    (interface,) = [i for i in card.supported_interfaces if i.protocol_binding == "GRPC"]
    assert interface.protocol_version.startswith("0.3")
    async with A2AClient(a2a_peer.base_url) as client:
        await client.use_card(card, interface)
        assert isinstance(client.transport, Grpc03Transport)
        outcome = await (
            await client.send({"text": "hi over 0.3 gRPC"}, task_type="echo", stream=False)
        )
        assert outcome.ok and outcome.task is not None
        assert outcome.result is not None and outcome.result.output == "hi over 0.3 gRPC"
        streamed = await (
            await client.send({"steps": 2, "delay": 0.05}, task_type="slow", stream=True)
        )
        assert streamed.ok
        got = await client.get_task(outcome.task.id)
        assert got.status.state == COMPLETED
        slow = await client.send({"steps": 50, "delay": 0.1}, task_type="slow", stream=False)
        task_id = slow.task_id
        created = await client.create_push_config(task_id, a2a_peer.hook_url, config_id="h-03")
        assert created.id == "h-03"
        assert [c.id for c in await client.list_push_configs(task_id)] == ["h-03"]
        await client.delete_push_config(task_id, "h-03")
        await slow.cancel()
        cancelled = await slow
        assert cancelled.task is not None
        assert cancelled.task.status.state == "TASK_STATE_CANCELED"
        extended = await client.get_extended_card()
        assert extended.name == "agent-a"


@pytest.mark.skipif(
    not GRPC_PRESENT, reason="gRPC needs the grpc extra: pip install 'synapse-agent-p2p[grpc]'"
)
async def test_a_03_grpc_message_without_its_id_or_role_is_refused(a2a_peer: A2APeer) -> None:
    """Proto3 carries a missing `message_id` as "" and a missing role as unspecified:
    refused as JSON-RPC and REST refuse missing ones (the 0.3 TCK's
    test_missing_required_message_fields over gRPC)."""
    import grpc
    from a2a.compat.v0_3 import a2a_v0_3_pb2 as pb

    assert a2a_peer.a2a.grpc is not None
    async with grpc.aio.insecure_channel(f"127.0.0.1:{a2a_peer.a2a.grpc.port}") as channel:
        send = channel.unary_unary(
            f"/{pb.DESCRIPTOR.services_by_name['A2AService'].full_name}/SendMessage",
            request_serializer=pb.SendMessageRequest.SerializeToString,
            response_deserializer=pb.SendMessageResponse.FromString,
        )
        text = pb.Part(text="no id")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await send(pb.SendMessageRequest(request=pb.Message(role=pb.ROLE_USER, content=[text])))
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "messageId" in (refused.value.details() or "")
        # No role (ROLE_UNSPECIFIED), and a part with no content: refused too, not run as
        # an agent's message nor answered with an internal error.
        for message in (
            pb.Message(message_id="no-role", content=[text]),
            pb.Message(message_id="empty-part", role=pb.ROLE_USER, content=[pb.Part()]),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await send(pb.SendMessageRequest(request=message))
            assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT, message
        sent = await send(
            pb.SendMessageRequest(
                request=pb.Message(message_id="with-id", role=pb.ROLE_USER, content=[text])
            )
        )
        assert sent.task.id
