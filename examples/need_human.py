"""A task that stops for a person's decision (`p2p:task_need_human`), approved by the requester.

The executor's handler asks before it publishes; the requester's person (here, the script)
approves with the value it may change. Run it: `python examples/need_human.py`.
"""

import asyncio
from typing import Any

from synapse import ExecutionContext, HumanOption, Peer, Reason, Validation

SECRET = "need-human-example-secret-0123456789"


class Publisher:
    """Publishes a post, but only once a person said yes to its title."""

    def get_capabilities(self) -> list[str]:
        return ["publish"]

    def validate_task(self, task_type: str, payload: dict[str, Any]) -> Validation:
        return Validation()

    async def execute_task(
        self, ctx: ExecutionContext, task_type: str, payload: dict[str, Any]
    ) -> str:
        decision = await ctx.need_human(  # waits; a rejection fails the task
            Reason(code="ethical_decision", message="a post goes out under your name"),
            options=[HumanOption(field="title", value=payload["title"], confidence=80)],
        )
        title = decision.decision.approved_fields.get("title", payload["title"])
        return f"published: {title}"


async def main() -> None:
    executor = Peer("agent-e", port=0, handler=Publisher())
    requester = Peer("agent-r", port=0)
    async with executor, requester:
        executor.add_partner("agent-r", requester.endpoint, (SECRET,))
        requester.add_partner("agent-e", executor.endpoint, (SECRET,))
        handle = await requester.submit("agent-e", "publish", {"title": "Sprng is here"})
        async for event in handle:
            print(event.kind, "→", event.state)
            if (asked := event.need_human) is not None:
                print("  asked:", asked.reason.message, [o.value for o in asked.options])
                await handle.start_deciding()  # a person took it up (human_deciding)
                await handle.approve({"title": "Spring is here"}, notes="typo fixed")
        outcome = await handle
        print(outcome.state, outcome.result.output if outcome.result else outcome.error)


if __name__ == "__main__":
    asyncio.run(main())
