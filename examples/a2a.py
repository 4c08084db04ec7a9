"""The same handler, served to A2A v1.0 clients, and called with Synapse's A2A client.

A Synapse peer serves its task types over A2A (JSON-RPC and HTTP+JSON) beside its Synapse
callback URL; an `A2AClient` discovers its agent card, sends a task, answers the question the
handler asks (A2A's INPUT_REQUIRED) and reads the result. Run it: `python examples/a2a.py`.
"""

import asyncio
from typing import Any

from synapse import ExecutionContext, Peer, Validation
from synapse.a2a import A2AClient, enable_a2a


class Greeter:
    def get_capabilities(self) -> list[str]:
        return ["greet"]

    def validate_task(self, task_type: str, payload: dict[str, Any]) -> Validation:
        return Validation()

    async def execute_task(
        self, ctx: ExecutionContext, task_type: str, payload: dict[str, Any]
    ) -> str:
        if "name" not in payload:
            payload = {**payload, **await ctx.need_info(["name"], question="Whom to greet?")}
        return f"Hello, {payload['name']}!"


async def main() -> None:
    peer = Peer("greeter", port=0, handler=Greeter())
    enable_a2a(peer, default_task_type="greet", tokens={"a-token-for-the-example": "alice"})
    async with peer:
        base = peer.endpoint.removesuffix("/synapse/callback")
        async with A2AClient(base, token="a-token-for-the-example") as client:
            handle = await client.send({}, task_type="greet")
            async for event in handle:
                print(event.kind, "→", event.state)
                if event.input_required:
                    await handle.provide_info({"name": "Ada"})
            outcome = await handle
            print(outcome.state, outcome.result)


if __name__ == "__main__":
    asyncio.run(main())
