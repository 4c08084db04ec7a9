"""An OpenAI Agents SDK `Agent` served as a Synapse task handler (the `openai-agents` extra).

    handler = OpenAIAgentsHandler(agent)      # or Peer(..., handler=agent)
    synapse serve --handler my_agents:agent   # the same from the command line

One task type, the agent's name (`synapse.frameworks.base` has the rules shared by every
framework: input, output, questions, checkpoints). How the agent's pauses map to Synapse:

- a tool with `needs_approval` ends the run with an interruption (a `ToolApprovalItem`): it
  becomes `need_human`, one option per argument; an approval approves the call on the
  `RunState` and the run resumes; a rejection fails the task. The SDK approves a call as the
  model made it: when the person edited values, the call is rejected instead with a message
  that gives the model the person's values, so that it may call again with them (and that
  call is asked again);
- the adapter gives the agent a tool of its own, `ask_requester(field, question)`: a call
  becomes `need_info`, and the requester's value is the tool's result;
- each tool the run starts becomes progress (`task_status_update`), at most one a second;
- a Synapse cancel cancels the run; an exception that leaves the run fails the task with its
  type and message (the SDK hands a tool's own errors to the model, as it always does).

Before each question the serialized `RunState` (`to_string`) is kept with the task, and the
answers after it: a run paused on a question resumes after a restart instead of starting over.
"""

from __future__ import annotations

import contextvars
import functools
import json
from typing import Any

from agents import Agent, RunHooks, Runner, RunResult, RunState, function_tool
from agents.run_context import RunContextWrapper
from agents.tool_context import ToolContext

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

FRAMEWORK = "openai_agents"
#: The tool the adapter adds to the agent: it asks the requester for a value.
ASK_TOOL = "ask_requester"
#: The requester's answers of the run being resumed, by tool call id (read by the ask tool).
_ANSWERS: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("synapse_answers")


@function_tool(name_override=ASK_TOOL, needs_approval=True)
def _ask_tool(context: ToolContext[Any], field: str, question: str) -> str:
    """Ask the agent that gave you this task for a value you need and do not have: `field`
    names it, `question` says what you need and why."""
    call = context.tool_call
    value = _ANSWERS.get({}).get(call.call_id if call is not None else "")
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


class _ProgressHooks(RunHooks[Any]):
    def __init__(self, progress: Progress) -> None:
        self.progress = progress

    async def on_tool_start(self, context: RunContextWrapper[Any], agent: Any, tool: Any) -> None:
        if tool.name != ASK_TOOL:
            await self.progress.report(f"calling {tool.name}")


class OpenAIAgentsHandler(AgentAdapter):
    """Runs `agent` for each task of its task type (see the module's docstring)."""

    def __init__(
        self,
        agent: Agent[Any],
        *,
        task_type: str | None = None,
        description: str = "",
        context: Any = None,
        max_turns: int = 10,
        progress_interval: float = 1.0,
    ) -> None:
        self.task_type = task_type or task_type_of(agent.name, "agent")
        self.description = description or (agent.handoff_description or "")
        self.context = context
        self.max_turns = max_turns
        self.progress_interval = progress_interval
        tools: list[Any] = [*agent.tools, _ask_tool]
        self.agent: Agent[Any] = agent.clone(tools=tools)

    async def execute_task(
        self, ctx: ExecutionContext, task_type: str, payload: dict[str, Any]
    ) -> Any:
        CURRENT_TASK.set(ctx)  # a delegated task's questions come here
        hooks = _ProgressHooks(Progress(ctx, self.progress_interval))
        start: str | RunState[Any] = prompt_of(payload)
        saved = last_checkpoint(ctx, FRAMEWORK)
        if saved is not None:  # started again after a restart: resume the paused run
            state = await RunState.from_string(self.agent, saved["state"])
            answers = await resumed_answers(
                ctx, FRAMEWORK, saved, functools.partial(self._ask, ctx, state)
            )
            start = self._answered(state, answers)
        while True:
            result: RunResult = await Runner.run(
                self.agent, start, context=self.context, max_turns=self.max_turns, hooks=hooks
            )
            if not result.interruptions:
                return result_of(result.final_output)
            state = result.to_state()
            kept = state.to_string()
            answers = await pause(
                ctx, FRAMEWORK, functools.partial(self._ask, ctx, state), state=kept
            )
            start = self._answered(state, answers)

    async def _ask(self, ctx: ExecutionContext, state: RunState[Any]) -> dict[str, Any]:
        """Each interruption's answer, asked in order: {call id: {"approved": arguments} or
        {"value": value}}."""
        answers: dict[str, Any] = {}
        for item in state.get_interruptions():
            call = item.raw_item
            arguments = json.loads(getattr(call, "arguments", None) or "{}")
            call_id = str(getattr(call, "call_id", ""))
            if item.tool_name == ASK_TOOL:
                field = str(arguments.get("field") or "value")
                value = await ask_requester(ctx, field, str(arguments.get("question", "")))
                answers[call_id] = {"value": value}
            else:
                approved = await approve_call(ctx, str(item.tool_name), arguments)
                answers[call_id] = {"approved": approved, "asked": arguments}
        return answers

    def _answered(self, state: RunState[Any], answers: dict[str, Any]) -> RunState[Any]:
        """`state` with each interruption approved (or rejected with the person's edits),
        the requester's values where the ask tool will read them."""
        values = {}
        for item in state.get_interruptions():
            call_id = str(getattr(item.raw_item, "call_id", ""))
            answer = answers[call_id]
            if "value" in answer:
                values[call_id] = answer["value"]
                state.approve(item)
            elif answer["approved"] == answer["asked"]:
                state.approve(item)
            else:
                edits = json.dumps(answer["approved"], ensure_ascii=False, sort_keys=True)
                state.reject(
                    item,
                    rejection_message=(
                        f"A person approved this call with other arguments: {edits}. "
                        "Call the tool again with exactly these arguments."
                    ),
                )
        _ANSWERS.set(values)
        return state


__all__ = ["ASK_TOOL", "FRAMEWORK", "OpenAIAgentsHandler"]
