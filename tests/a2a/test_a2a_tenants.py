"""Tenants: a task belongs to the tenant its first message named; from another tenant (or
none) it is not found, whatever the operation (get, cancel, subscribe, push configuration,
listing, retry); tenants are per credential when configured; stored with the task."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2akit import fast_config

from synapse.a2a import enable_a2a
from synapse.a2a.server.tenants import scoped, unscoped
from synapse.demo.handler import DemoHandler
from synapse.store import open_store
from synapse.transport.peer import Peer

V1 = {"A2A-Version": "1.0"}
ALICE = {**V1, "Authorization": "Bearer tok-alice"}
BOB = {**V1, "Authorization": "Bearer tok-bob"}
TOKENS = {"tok-alice": "alice", "tok-bob": "bob"}


def message(text: str, message_id: str = "m-1", **extra: Any) -> dict[str, Any]:
    return {
        "message": {"messageId": message_id, "role": "ROLE_USER", "parts": [{"text": text}]},
        **extra,
    }


async def rest(
    base: str, verb: str, path: str, body: Any = None, headers: dict[str, str] = ALICE
) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as http:
        return await http.request(verb, f"{base}/a2a{path}", json=body, headers=headers)


async def rpc(base: str, method: str, params: Any, headers: dict[str, str] = ALICE) -> Any:
    request = {"jsonrpc": "2.0", "id": "r", "method": method, "params": params}
    async with httpx.AsyncClient(timeout=10) as http:
        return (await http.post(f"{base}/a2a", json=request, headers=headers)).json()


async def start(store: str = "memory", **options: Any) -> tuple[Peer, str]:
    peer = Peer("agent-t", handler=DemoHandler(), config=fast_config(), store=open_store(store))
    enable_a2a(peer, tokens=TOKENS, push_allowlist=["http://127.0.0.1:9/hooks/"], **options)
    await peer.start()
    return peer, f"http://127.0.0.1:{peer.port}"


@pytest.fixture
async def agent() -> AsyncIterator[str]:
    peer, base = await start()
    try:
        yield base
    finally:
        await peer.close(drain_timeout=0.2)


async def test_a_task_is_found_only_in_its_tenant(agent: str) -> None:
    slow = message("wait", metadata=None)
    slow["message"]["metadata"] = {"task_type": "slow"}
    slow["message"]["parts"] = [{"data": {"steps": 200, "delay": 0.05}}]
    slow["configuration"] = {"returnImmediately": True}
    started = await rest(agent, "POST", "/acme/message:send", slow)
    assert started.status_code == 200, started.text
    task_id = started.json()["task"]["id"]
    assert (await rest(agent, "GET", f"/acme/tasks/{task_id}")).status_code == 200
    for path in (f"/globex/tasks/{task_id}", f"/tasks/{task_id}"):
        assert (await rest(agent, "GET", path)).status_code == 404
    for tenant in ("/globex", ""):
        assert (
            await rest(agent, "POST", f"{tenant}/tasks/{task_id}:cancel", {})
        ).status_code == 404
        assert (await rest(agent, "GET", f"{tenant}/tasks/{task_id}:subscribe")).status_code == 404
        configs = f"{tenant}/tasks/{task_id}/pushNotificationConfigs"
        assert (await rest(agent, "GET", configs)).status_code == 404
    listed = (await rest(agent, "GET", "/acme/tasks")).json()["tasks"]
    assert [t["id"] for t in listed] == [task_id]
    assert (await rest(agent, "GET", "/globex/tasks")).json()["tasks"] == []
    assert (await rest(agent, "GET", "/tasks")).json()["tasks"] == []
    # JSON-RPC names the tenant in the request.
    answer = await rpc(agent, "GetTask", {"id": task_id, "tenant": "acme"})
    assert answer["result"]["id"] == task_id
    answer = await rpc(agent, "GetTask", {"id": task_id, "tenant": "globex"})
    assert answer["error"]["code"] == -32001
    answer = await rpc(agent, "CancelTask", {"id": task_id, "tenant": "globex"})
    assert answer["error"]["code"] == -32001
    # The task itself goes on in its tenant.
    cancelled = await rest(agent, "POST", f"/acme/tasks/{task_id}:cancel", {})
    assert cancelled.status_code == 200


async def test_retries_are_deduplicated_per_tenant(agent: str) -> None:
    one = (await rest(agent, "POST", "/acme/message:send", message("hi"))).json()["task"]
    again = (await rest(agent, "POST", "/acme/message:send", message("hi"))).json()["task"]
    other = (await rest(agent, "POST", "/globex/message:send", message("hi"))).json()["task"]
    assert again["id"] == one["id"] and other["id"] != one["id"]


async def test_tenants_are_per_credential_when_configured() -> None:
    peer, base = await start(tenants={"alice": ["acme"], "bob": ["globex"]})
    try:
        assert (await rest(base, "POST", "/acme/message:send", message("a"))).status_code == 200
        refused = await rest(base, "POST", "/globex/message:send", message("a"))
        assert refused.status_code == 403
        assert refused.json()["error"]["status"] == "PERMISSION_DENIED"
        answer = await rpc(base, "ListTasks", {"tenant": "acme"}, headers=BOB)
        assert answer["error"]["code"] == -32107
        bobs = await rest(base, "POST", "/globex/message:send", message("b"), headers=BOB)
        assert bobs.status_code == 200
        # No tenant named: the default namespace, open to every principal.
        assert (await rest(base, "GET", "/tasks")).status_code == 200
    finally:
        await peer.close(drain_timeout=0.2)


async def test_the_tenant_is_stored_with_the_task(tmp_path: Path) -> None:
    store = str(tmp_path / "t.sqlite")
    peer, base = await start(store)
    try:
        task_id = (await rest(base, "POST", "/acme/message:send", message("x"))).json()["task"][
            "id"
        ]
    finally:
        await peer.close(drain_timeout=0.2)
    peer, base = await start(store)
    try:
        found = await rest(base, "GET", f"/acme/tasks/{task_id}")
        assert (
            found.status_code == 200 and found.json()["status"]["state"] == "TASK_STATE_COMPLETED"
        )
        assert (await rest(base, "GET", f"/globex/tasks/{task_id}")).status_code == 404
        assert (await rest(base, "GET", f"/tasks/{task_id}")).status_code == 404
    finally:
        await peer.close(drain_timeout=0.2)


@pytest.mark.parametrize(
    ("principal", "tenant"),
    [("alice", ""), ("alice", "acme"), ("@alice", ""), ("@acme:alice", ""), ("a:b", "x/y")],
)
def test_no_two_principal_and_tenant_pairs_share_a_scope(principal: str, tenant: str) -> None:
    pairs = [("alice", ""), ("alice", "acme"), ("@alice", ""), ("@acme:alice", ""), ("a:b", "x/y")]
    scopes = {scoped(p, t) for p, t in pairs}
    assert len(scopes) == len(pairs)
    assert unscoped(scoped(principal, tenant)) == principal
    assert scoped("alice", "") == "alice"  # tasks stored before tenants keep their keys
