"""`McpToolsHandler` and `serve --handler-mcp`: a real MCP server's tools (tool_server.py,
written with the official SDK) as task types, called by a Synapse requester (`synapse send`,
over loopback HTTP) and by the official A2A SDK's client."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from clikit import Server, client_args, executor_args, free_port, run, serve

from synapse.mcp import McpToolsHandler
from synapse.mcp.handler import server_of
from synapse.types import ErrorCode

HERE = Path(__file__).parent
TOOL_SERVER = f"{sys.executable} {HERE / 'tool_server.py'}"


@pytest.fixture(scope="module")
def tools_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def tools_executor(tools_port: int) -> Iterator[Server]:
    """`synapse serve --handler-mcp` over the stdio tool server, as agent `exec`."""
    with serve(*executor_args(tools_port, "--handler-mcp", TOOL_SERVER)) as server:
        yield server


@contextlib.contextmanager
def http_tool_server() -> Iterator[str]:
    """tool_server.py over streamable HTTP; yields its URL once it accepts connections."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(HERE / "tool_server.py"), "--http", str(port)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert process.poll() is None, "the HTTP tool server exited"
            assert time.monotonic() < deadline, "the HTTP tool server did not start"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def send(server: Server, port: int, *args: str) -> subprocess.CompletedProcess[str]:
    return run("send", *args, *client_args(server, port), "--json")


def events(result: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def outcome(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    [last] = [e for e in events(result) if e["event"] == "outcome"]
    return last


# --- the handler on its own ---------------------------------------------------------------------


@pytest.fixture
async def handler() -> AsyncIterator[McpToolsHandler]:
    async with McpToolsHandler(TOOL_SERVER) as found:
        yield found


async def test_each_tool_is_a_capability_with_its_input_schema(handler: McpToolsHandler) -> None:
    capabilities = {c.name: c for c in handler.get_capabilities()}
    assert set(capabilities) == {"add", "count", "poem", "order", "explode"}
    assert capabilities["add"].description == "Add two integers."
    schema = capabilities["add"].input_schema
    assert schema is not None and schema["required"] == ["a", "b"]


async def test_validation_follows_each_tools_input_schema(handler: McpToolsHandler) -> None:
    missing = handler.validate_task("add", {"a": 1})
    assert missing.ok
    assert [(f.field, f.reason) for f in missing.missing] == [("b", "the second addend")]
    assert missing.question == "add needs b"
    wrong = handler.validate_task("add", {"a": 1, "b": "two"})
    assert not wrong.ok and wrong.reason is not None
    assert wrong.reason.code == ErrorCode.INVALID_PARAMS.value
    assert "b" in wrong.reason.message and "integer" in wrong.reason.message
    out_of_range = handler.validate_task("count", {"n": 500})
    assert not out_of_range.ok
    unknown = handler.validate_task("paint", {})
    assert not unknown.ok and unknown.reason is not None
    assert unknown.reason.code == ErrorCode.CAPABILITY_LACKING.value
    assert handler.validate_task("add", {"a": 1, "b": 2}).ok


def test_a_server_is_a_command_line_or_a_url() -> None:
    assert server_of("http://127.0.0.1:9/mcp") == "http://127.0.0.1:9/mcp"
    stdio = server_of("python -m 'my tools' --fast")
    assert not isinstance(stdio, str)
    assert (stdio.command, stdio.args) == ("python", ["-m", "my tools", "--fast"])
    with pytest.raises(ValueError):
        server_of("   ")


async def test_an_unreachable_server_is_said_at_start() -> None:
    with pytest.raises(ConnectionError, match="cannot reach the MCP server"):
        await McpToolsHandler(f"http://127.0.0.1:{free_port()}/mcp", connect_timeout=10).start()


# --- a Synapse requester (synapse send) -----------------------------------------------------


def test_a_tool_call_completes_a_task(tools_executor: Server, tools_port: int) -> None:
    result = send(tools_executor, tools_port, "add", '{"a": 2, "b": 3}')
    assert result.returncode == 0, result.stderr
    assert outcome(result)["result"]["output_type"] == "json"
    assert outcome(result)["result"]["output"] == {"total": 5}


def test_a_missing_required_field_is_need_info(tools_executor: Server, tools_port: int) -> None:
    result = send(tools_executor, tools_port, "add", '{"a": 2}', "--field", "b=40")
    assert result.returncode == 0, result.stderr
    [asked] = [e for e in events(result) if e["event"] == "task_need_info"]
    assert asked["payload"]["missing_fields"][0]["field"] == "b"
    assert asked["payload"]["missing_fields"][0]["reason"] == "the second addend"
    assert outcome(result)["result"]["output"] == {"total": 42}


def test_an_elicitation_is_need_info(tools_executor: Server, tools_port: int) -> None:
    result = send(tools_executor, tools_port, "poem", '{"topic": "sea"}', "--field", "style=sonnet")
    assert result.returncode == 0, result.stderr
    [asked] = [e for e in events(result) if e["event"] == "task_need_info"]
    field = asked["payload"]["missing_fields"][0]
    assert field == {
        "field": "style",
        "reason": "the poem's style",
        "suggested_value": "haiku",
        "alternatives": ["sonnet"],
    }
    assert asked["payload"]["question"] == "Which style?"
    assert outcome(result)["result"]["output"] == {"result": "a sonnet about sea"}


def test_an_elicitation_asks_what_the_tool_requires_with_its_titled_choices(
    tools_executor: Server, tools_port: int
) -> None:
    """The tool's form as it wrote it: only the required field is asked for (the optional
    ones are left to the tool), its titled choices (`oneOf` of `const`/`title`) are the
    suggestion and the alternatives, with their titles in the reason."""
    result = send(tools_executor, tools_port, "order", '{"drink": "tea"}', "--field", "size=l")
    assert result.returncode == 0, result.stderr
    [asked] = [e for e in events(result) if e["event"] == "task_need_info"]
    [field] = asked["payload"]["missing_fields"]
    assert field["field"] == "size"
    assert field["suggested_value"] == "s" and field["alternatives"] == ["l"]
    assert "s (Small)" in field["reason"] and "l (Large)" in field["reason"]
    assert outcome(result)["result"]["output"] == {"result": "tea l ['size']"}


def test_progress_notifications_are_status_updates(tools_executor: Server, tools_port: int) -> None:
    result = send(tools_executor, tools_port, "count", '{"n": 4}')
    assert result.returncode == 0, result.stderr
    updates = [e["payload"] for e in events(result) if e["event"] == "task_status_update"]
    counted = [(u["progress"], u["message"]) for u in updates if u["message"].startswith("counted")]
    assert counted == [
        (25.0, "counted 1"),
        (50.0, "counted 2"),
        (75.0, "counted 3"),
        (100.0, "counted 4"),
    ]


def test_a_tool_error_fails_the_task(tools_executor: Server, tools_port: int) -> None:
    result = send(tools_executor, tools_port, "explode", '{"reason": "on purpose"}')
    assert result.returncode == 1
    error = outcome(result)["error"]
    assert error["code"] == "execution_failed"
    assert "exploded: on purpose" in error["message"]


def test_a_tools_server_over_streamable_http() -> None:
    port = free_port()
    with (
        http_tool_server() as url,
        serve(*executor_args(port, "--handler-mcp", url)) as server,
    ):
        result = send(server, port, "add", '{"a": 20, "b": 22}')
        poem = send(server, port, "poem", '{"topic": "rain"}', "--field", "style=haiku")
    assert result.returncode == 0, result.stderr
    assert outcome(result)["result"]["output"] == {"total": 42}
    assert outcome(poem)["result"]["output"] == {"result": "a haiku about rain"}


def test_serve_says_when_the_tools_server_cannot_start() -> None:
    flags = executor_args(free_port(), "--handler-mcp", f"{sys.executable} -c pass")
    result = run("serve", "--port", str(free_port()), *flags)
    assert result.returncode == 2
    assert "--handler-mcp" in result.stderr and "cannot reach the MCP server" in result.stderr
    # The cause itself, not the SDK's wrapper around it.
    assert "TaskGroup" not in result.stderr and "sub-exception" not in result.stderr


# --- the official A2A SDK's client ----------------------------------------------------------


async def test_the_official_a2a_client_uses_the_tools(handler: McpToolsHandler) -> None:
    sys.path.insert(0, str(HERE.parent / "a2a"))
    from a2a.client import ClientConfig, ClientFactory
    from a2akit import collect, sdk_message, state_of, task_id_of

    from synapse import Peer
    from synapse.a2a import enable_a2a

    peer = Peer("tools", handler=handler, port=0)
    enable_a2a(peer, default_task_type=None)
    await peer.start()
    http = httpx.AsyncClient(timeout=10.0)
    try:
        config = ClientConfig(
            streaming=True, httpx_client=http, supported_protocol_bindings=["JSONRPC"]
        )
        client = await ClientFactory(config).create_from_url(f"http://127.0.0.1:{peer.port}")
        added = await collect(
            client, sdk_message(parts=[{"data": {"a": 2, "b": 3}}], metadata={"taskType": "add"})
        )
        assert state_of(added[-1]) == "TASK_STATE_COMPLETED"
        assert '"total": 5' in json.dumps(added) or '"total": 5.0' in json.dumps(added)
        asked = await collect(
            client, sdk_message(parts=[{"data": {"topic": "snow"}}], metadata={"taskType": "poem"})
        )
        assert state_of(asked[-1]) == "TASK_STATE_INPUT_REQUIRED"
        answer = sdk_message(taskId=task_id_of(asked), parts=[{"data": {"style": "haiku"}}])
        done = await collect(client, answer)
        assert state_of(done[-1]) == "TASK_STATE_COMPLETED"
        assert "a haiku about snow" in json.dumps(done, ensure_ascii=False)
        await client.close()
    finally:
        await http.aclose()
        await peer.close(drain_timeout=0)
