"""`synapse mcp --a2a-agent`: A2A agents as partners of the MCP server (a `synapse serve --a2a`
process here), with the same tools: their skills listed, tasks delegated, INPUT_REQUIRED asked
through elicitation or answered with `answer_task`."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import mcp_types as types
import pytest
from clikit import EXECUTOR, Server, clean_env, free_port, serve
from mcp import Client, StdioServerParameters
from mcp.client.session import ClientRequestContext
from mcpkit import ROOT, structured, text


@pytest.fixture(scope="module")
def a2a_agent() -> Iterator[Server]:
    with serve("--agent-id", EXECUTOR, "--a2a") as server:
        yield server


def mcp_a2a(*agents: str) -> StdioServerParameters:
    args = ["-m", "synapse.cli.main", "mcp"]
    for agent in agents:
        args += ["--a2a-agent", agent]
    return StdioServerParameters(command=sys.executable, args=args, env=clean_env(), cwd=str(ROOT))


def base(server: Server) -> str:
    return f"http://127.0.0.1:{server.port}"


async def test_skills_are_listed_and_an_unreachable_agent_said(a2a_agent: Server) -> None:
    down = f"down=http://127.0.0.1:{free_port()}"
    async with Client(mcp_a2a(f"painter={base(a2a_agent)}", down)) as client:
        partners = structured(await client.call_tool("list_partners", {}))["partners"]
        refused = await client.call_tool(
            "delegate_task", {"partner": "down", "task_type": "echo", "payload": {"text": "x"}}
        )
    by_name = {p["name"]: p for p in partners}
    assert by_name["painter"]["protocol"] == "a2a"
    assert by_name["painter"]["reachable"] is True
    assert {"echo", "portrait"} <= {c["name"] for c in by_name["painter"]["capabilities"]}
    assert by_name["down"]["reachable"] is False
    assert refused.is_error and "down" in text(refused)


async def test_an_agent_given_by_url_is_named_by_its_card(a2a_agent: Server) -> None:
    async with Client(mcp_a2a(base(a2a_agent))) as client:
        partners = structured(await client.call_tool("list_partners", {}))["partners"]
        done = structured(
            await client.call_tool(
                "delegate_task",
                {"partner": EXECUTOR, "task_type": "echo", "payload": {"text": "via A2A"}},
            )
        )
    assert [p["name"] for p in partners] == [EXECUTOR]
    assert done["protocol"] == "a2a"
    assert done["status"] == "completed"
    assert done["state"] == "TASK_STATE_COMPLETED"
    assert "via A2A" in str(done["result"])


async def test_input_required_is_asked_through_elicitation(a2a_agent: Server) -> None:
    asked: list[dict[str, Any]] = []

    async def elicit(
        context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult:
        assert isinstance(params, types.ElicitRequestFormParams)
        asked.append(params.requested_schema)
        return types.ElicitResult(action="accept", content={"style": "浪漫"})

    async with Client(mcp_a2a(f"painter={base(a2a_agent)}"), elicitation_callback=elicit) as client:
        done = structured(
            await client.call_tool(
                "delegate_task",
                {"partner": "painter", "task_type": "text_generation", "payload": {"prompt": "月"}},
            )
        )
    assert done["status"] == "completed", done
    assert "浪漫" in str(done["result"])
    assert list(asked[0]["properties"]) == ["style"]


async def test_a_decision_is_answered_with_answer_task(a2a_agent: Server) -> None:
    async with Client(mcp_a2a(f"painter={base(a2a_agent)}")) as client:
        waiting = structured(
            await client.call_tool(
                "delegate_task",
                {"partner": "painter", "task_type": "portrait", "payload": {"subject": "Lin"}},
            )
        )
        assert waiting["status"] == "input_required"
        assert waiting["question"]["kind"] == "need_human"
        done = structured(
            await client.call_tool(
                "answer_task",
                {
                    "task_id": waiting["task_id"],
                    "decision": "approve",
                    "fields": {"authorized": True},
                },
            )
        )
    assert done["status"] == "completed", done
    assert "portrait of Lin" in str(done["result"])
