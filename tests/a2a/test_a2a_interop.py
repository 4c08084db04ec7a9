"""Defects independent A2A clients and agents found, each pinned on the wire (127.0.0.1).

Server side: card caching, push support checked first, snake_case members, the request id of
a 401, the version as a query parameter and strictly MAJOR.MINOR, millisecond timestamps,
push configuration ids, camelCase metadata keys. Client side: a repeated interrupted status
after a reply (as agents on the JavaScript SDK send it), the push configuration id the agent
chose, a timed-out call's reason.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import httpx
import pytest
from a2akit import A2APeer, fast_config, free_port
from aiohttp import web
from test_a2a_binding import V1, code, rpc, send_params

from synapse.a2a import A2AClient, A2AError, enable_a2a, wire
from synapse.cli.send_a2a import a2a_error
from synapse.demo.handler import DemoHandler
from synapse.transport.peer import Peer

CARD = "/.well-known/agent-card.json"
WAIT = 10.0


# --- the agent card is cacheable -------------------------------------------------------------


async def test_the_card_carries_caching_headers_and_answers_304(a2a_peer: A2APeer) -> None:
    async with httpx.AsyncClient(timeout=10) as http:
        first = await http.get(a2a_peer.base_url + CARD)
        assert first.status_code == 200
        etag = first.headers["ETag"]
        assert re.fullmatch(r'"[0-9a-f]{32}"', etag)
        assert re.search(r"max-age=\d+", first.headers["Cache-Control"])
        modified = first.headers["Last-Modified"]
        assert modified.endswith(" GMT")
        again = await http.get(a2a_peer.base_url + CARD, headers={"If-None-Match": etag})
        assert again.status_code == 304
        assert again.content == b""
        assert again.headers["ETag"] == etag
        listed = await http.get(
            a2a_peer.base_url + CARD, headers={"If-None-Match": f'"other", W/{etag}'}
        )
        assert listed.status_code == 304
        stale = await http.get(a2a_peer.base_url + CARD, headers={"If-None-Match": '"other"'})
        assert stale.status_code == 200
        assert stale.json() == first.json()
        since = await http.get(a2a_peer.base_url + CARD, headers={"If-Modified-Since": modified})
        assert since.status_code == 304
        old = await http.get(
            a2a_peer.base_url + CARD,
            headers={"If-Modified-Since": "Mon, 01 Jan 2001 00:00:00 GMT"},
        )
        assert old.status_code == 200


# --- push: support is checked first; each configuration its own id -------------------------


async def test_create_push_config_without_push_support_says_so_first() -> None:
    peer = Peer("agent-np", handler=DemoHandler(), config=fast_config())
    enable_a2a(peer)  # no allowlist: push is off
    await peer.start()
    try:
        base = f"http://127.0.0.1:{peer.port}"
        for method in ("CreateTaskPushNotificationConfig", "GetTaskPushNotificationConfig"):
            _, answer = await rpc(
                base, method, {"taskId": "no-such-task", "url": "http://x/", "id": "c"}
            )
            assert code(answer) == -32003, method  # not -32001: support comes first
    finally:
        await peer.close(drain_timeout=0.2)


async def test_push_configs_created_without_an_id_each_get_their_own(a2a_peer: A2APeer) -> None:
    base = a2a_peer.base_url
    slow = send_params(data={"steps": 100, "delay": 0.05}, metadata={"taskType": "slow"})
    slow["configuration"] = {"returnImmediately": True}
    _, started = await rpc(base, "SendMessage", slow)
    task_id = started["result"]["task"]["id"]
    ids = []
    for token in ("t1", "t2", "t3"):
        _, created = await rpc(
            base,
            "CreateTaskPushNotificationConfig",
            {"taskId": task_id, "url": a2a_peer.hook_url, "token": token},
        )
        ids.append(created["result"]["id"])
    assert ids[0] == task_id  # the first one: the task id, as the SDK does
    assert len(set(ids)) == 3
    _, listed = await rpc(base, "ListTaskPushNotificationConfigs", {"taskId": task_id})
    assert sorted(c["token"] for c in listed["result"]["configs"]) == ["t1", "t2", "t3"]
    for config_id, token in zip(ids, ("t1", "t2", "t3"), strict=True):
        _, got = await rpc(
            base, "GetTaskPushNotificationConfig", {"taskId": task_id, "id": config_id}
        )
        assert got["result"]["token"] == token
    await rpc(base, "CancelTask", {"id": task_id})


async def test_the_client_uses_the_push_config_id_the_agent_returned(a2a_peer: A2APeer) -> None:
    async with A2AClient(a2a_peer.base_url) as client:
        handle = await client.send({"steps": 100, "delay": 0.05}, task_type="slow")
        with pytest.raises(ValueError, match="config_id is required"):
            await client.get_push_config(handle.task_id)  # nothing created: no guess
        first = await client.create_push_config(handle.task_id, a2a_peer.hook_url, token="a")
        second = await client.create_push_config(handle.task_id, a2a_peer.hook_url, token="b")
        assert first.id != second.id
        assert second.id != handle.task_id  # the id is the agent's, not the task's
        assert (await client.get_push_config(handle.task_id)).token == "b"
        await client.delete_push_config(handle.task_id)
        left = await client.list_push_configs(handle.task_id)
        assert [c.id for c in left] == [first.id]
        await handle.cancel()


# --- names: snake_case accepted, camelCase written -------------------------------------------


async def test_snake_case_member_names_are_accepted(a2a_peer: A2APeer) -> None:
    base = a2a_peer.base_url
    params = {
        "message": {
            "message_id": "m-snake",
            "role": "ROLE_USER",
            "context_id": "ctx-snake",
            "parts": [{"data": {"text": "hi", "user_key": 1}, "media_type": "application/json"}],
            "metadata": {"task_type": "echo", "kept_as_is": True},
        },
        "configuration": {"history_length": 1, "return_immediately": False},
    }
    _, answer = await rpc(base, "SendMessage", params)
    task = answer["result"]["task"]
    assert task["contextId"] == "ctx-snake"
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    assert len(task["history"]) == 1  # history_length honoured
    _, got = await rpc(base, "GetTask", {"id": task["id"], "history_length": 0})
    assert "history" not in got["result"]
    _, got = await rpc(base, "GetTask", {"id": task["id"]})
    # Free-form values keep their keys: only the wire types' members are renamed.
    first = got["result"]["history"][0]
    assert first["messageId"] == "m-snake"
    assert first["parts"][0]["data"]["user_key"] == 1
    assert first["metadata"]["kept_as_is"] is True
    assert task["artifacts"][0]["parts"][0]["text"] == "hi"
    _, listed = await rpc(base, "ListTasks", {"context_id": "ctx-snake", "page_size": 1})
    assert [t["id"] for t in listed["result"]["tasks"]] == [task["id"]]
    raw = json.dumps(answer)
    assert "context_id" not in raw and "message_id" not in raw and "task_id" not in raw


def test_camel_members_renames_only_wire_members() -> None:
    value = {
        "message": {
            "message_id": "m",
            "role": "ROLE_USER",
            "reference_task_ids": ["t"],
            "parts": [{"data": {"snake_key": {"inner_key": 1}}, "media_type": "x"}],
            "metadata": {"snake_key": 1},
        },
        "configuration": {"task_push_notification_config": {"url": "u", "task_id": "t"}},
        "messageId": "not a member here, left alone",
    }
    renamed = wire.camel_members(value, wire.SendMessageRequest)
    assert renamed["message"]["messageId"] == "m"
    assert renamed["message"]["referenceTaskIds"] == ["t"]
    assert renamed["message"]["parts"][0] == {
        "data": {"snake_key": {"inner_key": 1}},
        "mediaType": "x",
    }
    assert renamed["message"]["metadata"] == {"snake_key": 1}
    assert renamed["configuration"]["taskPushNotificationConfig"]["taskId"] == "t"
    both = wire.camel_members({"messageId": "camel", "message_id": "snake"}, wire.Message)
    assert both == {"messageId": "camel"}


async def test_our_metadata_keys_are_camel_case(a2a_peer: A2APeer) -> None:
    _, answer = await rpc(
        a2a_peer.base_url,
        "SendMessage",
        send_params(data={"text": "hi"}, metadata={"taskType": "echo"}),
    )
    task = answer["result"]["task"]
    assert task["metadata"] == {"taskType": "echo"}
    (artifact,) = task["artifacts"]
    assert artifact["metadata"]["outputType"] == "text"
    _, asked = await rpc(
        a2a_peer.base_url,
        "SendMessage",
        send_params(data={"prompt": "p"}, metadata={"taskType": "text_generation"}),
    )
    status = asked["result"]["task"]["status"]
    assert status["message"]["metadata"] == {"synapseNeeds": "info"}
    raw = json.dumps([answer, asked])
    assert "task_type" not in raw and "output_type" not in raw and "synapse_needs" not in raw


# --- the 401 keeps the request's id ----------------------------------------------------------


async def test_an_unauthenticated_call_is_answered_with_its_id() -> None:
    peer = Peer("agent-t", handler=DemoHandler(), config=fast_config())
    enable_a2a(peer, tokens={"tok": "alice"})
    await peer.start()
    try:
        base = f"http://127.0.0.1:{peer.port}"
        async with httpx.AsyncClient(timeout=10) as http:
            for rpc_id in ("req-401", 401):
                body = {"jsonrpc": "2.0", "id": rpc_id, "method": "ListTasks", "params": {}}
                response = await http.post(f"{base}/a2a", json=body, headers=V1)
                assert response.status_code == 401
                assert response.json()["id"] == rpc_id
                assert response.json()["error"]["code"] == -32106
            # A body that does not parse is refused as unauthenticated first (no id to keep).
            response = await http.post(f"{base}/a2a", content=b"{nope", headers=V1)
            assert response.status_code == 401
            assert response.json()["id"] is None
    finally:
        await peer.close(drain_timeout=0.2)


# --- version as a query parameter; MAJOR.MINOR only; timestamps in milliseconds -------------


@pytest.mark.parametrize(
    ("query", "headers", "accepted"),
    [
        ("?A2A-Version=1.0", {}, True),
        ("?A2A-Version=1.0.1", {}, False),
        ("?A2A-Version=0.3", {}, False),
        ("?A2A-Version=0.3", {"A2A-Version": "1.0"}, True),  # the header wins
        ("", {"A2A-Version": "01.0"}, False),
        ("", {"A2A-Version": "1.0-rc1"}, False),
    ],
)
async def test_the_version_may_come_as_a_query_parameter(
    a2a_peer: A2APeer, query: str, headers: dict[str, str], accepted: bool
) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {}}
    async with httpx.AsyncClient(timeout=10) as http:
        response = await http.post(f"{a2a_peer.base_url}/a2a{query}", json=body, headers=headers)
    answer = response.json()
    if accepted:
        assert "result" in answer
    else:
        assert code(answer) == -32009


def test_versions_other_than_major_minor_are_refused() -> None:
    wire.check_version("1.0")
    wire.check_version("1.1")
    for bad in ("", "1", "1.0.0", "1.0.1", "v1.0", "1.x", " 1.0", "2.0", "0.3"):
        with pytest.raises(A2AError) as caught:
            wire.check_version(bad)
        assert caught.value.code == -32009, bad


async def test_timestamps_are_in_milliseconds(a2a_peer: A2APeer) -> None:
    _, answer = await rpc(a2a_peer.base_url, "SendMessage", send_params(text="hi"))
    stamp = answer["result"]["task"]["status"]["timestamp"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", stamp), stamp
    assert re.fullmatch(r".*\.\d{3}Z", wire.timestamp())


# --- the client: a repeated interrupted status, a timed-out call ------------------------------


class JsLikeAgent:
    """A JSON-RPC agent that behaves as agents on `@a2a-js/sdk` do: each turn's stream starts
    with a `task` event carrying the task as it is, so the turn after an answer starts with
    the interrupted status just answered; then WORKING, then the next question or the end."""

    def __init__(self, interrupted: str) -> None:
        self.interrupted = interrupted
        self.turns = 0
        self.status: dict[str, Any] = {}
        self.port = free_port()
        self.runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _status(self, state: str, text: str) -> dict[str, Any]:
        self.status = {
            "state": state,
            "message": {
                "messageId": f"status-{self.turns}-{state}",
                "role": "ROLE_AGENT",
                "parts": [{"text": text}],
            },
            "timestamp": wire.timestamp(),
        }
        return self.status

    def _task(self) -> dict[str, Any]:
        return {"id": "task-1", "contextId": "ctx-1", "status": self.status}

    async def card(self, _request: web.Request) -> web.Response:
        card = {
            "name": "js-like",
            "supportedInterfaces": [
                {"url": self.url + "/rpc", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
            ],
            "capabilities": {"streaming": True},
        }
        return web.json_response(card)

    async def rpc(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)

        async def send(result: dict[str, Any]) -> None:
            line = json.dumps({"jsonrpc": "2.0", "id": body["id"], "result": result})
            await response.write(f"data: {line}\n\n".encode())

        self.turns += 1
        if self.turns == 1:
            self._status("TASK_STATE_SUBMITTED", "")
            await send({"task": self._task()})
            await send({"statusUpdate": self._update(self.interrupted, "what is your name?")})
        else:
            await send({"task": self._task()})  # still the answered interruption
            await send({"statusUpdate": self._update("TASK_STATE_WORKING", "thinking")})
            if self.turns == 2:
                await send({"statusUpdate": self._update(self.interrupted, "and your age?")})
            else:
                await send({"statusUpdate": self._update("TASK_STATE_COMPLETED", "done")})
        await response.write_eof()
        return response

    def _update(self, state: str, text: str) -> dict[str, Any]:
        return {"taskId": "task-1", "contextId": "ctx-1", "status": self._status(state, text)}

    async def __aenter__(self) -> JsLikeAgent:
        app = web.Application()
        app.router.add_get(CARD, self.card)
        app.router.add_post("/rpc", self.rpc)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self.runner is not None
        await self.runner.cleanup()


@pytest.mark.parametrize("interrupted", ["TASK_STATE_INPUT_REQUIRED", "TASK_STATE_AUTH_REQUIRED"])
async def test_a_repeated_interruption_after_a_reply_is_not_a_new_question(
    interrupted: str,
) -> None:
    async with JsLikeAgent(interrupted) as agent, A2AClient(agent.url) as client:
        handle = await client.send("hello")
        questions: list[str] = []
        async with asyncio.timeout(WAIT):
            async for event in handle:
                if event.interrupted:
                    questions.append(event.text)
                    await handle.reply(f"answer {len(questions)}")
        outcome = await handle.result(WAIT)
    assert questions == ["what is your name?", "and your age?"]
    assert outcome.a2a_state == wire.COMPLETED
    assert agent.turns == 3


class HangingAgent:
    """An agent whose card answers and whose JSON-RPC endpoint never does."""

    def __init__(self) -> None:
        self.port = free_port()
        self.released = asyncio.Event()
        self.runner: web.AppRunner | None = None

    async def __aenter__(self) -> str:
        url = f"http://127.0.0.1:{self.port}"

        async def card(_request: web.Request) -> web.Response:
            interface = {"url": f"{url}/rpc", "protocolBinding": "JSONRPC"}
            interface["protocolVersion"] = "1.0"
            return web.json_response({"name": "hangs", "supportedInterfaces": [interface]})

        async def hang(_request: web.Request) -> web.Response:
            await self.released.wait()  # released at teardown
            return web.json_response({})

        app = web.Application()
        app.router.add_get(CARD, card)
        app.router.add_post("/rpc", hang)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
        return url

    async def __aexit__(self, *exc_info: object) -> None:
        self.released.set()
        assert self.runner is not None
        await self.runner.cleanup()


async def test_a_timed_out_cancel_says_why() -> None:
    async with HangingAgent() as url, A2AClient(url, timeout=0.3) as client:
        with pytest.raises(A2AError) as caught:
            await client.cancel_task("task-1")
    message = caught.value.message
    assert "CancelTask" in message and "timed out" in message and "0.3 s" in message
    line = str(a2a_error(caught.value, url))
    assert line.rstrip().endswith("(timed out)"), line
    assert "did not answer in time" in line
