"""The requester cancels a running task (`p2p:task_cancel`); the handler stops where it is.

Run it: `python examples/cancel.py`.
"""

import asyncio
from typing import Any

from synapse import ExecutionContext, Peer, Validation

SECRET = "cancel-example-secret-0123456789abcdef"


class Counter:
    """Counts slowly, reporting each step, until it is told to stop."""

    def get_capabilities(self) -> list[str]:
        return ["count"]

    def validate_task(self, task_type: str, payload: dict[str, Any]) -> Validation:
        return Validation()

    async def execute_task(
        self, ctx: ExecutionContext, task_type: str, payload: dict[str, Any]
    ) -> str:
        steps = int(payload["to"])
        for step in range(1, steps + 1):
            await ctx.progress(100 * step / steps, f"step {step}/{steps}")
            await asyncio.sleep(0.2)  # a cancel stops the handler here (CancelledError)
        return f"counted to {steps}"


async def main() -> None:
    executor = Peer("agent-e", port=0, handler=Counter())
    requester = Peer("agent-r", port=0)
    async with executor, requester:
        executor.add_partner("agent-r", requester.endpoint, (SECRET,))
        requester.add_partner("agent-e", executor.endpoint, (SECRET,))
        handle = await requester.submit("agent-e", "count", {"to": 50})
        async for event in handle:
            print(event.kind, "→", event.state)
            update = event.status_update
            if update is not None and update.progress is not None and update.progress >= 4:
                await handle.cancel("no longer needed")  # acknowledged with task_ack
        outcome = await handle
        print(outcome.state)


if __name__ == "__main__":
    asyncio.run(main())
