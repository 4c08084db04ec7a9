"""Push notifications: through the outbox, signed, with the A2A token, to allowed URLs only,
and delivered after the receiver was down for a while."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from a2a.types.a2a_pb2 import TaskPushNotificationConfig
from a2akit import PUSH_SECRET, A2APeer, SdkClientFactory, collect, sdk_message, stream_response
from aiohttp import web
from google.protobuf.json_format import ParseDict
from rawpost import eventually

from synapse.types.signing import SIGNATURE_HEADER, verify_header_signature


@dataclass
class Receiver:
    """An aiohttp webhook that records what it is sent."""

    port: int
    received: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    runner: web.AppRunner | None = None

    async def _hook(self, request: web.Request) -> web.Response:
        self.received.append((dict(request.headers), await request.read()))
        self.arrived.set()
        return web.Response(status=204)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/hooks/a2a", self._hook)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port, reuse_address=True).start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(body) for _, body in self.received]

    async def wait_for_final(self, timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout):
            while not any(_final(b) for b in self.bodies()):
                self.arrived.clear()
                await self.arrived.wait()


def _state(body: dict[str, Any]) -> str:
    inner = body.get("task") or body.get("statusUpdate") or {}
    state: str = inner.get("status", {}).get("state", "")
    return state


def _final(body: dict[str, Any]) -> bool:
    return _state(body) in ("TASK_STATE_COMPLETED", "TASK_STATE_FAILED", "TASK_STATE_CANCELED")


@pytest.fixture
async def receiver(a2a_peer: A2APeer) -> AsyncIterator[Receiver]:
    hook = Receiver(a2a_peer.hook_port)
    yield hook
    await hook.stop()


def check_signed(receiver: Receiver, token: str) -> None:
    for headers, body in receiver.received:
        assert headers["X-A2A-Notification-Token"] == token
        assert verify_header_signature([PUSH_SECRET], body, headers[SIGNATURE_HEADER])
        assert not verify_header_signature(["another secret"], body, headers[SIGNATURE_HEADER])
        stream_response(json.loads(body))  # the SDK parses it as a StreamResponse


async def test_notifications_reach_a_receiver_that_was_down(
    a2a_peer: A2APeer, sdk_client: SdkClientFactory, receiver: Receiver
) -> None:
    client = await sdk_client(streaming=False)
    message = sdk_message(
        parts=[{"data": {"steps": 3, "delay": 0.05}}], metadata={"task_type": "slow"}
    )
    push = {"url": a2a_peer.hook_url, "token": "tok-1"}
    events = await collect(client, message, taskPushNotificationConfig=push)
    assert events[-1]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
    task_id = events[-1]["task"]["id"]
    # The receiver is down: the notifications wait in the outbox, retried and parked (the push
    # partner joins the engine's backlog once its retries ran out).
    engine = a2a_peer.peer.protocol.engine
    await eventually(lambda: bool(engine._backlog), timeout=10)
    outbox = a2a_peer.peer.store.outbox  # type: ignore[attr-defined]
    assert outbox, "the notifications are kept until delivered"
    # The task is over: its view left the live views, kept aside for the queued notifications.
    service = a2a_peer.a2a.service
    await eventually(lambda: task_id not in service.tasks, timeout=10)
    assert task_id in service._pushing
    await receiver.start()
    await receiver.wait_for_final()
    check_signed(receiver, "tok-1")
    # Once they are delivered the view goes too (noticed as the next task leaves memory).
    later = await collect(client, sdk_message(parts=[{"text": "later"}]))
    assert later[-1]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
    await eventually(lambda: not service._pushing and not service.tasks, timeout=10)
    bodies = receiver.bodies()
    states = [_state(b) for b in bodies]
    assert states[0] == "TASK_STATE_WORKING"
    assert states[-1] == "TASK_STATE_COMPLETED"
    assert set(states[:-1]) == {"TASK_STATE_WORKING"}
    # In order, each once, each naming the Synapse message it stands for.
    stamps = [(b.get("task") or b["statusUpdate"])["metadata"]["synapse"] for b in bodies]
    assert len({s["messageId"] for s in stamps}) == len(stamps)
    assert [s["type"] for s in stamps][-1] == "p2p:task_complete"
    final = bodies[-1]["task"]
    assert final["id"] == task_id
    assert final["artifacts"][0]["parts"] == [{"text": "done after 3 steps"}]
    progress = [
        b["statusUpdate"]["status"]["message"]["parts"][0]["text"]
        for b in bodies
        if "statusUpdate" in b and "message" in b["statusUpdate"]["status"]
    ]
    assert progress == ["executing", "step 1/3", "step 2/3", "step 3/3"]


async def test_a_config_added_later_gets_what_follows(
    a2a_peer: A2APeer, sdk_client: SdkClientFactory, receiver: Receiver
) -> None:
    await receiver.start()
    client = await sdk_client(streaming=False)
    asked = await collect(
        client,
        sdk_message(parts=[{"data": {"subject": "Ada"}}], metadata={"task_type": "portrait"}),
    )
    task_id = asked[-1]["task"]["id"]
    config = ParseDict(
        {"taskId": task_id, "url": a2a_peer.hook_url, "token": "tok-2"},
        TaskPushNotificationConfig(),
    )
    stored = await client.create_task_push_notification_config(config)
    assert stored.id == task_id  # an id defaults to the task's, as in the SDK
    done = await collect(client, sdk_message(taskId=task_id, parts=[{"text": "reject: no"}]))
    assert done[-1]["task"]["status"]["state"] == "TASK_STATE_FAILED"
    await receiver.wait_for_final()
    check_signed(receiver, "tok-2")
    final = receiver.bodies()[-1]["task"]
    assert final["status"]["state"] == "TASK_STATE_FAILED"
    assert "permission_denied" in json.dumps(final["status"])


async def test_a_refusing_receiver_dead_letters_nothing_else(
    a2a_peer: A2APeer, sdk_client: SdkClientFactory
) -> None:
    """A 4xx from the webhook is final: the notification is dead-lettered, the task and its
    stream are unaffected."""

    async def refuse(request: web.Request) -> web.Response:
        return web.Response(status=401)

    app = web.Application()
    app.router.add_post("/hooks/a2a", refuse)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", a2a_peer.hook_port, reuse_address=True).start()
    try:
        client = await sdk_client()
        push = {"url": a2a_peer.hook_url, "token": "tok-3"}
        events = await collect(
            client, sdk_message(parts=[{"text": "hi"}]), taskPushNotificationConfig=push
        )
        assert "TASK_STATE_COMPLETED" in json.dumps(events[-1])
        store: Any = a2a_peer.peer.store
        async with asyncio.timeout(5):
            while len(store.dead_letters) < 2:  # noqa: ASYNC110 - polling the store
                await asyncio.sleep(0.02)
        assert not store.outbox
    finally:
        await runner.cleanup()
