"""Push-notification tokens rotate without dropping deliveries (issue 18, item 4).

A notification waiting in the outbox goes out with the configuration as it is when it is
sent, so a client that replaces its push token while notifications are queued (the webhook
down, or slow) gets every one of them, in order, under the new token.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from a2akit import A2APeer, SdkClientFactory, collect, sdk_message
from aiohttp import web
from google.protobuf.json_format import ParseDict


async def test_a_token_rotated_while_notifications_wait_is_the_one_they_carry(
    a2a_peer: A2APeer, sdk_client: SdkClientFactory
) -> None:
    client = await sdk_client(streaming=False)
    push = {"url": a2a_peer.hook_url, "token": "tok-old", "id": "hook"}
    message = sdk_message(
        parts=[{"data": {"steps": 2, "delay": 0.02}}], metadata={"task_type": "slow"}
    )
    events = await collect(client, message, taskPushNotificationConfig=push)
    task_id = events[-1]["task"]["id"]
    assert events[-1]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
    store: Any = a2a_peer.peer.store
    assert store.outbox, "the webhook is down: the notifications wait"
    # The client rotates the token (same configuration id) while they wait ...
    from a2a.types.a2a_pb2 import TaskPushNotificationConfig

    rotated = ParseDict(
        {"taskId": task_id, "id": "hook", "url": a2a_peer.hook_url, "token": "tok-new"},
        TaskPushNotificationConfig(),
    )
    await client.create_task_push_notification_config(rotated)
    # ... and the webhook comes up accepting the new token only.
    received: list[dict[str, Any]] = []
    tokens: list[str] = []
    done = asyncio.Event()

    async def hook(request: web.Request) -> web.Response:
        token = request.headers.get("X-A2A-Notification-Token", "")
        tokens.append(token)
        if token != "tok-new":
            return web.Response(status=401)
        body = json.loads(await request.read())
        received.append(body)
        if "task" in body:
            done.set()
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/hooks/a2a", hook)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", a2a_peer.hook_port, reuse_address=True).start()
    try:
        async with asyncio.timeout(10):
            await done.wait()
    finally:
        await runner.cleanup()
    assert set(tokens) == {"tok-new"}
    assert not store.dead_letters
    kinds = [(b.get("task") or b["statusUpdate"])["metadata"]["synapse"]["type"] for b in received]
    assert kinds[0] == "p2p:task_status_update" and kinds[-1] == "p2p:task_complete"
    assert received[-1]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
