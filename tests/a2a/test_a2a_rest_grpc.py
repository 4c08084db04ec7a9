"""The HTTP+JSON/REST and gRPC bindings on the wire, raw (no SDK): routes, query names,
media types, server-sent events, status mapping and error bodies; gRPC status codes, the
ErrorInfo detail, version and authorization metadata; the card's order of interfaces."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from a2akit import GRPC_PRESENT, A2APeer, fast_config

from synapse.a2a import A2AClient, A2AError, enable_a2a, wire
from synapse.a2a.errors import A2ACode
from synapse.demo.handler import DemoHandler
from synapse.transport.peer import Peer

V1 = {"A2A-Version": "1.0"}
WAIT = 10.0


def message(text: str = "", data: Any = None, **fields: Any) -> dict[str, Any]:
    parts: list[dict[str, Any]] = []
    if text:
        parts.append({"text": text})
    if data is not None:
        parts.append({"data": data})
    return {"messageId": "m-1", "role": "ROLE_USER", "parts": parts, **fields}


async def rest(
    base: str,
    verb: str,
    path: str,
    body: Any = None,
    *,
    headers: dict[str, str] | None = None,
    params: dict[str, Any] | None = None,
    content: bytes | None = None,
) -> httpx.Response:
    async with httpx.AsyncClient(timeout=WAIT) as http:
        return await http.request(
            verb,
            f"{base}/a2a{path}",
            json=body if content is None else None,
            content=content,
            params=params,
            headers=V1 if headers is None else headers,
        )


def error_of(response: httpx.Response) -> dict[str, Any]:
    body: dict[str, Any] = response.json()
    error: dict[str, Any] = body["error"]
    assert set(error) == {"code", "status", "message", "details"}
    assert error["code"] == response.status_code
    (info,) = error["details"]
    assert info["@type"] == "type.googleapis.com/google.rpc.ErrorInfo"
    assert info["domain"] == "a2a-protocol.org"
    return error


# --- REST ---------------------------------------------------------------------------------------


async def test_rest_every_operation(a2a_peer: A2APeer) -> None:
    base = a2a_peer.base_url
    sent = await rest(base, "POST", "/message:send", {"message": message("hi")})
    assert sent.status_code == 200
    assert sent.headers["Content-Type"].startswith("application/json")
    task = sent.json()["task"]
    assert task["status"]["state"] == wire.COMPLETED
    got = await rest(base, "GET", f"/tasks/{task['id']}", params={"historyLength": 0})
    assert got.json()["id"] == task["id"]
    assert "history" not in got.json()
    listed = await rest(
        base,
        "GET",
        "/tasks",
        params={"pageSize": "1", "includeArtifacts": "true", "contextId": task["contextId"]},
    )
    assert listed.status_code == 200
    (only,) = listed.json()["tasks"]
    assert only["artifacts"][0]["parts"][0]["text"] == "hi"
    assert listed.json()["pageSize"] == 1
    # snake_case query names too
    snake = await rest(base, "GET", "/tasks", params={"page_size": "1", "context_id": "nope"})
    assert snake.json()["tasks"] == []

    slow = {"message": message(data={"steps": 100, "delay": 0.05}, metadata={"taskType": "slow"})}
    slow["configuration"] = {"returnImmediately": True}
    started = (await rest(base, "POST", "/message:send", slow)).json()["task"]
    task_id = started["id"]
    created = await rest(
        base,
        "POST",
        f"/tasks/{task_id}/pushNotificationConfigs",
        {"url": a2a_peer.hook_url, "token": "tok"},
    )
    assert created.status_code == 200
    config = created.json()
    assert config["taskId"] == task_id
    path = f"/tasks/{task_id}/pushNotificationConfigs/{config['id']}"
    assert (await rest(base, "GET", path)).json()["token"] == "tok"
    configs = await rest(base, "GET", f"/tasks/{task_id}/pushNotificationConfigs")
    assert [c["id"] for c in configs.json()["configs"]] == [config["id"]]
    deleted = await rest(base, "DELETE", path)
    assert (deleted.status_code, deleted.json()) == (200, {})
    assert (await rest(base, "GET", path)).status_code == 404
    cancelled = await rest(base, "POST", f"/tasks/{task_id}:cancel", {})
    assert cancelled.json()["status"]["state"] == wire.CANCELED
    again = await rest(base, "POST", f"/tasks/{task_id}:cancel", {})
    assert again.status_code == 409
    assert error_of(again)["status"] == "FAILED_PRECONDITION"
    assert error_of(again)["details"][0]["reason"] == "TASK_NOT_CANCELABLE"
    # A tenant segment before the route: the route is the same, in another namespace of
    # tasks (docs/a2a.md, "Tenants"): this task, started in none, is not found there.
    tenant = await rest(base, "GET", f"/acme/tasks/{task_id}")
    assert tenant.status_code == 404
    assert error_of(tenant)["details"][0]["reason"] == "TASK_NOT_FOUND"


async def test_rest_streams_are_server_sent_events(a2a_peer: A2APeer) -> None:
    body = {"message": message(data={"steps": 3, "delay": 0.02}, metadata={"taskType": "slow"})}
    events: list[dict[str, Any]] = []
    async with (
        httpx.AsyncClient(timeout=WAIT) as http,
        http.stream(
            "POST", f"{a2a_peer.base_url}/a2a/message:stream", json=body, headers=V1
        ) as response,
    ):
        assert response.headers["Content-Type"].startswith("text/event-stream")
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    assert "task" in events[0]
    assert any("statusUpdate" in e for e in events)
    assert any("artifactUpdate" in e for e in events)
    assert events[-1]["statusUpdate"]["status"]["state"] == wire.COMPLETED
    # Subscribing to a terminal task: an error body with its status, not a stream.
    task_id = events[0]["task"]["id"]
    refused = await rest(a2a_peer.base_url, "GET", f"/tasks/{task_id}:subscribe")
    assert refused.status_code == 400
    assert error_of(refused)["details"][0]["reason"] == "UNSUPPORTED_OPERATION"


@pytest.mark.parametrize(
    ("verb", "path", "body", "status", "grpc_status", "reason"),
    [
        ("GET", "/tasks/no-such-task", None, 404, "NOT_FOUND", "TASK_NOT_FOUND"),
        ("POST", "/message:send", {}, 400, "INVALID_ARGUMENT", "INVALID_PARAMS"),
        (
            "POST",
            "/message:send",
            {"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"metadata": {}}]}},
            415,
            "INVALID_ARGUMENT",
            "CONTENT_TYPE_NOT_SUPPORTED",
        ),
        ("GET", "/tasks", {"pageSize": 0}, 400, "INVALID_ARGUMENT", "INVALID_PARAMS"),
        ("GET", "/extendedAgentCard", None, 400, "UNIMPLEMENTED", "UNSUPPORTED_OPERATION"),
        ("GET", "/no/such/route", None, 404, "NOT_FOUND", "METHOD_NOT_FOUND"),
    ],
)
async def test_rest_errors_have_the_status_and_body_of_the_spec(
    a2a_peer: A2APeer,
    verb: str,
    path: str,
    body: Any,
    status: int,
    grpc_status: str,
    reason: str,
) -> None:
    params = body if verb == "GET" else None
    response = await rest(
        a2a_peer.base_url, verb, path, body if verb != "GET" else None, params=params
    )
    assert response.status_code == status, response.text
    error = error_of(response)
    assert error["status"] == grpc_status
    assert error["details"][0]["reason"] == reason


async def test_rest_media_types_methods_and_version(a2a_peer: A2APeer) -> None:
    base = a2a_peer.base_url
    body = json.dumps({"message": message("hi")}).encode()
    a2a_json = await rest(
        base,
        "POST",
        "/message:send",
        content=body,
        headers={**V1, "Content-Type": "application/a2a+json"},
    )
    assert a2a_json.status_code == 200
    form = await rest(
        base, "POST", "/message:send", content=body, headers={**V1, "Content-Type": "text/plain"}
    )
    assert form.status_code == 415
    unparsable = await rest(
        base,
        "POST",
        "/message:send",
        content=b"{nope",
        headers={**V1, "Content-Type": "application/json"},
    )
    assert unparsable.status_code == 400
    assert error_of(unparsable)["details"][0]["reason"] == "PARSE_ERROR"
    wrong_verb = await rest(base, "PUT", "/message:send", {})
    assert wrong_verb.status_code == 405
    assert wrong_verb.headers["Allow"] == "POST"
    no_version = await rest(base, "GET", "/tasks", headers={})
    assert no_version.status_code == 400
    assert error_of(no_version)["details"][0]["reason"] == "VERSION_NOT_SUPPORTED"
    by_query = await rest(base, "GET", "/tasks", headers={}, params={"A2A-Version": "1.0"})
    assert by_query.status_code == 200


async def test_rest_authentication() -> None:
    peer = Peer("agent-rt", handler=DemoHandler(), config=fast_config())
    enable_a2a(peer, tokens={"tok": "alice"})
    await peer.start()
    try:
        base = f"http://127.0.0.1:{peer.port}"
        refused = await rest(base, "GET", "/tasks")
        assert refused.status_code == 401
        assert refused.headers["WWW-Authenticate"].startswith("Bearer")
        assert error_of(refused)["status"] == "UNAUTHENTICATED"
        allowed = await rest(base, "GET", "/tasks", headers={**V1, "Authorization": "Bearer tok"})
        assert allowed.status_code == 200
        card = await rest(
            base, "GET", "/extendedAgentCard", headers={**V1, "Authorization": "Bearer tok"}
        )
        assert card.json()["name"] == "agent-rt"
    finally:
        await peer.close(drain_timeout=0.2)


# --- the card's interfaces and their order -----------------------------------------------------


async def test_the_card_lists_the_bindings_in_the_configured_order() -> None:
    peer = Peer("agent-o", handler=DemoHandler(), config=fast_config())
    bindings = ["HTTP+JSON", "JSONRPC"] + (["GRPC"] if GRPC_PRESENT else [])
    if GRPC_PRESENT:
        bindings = ["GRPC", *bindings[:2]]
    server = enable_a2a(peer, bindings=bindings, grpc_port=0 if GRPC_PRESENT else None)
    await peer.start()
    try:
        base = f"http://127.0.0.1:{peer.port}"
        async with httpx.AsyncClient(timeout=WAIT) as http:
            card = (await http.get(f"{base}{wire.AGENT_CARD_PATH}")).json()
        assert [i["protocolBinding"] for i in card["supportedInterfaces"]] == bindings
        # Our client follows that order, among what it speaks.
        async with A2AClient(base) as client:
            assert client.binding == bindings[0]
            assert (await (await client.send("hi")).result(WAIT)).ok
        async with A2AClient(base, bindings=["JSONRPC"]) as client:
            assert client.binding == "JSONRPC"
        if GRPC_PRESENT:
            assert server.grpc is not None
    finally:
        await peer.close(drain_timeout=0.2)


@pytest.mark.skipif(not GRPC_PRESENT, reason="grpcio missing: pip install '.[grpc]'")
async def test_the_grpc_interface_is_advertised_at_the_public_host() -> None:
    peer = Peer("agent-p", handler=DemoHandler(), config=fast_config(), host="0.0.0.0")
    server = enable_a2a(peer, public_url="https://agent.example", grpc_port=0, grpc_host="0.0.0.0")
    await peer.start()
    try:
        assert server.grpc is not None
        urls = {i.protocol_binding: i.url for i in server.card().supported_interfaces}
        assert urls == {
            "JSONRPC": "https://agent.example/a2a",
            "HTTP+JSON": "https://agent.example/a2a",
            "GRPC": f"agent.example:{server.grpc.port}",  # not 0.0.0.0
        }
        server.grpc_public_address = "grpc.agent.example:443"
        assert server.interfaces()[2].url == "grpc.agent.example:443"
    finally:
        await peer.close(drain_timeout=0.2)


async def test_only_the_bindings_asked_for_are_served() -> None:
    peer = Peer("agent-j", handler=DemoHandler(), config=fast_config())
    enable_a2a(peer, bindings=["JSONRPC"])
    await peer.start()
    try:
        base = f"http://127.0.0.1:{peer.port}"
        assert (await rest(base, "GET", "/tasks")).status_code == 404
        async with httpx.AsyncClient(timeout=WAIT) as http:
            card = (await http.get(f"{base}{wire.AGENT_CARD_PATH}")).json()
        assert [i["protocolBinding"] for i in card["supportedInterfaces"]] == ["JSONRPC"]
    finally:
        await peer.close(drain_timeout=0.2)
    with pytest.raises(ValueError, match="grpc_port"):
        enable_a2a(Peer("agent-x", handler=DemoHandler()), bindings=["GRPC"])
    with pytest.raises(ValueError, match="distinct"):
        enable_a2a(Peer("agent-y", handler=DemoHandler()), bindings=["SOAP"])


def test_grpc_without_the_extra_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import synapse.a2a.server.app

    monkeypatch.setattr(synapse.a2a.server.app, "grpc_available", lambda: False)
    with pytest.raises(ValueError, match=r"pip install 'synapse-agent-p2p\[grpc\]'"):
        enable_a2a(Peer("agent-z", handler=DemoHandler()), grpc_port=0)


# --- gRPC -----------------------------------------------------------------------------------------


grpc_only = pytest.mark.skipif(not GRPC_PRESENT, reason="grpcio missing: pip install '.[grpc]'")


@grpc_only
async def test_grpc_statuses_metadata_and_streams(a2a_peer: A2APeer) -> None:
    import grpc
    from a2a.types import a2a_pb2, a2a_pb2_grpc
    from google.rpc import error_details_pb2, status_pb2

    assert a2a_peer.a2a.grpc is not None
    target = f"127.0.0.1:{a2a_peer.a2a.grpc.port}"
    version = (("a2a-version", "1.0"),)
    async with grpc.aio.insecure_channel(target) as channel:
        stub = a2a_pb2_grpc.A2AServiceStub(channel)
        request = a2a_pb2.SendMessageRequest()
        request.message.message_id = "m-g"
        request.message.role = a2a_pb2.ROLE_USER
        request.message.parts.add().text = "over grpc"
        sent = await stub.SendMessage(request, metadata=version)
        assert sent.task.status.state == a2a_pb2.TASK_STATE_COMPLETED
        streamed = [e async for e in stub.SendStreamingMessage(request, metadata=version)]
        assert streamed[0].HasField("task")
        assert streamed[-1].status_update.status.state == a2a_pb2.TASK_STATE_COMPLETED

        async def refused(call: Any, code: grpc.StatusCode, reason: str) -> None:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call
            assert caught.value.code() == code
            details = dict(caught.value.trailing_metadata() or ())["grpc-status-details-bin"]
            status = status_pb2.Status.FromString(details)
            info = error_details_pb2.ErrorInfo()
            status.details[0].Unpack(info)
            assert (info.reason, info.domain) == (reason, "a2a-protocol.org")

        missing = a2a_pb2.GetTaskRequest(id="no-such-task")
        await refused(
            stub.GetTask(missing, metadata=version), grpc.StatusCode.NOT_FOUND, "TASK_NOT_FOUND"
        )
        await refused(
            stub.GetTask(missing),  # no a2a-version: an A2A 0.3 client
            grpc.StatusCode.UNIMPLEMENTED,
            "VERSION_NOT_SUPPORTED",
        )
        await refused(
            stub.CancelTask(a2a_pb2.CancelTaskRequest(id=sent.task.id), metadata=version),
            grpc.StatusCode.FAILED_PRECONDITION,
            "TASK_NOT_CANCELABLE",
        )
        subscribe = stub.SubscribeToTask(
            a2a_pb2.SubscribeToTaskRequest(id=sent.task.id), metadata=version
        )
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for _ in subscribe:
                pass
        assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED


@grpc_only
async def test_grpc_authentication() -> None:
    import grpc
    from a2a.types import a2a_pb2, a2a_pb2_grpc

    peer = Peer("agent-gt", handler=DemoHandler(), config=fast_config())
    server = enable_a2a(peer, tokens={"tok": "alice"}, grpc_port=0)
    await peer.start()
    try:
        assert server.grpc is not None
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc.port}") as channel:
            stub = a2a_pb2_grpc.A2AServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.ListTasks(a2a_pb2.ListTasksRequest(), metadata=(("a2a-version", "1.0"),))
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
            listed = await stub.ListTasks(
                a2a_pb2.ListTasksRequest(),
                metadata=(("a2a-version", "1.0"), ("authorization", "Bearer tok")),
            )
            assert list(listed.tasks) == []
        base = f"http://127.0.0.1:{peer.port}"
        async with A2AClient(base, token="tok", bindings=["GRPC"]) as client:
            assert (await client.list_tasks()).tasks == []
            card = await client.get_extended_card()
            assert card.name == "agent-gt"
    finally:
        await peer.close(drain_timeout=0.2)


def test_error_statuses_cover_every_code() -> None:
    for code in A2ACode:
        assert 400 <= code.http_status < 600
        assert code.grpc_status


@grpc_only
async def test_an_unreachable_grpc_agent_says_so() -> None:
    from synapse.a2a.client.transports import GrpcTransport

    transport = GrpcTransport("127.0.0.1:1", {}, 2.0)  # nothing listens on port 1
    try:
        with pytest.raises(A2AError) as caught:
            await transport.call("GetTask", {"id": "x"})
    finally:
        await transport.close()
    assert caught.value.code == A2ACode.INTERNAL_ERROR
    assert caught.value.message.startswith("GetTask: cannot reach 127.0.0.1:1: ")
