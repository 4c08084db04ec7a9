"""The other direction: a framework's agent calls a Synapse partner as one of its tools.

    delegate_to_writer = delegate(peer, "agent-w", "text_generation")
    agent = Agent(model, tools=[delegate_to_writer])          # Pydantic AI
    agent = Agent(name="…", tools=[function_tool(delegate_to_writer)])   # OpenAI Agents SDK
    result = await delegate_to_writer({"prompt": "…"})         # from a LangGraph node

`delegate` returns a plain async function of one argument, the task's payload (a JSON
object), which every framework takes as a tool. Awaited, it requests the task from the partner
through `peer` and returns the partner's result (`output`). The partner's questions go where
questions of the calling agent go: when the agent runs as a Synapse handler (served by one of
the adapters of this package), a partner's `need_info` or `need_human` is asked again of that
task's own requester, with the same fields, reason and options, and the answer is passed back
(a person, the calling agent's caller or its people answer it); a rejection fails both tasks.
Outside a Synapse handler nobody can answer, and the sub-task is cancelled. A task that does
not complete raises `DelegationFailed`, which the framework hands to its model (or fails
the run with), as for any tool error.

A sub-task waiting on a question does not survive a restart of the calling agent: the
restarted run may delegate again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from synapse.frameworks.base import CURRENT_TASK
from synapse.runtime.runtime_base import TaskHandle
from synapse.types.errors import SynapseException


class Submits(Protocol):
    """What `delegate` needs of a peer (`synapse.Peer` is one)."""

    async def submit(self, partner: str, task_type: str, payload: dict[str, Any]) -> TaskHandle: ...


class DelegationFailed(SynapseException):
    """The partner's task did not complete (rejected, failed, cancelled, or nobody could
    answer its question)."""


def delegate(
    peer: Submits, partner: str, task_type: str, *, name: str | None = None, description: str = ""
) -> Callable[[dict[str, Any]], Awaitable[Any]]:
    """A tool that asks `partner` for a `task_type` task (see the module's docstring)."""

    async def call(payload: dict[str, Any]) -> Any:
        handle = await peer.submit(partner, task_type, dict(payload))
        try:
            await _relay_questions(handle, partner)
        except asyncio.CancelledError:
            await asyncio.shield(handle.cancel("the calling task ended"))
            raise
        outcome = await handle
        if outcome.ok and outcome.result is not None:
            return outcome.result.output
        why = outcome.error.message if outcome.error else outcome.state.value
        if outcome.reject is not None:
            why = outcome.reject.reason.message or outcome.reject.reason.code
        raise DelegationFailed(f"{partner} did not complete the {task_type} task: {why}")

    call.__name__ = name or task_type
    call.__qualname__ = call.__name__
    call.__doc__ = description or (
        f"Ask the agent {partner} to do a {task_type} task. `payload` is the task's input, a "
        "JSON object; returns the task's result."
    )
    return call


async def _relay_questions(handle: TaskHandle, partner: str) -> None:
    """Ask each of the partner's questions of the calling task's requester, and answer it."""
    async for event in handle:
        info, human = event.need_info, event.need_human
        if info is None and human is None:
            continue
        outer = CURRENT_TASK.get()
        if outer is None:
            await handle.cancel("nobody here can answer the partner's question")
            raise DelegationFailed(f"{partner} asked a question and nobody here can answer it")
        if info is not None:
            fields = await outer.need_info(
                info.missing_fields, question=info.question, required_by=info.required_by
            )
            await handle.provide_info(fields)
        elif human is not None:
            decision = await outer.need_human(
                human.reason, context=human.context, options=human.options
            )
            await handle.approve(decision.decision.approved_fields, notes=decision.notes)


__all__ = ["CURRENT_TASK", "DelegationFailed", "Submits", "delegate"]
