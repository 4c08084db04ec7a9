"""A2A on replicas of one agent (PostgreSQL): a `SendMessage` retried on another replica after
the first one was killed returns the task the first attempt started, never a second one; the
task is read, and followed to its end, on the replica that took it over.

Every process runs on 127.0.0.1 and is stopped by its PID (tests/cluster/conftest.py).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from clusterkit import Cluster, ClusterFactory, Replica

pytestmark = pytest.mark.slow

TOKEN = "cluster-a2a-token"
HEADERS = {"A2A-Version": "1.0", "Authorization": f"Bearer {TOKEN}"}


async def a2a_cluster(make_cluster: ClusterFactory) -> Cluster:
    """Two replicas speaking A2A (alice's token), whose `slow` tasks resume elsewhere."""
    return await make_cluster(
        2,
        lease_ttl=2.0,
        handler="resumable:ResumableDemo",
        args=("--a2a", "--a2a-token", f"{TOKEN}=alice"),
    )


def a2a_url(replica: Replica) -> str:
    return f"http://{replica.hostport}/a2a"


async def call(replica: Replica, method: str, params: dict[str, Any]) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    async with httpx.AsyncClient(timeout=15.0) as http:
        answer: dict[str, Any] = (
            await http.post(a2a_url(replica), json=body, headers=HEADERS)
        ).json()
        return answer


def message(message_id: str, steps: int) -> dict[str, Any]:
    return {
        "message": {
            "messageId": message_id,
            "role": "ROLE_USER",
            "parts": [{"data": {"steps": steps, "delay": 0.25}}],
            "metadata": {"taskType": "slow"},
        },
        "configuration": {"returnImmediately": True},
    }


async def test_a_retry_on_another_replica_gets_the_same_task(
    make_cluster: ClusterFactory,
) -> None:
    cluster = await a2a_cluster(make_cluster)
    first, second = cluster.replicas
    sent = await call(first, "SendMessage", message("m-retry-1", 12))
    task_id = sent["result"]["task"]["id"]
    await first.kill()  # the answer is "lost": the client retries elsewhere

    retried = await call(second, "SendMessage", message("m-retry-1", 12))
    assert retried["result"]["task"]["id"] == task_id  # the same task, not a second one
    reused = await call(second, "SendMessage", message("m-retry-1", 3))
    assert reused["error"]["code"] == -32602  # the same id, another message: refused
    assert "message_id_reused" in json.dumps(reused["error"])

    # The survivor took the task over (its lease expired) and runs it to its end.
    async def completed() -> dict[str, Any]:
        while True:
            got = await call(second, "GetTask", {"id": task_id})
            task = got.get("result") or {}
            if task.get("status", {}).get("state") in ("TASK_STATE_COMPLETED", "TASK_STATE_FAILED"):
                return task
            await asyncio.sleep(0.2)  # polling the task is what an A2A client without streams does

    task = await asyncio.wait_for(completed(), 40)
    assert task["status"]["state"] == "TASK_STATE_COMPLETED", task
    listed = await call(second, "ListTasks", {})
    assert [t["id"] for t in listed["result"]["tasks"]] == [task_id]  # one task, ever


async def stream_events(
    replica: Replica,
    method: str,
    params: dict[str, Any],
    *,
    last_event_id: str = "",
    limit: int = 0,
) -> list[tuple[str, dict[str, Any]]]:
    """(event id, result) of each server-sent event, up to `limit` (0: to the stream's end)."""
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    headers = dict(HEADERS, **({"Last-Event-ID": last_event_id} if last_event_id else {}))
    found: list[tuple[str, dict[str, Any]]] = []
    event_id = ""
    async with (
        httpx.AsyncClient(timeout=30.0) as http,
        http.stream("POST", a2a_url(replica), json=body, headers=headers) as response,
    ):
        async for line in response.aiter_lines():
            if line.startswith("id: "):
                event_id = line[4:]
            elif line.startswith("data: "):
                found.append((event_id, json.loads(line[6:])["result"]))
                if limit and len(found) == limit:
                    break
    return found


async def test_a_stream_cut_with_its_replica_resumes_on_another(
    make_cluster: ClusterFactory,
) -> None:
    cluster = await a2a_cluster(make_cluster)
    first, second = cluster.replicas
    started = await asyncio.wait_for(
        stream_events(
            first,
            "SendStreamingMessage",
            {"message": message("m-stream-1", 10)["message"]},
            limit=3,
        ),
        60,
    )
    task_id = started[0][1]["task"]["id"]
    last_id = started[-1][0]
    await first.kill()  # the stream breaks with its replica

    resumed = await asyncio.wait_for(
        stream_events(second, "SubscribeToTask", {"id": task_id}, last_event_id=last_id), 60
    )
    # Another replica has none of the first one's event ids: it sends the whole task first,
    # then what happens, to the end. Nothing of the outcome is lost.
    assert "task" in resumed[0][1] and resumed[0][1]["task"]["id"] == task_id
    states = [
        (r.get("statusUpdate") or r.get("task") or {}).get("status", {}).get("state")
        for _, r in resumed
    ]
    assert states[-1] == "TASK_STATE_COMPLETED", states
    artifacts = [r["artifactUpdate"]["artifact"] for _, r in resumed if "artifactUpdate" in r]
    assert any("done after 10 steps" in json.dumps(a) for a in artifacts), resumed


async def test_a_replica_that_does_not_hold_a_task_follows_it_to_its_end(
    make_cluster: ClusterFactory,
) -> None:
    """Behind a balancer, a client reads a task, or follows its stream, at whichever replica
    its request reaches. A replica that does not hold the task (another one runs it) tells
    its progress as the store has it, and the stream there ends with the task; it never
    keeps telling a state the task has left."""
    cluster = await a2a_cluster(make_cluster)
    first, second = cluster.replicas
    sent = await call(first, "SendMessage", message("m-elsewhere-1", 8))
    task_id = sent["result"]["task"]["id"]
    seen = await call(second, "GetTask", {"id": task_id})  # read at the other replica
    assert seen["result"]["status"]["state"] != "TASK_STATE_COMPLETED"
    followed = await asyncio.wait_for(stream_events(second, "SubscribeToTask", {"id": task_id}), 60)
    states = [
        (r.get("statusUpdate") or r.get("task") or {}).get("status", {}).get("state")
        for _, r in followed
    ]
    assert states[-1] == "TASK_STATE_COMPLETED", states
    again = await call(second, "GetTask", {"id": task_id})
    assert again["result"]["status"]["state"] == "TASK_STATE_COMPLETED", again
    artifacts = json.dumps(again["result"].get("artifacts"))
    assert "done after 8 steps" in artifacts, again
