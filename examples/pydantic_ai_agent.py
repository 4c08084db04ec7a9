"""A Pydantic AI agent served as a Synapse peer, as it is: `Peer(handler=agent)`.

Its tool that needs a person's approval becomes `p2p:task_need_human`; the requester (here,
the script) approves. The model is Pydantic AI's offline `FunctionModel`, so this runs with no
API key: put your own model in its place. Run it: `python examples/pydantic_ai_agent.py`.
Needs the `pydantic-ai` extra.
"""

import asyncio

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from synapse import Peer

SECRET = "pydantic-ai-example-secret-0123456789"


def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Stands in for an LLM: books a table, then reports what the tool said."""
    returned = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
    if not returned:
        return ModelResponse(parts=[ToolCallPart("book_table", {"guests": 4, "time": "19:30"})])
    return ModelResponse(parts=[TextPart(f"Done: {returned[-1].content}")])


agent = Agent(FunctionModel(model), name="concierge")


@agent.tool_plain(requires_approval=True)
def book_table(guests: int, time: str) -> str:
    """Book a table at the restaurant."""
    return f"a table for {guests} at {time}"


async def main() -> None:
    executor = Peer("agent-e", port=0, handler=agent)  # task type: "concierge"
    requester = Peer("agent-r", port=0)
    async with executor, requester:
        executor.add_partner("agent-r", requester.endpoint, (SECRET,))
        requester.add_partner("agent-e", executor.endpoint, (SECRET,))
        handle = await requester.submit("agent-e", "concierge", {"prompt": "dinner for four"})
        async for event in handle:
            if (asked := event.need_human) is not None:
                print("asked:", asked.reason.message, {o.field: o.value for o in asked.options})
                await handle.approve({"time": "20:00"})  # a person changes the time
        outcome = await handle
        print(outcome.state, outcome.result.output if outcome.result else outcome.error)


if __name__ == "__main__":
    asyncio.run(main())
