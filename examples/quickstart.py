"""Two peers in one process: an executor with its own TaskHandler, and a requester.

Run it: `python examples/quickstart.py` (the README shows this file).
"""

import asyncio
from typing import Any

from synapse import ExecutionContext, Peer, Validation

SECRET = "a secret the two peers share: 32 bytes or more"


class Summarizer:
    """A TaskHandler: what it offers, what it accepts, how it runs a task."""

    def get_capabilities(self) -> list[str]:
        return ["summarize"]

    def validate_task(self, task_type: str, payload: dict[str, Any]) -> Validation:
        if "text" not in payload:  # answered synchronously with task_need_info
            return Validation(missing_fields=["text"], question="What should I summarize?")
        return Validation()

    async def execute_task(
        self, ctx: ExecutionContext, task_type: str, payload: dict[str, Any]
    ) -> str:
        await ctx.progress(50, "reading")
        if "style" not in payload:  # ask during execution, and wait for the answer
            answer = await ctx.need_info(["style"], question="Which style?")
            payload = {**payload, **answer}
        return f"[{payload['style']}] {payload['text'][:40]}"  # becomes task_complete.result


async def main() -> None:
    executor = Peer("agent-e", port=0, handler=Summarizer())  # port 0: any free port
    requester = Peer("agent-r", port=0)
    async with executor, requester:  # both listen now, so each can learn the other's URL
        executor.add_partner("agent-r", requester.endpoint, (SECRET,))
        requester.add_partner("agent-e", executor.endpoint, (SECRET,))
        handle = await requester.submit("agent-e", "summarize", {})
        answers = {"text": "Synapse peers delegate tasks.", "style": "terse"}
        async for event in handle:  # every message about the task, in order
            print(event.kind, "→", event.state)
            if (asked := event.need_info) is not None:  # a p2p:task_need_info
                await handle.provide_info({f.field: answers[f.field] for f in asked.missing_fields})
        outcome = await handle
        print(outcome.state, outcome.result.output if outcome.result else outcome.error)


if __name__ == "__main__":
    asyncio.run(main())
