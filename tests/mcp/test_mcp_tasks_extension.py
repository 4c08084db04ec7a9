"""The MCP Tasks extension on `delegate_task`: a client that declares it gets a task handle
for a long task and follows it with `tasks/get`, `tasks/update` and `tasks/cancel`; a short
task still answers at once; a client that does not declare it never sees a handle."""

from __future__ import annotations

import pytest
from clikit import Server
from mcp import Client
from mcpkit import mcp_stdio, structured, text
from taskskit import TasksRequester


async def test_a_long_task_is_a_task_handle_followed_to_its_result(
    executor: Server, requester_port: int
) -> None:
    tasks = TasksRequester()
    async with Client(mcp_stdio(executor, requester_port), extensions=[tasks]) as client:
        result = await client.call_tool(
            "delegate_task",
            {"partner": "exec", "task_type": "slow", "payload": {"steps": 8, "delay": 0.25}},
        )
    done = structured(result)
    [handle] = tasks.handles
    assert handle.task_id == done["task_id"]
    assert handle.status == "working"
    assert handle.created_at.endswith("Z")
    assert done["status"] == "completed"
    assert done["result"]["output"] == "done after 8 steps"
    polled = [d.status for d in tasks.seen]
    assert polled[-1] == "completed" and "working" in polled
    messages = [d.status_message for d in tasks.seen if d.status == "working"]
    assert any(m and m.startswith("step ") for m in messages), messages


async def test_a_question_is_answered_with_tasks_update(
    executor: Server, requester_port: int
) -> None:
    tasks = TasksRequester(answers={"decision": "approve", "authorized": True})
    async with Client(mcp_stdio(executor, requester_port), extensions=[tasks]) as client:
        result = await client.call_tool(
            "delegate_task",
            {"partner": "exec", "task_type": "portrait", "payload": {"subject": "Eve"}},
        )
    done = structured(result)
    assert done["result"]["metadata"] == {"approved_fields": {"authorized": True}}
    [form] = tasks.forms
    assert form["properties"]["decision"]["enum"] == ["approve", "reject"]
    assert tasks.seen[0].status == "input_required"


async def test_tasks_cancel_ends_the_task(executor: Server, requester_port: int) -> None:
    tasks = TasksRequester(cancel_after=2)
    async with Client(mcp_stdio(executor, requester_port), extensions=[tasks]) as client:
        result = await client.call_tool(
            "delegate_task",
            {"partner": "exec", "task_type": "slow", "payload": {"steps": 100, "delay": 0.1}},
        )
        listed = structured(await client.call_tool("list_tasks", {"status": "cancelled"}))
    assert result.is_error and "task cancelled" in text(result)
    [handle] = tasks.handles
    assert handle.task_id in {t["task_id"] for t in listed["tasks"]}


async def test_a_short_task_answers_at_once_even_with_the_extension(
    executor: Server, requester_port: int
) -> None:
    tasks = TasksRequester()
    async with Client(mcp_stdio(executor, requester_port), extensions=[tasks]) as client:
        result = await client.call_tool(
            "delegate_task", {"partner": "exec", "task_type": "echo", "payload": {"text": "now"}}
        )
    assert structured(result)["result"]["output"] == "now"
    assert tasks.handles == []


@pytest.mark.parametrize("mode", ["2026-07-28", "legacy"])
async def test_no_handle_without_the_extension(
    executor: Server, requester_port: int, mode: str
) -> None:
    async with Client(mcp_stdio(executor, requester_port), mode=mode) as client:
        result = await client.call_tool(
            "delegate_task",
            {
                "partner": "exec",
                "task_type": "slow",
                "payload": {"steps": 30, "delay": 0.1},
                "wait_seconds": 0.5,
            },
        )
        task = structured(result)
        await client.call_tool("cancel_task", {"task_id": task["task_id"]})
    assert task["status"] == "working"
