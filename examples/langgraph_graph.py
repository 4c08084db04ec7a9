"""A LangGraph graph served as a Synapse peer, as it is: `Peer(handler=graph)`.

`interrupt()` inside a node becomes a question for the requester: a field asked for is
`p2p:task_need_info`, values to approve are `p2p:task_need_human`. The payload is the graph's
input state; its final state is the result. Run it: `python examples/langgraph_graph.py`.
Needs the `langgraph` extra.
"""

import asyncio
from typing import Any

from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt
from typing_extensions import TypedDict

from synapse import Peer

SECRET = "langgraph-example-secret-0123456789"


class Trip(TypedDict, total=False):
    destination: str
    dates: str
    plan: str


def ask_dates(state: Trip) -> dict[str, Any]:
    dates = interrupt({"field": "dates", "question": "when do you travel?"})
    return {"dates": dates}


def propose(state: Trip) -> dict[str, Any]:
    plan = f"train to {state['destination']}, {state['dates']}"
    approved = interrupt({"approve": {"plan": plan}, "question": "book this trip?"})
    return {"plan": approved["plan"]}


builder = StateGraph(Trip)
builder.add_node(ask_dates)
builder.add_node(propose)
builder.add_edge(START, "ask_dates")
builder.add_edge("ask_dates", "propose")
builder.add_edge("propose", END)
graph = builder.compile(name="trip_planner")


async def main() -> None:
    executor = Peer("agent-e", port=0, handler=graph)  # task type: "trip_planner"
    requester = Peer("agent-r", port=0)
    async with executor, requester:
        executor.add_partner("agent-r", requester.endpoint, (SECRET,))
        requester.add_partner("agent-e", executor.endpoint, (SECRET,))
        handle = await requester.submit("agent-e", "trip_planner", {"destination": "Lyon"})
        async for event in handle:
            if (info := event.need_info) is not None:
                print("asked for:", [f.field for f in info.missing_fields])
                await handle.provide_info({"dates": "May 3-5"})
            if (asked := event.need_human) is not None:
                print("asked:", asked.reason.message, {o.field: o.value for o in asked.options})
                await handle.approve()
        outcome = await handle
        print(outcome.state, outcome.result.output if outcome.result else outcome.error)


if __name__ == "__main__":
    asyncio.run(main())
