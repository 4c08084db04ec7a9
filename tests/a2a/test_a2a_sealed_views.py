"""A finished A2A view is kept sealed (its contents packed into one `bytes`) and reads the
same as before: snapshots, push configurations, late callbacks, follow-ups.

Over real loopback HTTP for the binding, directly for the view.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from rawpost import eventually

from synapse.a2a import enable_a2a, wire
from synapse.a2a.server.view import A2ATask
from synapse.demo.handler import DemoHandler
from synapse.p2p.engine import TaskKey
from synapse.transport.peer import Peer

V1 = {"A2A-Version": "1.0", "Content-Type": "application/json"}


def finished_view() -> A2ATask:
    view = A2ATask(
        key=TaskKey("a2a:anonymous", "task-1"),
        principal="anonymous",
        context_id="ctx-1",
        task_type="echo",
    )
    ids = {"task_id": "task-1", "context_id": "ctx-1"}
    view.history.append(
        wire.Message(message_id="m-1", role=wire.ROLE_USER, parts=[wire.text_part("hi")], **ids)
    )
    view.push["cfg"] = wire.TaskPushNotificationConfig(
        url="http://127.0.0.1:1/hooks/x", id="cfg", task_id="task-1", token="t"
    )
    view.applied.add("msg-1")
    working = wire.Message(message_id="m-2", role=wire.ROLE_AGENT, parts=[wire.text_part("w")])
    view.set_status(wire.WORKING, working)
    view.add_artifact(wire.Artifact(artifact_id="a-1", parts=[wire.data_part({"n": [1, 2.5]})]))
    done = wire.Message(message_id="m-3", role=wire.ROLE_AGENT, parts=[wire.text_part("done")])
    view.set_status(wire.COMPLETED, done)  # no event loop here: sealed at once
    return view


def test_a_terminal_view_without_streams_is_sealed_and_reads_the_same() -> None:
    view = finished_view()
    assert view.sealed
    task = view.snapshot()
    assert task.status.state == wire.COMPLETED
    assert [m.message_id for m in task.history] == ["m-1", "m-2"]
    assert task.status.message is not None and task.status.message.message_id == "m-3"
    assert task.artifacts[0].parts[0].data == {"n": [1, 2.5]}
    assert view.snapshot(history_length=1).history[0].message_id == "m-2"
    assert view.sealed  # reading a snapshot does not unseal
    assert "msg-1" in view.applied  # reading the contents unseals them, intact
    assert not view.sealed
    assert view.push["cfg"].token == "t"
    assert view.snapshot() == task
    view.seal()
    assert view.sealed and view.snapshot() == task


def test_a_view_is_not_sealed_while_a_stream_follows_it() -> None:
    view = A2ATask(
        key=TaskKey("a2a:anonymous", "t"), principal="anonymous", context_id="c", task_type="echo"
    )
    queue = view.subscribe()
    view.set_status(wire.COMPLETED, None)
    view.seal()
    assert not view.sealed
    assert queue.get_nowait()[1].status_update is not None  # type: ignore[index]
    view.unsubscribe(queue)
    assert view.sealed


def test_a_live_view_is_never_sealed() -> None:
    view = A2ATask(
        key=TaskKey("a2a:anonymous", "t"), principal="anonymous", context_id="c", task_type="echo"
    )
    view.set_status(wire.WORKING, None)
    view.seal()
    assert not view.sealed


@pytest.fixture
async def a2a_url() -> AsyncIterator[tuple[str, Any]]:
    peer = Peer("agent-a", handler=DemoHandler())
    server = enable_a2a(peer, default_task_type="echo")
    await peer.start()
    try:
        yield f"http://127.0.0.1:{peer.port}/a2a", server.service
    finally:
        await peer.close(drain_timeout=0.5)


async def rpc(url: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    async with (
        aiohttp.ClientSession() as http,
        http.post(url, data=json.dumps(body), headers=V1) as response,
    ):
        answer: dict[str, Any] = json.loads(await response.read())
        return answer


async def test_a_finished_task_over_http_is_sealed_and_answers_as_it_did(
    a2a_url: tuple[str, Any],
) -> None:
    url, service = a2a_url
    message = {"messageId": "m-1", "role": "ROLE_USER", "parts": [{"text": "hello"}]}
    sent = await rpc(url, "SendMessage", {"message": message})
    task = sent["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    # Sealed right after the answer was built (the response is written after it), or
    # already gone with its task once the task left memory (rebuilt from the store).
    view = service.tasks.get(task["id"])
    assert view is None or view.sealed
    got = await rpc(url, "GetTask", {"id": task["id"]})
    assert got["result"] == task
    listed = await rpc(url, "ListTasks", {"includeArtifacts": True})
    assert [t["id"] for t in listed["result"]["tasks"]] == [task["id"]]
    assert listed["result"]["tasks"][0]["artifacts"] == task["artifacts"]
    view = service.tasks.get(task["id"])
    assert view is None or view.sealed
    # A follow-up to the finished task is refused as before, and the task is unchanged.
    again = await rpc(url, "SendMessage", {"message": {**message, "taskId": task["id"]}})
    assert again["error"]["code"] == -32004
    assert (await rpc(url, "GetTask", {"id": task["id"]}))["result"] == task


async def test_finished_views_kept_are_bounded_and_go_with_the_purge(
    a2a_url: tuple[str, Any],
) -> None:
    """Past `max_kept_views` the oldest finished view is rebuilt from the store (still
    found); the newest answers exactly as when it ended; a task the store purged is gone."""
    url, service = a2a_url
    service.max_kept_views = 1
    answers = []
    for n in range(3):
        message = {"messageId": f"m-{n}", "role": "ROLE_USER", "parts": [{"text": "hi"}]}
        sent = await rpc(url, "SendMessage", {"message": message})
        answers.append(sent["result"]["task"])
    for task in answers:
        assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    protocol = service._protocol
    assert protocol is not None

    await eventually(lambda: not any(t["id"] in service.tasks for t in answers), timeout=10)
    assert len(service._kept) == 1
    newest = answers[-1]
    assert (await rpc(url, "GetTask", {"id": newest["id"]}))["result"] == newest
    oldest = (await rpc(url, "GetTask", {"id": answers[0]["id"]}))["result"]
    assert oldest["id"] == answers[0]["id"]
    assert oldest["status"]["state"] == "TASK_STATE_COMPLETED"
    purged = await protocol.store.purge(finished_before=float("inf"), now=0.0, limit=100)
    assert purged >= 3
    gone = await rpc(url, "GetTask", {"id": newest["id"]})
    assert gone["error"]["code"] == -32001, gone
    assert newest["id"] not in service._kept
