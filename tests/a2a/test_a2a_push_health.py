"""Push delivery you can watch: each configuration's last success, last failure and why,
failures in a row; a configuration that keeps failing is disabled by policy (its later
notifications dropped) until it is created again; and the metrics count it all."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from a2akit import PUSH_SECRET, fast_config, reserved_port
from aiohttp import web
from rawpost import eventually

from synapse.a2a import A2AServer, enable_a2a
from synapse.a2a.server.push_health import PushHealthBook
from synapse.demo.handler import DemoHandler
from synapse.transport.peer import Peer

V1 = {"A2A-Version": "1.0"}


class Webhook:
    """Answers `status` to every POST, and counts them."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.status = 500
        self.posts = 0
        self.runner: web.AppRunner | None = None

    async def hook(self, request: web.Request) -> web.Response:
        await request.read()
        self.posts += 1
        return web.Response(status=self.status)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/hooks/a2a", self.hook)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port, reuse_address=True).start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


@pytest.fixture
async def agent() -> AsyncIterator[tuple[str, A2AServer, Webhook]]:
    placeholder = reserved_port()
    port = placeholder.getsockname()[1]
    peer = Peer(
        "agent-p", handler=DemoHandler(), config=fast_config(max_retries=1, retry_base_delay=0.01)
    )
    server = enable_a2a(
        peer,
        push_allowlist=[f"http://127.0.0.1:{port}/hooks/"],
        push_secret=PUSH_SECRET,
        push_disable_after=3,
    )
    await peer.start()
    placeholder.close()
    hook = Webhook(port)
    await hook.start()
    try:
        yield f"http://127.0.0.1:{peer.port}", server, hook
    finally:
        await hook.stop()
        await peer.close(drain_timeout=0.2)


async def rpc(base: str, method: str, params: Any) -> Any:
    request = {"jsonrpc": "2.0", "id": "r", "method": method, "params": params}
    async with httpx.AsyncClient(timeout=10) as http:
        return (await http.post(f"{base}/a2a", json=request, headers=V1)).json()


def slow_task(steps: int) -> dict[str, Any]:
    message = {
        "messageId": f"m-{steps}",
        "role": "ROLE_USER",
        "parts": [{"data": {"steps": steps, "delay": 0.02}}],
        "metadata": {"taskType": "slow"},
    }
    return {"message": message, "configuration": {"returnImmediately": True}}


async def test_a_failing_webhook_is_watched_then_disabled_then_enabled_again(
    agent: tuple[str, A2AServer, Webhook],
) -> None:
    from prometheus_client import CollectorRegistry

    base, server, hook = agent
    registry = CollectorRegistry()
    server.register_metrics(registry)

    def metric(name: str) -> float:
        return registry.get_sample_value(f"synapse_a2a_push_{name}") or 0.0

    task = (await rpc(base, "SendMessage", slow_task(1000)))["result"]["task"]
    url = f"http://127.0.0.1:{hook.port}/hooks/a2a"
    created = await rpc(
        base, "CreateTaskPushNotificationConfig", {"taskId": task["id"], "id": "c1", "url": url}
    )
    assert created["result"]["id"] == "c1"

    def status() -> dict[str, Any]:
        return server.push_status(task["id"]).get("c1", {})

    await eventually(lambda: bool(status().get("disabled")), timeout=10)
    record = status()
    assert record["consecutive_failures"] == 3 and record["failed_attempts"] == 3
    assert record["last_failure_reason"] == "HTTP 500" and record["last_success"] is None
    assert "3 attempts failed in a row" in record["disabled"]
    posts = hook.posts
    # The task goes on reporting progress: its notifications are dropped, not POSTed.
    await eventually(lambda: status().get("dropped", 0) >= 2, timeout=10)
    assert hook.posts == posts
    assert metric("configs_disabled") == 1 and metric("disabled_total") == 1
    assert metric("failed_attempts_total") == 3 and metric("dropped_total") >= 2

    # The webhook is mended and the configuration created again: enabled, a clean record.
    hook.status = 204
    again = await rpc(
        base, "CreateTaskPushNotificationConfig", {"taskId": task["id"], "id": "c1", "url": url}
    )
    assert again["result"]["id"] == "c1"
    await eventually(lambda: status().get("delivered", 0) >= 1, timeout=10)
    record = status()
    assert record["disabled"] == "" and record["consecutive_failures"] == 0
    assert record["last_success"] is not None and record["failed_attempts"] == 0
    assert hook.posts > posts
    assert metric("configs_disabled") == 0 and metric("deliveries_total") >= 1
    await rpc(base, "CancelTask", {"id": task["id"]})


def test_the_book_counts_and_forgets_the_oldest() -> None:
    now = [100.0]
    book = PushHealthBook(disable_after=2, clock=lambda: now[0], max_records=2)
    book.failed("t1", "c", "HTTP 503")
    book.succeeded("t1", "c")
    assert book.of("t1", "c").consecutive_failures == 0
    book.failed("t1", "c", "timeout")
    assert not book.drop("t1", "c")
    book.failed("t1", "c", "timeout")
    assert book.is_disabled("t1", "c") and book.disabled_now == 1
    assert book.drop("t1", "c") and book.of("t1", "c").dropped == 1
    assert (book.delivered, book.failed_attempts, book.disabled_total) == (1, 3, 1)
    book.of("t2", "c")
    book.of("t3", "c")  # a third record: the oldest (t1) goes
    assert not book.is_disabled("t1", "c") and set(book.status("t1")) == set()
    with pytest.raises(ValueError):
        PushHealthBook(disable_after=0)


async def test_the_console_shows_each_configurations_deliveries() -> None:
    """`serve --a2a --console`: an A2A task's page has a panel of its push configurations."""
    from synapse.cli.ops import push_panel
    from synapse.ops.console import Reviewer, TokenAuth, enable_console

    token = "console-token-of-the-operator"
    placeholder = reserved_port()
    port = placeholder.getsockname()[1]
    peer = Peer("agent-c", handler=DemoHandler(), config=fast_config(max_retries=0))
    server = enable_a2a(
        peer,
        push_allowlist=[f"http://127.0.0.1:{port}/hooks/"],
        push_secret=PUSH_SECRET,
        tokens={"a2a-token-of-alice": "alice"},
    )
    console = enable_console(peer, TokenAuth({token: Reviewer("operator")}))
    console.add_panel("push", "Push deliveries", push_panel(server))
    await peer.start()
    placeholder.close()
    hook = Webhook(port)
    await hook.start()
    base = f"http://127.0.0.1:{peer.port}"
    headers = {**V1, "Authorization": "Bearer a2a-token-of-alice"}
    try:
        async with httpx.AsyncClient(timeout=10) as http:

            async def call(method: str, params: Any) -> Any:
                body = {"jsonrpc": "2.0", "id": "c", "method": method, "params": params}
                return (await http.post(f"{base}/a2a", json=body, headers=headers)).json()

            task = (await call("SendMessage", slow_task(500)))["result"]["task"]
            url = f"http://127.0.0.1:{port}/hooks/a2a"
            await call(
                "CreateTaskPushNotificationConfig", {"taskId": task["id"], "id": "c1", "url": url}
            )
            await eventually(
                lambda: server.push_status(task["id"]).get("c1", {}).get("failed_attempts", 0) >= 1
            )
            signed = await http.post(f"{base}/console/login", data={"token": token})
            assert signed.status_code in (200, 303)
            tasks = (await http.get(f"{base}/console/api/tasks")).json()["tasks"]
            [mine] = [t for t in tasks if t["task_id"] == task["id"]]
            detail = (
                await http.get(f"{base}/console/api/tasks/{mine['requester']}/{task['id']}")
            ).json()
            await call("CancelTask", {"id": task["id"]})
    finally:
        await hook.stop()
        await peer.close(drain_timeout=0.2)
    [panel] = detail["panels"]
    assert (panel["name"], panel["title"]) == ("push", "Push deliveries")
    [row] = panel["rows"]
    assert row["config"] == "c1"
    assert row["last_failure_reason"] == "HTTP 500" and row["failed_attempts"] >= 1
    assert row["last_failure"].endswith("+00:00") and row["last_success"] is None
