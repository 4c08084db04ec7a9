"""Against the official A2A JavaScript SDK (`@a2a-js/sdk`, installed by the tests themselves
with `npm ci` in `tests/a2a/js/` from the committed lockfile), each side in its own Node.js
process on 127.0.0.1:

- its client on our server, over JSON-RPC, HTTP+JSON/REST and gRPC: send, get, stream,
  list, a multi-turn INPUT_REQUIRED, cancel and its errors, push configurations (and the
  notifications that follow), extensions asked for with `withA2AExtensions` (and a required
  one left out), several chunked artifacts streamed and listed;
- our client on an agent built with its server classes (its card preferring each binding
  in turn): multi-turn INPUT_REQUIRED and AUTH_REQUIRED (each turn starts with the task
  as it was), a failure, and push notifications it sends to our webhook.

Outside CI a missing `node` (or an `npm ci` that fails) skips with what to install; under
CI=true it fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from a2akit import GRPC_PRESENT, SDK_BINDINGS, A2APeer, free_port
from test_a2a_artifacts import served_peer
from test_a2a_extensions import NOW, POLICY, TRACE, requiring_peer
from test_a2a_push import Receiver

from synapse.a2a import A2AClient, wire
from synapse.a2a.server.extensions import TIMESTAMP_FIELD, TIMESTAMP_URI

JS = Path(__file__).parent / "js"
WAIT = 20.0


def _require_node() -> str:
    """Node.js, with the JavaScript SDK installed from the committed lockfile (`npm ci`,
    once: again only when the lockfile changes)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    missing = None
    if node is None or npm is None:
        missing = "Node.js is not installed (apt-get install nodejs npm)"
    else:
        missing = _install_sdk(npm)
    if missing is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"under CI the JavaScript SDK tests must run: {missing}")
        pytest.skip(missing)
    assert node is not None
    return node


def _install_sdk(npm: str) -> str | None:
    """`npm ci` in `tests/a2a/js` unless the installed SDK matches the lockfile; None when
    it is installed, else what went wrong."""
    lock = hashlib.sha256((JS / "package-lock.json").read_bytes()).hexdigest()
    marker = JS / "node_modules" / ".installed-from-lockfile"
    sdk = JS / "node_modules" / "@a2a-js" / "sdk" / "package.json"
    if sdk.exists() and marker.exists() and marker.read_text() == lock:
        return None
    try:
        done = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=JS,
            capture_output=True,
            text=True,
            timeout=600,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return f"`npm ci` in {JS} did not finish in 600 s"
    if done.returncode != 0 or not sdk.exists():
        return f"`npm ci` in {JS} failed: {done.stderr.strip()[-500:]}"
    marker.write_text(lock)
    return None


@pytest.fixture(scope="module")
def node() -> str:
    return _require_node()


async def run_js_client(node: str, base: str, binding: str, scenario: str) -> dict[str, Any]:
    """`node client.mjs`: its steps by name (it must end with `done`)."""
    process = await asyncio.create_subprocess_exec(
        node,
        str(JS / "client.mjs"),
        base,
        binding,
        scenario,
        cwd=JS,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(WAIT):
            out, err = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    lines = [json.loads(line) for line in out.decode().splitlines() if line.strip()]
    assert process.returncode == 0 and lines and lines[-1] == {"done": True}, (lines, err)
    return {line["step"]: line for line in lines if "step" in line}


def state(event: dict[str, Any]) -> str | None:
    inner = event.get("task") or event.get("statusUpdate")
    return inner["status"]["state"] if inner else None


# --- its client on our server --------------------------------------------------------------


@pytest.mark.parametrize("binding", SDK_BINDINGS)
async def test_js_client_sends_gets_streams_and_lists(
    node: str, a2a_peer: A2APeer, binding: str
) -> None:
    steps = await run_js_client(node, a2a_peer.base_url, binding, "echo")
    assert steps["card"]["name"] == "agent-a"
    task = steps["sent"]["task"]
    assert task["status"]["state"] == wire.COMPLETED
    assert task["artifacts"][0]["parts"][0]["text"] == "hello from js"
    assert steps["got"]["task"]["id"] == task["id"]
    assert len(steps["got"]["task"]["history"]) == 1
    events = steps["streamed"]["events"]
    assert "task" in events[0]
    assert [state(e) for e in events if state(e)][-1] == wire.COMPLETED
    assert any("artifactUpdate" in e for e in events)
    listed = [t["id"] for t in steps["listed"]["listed"]["tasks"]]
    assert task["id"] in listed


@pytest.mark.parametrize("binding", SDK_BINDINGS)
async def test_js_client_multi_turn_input_required(
    node: str, a2a_peer: A2APeer, binding: str
) -> None:
    steps = await run_js_client(node, a2a_peer.base_url, binding, "multi-turn")
    asked = steps["asked"]["events"]
    assert state(asked[-1]) == wire.INPUT_REQUIRED
    answered = steps["answered"]["events"]
    assert state(answered[-1]) == wire.COMPLETED
    texts = [
        p.get("text")
        for e in answered
        if "artifactUpdate" in e
        for p in e["artifactUpdate"]["artifact"]["parts"]
    ]
    assert texts == ["“spring”, written in the modern style"]


@pytest.mark.parametrize("binding", SDK_BINDINGS)
async def test_js_client_cancel_and_errors(node: str, a2a_peer: A2APeer, binding: str) -> None:
    steps = await run_js_client(node, a2a_peer.base_url, binding, "cancel")
    assert steps["cancelled"]["task"]["status"]["state"] == wire.CANCELED
    # Its client raises the error classes of the spec's errors, whatever the binding.
    assert steps["cancelled-again"]["error"].endswith("TaskNotCancelableError")
    assert steps["missing"]["error"].endswith("TaskNotFoundError")


@pytest.mark.parametrize("binding", SDK_BINDINGS)
async def test_js_client_push_configs_and_notifications(
    node: str, a2a_peer: A2APeer, binding: str
) -> None:
    hook = Receiver(a2a_peer.hook_port)
    await hook.start()
    try:
        steps = await run_js_client(node, a2a_peer.base_url, binding, f"push={a2a_peer.hook_url}")
        config = steps["created"]["config"]
        assert config["url"] == a2a_peer.hook_url
        assert [c["id"] for c in steps["listed"]["configs"]["configs"]] == [config["id"]]
        assert steps["got"]["config"]["token"] == "js-token"
        await hook.wait_for_final(WAIT)
        headers = [h for h, _ in hook.received]
        assert {h["X-A2A-Notification-Token"] for h in headers} == {"js-token"}
    finally:
        await hook.stop()


@pytest.mark.parametrize("binding", SDK_BINDINGS)
async def test_js_client_activates_extensions_and_reads_their_data(node: str, binding: str) -> None:
    """The JavaScript SDK's `withA2AExtensions` on each binding: what it asks for is active
    for the handler and stamped on the result (the samples' timestamp extension); a call
    that leaves out a required extension gets its `ExtensionSupportRequiredError`."""
    peer = requiring_peer("agent-x")
    async with peer:
        asked = f"extensions={TIMESTAMP_URI},{TRACE},{POLICY}"
        steps = await run_js_client(node, f"http://127.0.0.1:{peer.port}", binding, asked)
    (artifact,) = steps["asked"]["task"]["artifacts"]
    assert artifact["parts"][0]["data"]["active"] == [TIMESTAMP_URI, TRACE, POLICY]
    assert datetime.fromisoformat(artifact["metadata"][TIMESTAMP_FIELD]).timestamp() == NOW
    assert artifact["metadata"][TRACE] == {"span": "s-1"}
    assert set(artifact["extensions"]) == {TIMESTAMP_URI, TRACE}
    assert steps["plain"]["error"].endswith("ExtensionSupportRequiredError"), steps["plain"]
    assert POLICY in steps["plain"]["message"]


@pytest.mark.parametrize("binding", SDK_BINDINGS)
async def test_js_client_streams_every_artifact(node: str, tmp_path: Path, binding: str) -> None:
    """Several named artifacts, one in two chunks (`append`, `lastChunk`), streamed to the
    JavaScript SDK on each binding and listed whole by its GetTask."""
    async with served_peer(tmp_path / "store.db", grpc_port=0 if GRPC_PRESENT else None) as peer:
        steps = await run_js_client(node, f"http://127.0.0.1:{peer.port}", binding, "artifacts")
    updates = [e["artifactUpdate"] for e in steps["streamed"]["events"] if "artifactUpdate" in e]
    chunks = [
        (u["artifact"].get("name", ""), u.get("append", False), u.get("lastChunk", False))
        for u in updates
    ]
    assert chunks[:3] == [("outline", False, True), ("table", False, False), ("", True, True)]
    artifacts = steps["got"]["task"]["artifacts"]
    assert [(a["name"], len(a["parts"])) for a in artifacts] == [
        ("outline", 1),
        ("table", 2),
        ("report", 1),
    ]
    (table,) = [a for a in artifacts if a["name"] == "table"]
    assert [p["data"] for p in table["parts"]] == [{"rows": [1]}, {"rows": [2]}]


# --- our client on its agent ---------------------------------------------------------------


class JsAgent:
    """`node agent.mjs`: an agent on the JavaScript SDK's server classes."""

    def __init__(self, node: str, first: str) -> None:
        self.node = node
        self.first = first
        self.port = free_port()
        self.grpc_port = free_port()
        self.process: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> JsAgent:
        self.process = await asyncio.create_subprocess_exec(
            self.node,
            str(JS / "agent.mjs"),
            str(self.port),
            str(self.grpc_port),
            self.first,
            cwd=JS,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        assert self.process.stdout is not None
        async with asyncio.timeout(WAIT):
            line = await self.process.stdout.readline()
        assert json.loads(line) == {"ready": True}, line
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        process = self.process
        if process is None or process.returncode is not None:
            return
        assert process.stdin is not None
        process.stdin.close()  # it stops when its stdin ends
        try:
            async with asyncio.timeout(5):
                await process.wait()
        except TimeoutError:
            process.kill()
            await process.wait()


@pytest.fixture(params=SDK_BINDINGS)
async def js_agent(node: str, request: pytest.FixtureRequest) -> AsyncIterator[JsAgent]:
    async with JsAgent(node, request.param) as agent:
        yield agent


async def answer_every_question(
    client: A2AClient, text: str, *, stream: bool = True
) -> tuple[list[str], Any]:
    handle = await client.send(text, stream=stream)
    questions: list[str] = []
    async with asyncio.timeout(WAIT):
        async for event in handle:
            if event.interrupted:
                questions.append(event.text)
                await handle.reply("Ada")
    return questions, await handle.result(WAIT)


async def test_our_client_on_a_js_agent_multi_turn(js_agent: JsAgent) -> None:
    async with A2AClient(js_agent.url) as client:
        assert client.binding == js_agent.first  # the card's preference
        for text, question in (("ask", "What is your name?"), ("auth", "Who are you?")):
            questions, outcome = await answer_every_question(client, text)
            assert questions == [question]  # asked once: the repeated status is not new
            assert outcome.a2a_state == wire.COMPLETED
            assert outcome.text == "hello Ada"
        _, echoed = await answer_every_question(client, "hello js")
        assert echoed.text == "hello js"
        _, failed = await answer_every_question(client, "fail")
        assert failed.a2a_state == wire.FAILED
        assert failed.error is not None and "it broke" in failed.error.message
        # Without streaming (polling GetTask), the same.
        questions, polled = await answer_every_question(client, "ask", stream=False)
        assert questions == ["What is your name?"]
        assert polled.text == "hello Ada"


async def test_push_notifications_from_a_js_agent(js_agent: JsAgent) -> None:
    hook = Receiver(free_port())
    await hook.start()
    try:
        url = f"http://127.0.0.1:{hook.port}/hooks/a2a"
        async with A2AClient(js_agent.url) as client:
            handle = await client.send(
                "ask", push=wire.TaskPushNotificationConfig(url=url, token="for-us")
            )
            async with asyncio.timeout(WAIT):
                async for event in handle:
                    if event.interrupted:
                        await handle.reply("Ada")
            assert (await handle.result(WAIT)).text == "hello Ada"
            configs = await client.list_push_configs(handle.task_id)
            assert [c.url for c in configs] == [url]
            await hook.wait_for_final(WAIT)
        tokens = {h.get("X-A2A-Notification-Token") for h, _ in hook.received}
        assert tokens == {"for-us"}
        kinds = {"task", "message", "statusUpdate", "artifactUpdate"}
        bodies = hook.bodies()
        assert all(len(kinds & set(b)) == 1 for b in bodies), bodies
        states = [state(b) for b in bodies if state(b)]
        assert wire.INPUT_REQUIRED in states, states
        assert states[-1] == wire.COMPLETED, states
    finally:
        with contextlib.suppress(Exception):
            await hook.stop()
