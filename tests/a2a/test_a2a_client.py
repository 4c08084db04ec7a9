"""Our A2A client: against an agent built with the official SDK's server classes, and against a
Synapse peer speaking A2A — discover, send, stream, get, list, answer INPUT_REQUIRED, cancel."""

from __future__ import annotations

import asyncio
import json

import pytest
from a2akit import GRPC_PRESENT, SDK_BINDINGS, A2APeer
from aiohttp import web

from synapse.a2a import A2AClient, A2AError, A2AEvent, A2AVersionError, wire
from synapse.a2a.client.legacy import JsonRpc03Transport, Rest03Transport
from synapse.types import TaskState

WAIT = 10.0


async def drain(events: list[A2AEvent], handle_events: object) -> None:
    async for event in handle_events:  # type: ignore[attr-defined]
        events.append(event)


# --- against the SDK's echo agent -----------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "poll"])
async def test_echo_agent_send_get_list(sdk_agent: str, stream: bool) -> None:
    async with A2AClient(sdk_agent, poll_interval=0.05) as client:
        assert client.card is not None
        assert client.card.name == "sdk-echo"
        # The card's first interface (the agent's preference), whichever binding it is.
        preferred = client.card.supported_interfaces[0]
        assert (client.binding, client.rpc_url) == (preferred.protocol_binding, preferred.url)
        handle = await client.send("hello there", stream=stream)
        events = [event async for event in handle]
        outcome = await handle.result(WAIT)
        assert outcome.ok
        assert outcome.state is TaskState.COMPLETED
        assert outcome.text == "hello there"
        assert outcome.result is not None
        assert outcome.result.output == "hello there"
        assert events[-1].final
        if stream:
            kinds = [e.kind for e in events]
            assert kinds[0] == "task"
            assert "status_update" in kinds
            assert "artifact_update" in kinds
        task = await client.get_task(handle.task_id)
        assert task.status.state == wire.COMPLETED
        listed = await client.list_tasks()
        assert handle.task_id in [t.id for t in listed.tasks]


async def test_echo_agent_input_required_and_failure(sdk_agent: str) -> None:
    async with A2AClient(sdk_agent) as client:
        handle = await client.send("ask me")
        async with asyncio.timeout(WAIT):
            async for event in handle:
                if event.input_required:
                    assert event.text == "What is your name?"
                    assert handle.input_required is not None
                    await handle.reply("Ada")
        outcome = await handle.result(WAIT)
        assert outcome.ok
        assert outcome.text == "hello Ada"

        failed = await (await client.send("fail")).result(WAIT)
        assert failed.state is TaskState.FAILED
        assert failed.error is not None
        assert failed.error.message == "it broke"


async def test_echo_agent_cancel(sdk_agent: str) -> None:
    async with A2AClient(sdk_agent) as client:
        handle = await client.send("slow")
        async with asyncio.timeout(WAIT):
            async for event in handle:
                if event.state == wire.WORKING:
                    break
        await handle.cancel("enough")
        outcome = await handle.result(WAIT)
        assert outcome.state is TaskState.CANCELLED
        assert (await client.get_task(handle.task_id)).status.state == wire.CANCELED
        with pytest.raises(A2AError) as caught:
            await client.get_task("no-such-task")
        assert caught.value.code == -32001


# --- against a Synapse peer speaking A2A ----------------------------------------------------------


@pytest.mark.parametrize("binding", SDK_BINDINGS)
async def test_a_method_a2a_does_not_have_is_an_a2a_error_on_every_binding(
    a2a_peer: A2APeer, binding: str
) -> None:
    """JSON-RPC asks the server, which answers -32601; REST and gRPC have no route for it:
    the client says the same, an `A2AError` (not a lookup error of its own)."""
    async with A2AClient(a2a_peer.base_url, bindings=[binding]) as client:
        with pytest.raises(A2AError) as caught:
            await client.call("tasks/get", {"id": "x"})  # an A2A 0.3 method name
        assert caught.value.code == -32601
        # The client is still usable: a task sent next completes.
        echo = await (await client.send({"text": "hi"}, task_type="echo")).result(WAIT)
        assert echo.ok


@pytest.mark.parametrize("binding", SDK_BINDINGS)
async def test_synapse_peer_every_flow_with_the_handle_api(a2a_peer: A2APeer, binding: str) -> None:
    async with A2AClient(a2a_peer.base_url, bindings=[binding]) as client:
        assert client.binding == binding
        assert client.streaming
        echo = await (await client.send({"text": "hi"}, task_type="echo")).result(WAIT)
        assert echo.ok
        assert echo.result is not None
        assert (echo.result.output_type, echo.result.output) == ("text", "hi")

        generation = await client.send({"prompt": "春天"}, task_type="text_generation")
        assert generation.state == wire.INPUT_REQUIRED
        assert generation.input_required is not None
        await generation.provide_info({"style": "浪漫"})
        done = await generation.result(WAIT)
        assert done.ok
        assert done.result is not None
        assert done.result.output == "“春天”, written in the 浪漫 style"
        assert done.result.metadata == {"prompt": "春天", "style": "浪漫"}

        portrait = await client.send({"subject": "Ada"}, task_type="portrait")
        events: list[A2AEvent] = []
        async with asyncio.timeout(WAIT):
            async for event in portrait:
                events.append(event)
                if event.input_required:
                    await portrait.start_deciding()
                    await portrait.approve({"authorized": True})
        assert (await portrait.result(WAIT)).text == "portrait of Ada"
        assert [e.kind for e in events][-1] == "status_update"

        refused = await client.send({"subject": "Bob"}, task_type="portrait")
        async with asyncio.timeout(WAIT):
            while refused.state != wire.INPUT_REQUIRED:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        await refused.reject("no consent")
        outcome = await refused.result(WAIT)
        assert outcome.state is TaskState.FAILED
        assert outcome.error is not None
        assert outcome.error.code == "permission_denied"
        assert outcome.error.message == "no consent"

        rejected = await (await client.send({}, task_type="nope")).result(WAIT)
        assert rejected.state is TaskState.REJECTED
        assert rejected.error is not None
        assert rejected.error.code == "capability_lacking"

        slow = await client.send({"steps": 500, "delay": 0.02}, task_type="slow")
        await slow.cancel()  # whenever: a cancel is valid in any live state
        assert (await slow.result(WAIT)).state is TaskState.CANCELLED

        listed = await client.list_tasks(status=wire.COMPLETED)
        assert len(listed.tasks) == 3


@pytest.mark.parametrize("binding", SDK_BINDINGS)
async def test_a_broken_stream_is_resumed(a2a_peer: A2APeer, binding: str) -> None:
    async with A2AClient(a2a_peer.base_url, bindings=[binding]) as client:
        assert client.binding == binding
        handle = await client.send({"steps": 5, "delay": 0.1}, task_type="slow")
        events: list[A2AEvent] = []
        async with asyncio.timeout(WAIT):
            async for event in handle:
                events.append(event)
                if event.state == wire.WORKING and len(events) == 2:
                    a2a_peer.a2a.tasks[handle.task_id].close_streams()  # the server drops it
        assert "reconnected" in [e.kind for e in events]
        outcome = await handle.result(WAIT)
        assert outcome.text == "done after 5 steps"


@pytest.mark.parametrize("binding", SDK_BINDINGS)
async def test_attach_and_push_config_helpers(a2a_peer: A2APeer, binding: str) -> None:
    async with A2AClient(a2a_peer.base_url, bindings=[binding]) as client:
        assert client.binding == binding
        handle = await client.send({"steps": 3, "delay": 0.05}, task_type="slow")
        config = await client.create_push_config(handle.task_id, a2a_peer.hook_url, token="t")
        assert config.id == handle.task_id
        assert [c.url for c in await client.list_push_configs(handle.task_id)] == [
            a2a_peer.hook_url
        ]
        await client.delete_push_config(handle.task_id)
        again = await client.attach(handle.task_id)
        assert (await again.result(WAIT)).text == "done after 3 steps"
        assert (await handle.result(WAIT)).ok


async def test_which_cards_the_client_speaks_to() -> None:
    """1.x on any binding, 0.3 on JSON-RPC (a 0.3 card, or 0.3 interfaces), else 0.3 on
    HTTP+JSON; nothing else."""
    legacy_card = {
        "name": "old",
        "url": "http://127.0.0.1:1/",
        "protocolVersion": "0.3.0",
        "capabilities": {},
        "skills": [],
    }
    modern_0_3 = {
        "name": "old2",
        "supportedInterfaces": [
            {"url": "http://127.0.0.1:1/", "protocolBinding": "JSONRPC", "protocolVersion": "0.3"}
        ],
    }
    rest_0_3 = {
        "name": "old3",
        "supportedInterfaces": [
            {"url": "http://127.0.0.1:1/", "protocolBinding": "HTTP+JSON", "protocolVersion": "0.3"}
        ],
    }
    both_0_3 = {
        "name": "old4",
        "supportedInterfaces": [
            {
                "url": "http://127.0.0.1:1/r",
                "protocolBinding": "HTTP+JSON",
                "protocolVersion": "0.3",
            },
            {"url": "http://127.0.0.1:1/j", "protocolBinding": "JSONRPC", "protocolVersion": "0.3"},
        ],
    }
    grpc_0_3 = {
        "name": "old5",
        "supportedInterfaces": [
            {"url": "127.0.0.1:1", "protocolBinding": "GRPC", "protocolVersion": "0.3"}
        ],
    }
    future = {
        "name": "new",
        "supportedInterfaces": [
            {"url": "http://127.0.0.1:1/", "protocolBinding": "JSONRPC", "protocolVersion": "2.0"}
        ],
    }
    old_02 = {**legacy_card, "protocolVersion": "0.2.5"}
    cards = {
        "/legacy/.well-known/agent-card.json": legacy_card,
        "/modern/.well-known/agent-card.json": modern_0_3,
        "/rest/.well-known/agent-card.json": rest_0_3,
        "/both/.well-known/agent-card.json": both_0_3,
        "/grpc/.well-known/agent-card.json": grpc_0_3,
        "/future/.well-known/agent-card.json": future,
        "/older/.well-known/agent-card.json": old_02,
    }

    async def card(request: web.Request) -> web.Response:
        return web.Response(text=json.dumps(cards[request.path]), content_type="application/json")

    app = web.Application()
    for path in cards:
        app.router.add_get(path, card)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    if GRPC_PRESENT:
        from synapse.a2a.client.grpc03 import Grpc03Transport
    try:
        for prefix, kind in (
            ("legacy", JsonRpc03Transport),
            ("modern", JsonRpc03Transport),
            ("both", JsonRpc03Transport),  # JSON-RPC first, as 0.3 agents all offer it
            ("rest", Rest03Transport),
            *((("grpc", Grpc03Transport),) if GRPC_PRESENT else ()),
        ):
            async with A2AClient(f"http://127.0.0.1:{port}/{prefix}") as client:
                await client.discover()
                assert type(client.transport) is kind, prefix
        for prefix, says in (
            *(() if GRPC_PRESENT else (("grpc", "nor 0.3 over JSON-RPC or HTTP+JSON"),)),
            ("future", "offers: JSONRPC 2.0"),
            ("older", "A2A 0.2.5"),
        ):
            client = A2AClient(f"http://127.0.0.1:{port}/{prefix}")
            with pytest.raises(A2AVersionError) as caught:
                await client.discover()
            assert says in caught.value.message, prefix
            await client.close()
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("binding", SDK_BINDINGS)
async def test_errors_of_the_agent_surface_as_a2a_errors(a2a_peer: A2APeer, binding: str) -> None:
    async with A2AClient(a2a_peer.base_url, bindings=[binding]) as client:
        assert client.binding == binding
        with pytest.raises(A2AError) as caught:
            await client.send(
                {"text": "hi"},
                task_type="echo",
                push=wire.TaskPushNotificationConfig(url="http://not-allowed.example/"),
            )
        assert caught.value.code == -32602
        client.headers[wire.VERSION_HEADER] = "0.3"
        await client.close()  # a new session picks up the header
        with pytest.raises(A2AError) as caught:
            await client.list_tasks()
        assert caught.value.code == -32009
