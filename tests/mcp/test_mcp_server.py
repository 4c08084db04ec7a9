"""`synapse mcp` over stdio, driven by the official MCP client (`mcp.Client`), in front of a
real `synapse serve` executor over loopback HTTP: the tools, elicitation, `answer_task`,
progress and cancellation, the task history resource, and errors that never stop the server."""

from __future__ import annotations

from typing import Any

import mcp_types as types
import pytest
from clikit import Server, free_port
from mcp import Client
from mcp.client.session import ClientRequestContext
from mcpkit import mcp_stdio, resource_json, structured, text

TOOLS = {"list_partners", "delegate_task", "get_task", "list_tasks", "cancel_task", "answer_task"}

#: The client's protocol revision: 2026-07-28 (elicitation inside the tool's result, the
#: call retried) and 2025-11-25 (elicitation as a request in the middle of the call).
MODES = ["2026-07-28", "legacy"]


class Elicitations:
    """An elicitation callback that answers from `answers` and records what it was asked."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.asked: list[types.ElicitRequestFormParams] = []

    async def __call__(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult:
        assert isinstance(params, types.ElicitRequestFormParams)
        self.asked.append(params)
        wanted = params.requested_schema["properties"]
        content = {k: v for k, v in self.answers.items() if k in wanted}
        return types.ElicitResult(action="accept", content=content)


async def test_every_tool_has_input_and_output_schemas(
    executor: Server, requester_port: int
) -> None:
    async with Client(mcp_stdio(executor, requester_port)) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert set(tools) == TOOLS
    for tool in tools.values():
        assert tool.description, tool.name
        assert tool.input_schema["type"] == "object", tool.name
        assert tool.output_schema is not None and tool.output_schema.get("type") == "object"
    delegate = tools["delegate_task"].input_schema
    assert set(delegate["required"]) == {"partner", "task_type"}
    assert "payload" in delegate["properties"]


async def test_list_partners_says_who_answers_and_what_it_can_do(
    executor: Server, requester_port: int, tmp_path: Any
) -> None:
    secret_file = tmp_path / "gone.secret"
    secret_file.write_text("another-secret-for-a-partner-that-is-down\n")
    gone = f"gone=http://127.0.0.1:{free_port()}/synapse/callback"
    extra = ("--peer", gone, "--peer-secret-file", f"gone={secret_file}")
    async with Client(mcp_stdio(executor, requester_port, *extra)) as client:
        partners = structured(await client.call_tool("list_partners", {}))["partners"]
    by_name = {p["name"]: p for p in partners}
    assert by_name["exec"]["reachable"] is True
    assert by_name["exec"]["protocol"] == "synapse"
    names = {c["name"] for c in by_name["exec"]["capabilities"]}
    assert {"echo", "slow", "text_generation", "portrait"} <= names
    assert by_name["gone"]["reachable"] is False
    assert by_name["gone"]["error"]


async def test_an_echo_task_returns_its_result(executor: Server, requester_port: int) -> None:
    async with Client(mcp_stdio(executor, requester_port)) as client:
        result = await client.call_tool(
            "delegate_task",
            {"partner": "exec", "task_type": "echo", "payload": {"text": "hello over MCP"}},
        )
    task = structured(result)
    assert task["status"] == "completed"
    assert task["state"] == "completed"
    assert task["result"]["output"] == "hello over MCP"
    assert "hello over MCP" in text(result)  # the same, as text, for clients that read text


@pytest.mark.parametrize("mode", MODES)
async def test_need_info_is_asked_through_elicitation(
    executor: Server, requester_port: int, mode: str
) -> None:
    """`text_generation` without a style: the `task_need_info` becomes a form (its field,
    its reason, the suggested value and the alternatives), the answer `task_info_provided`."""
    elicit = Elicitations({"style": "现代"})
    async with Client(
        mcp_stdio(executor, requester_port), elicitation_callback=elicit, mode=mode
    ) as client:
        result = await client.call_tool(
            "delegate_task",
            {"partner": "exec", "task_type": "text_generation", "payload": {"prompt": "rain"}},
        )
    task = structured(result)
    assert task["status"] == "completed", task
    assert task["result"]["metadata"] == {"prompt": "rain", "style": "现代"}
    [asked] = elicit.asked
    style = asked.requested_schema["properties"]["style"]
    assert style["default"] == "古典"
    assert style["enum"] == ["古典", "现代", "浪漫"]
    assert style["description"] == "no style given"
    assert asked.requested_schema["required"] == ["style"]
    assert "Which style" in asked.message


@pytest.mark.parametrize("mode", MODES)
async def test_need_human_is_asked_through_elicitation(
    executor: Server, requester_port: int, mode: str
) -> None:
    """A person's decision as a form: approve/reject, the proposed field with its pros and
    cons and confidence, editable; the reviewer's value goes out in `approved_fields`."""
    elicit = Elicitations({"decision": "approve", "authorized": False})
    async with Client(
        mcp_stdio(executor, requester_port), elicitation_callback=elicit, mode=mode
    ) as client:
        result = await client.call_tool(
            "delegate_task",
            {"partner": "exec", "task_type": "portrait", "payload": {"subject": "Ada"}},
        )
    task = structured(result)
    assert task["status"] == "completed", task
    assert task["result"]["metadata"] == {"approved_fields": {"authorized": False}}
    [asked] = elicit.asked
    form = asked.requested_schema["properties"]
    assert form["decision"]["enum"] == ["approve", "reject"]
    assert form["authorized"]["type"] == "boolean" and form["authorized"]["default"] is True
    assert "confidence 70%" in form["authorized"]["description"]
    assert "Paint a portrait of Ada" in asked.message


async def test_a_portrait_is_approved_with_answer_task(
    executor: Server, requester_port: int
) -> None:
    """A client without elicitation gets the question in the result and answers it with
    `answer_task`."""
    async with Client(mcp_stdio(executor, requester_port)) as client:
        asked = structured(
            await client.call_tool(
                "delegate_task",
                {"partner": "exec", "task_type": "portrait", "payload": {"subject": "Ada"}},
            )
        )
        assert asked["status"] == "input_required"
        assert asked["state"] == "need_human"
        question = asked["question"]
        assert question["kind"] == "need_human"
        assert question["reason"]["code"] == "ethical_decision"
        assert question["options"][0]["field"] == "authorized"
        assert "answer_task" in asked["hint"]
        done = structured(
            await client.call_tool(
                "answer_task",
                {
                    "task_id": asked["task_id"],
                    "decision": "approve",
                    "fields": {"authorized": True},
                    "notes": "checked the release form",
                },
            )
        )
        history = resource_json(await client.read_resource(f"synapse://tasks/{asked['task_id']}"))
    assert done["status"] == "completed"
    assert done["result"]["metadata"] == {"approved_fields": {"authorized": True}}
    audit = [step["audit"] for step in history["history"] if "audit" in step]
    assert [a["action"] for a in audit] == ["approve"]
    assert audit[0]["actor"] == "mcp-client"
    assert audit[0]["detail"]["notes"] == "checked the release form"


async def test_a_rejection_fails_the_task(executor: Server, requester_port: int) -> None:
    async with Client(mcp_stdio(executor, requester_port)) as client:
        asked = structured(
            await client.call_tool(
                "delegate_task",
                {"partner": "exec", "task_type": "portrait", "payload": {"subject": "Bo"}},
            )
        )
        done = structured(
            await client.call_tool(
                "answer_task",
                {"task_id": asked["task_id"], "decision": "reject", "rejection_reason": "no"},
            )
        )
    assert done["status"] == "failed"
    assert done["state"] == "failed"
    assert done["error"]["code"] == "permission_denied"


async def test_need_info_answered_with_answer_task(executor: Server, requester_port: int) -> None:
    async with Client(mcp_stdio(executor, requester_port)) as client:
        asked = structured(
            await client.call_tool(
                "delegate_task",
                {"partner": "exec", "task_type": "text_generation", "payload": {"prompt": "x"}},
            )
        )
        assert asked["question"]["kind"] == "need_info"
        assert asked["question"]["missing_fields"][0]["field"] == "style"
        wrong = await client.call_tool(
            "answer_task", {"task_id": asked["task_id"], "decision": "approve"}
        )
        assert wrong.is_error and "not a decision" in text(wrong)
        missing = await client.call_tool("answer_task", {"task_id": asked["task_id"]})
        assert missing.is_error and "missing style" in text(missing)
        done = structured(
            await client.call_tool(
                "answer_task", {"task_id": asked["task_id"], "fields": {"style": "浪漫"}}
            )
        )
    assert done["result"]["metadata"]["style"] == "浪漫"


async def test_a_long_task_reports_progress_and_can_be_cancelled(
    executor: Server, requester_port: int
) -> None:
    """The call returns with the task id once its wait is over; progress notifications
    come while it waits; `cancel_task` ends it."""
    seen: list[tuple[float, float | None, str | None]] = []

    async def progress(done: float, total: float | None, message: str | None) -> None:
        seen.append((done, total, message))

    async with Client(mcp_stdio(executor, requester_port)) as client:
        running = structured(
            await client.call_tool(
                "delegate_task",
                {
                    "partner": "exec",
                    "task_type": "slow",
                    "payload": {"steps": 200, "delay": 0.05},
                    "wait_seconds": 1.0,
                },
                progress_callback=progress,
            )
        )
        assert running["status"] == "working"
        assert "get_task" in running["hint"]
        again = structured(
            await client.call_tool("get_task", {"task_id": running["task_id"], "wait_seconds": 0.3})
        )
        assert again["status"] == "working"
        assert again["progress"] >= running["progress"] > 0
        cancelled = structured(
            await client.call_tool(
                "cancel_task", {"task_id": running["task_id"], "reason": "enough"}
            )
        )
        listed = structured(await client.call_tool("list_tasks", {"status": "cancelled"}))
    assert cancelled["status"] == "cancelled"
    assert cancelled["state"] == "cancelled"
    assert running["task_id"] in {t["task_id"] for t in listed["tasks"]}
    steps = [p for p, _, m in seen if m and m.startswith("step ")]
    assert len(steps) >= 3, seen
    assert steps == sorted(steps)
    assert all(total == 100.0 for _, total, _ in seen)


async def test_errors_are_tool_errors_and_the_server_keeps_serving(
    executor: Server, requester_port: int, tmp_path: Any
) -> None:
    secret_file = tmp_path / "gone.secret"
    secret_file.write_text("a-secret-of-a-partner-nobody-runs\n")
    gone = f"gone=http://127.0.0.1:{free_port()}/synapse/callback"
    extra = ("--peer", gone, "--peer-secret-file", f"gone={secret_file}", "--retries", "1")
    async with Client(mcp_stdio(executor, requester_port, *extra)) as client:
        unknown = await client.call_tool(
            "delegate_task", {"partner": "nobody", "task_type": "echo", "payload": {"text": "x"}}
        )
        refused = await client.call_tool(
            "delegate_task", {"partner": "exec", "task_type": "echo", "payload": {}}
        )
        unreachable = await client.call_tool(
            "delegate_task", {"partner": "gone", "task_type": "echo", "payload": {"text": "x"}}
        )
        bad_argument = await client.call_tool(
            "delegate_task", {"partner": "exec", "task_type": "echo", "priority": "whenever"}
        )
        no_task = await client.call_tool("get_task", {"task_id": "task-nobody-started"})
        done = structured(
            await client.call_tool(
                "delegate_task", {"partner": "exec", "task_type": "echo", "payload": {"text": "a"}}
            )
        )
        not_waiting = await client.call_tool(
            "answer_task", {"task_id": done["task_id"], "fields": {"x": 1}}
        )
        ended = await client.call_tool("cancel_task", {"task_id": done["task_id"]})
        still = structured(
            await client.call_tool(
                "delegate_task", {"partner": "exec", "task_type": "echo", "payload": {"text": "b"}}
            )
        )
    assert unknown.is_error and "unknown partner 'nobody' (known: exec, gone)" in text(unknown)
    assert refused.is_error and "invalid_params" in text(refused)
    assert "echo needs a string `text`" in text(refused)
    assert unreachable.is_error and "gone did not take echo task" in text(unreachable)
    assert "undeliverable" in text(unreachable)
    assert bad_argument.is_error and "priority" in text(bad_argument)
    assert no_task.is_error and "task-nobody-started" in text(no_task)
    assert not_waiting.is_error and "not waiting for an answer" in text(not_waiting)
    assert ended.is_error and "already ended" in text(ended)
    assert still["result"]["output"] == "b"


async def test_the_history_resource_lists_every_transition(
    executor: Server, requester_port: int
) -> None:
    async with Client(mcp_stdio(executor, requester_port)) as client:
        done = structured(
            await client.call_tool(
                "delegate_task", {"partner": "exec", "task_type": "echo", "payload": {"text": "h"}}
            )
        )
        templates = await client.list_resource_templates()
        history = resource_json(await client.read_resource(f"synapse://tasks/{done['task_id']}"))
        missing = None
        try:
            await client.read_resource("synapse://tasks/task-unknown")
        except Exception as exc:  # the SDK raises the resource error
            missing = str(exc)
    assert [t.uri_template for t in templates.resource_templates] == ["synapse://tasks/{task_id}"]
    assert history["task_id"] == done["task_id"]
    states = [(s["from"], s["to"]) for s in history["history"] if "from" in s]
    assert states[0] == ("idle", "pending")
    assert states[-1][1] == "completed"
    assert missing is not None and "task-unknown" in missing


async def test_tasks_outlive_the_server_with_a_store(
    executor: Server, requester_port: int, tmp_path: Any
) -> None:
    """With `--store`, a task delegated before a restart is still there after it."""
    store = ("--store", str(tmp_path / "mcp.db"))
    async with Client(mcp_stdio(executor, requester_port, *store)) as client:
        done = structured(
            await client.call_tool(
                "delegate_task",
                {"partner": "exec", "task_type": "echo", "payload": {"text": "kept"}},
            )
        )
    async with Client(mcp_stdio(executor, requester_port, *store)) as client:
        again = structured(await client.call_tool("get_task", {"task_id": done["task_id"]}))
        listed = structured(await client.call_tool("list_tasks", {}))["tasks"]
        history = resource_json(await client.read_resource(f"synapse://tasks/{done['task_id']}"))
    assert again["status"] == "completed"
    assert again["result"]["output"] == "kept"
    assert again["task_type"] == "echo" and again["partner"] == "exec"
    assert done["task_id"] in {t["task_id"] for t in listed}
    assert history["history"][-1]["to"] == "completed"


async def test_a_waiting_question_survives_a_restart_with_a_store(
    executor: Server, requester_port: int, tmp_path: Any
) -> None:
    """With `--store`, a task waiting on need_info when the server stops still asks it after
    the restart: `get_task` shows the question, and `answer_task` answers it."""
    store = ("--store", str(tmp_path / "mcp.db"))
    async with Client(mcp_stdio(executor, requester_port, *store)) as client:
        asked = structured(
            await client.call_tool(
                "delegate_task",
                {"partner": "exec", "task_type": "text_generation", "payload": {"prompt": "x"}},
            )
        )
        assert asked["question"]["kind"] == "need_info"
    async with Client(mcp_stdio(executor, requester_port, *store)) as client:
        again = structured(await client.call_tool("get_task", {"task_id": asked["task_id"]}))
        assert again["question"] is not None, again
        assert again["question"]["kind"] == "need_info"
        assert again["question"]["missing_fields"][0]["field"] == "style"
        done = structured(
            await client.call_tool(
                "answer_task", {"task_id": asked["task_id"], "fields": {"style": "浪漫"}}
            )
        )
    assert done["result"]["metadata"]["style"] == "浪漫"


class Dismissing:
    """An elicitation callback whose person closes the form (`cancel`) or declines it."""

    def __init__(self, action: str) -> None:
        self.action = action
        self.asked = 0

    async def __call__(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult:
        self.asked += 1
        return types.ElicitResult(action=self.action)  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("action", ["cancel", "decline"])
async def test_a_dismissed_form_leaves_the_task_waiting_and_says_its_id(
    executor: Server, requester_port: int, mode: str, action: str
) -> None:
    """Closing a need_info form (or declining it) is asked once: the call returns the task,
    with its id and its question, still waiting; `answer_task` then answers it."""
    dismiss = Dismissing(action)
    async with Client(
        mcp_stdio(executor, requester_port), elicitation_callback=dismiss, mode=mode
    ) as client:
        result = await client.call_tool(
            "delegate_task",
            {"partner": "exec", "task_type": "text_generation", "payload": {"prompt": "x"}},
        )
        assert not result.is_error, text(result)
        waiting = structured(result)
        assert dismiss.asked == 1
        assert waiting["status"] == "input_required", waiting
        assert waiting["question"]["kind"] == "need_info"
        done = structured(
            await client.call_tool(
                "answer_task", {"task_id": waiting["task_id"], "fields": {"style": "现代"}}
            )
        )
    assert done["status"] == "completed", done
