"""An OpenAI Agents SDK `Agent` served as a Synapse handler, as it is (`Peer(handler=agent)`),
between two real peers over loopback HTTP, on a scripted offline model."""

from __future__ import annotations

import signal
from pathlib import Path

import oa_agents
import pytest
from fwkit import HERE, pair, requester_of_serve, serve

from synapse.frameworks import as_handler, framework_of
from synapse.frameworks.base import APPROVAL_REQUIRED
from synapse.frameworks.openai_agents import ASK_TOOL, OpenAIAgentsHandler
from synapse.types import TaskState


def test_an_agent_is_recognized_and_named_by_its_task_type() -> None:
    assert framework_of(oa_agents.payer) == "agents"
    handler = as_handler(oa_agents.payer)
    assert isinstance(handler, OpenAIAgentsHandler)
    assert handler.task_type == "payer"
    assert [t.name for t in handler.agent.tools] == ["send_payment", ASK_TOOL]
    assert [t.name for t in oa_agents.payer.tools] == ["send_payment"]  # the agent is unchanged


async def test_a_prompt_in_text_out_and_structured_output_as_json() -> None:
    async with pair(oa_agents.echo) as (requester, _):
        text = await (await requester.submit("agent-e", "echo", {"prompt": "hi"}))
    async with pair(oa_agents.forecast) as (requester, _):
        structured = await (await requester.submit("agent-e", "forecast", {"prompt": "Oslo?"}))
    assert text.result is not None and (text.result.output_type, text.result.output) == (
        "text",
        "echo",
    )
    assert structured.result is not None
    assert structured.result.output == {"city": "Oslo", "celsius": -3}


async def test_the_agent_asks_the_requester_then_a_person_and_an_edit_is_called_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SDK approves a call as the model made it: the person's edit goes back to the model
    as a rejection naming the values, the model calls again with them, and that call is
    asked again; the tool runs once, with the person's amount."""
    log = tmp_path / "calls.log"
    monkeypatch.setenv("FRAMEWORK_TEST_LOG", str(log))
    asked: list[dict[str, object]] = []
    progress: list[str] = []
    async with pair(oa_agents.payer) as (requester, _):
        handle = await requester.submit("agent-e", "payer", {"prompt": "pay"})
        async for event in handle:
            if (update := event.status_update) is not None and update.message:
                progress.append(update.message)
            if (info := event.need_info) is not None:
                assert [(f.field, f.reason) for f in info.missing_fields] == [
                    ("iban", "which account?")
                ]
                await handle.provide_info({"iban": "NO93860111"})
            if (human := event.need_human) is not None:
                assert human.reason.code == APPROVAL_REQUIRED
                asked.append({o.field: o.value for o in human.options})
                if len(asked) == 1:
                    await handle.approve({"amount": 35})
                else:
                    await handle.approve()
        outcome = await handle
    assert outcome.result is not None
    assert outcome.result.output == "done: paid 35 to NO93860111"
    assert asked == [{"amount": 40, "to": "NO93860111"}, {"amount": 35, "to": "NO93860111"}]
    assert log.read_text().splitlines() == [
        "model: plan",
        "model: pay",
        "model: pay as approved",
        "tool: send_payment 35 NO93860111",
        "model: report",
    ]
    assert "calling send_payment" in progress
    assert f"calling {ASK_TOOL}" not in progress


async def test_a_rejection_fails_the_task_and_the_tool_never_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "calls.log"
    monkeypatch.setenv("FRAMEWORK_TEST_LOG", str(log))
    async with pair(oa_agents.payer) as (requester, _):
        handle = await requester.submit("agent-e", "payer", {"prompt": "pay"})
        async for event in handle:
            if event.need_info is not None:
                await handle.provide_info({"iban": "X"})
            if event.need_human is not None:
                await handle.reject("no")
        outcome = await handle
    assert outcome.state is TaskState.FAILED
    assert outcome.error is not None and outcome.error.code == "permission_denied"
    assert not any(line.startswith("tool:") for line in log.read_text().splitlines())


async def test_a_cancel_cancels_the_run() -> None:
    async with pair(oa_agents.slow) as (requester, _):
        handle = await requester.submit("agent-e", "slow", {"prompt": "wait"})
        await oa_agents.SLOW.started.wait()
        await handle.cancel("no longer needed")
        outcome = await handle
        await oa_agents.SLOW.cancelled.wait()
    assert outcome.state is TaskState.CANCELLED


async def test_an_exception_fails_the_task_with_its_type_and_message() -> None:
    async with pair(oa_agents.broken) as (requester, _):
        outcome = await (await requester.submit("agent-e", "broken", {"prompt": "x"}))
    assert outcome.state is TaskState.FAILED
    assert outcome.error is not None and outcome.error.code == "execution_failed"
    assert outcome.error.message == "ConnectionError: the model is unreachable"


async def test_a_run_paused_on_a_question_resumes_after_a_sigkill(tmp_path: Path) -> None:
    """`synapse serve --handler oa_agents:payer` on SQLite, SIGKILLed while the approval
    waits: started again, the answer resumes the run from its saved `RunState`."""
    log = tmp_path / "calls.log"
    async with requester_of_serve(tmp_path, "oa_agents:payer") as (requester, args, port):
        env = {"FRAMEWORK_TEST_LOG": str(log)}
        with serve(*args, port=port, env=env, cwd=str(HERE)) as first:
            handle = await requester.submit("agent-e", "payer", {"prompt": "pay"})
            async for event in handle:
                if event.need_info is not None:
                    await handle.provide_info({"iban": "SE45500001"})
                if event.need_human is not None:
                    break
            first.stop(signal.SIGKILL)
        assert log.read_text().splitlines() == ["model: plan", "model: pay"]
        with serve(*args, port=port, env=env, cwd=str(HERE)):
            await handle.approve()
            outcome = await handle
    assert outcome.state is TaskState.COMPLETED, outcome
    assert outcome.result is not None and outcome.result.output == "done: paid 40 to SE45500001"
    assert log.read_text().splitlines() == [
        "model: plan",
        "model: pay",
        "tool: send_payment 40 SE45500001",
        "model: report",
    ]


def test_what_the_adapter_uses_of_the_agents_sdk_is_there() -> None:
    """An Agents SDK release that renames or drops what the adapter calls fails here, by name."""
    import inspect

    import agents
    from agents.tool_context import ToolContext

    for name in ("Agent", "RunHooks", "Runner", "RunResult", "RunState", "function_tool"):
        assert hasattr(agents, name), name
    assert {"approve", "reject", "get_interruptions", "to_string", "from_string"} <= set(
        dir(agents.RunState)
    )
    assert "rejection_message" in inspect.signature(agents.RunState.reject).parameters
    assert "needs_approval" in inspect.signature(agents.function_tool).parameters
    assert "hooks" in inspect.signature(agents.Runner.run).parameters
    assert "tool_call" in dir(ToolContext)
    assert callable(agents.Agent.clone)
