"""What every framework adapter shares: the rules that turn a Synapse task into a framework's
run and back, the two questions, progress, and the checkpoints that let a paused run survive
a restart.

- **Task type.** The agent's or graph's name, made a task type (`task_type_of`: lower case,
  runs of other characters than letters, digits and `_` become one `_`), unless given.
- **Input.** A payload `{"prompt": TEXT}` is the prompt TEXT; any other payload is its JSON
  text (`prompt_of`). A graph takes the payload as its input state, as it is.
- **Output.** A string is a `text` result; a Pydantic model, a dataclass or any JSON value is
  a `json` result (`result_of`).
- **Questions.** A tool call a person must approve becomes `need_human` (`approve_call`:
  reason code `approval_required`, one option per argument, the person may edit them); a
  value the agent asks the requester for becomes `need_info` (`ask_requester`). A rejection
  fails the task (`permission_denied`), as for a hand-written handler.
- **Checkpoints.** Before it asks, an adapter keeps what its framework needs to resume the
  run (`checkpoint`: a note in the task's audit trail, durable before the question leaves);
  after the answer, it keeps the answer too. Started again after a restart, the adapter finds
  its last checkpoint (`last_checkpoint`) and resumes from it: the run does not start over,
  and a question answered is not asked twice. Work done after the last checkpoint (model
  calls, tool calls) may run again.
"""

from __future__ import annotations

import contextvars
import dataclasses
import json
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from synapse.p2p.engine import Validation
from synapse.runtime.handler import ExecutionContext
from synapse.types import Capability, HumanContext, HumanOption, MissingField, Reason

#: The task the running adapter serves (set by each adapter's `execute_task`): the questions
#: of a task delegated from inside the run (`synapse.frameworks.delegate`) are asked of its
#: requester.
CURRENT_TASK: contextvars.ContextVar[ExecutionContext | None] = contextvars.ContextVar(
    "synapse_current_task", default=None
)
#: The audit-trail action of an adapter's checkpoint (`ExecutionContext.note`).
CHECKPOINT = "framework.checkpoint"
#: `need_human.reason.code` of a tool call waiting for a person's approval.
APPROVAL_REQUIRED = "approval_required"


#: What a prompt-taking agent's payload may hold (`prompt_of`: anything else is sent as JSON).
PROMPT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"prompt": {"type": "string", "description": "what the agent is asked"}},
}


def validate_prompt(payload: Mapping[str, Any]) -> Validation:
    """A prompt-taking agent's check before it confirms: a `prompt`, if any, is a string."""
    if "prompt" in payload and not isinstance(payload["prompt"], str):
        return Validation(
            ok=False, reason=Reason(code="invalid_params", message="prompt must be a string")
        )
    return Validation()


class AgentAdapter:
    """What every adapter shares: one task type, its capability (with the input schema),
    the prompt check (LangGraph checks its state instead), and resuming after a restart."""

    task_type: str
    description: str
    #: Offered in `capability_query`; None: no schema.
    input_schema: dict[str, Any] | None = PROMPT_SCHEMA

    def get_capabilities(self) -> list[Capability]:
        return [
            Capability(
                name=self.task_type, description=self.description, input_schema=self.input_schema
            )
        ]

    def validate_task(self, task_type: str, payload: dict[str, Any]) -> Validation:
        return validate_prompt(payload)

    def is_resumable(self, task_type: str) -> bool:
        return True  # from its last checkpoint, or from the start


def task_type_of(name: str | None, default: str) -> str:
    """ "Travel Planner" → "travel_planner"; `default` when there is no usable name."""
    slug = re.sub(r"[^a-z0-9_]+", "_", (name or "").lower()).strip("_")
    return slug or default


def prompt_of(payload: Mapping[str, Any]) -> str:
    """The prompt a payload stands for: its `prompt` when that is a string, else its JSON."""
    prompt = payload.get("prompt")
    if isinstance(prompt, str):
        return prompt
    return json.dumps(payload, ensure_ascii=False, sort_keys=True)


def result_of(output: Any) -> Any:
    """What a run produced, as a task result's value (plain JSON, or a string): Pydantic
    models (a LangChain message is one) and dataclasses become their fields, within lists
    and mappings too."""
    dump = getattr(output, "model_dump", None)
    if callable(dump) and not isinstance(output, type):  # a Pydantic model
        return dump(mode="json")
    if dataclasses.is_dataclass(output) and not isinstance(output, type):
        return result_of(dataclasses.asdict(output))
    if isinstance(output, Mapping):
        return {str(key): result_of(value) for key, value in output.items()}
    if isinstance(output, list | tuple):
        return [result_of(value) for value in output]
    return output


def last_checkpoint(ctx: ExecutionContext, framework: str) -> dict[str, Any] | None:
    """The latest checkpoint `framework`'s adapter kept with this task, or None."""
    for entry in reversed(ctx.notes):
        if entry.action == CHECKPOINT and entry.detail.get("framework") == framework:
            return dict(entry.detail)
    return None


async def checkpoint(ctx: ExecutionContext, framework: str, **state: Any) -> None:
    """Keep `state` (plain JSON) with the task, durable when this returns."""
    await ctx.note(CHECKPOINT, framework=framework, **state)


Ask = Callable[[], Awaitable[dict[str, Any]]]


async def pause(ctx: ExecutionContext, framework: str, ask: Ask, **state: Any) -> dict[str, Any]:
    """A run paused on questions: keep `state` (what resumes it), ask (`ask` returns the
    answers), keep the answers with it; the answers. Each keeping is durable before the next
    step, so that a restart finds the run where it was."""
    await checkpoint(ctx, framework, **state)
    answers = await ask()
    await checkpoint(ctx, framework, **state, answers=answers)
    return answers


async def resumed_answers(
    ctx: ExecutionContext, framework: str, saved: Mapping[str, Any], ask: Ask
) -> dict[str, Any]:
    """The answers of the checkpoint `saved` a restarted run resumes from: kept with it, or
    asked now (the question the run waited on; answered meanwhile, it is not asked again)."""
    answers = saved.get("answers")
    if answers is not None:
        return dict(answers)
    state = {k: v for k, v in saved.items() if k != "framework"}
    answers = await ask()
    await checkpoint(ctx, framework, **state, answers=answers)
    return answers


async def approve_values(
    ctx: ExecutionContext,
    proposed: Mapping[str, Any],
    *,
    message: str,
    details: Any = None,
    summary: str = "",
) -> dict[str, Any]:
    """Ask a person to approve the `proposed` values (`need_human`, one option each):
    returns them as approved (the person may have edited some). A rejection fails the task
    and cancels the caller."""
    options = [HumanOption(field=name, value=value) for name, value in proposed.items()]
    decision = await ctx.need_human(
        Reason(code=APPROVAL_REQUIRED, message=message, details=details),
        context=HumanContext(task_summary=summary) if summary else None,
        options=options or [HumanOption(field="approve", value=True)],
    )
    approved = dict(proposed)
    for name, value in decision.decision.approved_fields.items():
        if name in approved:
            approved[name] = value
    return approved


async def approve_call(
    ctx: ExecutionContext, tool: str, arguments: Mapping[str, Any], *, summary: str = ""
) -> dict[str, Any]:
    """Ask a person to approve a call of `tool`: returns its arguments as approved."""
    return await approve_values(
        ctx,
        arguments,
        message=f"the agent wants to call {tool}",
        details={"tool": tool, "arguments": dict(arguments)},
        summary=summary,
    )


async def ask_requester(
    ctx: ExecutionContext, field: str, question: str = "", suggested: Any = None
) -> Any:
    """Ask the requester for the value of `field` (`need_info`); returns it."""
    answer = await ctx.need_info(
        [MissingField(field=field, reason=question, suggested_value=suggested)],
        question=question,
    )
    return answer.get(field)


class Progress:
    """`task_status_update`s from a run's events, at most one every `interval` seconds (the
    first at once): a model streaming tokens must not flood the requester."""

    def __init__(
        self,
        ctx: ExecutionContext,
        interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ctx = ctx
        self.interval = interval
        self.clock = clock
        self._last: float | None = None
        self.sent = 0

    async def report(self, message: str, intermediate_result: Any = None) -> None:
        now = self.clock()
        if self._last is not None and now - self._last < self.interval:
            return
        self._last = now
        self.sent += 1
        await self.ctx.progress(message=message, intermediate_result=intermediate_result)


__all__ = [
    "APPROVAL_REQUIRED",
    "CHECKPOINT",
    "CURRENT_TASK",
    "PROMPT_SCHEMA",
    "AgentAdapter",
    "Progress",
    "approve_call",
    "approve_values",
    "ask_requester",
    "checkpoint",
    "last_checkpoint",
    "pause",
    "prompt_of",
    "result_of",
    "resumed_answers",
    "task_type_of",
    "validate_prompt",
]
