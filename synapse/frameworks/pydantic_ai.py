"""A Pydantic AI `Agent` served as a Synapse task handler (the `pydantic-ai` extra).

    handler = PydanticAIHandler(agent)        # or Peer(..., handler=agent)
    synapse serve --handler my_agents:agent   # the same from the command line

One task type, the agent's name (`synapse.frameworks.base` has the rules shared by every
framework: input, output, questions, checkpoints). How the agent's pauses map to Synapse:

- a tool marked `requires_approval=True` (or raising `ApprovalRequired`) ends the run with a
  deferred approval: it becomes `need_human`, one option per argument; the decision resumes
  the run with `DeferredToolResults` (`ToolApproved`, with the person's edits as
  `override_args`); a rejection fails the task;
- the adapter gives the agent a tool of its own, `ask_requester(field, question)`: a call
  ends the run with a deferred call, which becomes `need_info`, and the requester's value is
  the tool's result. A tool of the agent that defers its call (`CallDeferred`, an external
  tool) is asked the same way, the tool's name as the field;
- each tool call the model makes becomes progress (`task_status_update`), at most one a
  second;
- a Synapse cancel cancels the run; an exception fails the task with its type and message.

Before each question the message history (`ModelMessagesTypeAdapter`) and the pending calls are
kept with the task, and the answers after it: a run paused on a question resumes after a
restart instead of starting over.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

from pydantic_ai import (
    Agent,
    AgentRun,
    AgentRunResult,
    CallDeferred,
    DeferredToolRequests,
    DeferredToolResults,
    FunctionToolset,
    ToolApproved,
)
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ToolCallPart

from synapse.frameworks.base import (
    CURRENT_TASK,
    AgentAdapter,
    Progress,
    approve_call,
    ask_requester,
    last_checkpoint,
    pause,
    prompt_of,
    result_of,
    resumed_answers,
    task_type_of,
)
from synapse.runtime.handler import ExecutionContext

FRAMEWORK = "pydantic_ai"
#: The tool the adapter adds to every run: the agent asks its requester for a value.
ASK_TOOL = "ask_requester"


def _asking_toolset() -> FunctionToolset[Any]:
    toolset: FunctionToolset[Any] = FunctionToolset()

    @toolset.tool_plain(name=ASK_TOOL)
    def ask(field: str, question: str) -> str:
        """Ask the agent that gave you this task for a value you need and do not have:
        `field` names it, `question` says what you need and why."""
        raise CallDeferred

    return toolset


class PydanticAIHandler(AgentAdapter):
    """Runs `agent` for each task of its task type (see the module's docstring)."""

    def __init__(
        self,
        agent: Agent[Any, Any],
        *,
        task_type: str | None = None,
        description: str = "",
        deps: Any = None,
        progress_interval: float = 1.0,
    ) -> None:
        self.agent = agent
        self.task_type = task_type or task_type_of(agent.name, "agent")
        self.description = description or (agent.description or "")
        self.deps = deps
        self.progress_interval = progress_interval
        self._toolset = _asking_toolset()
        output = agent.output_type
        outputs = (
            list(output)
            if isinstance(output, Sequence) and not isinstance(output, str)
            else [output]
        )
        self._output_type = (
            outputs if DeferredToolRequests in outputs else [*outputs, DeferredToolRequests]
        )

    async def execute_task(
        self, ctx: ExecutionContext, task_type: str, payload: dict[str, Any]
    ) -> Any:
        CURRENT_TASK.set(ctx)  # a delegated task's questions come here
        progress = Progress(ctx, self.progress_interval)
        prompt: str | None = prompt_of(payload)
        history: list[ModelMessage] | None = None
        results: DeferredToolResults | None = None
        saved = last_checkpoint(ctx, FRAMEWORK)
        if saved is not None:  # started again after a restart: resume the paused run
            prompt = None
            history = ModelMessagesTypeAdapter.validate_python(saved["history"])
            pending = saved["pending"]
            answers = await resumed_answers(
                ctx, FRAMEWORK, saved, functools.partial(self._ask, ctx, pending)
            )
            results = _results(answers)
        while True:
            run = await self._run(prompt, history, results, progress)
            output = run.output
            if not isinstance(output, DeferredToolRequests):
                return result_of(output)
            history = run.all_messages()
            kept = ModelMessagesTypeAdapter.dump_python(history, mode="json")
            pending = _pending(output)
            answers = await pause(
                ctx,
                FRAMEWORK,
                functools.partial(self._ask, ctx, pending),
                history=kept,
                pending=pending,
            )
            prompt, results = None, _results(answers)

    async def _run(
        self,
        prompt: str | None,
        history: list[ModelMessage] | None,
        results: DeferredToolResults | None,
        progress: Progress,
    ) -> AgentRunResult[Any]:
        """One run to its end or its next pause, node by node: each tool call the model
        makes is progress (a model need not stream for it)."""
        running: AbstractAsyncContextManager[AgentRun[Any, Any]] = self.agent.iter(
            prompt,
            output_type=self._output_type,
            message_history=history,
            deferred_tool_results=results,
            deps=self.deps,
            toolsets=[self._toolset],
        )
        async with running as run:
            async for node in run:
                if Agent.is_call_tools_node(node):
                    for part in node.model_response.parts:
                        if isinstance(part, ToolCallPart) and part.tool_name != ASK_TOOL:
                            await progress.report(f"calling {part.tool_name}")
        result = run.result
        if result is None:  # the graph ended without an end node: not a run that finished
            raise RuntimeError("the agent run ended without a result")
        return result

    async def _ask(self, ctx: ExecutionContext, pending: list[dict[str, Any]]) -> dict[str, Any]:
        """Each pending call's answer, asked in order: {call id: {"approved": args} or
        {"value": value}}."""
        answers: dict[str, Any] = {}
        for call in pending:
            tool, args = call["tool"], call["args"]
            if call["kind"] == "approval":
                answers[call["id"]] = {"approved": await approve_call(ctx, tool, args)}
            elif tool == ASK_TOOL:
                field = str(args.get("field") or "value")
                answers[call["id"]] = {
                    "value": await ask_requester(ctx, field, str(args.get("question", "")))
                }
            else:  # the agent's own external tool: its result is the requester's to give
                answers[call["id"]] = {
                    "value": await ask_requester(ctx, tool, f"the result of {tool}({args})")
                }
        return answers


def _pending(requests: DeferredToolRequests) -> list[dict[str, Any]]:
    return [
        {"kind": kind, "id": call.tool_call_id, "tool": call.tool_name, "args": call.args_as_dict()}
        for kind, calls in (("approval", requests.approvals), ("call", requests.calls))
        for call in calls
    ]


def _results(answers: dict[str, Any]) -> DeferredToolResults:
    results = DeferredToolResults()
    for call_id, answer in answers.items():
        if "approved" in answer:
            results.approvals[call_id] = ToolApproved(override_args=answer["approved"])
        else:
            results.calls[call_id] = answer["value"]
    return results


__all__ = ["ASK_TOOL", "FRAMEWORK", "PydanticAIHandler"]
