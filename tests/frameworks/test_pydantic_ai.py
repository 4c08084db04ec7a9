"""A Pydantic AI `Agent` served as a Synapse handler, as it is (`Peer(handler=agent)`), between
two real peers over loopback HTTP, on the framework's own offline models."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pai_agents
import pytest
from fwkit import HERE, pair, requester_of_serve, serve

from synapse.frameworks import as_handler, framework_of
from synapse.frameworks.base import APPROVAL_REQUIRED
from synapse.frameworks.pydantic_ai import ASK_TOOL, PydanticAIHandler
from synapse.types import MessageType, TaskState


def test_an_agent_is_recognized_and_named_by_its_task_type() -> None:
    assert framework_of(pai_agents.echo) == "pydantic_ai"
    handler = as_handler(pai_agents.echo)
    assert isinstance(handler, PydanticAIHandler)
    assert handler.task_type == "echo_agent"  # "Echo Agent"
    assert as_handler(pai_agents.echo, task_type="say").get_capabilities()[0].name == "say"
    with pytest.raises(TypeError, match="neither a TaskHandler nor an agent"):
        as_handler(object())


async def test_a_prompt_in_text_out() -> None:
    async with pair(pai_agents.echo) as (requester, _):
        outcome = await (await requester.submit("agent-e", "echo_agent", {"prompt": "hi"}))
    assert outcome.state is TaskState.COMPLETED
    assert outcome.result is not None
    assert (outcome.result.output_type, outcome.result.output) == ("text", "echo: hi")


async def test_any_other_payload_is_sent_as_its_json_text() -> None:
    async with pair(pai_agents.echo) as (requester, _):
        outcome = await (await requester.submit("agent-e", "echo_agent", {"b": 2, "a": "x"}))
    assert outcome.result is not None
    assert outcome.result.output == 'echo: {"a": "x", "b": 2}'


async def test_structured_output_is_a_json_result() -> None:
    async with pair(pai_agents.weather) as (requester, _):
        outcome = await (await requester.submit("agent-e", "weather", {"prompt": "Paris?"}))
    assert outcome.result is not None
    assert (outcome.result.output_type, outcome.result.output) == (
        "json",
        {"city": "Paris", "celsius": 21},
    )


async def test_capabilities_offer_the_input_schema_and_a_bad_prompt_is_refused() -> None:
    async with pair(pai_agents.echo) as (requester, _):
        answer = await requester.capabilities("agent-e")
        [capability] = answer.capabilities
        assert capability.name == "echo_agent"
        assert capability.input_schema is not None
        assert capability.input_schema["properties"]["prompt"]["type"] == "string"
        outcome = await (await requester.submit("agent-e", "echo_agent", {"prompt": 3}))
    assert outcome.state is TaskState.REJECTED
    assert outcome.reject is not None and outcome.reject.reason.code == "invalid_params"


async def test_the_agent_asks_the_requester_then_a_person_approves_an_edited_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "calls.log"
    monkeypatch.setenv("FRAMEWORK_TEST_LOG", str(log))
    kinds: list[str] = []
    async with pair(pai_agents.payer) as (requester, _):
        handle = await requester.submit("agent-e", "payer", {"prompt": "pay Bob"})
        async for event in handle:
            kinds.append(event.kind)
            if (info := event.need_info) is not None:
                [missing] = info.missing_fields
                assert (missing.field, missing.reason) == (
                    "iban",
                    "which account should the money go to?",
                )
                await handle.provide_info({"iban": "FR7612345"})
            if (asked := event.need_human) is not None:
                assert asked.reason.code == APPROVAL_REQUIRED
                assert asked.reason.details == {
                    "tool": "send_payment",
                    "arguments": {"amount": 40, "to": "FR7612345"},
                }
                assert {o.field: o.value for o in asked.options} == {
                    "amount": 40,
                    "to": "FR7612345",
                }
                await handle.approve({"amount": 35})  # the person lowers the amount
        outcome = await handle
    assert outcome.result is not None
    assert outcome.result.output == "done: paid 35 to FR7612345"
    assert kinds.index(MessageType.TASK_NEED_INFO.value) < kinds.index(
        MessageType.TASK_NEED_HUMAN.value
    )
    # The tool ran once, with the person's amount; the run went on from each answer.
    assert log.read_text().splitlines() == [
        "model: plan",
        "model: pay",
        "tool: send_payment 35 FR7612345",
        "model: report",
    ]


async def test_a_tool_call_becomes_progress() -> None:
    messages: list[str] = []
    async with pair(pai_agents.payer) as (requester, _):
        handle = await requester.submit("agent-e", "payer", {"prompt": "pay"})
        async for event in handle:
            if (update := event.status_update) is not None and update.message:
                messages.append(update.message)
            if event.need_info is not None:
                await handle.provide_info({"iban": "X1"})
            if event.need_human is not None:
                await handle.approve()
        assert (await handle).state is TaskState.COMPLETED
    assert "calling send_payment" in messages
    assert f"calling {ASK_TOOL}" not in messages  # a question is not progress


async def test_a_rejected_call_fails_the_task_and_never_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "calls.log"
    monkeypatch.setenv("FRAMEWORK_TEST_LOG", str(log))
    async with pair(pai_agents.payer) as (requester, _):
        handle = await requester.submit("agent-e", "payer", {"prompt": "pay"})
        async for event in handle:
            if event.need_info is not None:
                await handle.provide_info({"iban": "X1"})
            if event.need_human is not None:
                await handle.reject("not this month")
        outcome = await handle
    assert outcome.state is TaskState.FAILED
    assert outcome.error is not None and outcome.error.code == "permission_denied"
    assert not any(line.startswith("tool:") for line in log.read_text().splitlines())


async def test_a_cancel_cancels_the_run() -> None:
    async with pair(pai_agents.slow) as (requester, _):
        handle = await requester.submit("agent-e", "slow", {"prompt": "wait"})
        await pai_agents.SLOW.started.wait()
        await handle.cancel("no longer needed")
        outcome = await handle
        await pai_agents.SLOW.cancelled.wait()  # the tool's coroutine was cancelled
    assert outcome.state is TaskState.CANCELLED


async def test_an_exception_fails_the_task_with_its_type_and_message() -> None:
    async with pair(pai_agents.broken) as (requester, _):
        outcome = await (await requester.submit("agent-e", "broken", {"prompt": "look"}))
    assert outcome.state is TaskState.FAILED
    assert outcome.error is not None
    assert outcome.error.code == "execution_failed"
    assert outcome.error.message == "LookupError: no such account: nobody"


def test_what_the_adapter_uses_of_pydantic_ai_is_there() -> None:
    """A Pydantic AI release that renames or drops what the adapter calls fails here, by
    name, before any flow does."""
    import inspect

    import pydantic_ai
    from pydantic_ai.messages import ModelMessagesTypeAdapter

    for name in (
        "Agent",
        "AgentRunResult",
        "CallDeferred",
        "DeferredToolRequests",
        "DeferredToolResults",
        "FunctionToolset",
        "ToolApproved",
    ):
        assert hasattr(pydantic_ai, name), name
    run = inspect.signature(pydantic_ai.Agent.iter).parameters
    for parameter in (
        "output_type",
        "message_history",
        "deferred_tool_results",
        "deps",
        "toolsets",
    ):
        assert parameter in run, parameter
    assert "override_args" in inspect.signature(pydantic_ai.ToolApproved).parameters
    assert callable(pydantic_ai.Agent.is_call_tools_node)
    requests: Any = pydantic_ai.DeferredToolRequests()
    assert requests.approvals == [] and requests.calls == []
    assert ModelMessagesTypeAdapter.validate_python([]) == []


async def test_a_run_paused_on_a_question_resumes_after_a_sigkill(tmp_path: Path) -> None:
    """`synapse serve --handler pai_agents:payer` on SQLite, SIGKILLed while a person's
    approval waits: started again, the answer resumes the run from its checkpoint. The model
    is not called again for the steps before the pause, the question already answered is not
    asked again, and the tool runs once, with the person's edit."""
    log = tmp_path / "calls.log"
    async with requester_of_serve(tmp_path, "pai_agents:payer") as (requester, args, port):
        env = {"FRAMEWORK_TEST_LOG": str(log)}
        with serve(*args, port=port, env=env, cwd=str(HERE)) as first:
            handle = await requester.submit("agent-e", "payer", {"prompt": "pay"})
            async for event in handle:
                if event.need_info is not None:
                    await handle.provide_info({"iban": "FR7600001"})
                if event.need_human is not None:
                    break
            first.stop(signal.SIGKILL)
        assert log.read_text().splitlines() == ["model: plan", "model: pay"]
        with serve(*args, port=port, env=env, cwd=str(HERE)):
            await handle.approve({"amount": 30})
            outcome = await handle
    assert outcome.state is TaskState.COMPLETED, outcome
    assert outcome.result is not None
    assert outcome.result.output == "done: paid 30 to FR7600001"
    assert log.read_text().splitlines() == [
        "model: plan",
        "model: pay",
        "tool: send_payment 30 FR7600001",
        "model: report",
    ]


async def test_progress_is_throttled_to_one_update_an_interval() -> None:
    """The sans-IO part of progress: with a fake clock, events closer than the interval are
    dropped, the first is sent at once."""
    from synapse.frameworks.base import Progress

    sent: list[str] = []

    class Context:
        async def progress(self, *, message: str, intermediate_result: object = None) -> None:
            sent.append(message)

    now = [100.0]
    progress = Progress(Context(), interval=1.0, clock=lambda: now[0])  # type: ignore[arg-type]
    for at, message in [(100.0, "a"), (100.5, "b"), (101.0, "c"), (101.2, "d"), (103.0, "e")]:
        now[0] = at
        await progress.report(message)
    assert sent == ["a", "c", "e"]
    assert progress.sent == 3
