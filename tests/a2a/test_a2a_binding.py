"""The JSON-RPC binding on the wire: version header, JSON-RPC and A2A error codes, follow-up
rules, authentication, push configuration methods, draining and restart."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2akit import A2APeer, fast_config

from synapse.a2a import enable_a2a
from synapse.demo.handler import DemoHandler
from synapse.store import SqliteStore
from synapse.transport.peer import Peer

V1 = {"A2A-Version": "1.0"}


async def rpc(
    base_url: str,
    method: str,
    params: Any = None,
    *,
    headers: dict[str, str] | None = None,
    body: bytes | None = None,
) -> tuple[int, dict[str, Any]]:
    request: dict[str, Any] = {"jsonrpc": "2.0", "id": "req-1", "method": method}
    if params is not None:
        request["params"] = params
    async with httpx.AsyncClient(timeout=10) as http:
        if body is not None:
            response = await http.post(
                f"{base_url}/a2a", content=body, headers=V1 if headers is None else headers
            )
        else:
            response = await http.post(
                f"{base_url}/a2a", json=request, headers=V1 if headers is None else headers
            )
    data: dict[str, Any] = response.json()
    return response.status_code, data


def code(answer: dict[str, Any]) -> int:
    value: int = answer["error"]["code"]
    return value


def send_params(data: Any = None, text: str | None = None, **message: Any) -> dict[str, Any]:
    parts: list[dict[str, Any]] = []
    if text is not None:
        parts.append({"text": text})
    if data is not None:
        parts.append({"data": data})
    return {"message": {"messageId": "m-1", "role": "ROLE_USER", "parts": parts, **message}}


# --- version ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "accepted"),
    [
        ({}, False),  # no header: an A2A 0.3 client
        ({"A2A-Version": "0.3"}, False),
        ({"A2A-Version": "2.0"}, False),
        ({"A2A-Version": "banana"}, False),
        ({"A2A-Version": "1.0"}, True),
        ({"A2A-Version": "1.0.1"}, False),  # not MAJOR.MINOR
        ({"A2A-Version": "1"}, False),
        ({"A2A-Version": "1.1"}, True),
    ],
)
async def test_the_version_header_is_checked(
    a2a_peer: A2APeer, headers: dict[str, str], accepted: bool
) -> None:
    status, answer = await rpc(a2a_peer.base_url, "ListTasks", {}, headers=headers)
    assert status == 200
    if accepted:
        assert "result" in answer
    else:
        assert code(answer) == -32009
        assert "1.0" in answer["error"]["message"]
        (info,) = answer["error"]["data"]
        assert info["reason"] == "VERSION_NOT_SUPPORTED"
        assert info["metadata"]["supportedVersions"] == "1.0"


async def test_the_json_rpc_url_with_a_slash_added_is_the_same_endpoint(a2a_peer: A2APeer) -> None:
    """Clients that join "/" onto the card's URL (httpx's `base_url`, the A2A TCK's client)
    POST `/a2a/`: answered as at `/a2a`."""
    async with httpx.AsyncClient(base_url=f"{a2a_peer.base_url}/a2a", timeout=10) as http:
        response = await http.post(
            "/",
            json={"jsonrpc": "2.0", "id": 3, "method": "GetTask", "params": {"id": "x"}},
            headers=V1,
        )
    assert str(response.url).endswith("/a2a/")
    assert response.status_code == 200 and response.json()["error"]["code"] == -32001


# --- JSON-RPC errors ------------------------------------------------------------------------


async def test_json_rpc_errors(a2a_peer: A2APeer) -> None:
    base = a2a_peer.base_url
    _, answer = await rpc(base, "", body=b"{not json")
    assert code(answer) == -32700
    assert answer["id"] is None
    # A body declared as another media type than JSON is refused as such, whatever it holds
    # (the A2A TCK's JSONRPC-SSE-002 expects ContentTypeNotSupportedError); no declared type
    # is taken as JSON.
    well_formed = b'{"jsonrpc": "2.0", "id": 4, "method": "GetTask", "params": {"id": "x"}}'
    for declared in ("text/plain", "application/x-www-form-urlencoded"):
        status, answer = await rpc(
            base, "", body=well_formed, headers={**V1, "Content-Type": declared}
        )
        assert (status, code(answer), answer["id"]) == (200, -32005, 4), answer
        assert declared in answer["error"]["message"]
    status, answer = await rpc(base, "", body=well_formed, headers={**V1, "Content-Type": ""})
    assert (status, code(answer)) == (200, -32001)  # parsed as JSON: the task is unknown
    _, answer = await rpc(base, "", body=b'[{"jsonrpc": "2.0", "id": 1, "method": "GetTask"}]')
    assert code(answer) == -32600
    _, answer = await rpc(base, "", body=b'{"id": 7, "method": "GetTask"}')
    assert (code(answer), answer["id"]) == (-32600, 7)
    _, answer = await rpc(base, "tasks/get", {"id": "x"})  # an A2A 0.3 method name
    assert code(answer) == -32601
    _, answer = await rpc(base, "GetTask", {"id": 5})
    assert code(answer) == -32602
    _, answer = await rpc(base, "SendMessage", {})
    assert code(answer) == -32602
    _, answer = await rpc(base, "SendMessage", send_params())
    assert code(answer) == -32602  # no parts
    _, answer = await rpc(
        base,
        "SendMessage",
        {"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"metadata": {}}]}},
    )
    assert code(answer) == -32005  # a part with no content
    _, answer = await rpc(base, "SendMessage", send_params(data=[1, 2]))
    assert code(answer) == -32602  # a payload is an object
    _, answer = await rpc(base, "GetTask", {"id": "missing"})
    assert code(answer) == -32001
    _, answer = await rpc(base, "GetExtendedAgentCard", {})
    assert code(answer) == -32004  # no authenticated card without authentication


async def test_follow_ups_answer_input_required_and_never_a_terminal_task(
    a2a_peer: A2APeer,
) -> None:
    base = a2a_peer.base_url
    _, done = await rpc(base, "SendMessage", send_params(text="hi"))
    task = done["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    _, answer = await rpc(base, "SendMessage", send_params(text="again", taskId=task["id"]))
    assert code(answer) == -32004
    assert "terminal" in answer["error"]["message"]

    slow = send_params(data={"steps": 100, "delay": 0.05}, metadata={"task_type": "slow"})
    slow["configuration"] = {"returnImmediately": True}
    _, started = await rpc(base, "SendMessage", slow)
    running = started["result"]["task"]
    _, asked = await rpc(
        base,
        "SendMessage",
        send_params(data={"prompt": "p"}, metadata={"task_type": "text_generation"}),
    )
    waiting = asked["result"]["task"]
    assert waiting["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    _, answer = await rpc(
        base,
        "SendMessage",
        send_params(data={"style": "s"}, taskId=waiting["id"], contextId="another-context"),
    )
    assert code(answer) == -32602
    _, answer = await rpc(base, "SendMessage", send_params(text="a b", taskId=waiting["id"]))
    assert answer["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
    _, cancelled = await rpc(base, "CancelTask", {"id": running["id"]})
    assert cancelled["result"]["status"]["state"] == "TASK_STATE_CANCELED"


async def test_no_task_type_and_no_default(tmp_path: Path) -> None:
    peer = Peer("agent-n", handler=DemoHandler(), config=fast_config())
    enable_a2a(peer, default_task_type=None)
    await peer.start()
    try:
        base = f"http://127.0.0.1:{peer.port}"
        _, answer = await rpc(base, "SendMessage", send_params(text="hi"))
        assert code(answer) == -32602
        assert "taskType" in answer["error"]["message"]
        async with httpx.AsyncClient() as http:
            card = (await http.get(f"{base}/.well-known/agent-card.json")).json()
        assert "pushNotifications" not in card["capabilities"]  # no allowed URL: off
        _, answer = await rpc(
            base,
            "SendMessage",
            send_params(text="hi", metadata={"task_type": "echo"})
            | {"configuration": {"taskPushNotificationConfig": {"url": "http://127.0.0.1:1/"}}},
        )
        assert code(answer) == -32003
    finally:
        await peer.close(drain_timeout=0.2)


# --- authentication ---------------------------------------------------------------------------


@pytest.fixture
async def guarded() -> AsyncIterator[str]:
    peer = Peer("agent-g", handler=DemoHandler(), config=fast_config())
    enable_a2a(peer, tokens={"token-alice": "alice", "token-bob": "bob"})
    await peer.start()
    try:
        yield f"http://127.0.0.1:{peer.port}"
    finally:
        await peer.close(drain_timeout=0.2)


async def test_bearer_tokens_are_enforced_and_scope_tasks(guarded: str) -> None:
    async with httpx.AsyncClient() as http:
        card = (await http.get(f"{guarded}/.well-known/agent-card.json")).json()
    assert card["securitySchemes"] == {
        "bearer": {
            "httpAuthSecurityScheme": {
                "scheme": "Bearer",
                "description": card["securitySchemes"]["bearer"]["httpAuthSecurityScheme"][
                    "description"
                ],
            }
        }
    }
    assert card["securityRequirements"] == [{"schemes": {"bearer": {}}}]
    assert card["capabilities"]["extendedAgentCard"] is True

    status, answer = await rpc(guarded, "ListTasks", {})
    assert status == 401
    assert code(answer) == -32106
    status, answer = await rpc(
        guarded, "ListTasks", {}, headers={**V1, "Authorization": "Bearer wrong"}
    )
    assert status == 401
    alice = {**V1, "Authorization": "Bearer token-alice"}
    bob = {**V1, "Authorization": "Bearer token-bob"}
    _, sent = await rpc(guarded, "SendMessage", send_params(text="mine"), headers=alice)
    task_id = sent["result"]["task"]["id"]
    _, answer = await rpc(guarded, "GetTask", {"id": task_id}, headers=alice)
    assert answer["result"]["id"] == task_id
    _, answer = await rpc(guarded, "GetTask", {"id": task_id}, headers=bob)
    assert code(answer) == -32001
    _, listed = await rpc(guarded, "ListTasks", {}, headers=bob)
    assert listed["result"]["tasks"] == []
    _, extended = await rpc(guarded, "GetExtendedAgentCard", {}, headers=bob)
    assert extended["result"]["name"] == "agent-g"


# --- push configuration methods ---------------------------------------------------------------


async def test_push_config_methods(a2a_peer: A2APeer) -> None:
    base = a2a_peer.base_url
    slow = send_params(data={"steps": 100, "delay": 0.05}, metadata={"task_type": "slow"})
    slow["configuration"] = {"returnImmediately": True}
    _, started = await rpc(base, "SendMessage", slow)
    task_id = started["result"]["task"]["id"]
    _, answer = await rpc(
        base,
        "CreateTaskPushNotificationConfig",
        {"taskId": task_id, "url": "http://evil.example/hook"},
    )
    assert code(answer) == -32602
    assert answer["error"]["data"][0]["metadata"]["reason"] == "push_url_not_allowed"
    _, answer = await rpc(
        base,
        "CreateTaskPushNotificationConfig",
        {"taskId": task_id, "url": f"http://127.0.0.1:{a2a_peer.hook_port}/elsewhere"},
    )
    assert code(answer) == -32602
    _, created = await rpc(
        base,
        "CreateTaskPushNotificationConfig",
        {"taskId": task_id, "url": a2a_peer.hook_url, "token": "t1", "id": "cfg-1"},
    )
    assert created["result"] == {
        "url": a2a_peer.hook_url,
        "id": "cfg-1",
        "taskId": task_id,
        "token": "t1",
    }
    _, got = await rpc(base, "GetTaskPushNotificationConfig", {"taskId": task_id, "id": "cfg-1"})
    assert got["result"]["url"] == a2a_peer.hook_url
    _, listed = await rpc(base, "ListTaskPushNotificationConfigs", {"taskId": task_id})
    assert [c["id"] for c in listed["result"]["configs"]] == ["cfg-1"]
    _, deleted = await rpc(
        base, "DeleteTaskPushNotificationConfig", {"taskId": task_id, "id": "cfg-1"}
    )
    # google.protobuf.Empty, as 1.0 answers every method with a message: {}, never null.
    assert deleted == {"jsonrpc": "2.0", "id": "req-1", "result": {}}
    _, listed = await rpc(base, "ListTaskPushNotificationConfigs", {"taskId": task_id})
    assert listed["result"] == {}
    _, answer = await rpc(base, "GetTaskPushNotificationConfig", {"taskId": task_id, "id": "cfg-1"})
    assert code(answer) == -32001
    await rpc(base, "CancelTask", {"id": task_id})


# --- draining, restart ------------------------------------------------------------------------


async def test_a_draining_peer_refuses_new_tasks(a2a_peer: A2APeer) -> None:
    a2a_peer.peer.protocol.engine.draining = True
    _, answer = await rpc(a2a_peer.base_url, "SendMessage", send_params(text="late"))
    assert code(answer) == -32101
    assert answer["error"]["data"][0]["reason"] == "AGENT_NOT_READY"
    _, listed = await rpc(a2a_peer.base_url, "ListTasks", {})
    assert listed["result"]["tasks"] == []


async def test_a2a_tasks_survive_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "store.db"

    async def start() -> tuple[Peer, str]:
        peer = Peer("agent-r", handler=DemoHandler(), config=fast_config(), store=SqliteStore(path))
        enable_a2a(peer, push_allowlist=["http://127.0.0.1:9/hooks/"])
        await peer.start()
        return peer, f"http://127.0.0.1:{peer.port}"

    peer, base = await start()
    try:
        _, done = await rpc(base, "SendMessage", send_params(text="kept", contextId="ctx-r"))
        done_id = done["result"]["task"]["id"]
        _, asked = await rpc(
            base,
            "SendMessage",
            send_params(data={"prompt": "p"}, metadata={"task_type": "text_generation"})
            | {
                "configuration": {
                    "taskPushNotificationConfig": {"url": "http://127.0.0.1:9/hooks/x"}
                }
            },
        )
        waiting_id = asked["result"]["task"]["id"]
    finally:
        await peer.close(drain_timeout=0.2)
    peer, base = await start()
    try:
        _, got = await rpc(base, "GetTask", {"id": done_id})
        task = got["result"]
        assert task["status"]["state"] == "TASK_STATE_COMPLETED"
        assert task["contextId"] == "ctx-r"
        assert task["artifacts"][0]["parts"] == [{"text": "kept"}]
        assert task["history"][0]["parts"] == [{"text": "kept"}]
        _, got = await rpc(base, "GetTask", {"id": waiting_id})
        assert got["result"]["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
        _, configs = await rpc(base, "ListTaskPushNotificationConfigs", {"taskId": waiting_id})
        assert [c["url"] for c in configs["result"]["configs"]] == ["http://127.0.0.1:9/hooks/x"]
        # The follow-up still works: the engine's record was restored too.
        _, answer = await rpc(base, "SendMessage", send_params(text="古典", taskId=waiting_id))
        assert answer["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
    finally:
        await peer.close(drain_timeout=0.2)
