"""An OpenAI Agents SDK agent served as a Synapse peer, as it is: `Peer(handler=agent)`.

A tool with `needs_approval=True` becomes `p2p:task_need_human`; the requester (here, the
script) approves. The model below is a scripted stand-in, so this runs with no API key: give
the agent your own model instead. Run it: `python examples/openai_agent.py`. Needs the
`openai-agents` extra.
"""

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from agents import Agent, ModelResponse, Usage, function_tool, set_tracing_disabled
from agents.models.interface import Model
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from synapse import Peer

SECRET = "openai-agents-example-secret-0123456789"


class StandInModel(Model):
    """Stands in for an LLM: calls the tool once, then reports what it said."""

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        items = input if isinstance(input, list) else []
        said = [i["output"] for i in items if isinstance(i, dict) and "output" in i]
        if said:
            text = ResponseOutputText(type="output_text", text=f"Done: {said[-1]}", annotations=[])
            message = ResponseOutputMessage(
                type="message", id="m", role="assistant", status="completed", content=[text]
            )
            return ModelResponse(output=[message], usage=Usage(), response_id=None)
        call = ResponseFunctionToolCall(
            type="function_call",
            call_id="c1",
            name="refund",
            arguments=json.dumps({"order": "A-17", "euros": 25}),
        )
        return ModelResponse(output=[call], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError


@function_tool(needs_approval=True)
def refund(order: str, euros: int) -> str:
    """Refund an order."""
    return f"refunded {euros} EUR on {order}"


agent = Agent(name="support", model=StandInModel(), tools=[refund])


async def main() -> None:
    set_tracing_disabled(True)  # the stand-in model: nothing to trace to OpenAI
    executor = Peer("agent-e", port=0, handler=agent)  # task type: "support"
    requester = Peer("agent-r", port=0)
    async with executor, requester:
        executor.add_partner("agent-r", requester.endpoint, (SECRET,))
        requester.add_partner("agent-e", executor.endpoint, (SECRET,))
        handle = await requester.submit("agent-e", "support", {"prompt": "refund order A-17"})
        async for event in handle:
            if (asked := event.need_human) is not None:
                print("asked:", asked.reason.message, {o.field: o.value for o in asked.options})
                await handle.approve()
        outcome = await handle
        print(outcome.state, outcome.result.output if outcome.result else outcome.error)


if __name__ == "__main__":
    asyncio.run(main())
