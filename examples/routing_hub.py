"""A hub and its spokes in one process (docs/routing.md): run `python examples/routing_hub.py`.

Topology, every peer on 127.0.0.1 with a port the system picks:

    client ──► hub ──► writer-1   (every demo type)
                  ├──► writer-2   (every demo type, weight 2: twice the share of writer-1)
                  └──► echoer     (echo only)

The client sends tasks to the hub only; the hub routes each one to a spoke that offers its
type, passes the spokes' questions back, and fans `echo_all` out to three spokes at once.
The favourite spoke is then stopped: the next task fails over to another one.
"""

import asyncio
import logging
from typing import Any

from synapse import Peer
from synapse.demo.handler import CAPABILITIES, DemoHandler
from synapse.router import FanOutPlan, PoolConfig, Router, SubResult, SubTask
from synapse.router.pool import SynapsePartnerConfig
from synapse.types import Capability

# The router logs every failover as a warning (through `logging`, as the whole library does);
# keep this demo's output to its own prints.
logging.getLogger("synapse").setLevel(logging.ERROR)
SECRET = "hub-secret"


class EchoOnly(DemoHandler):
    def get_capabilities(self) -> list[Capability]:
        return [c for c in CAPABILITIES if c.name == "echo"]


def split(payload: dict[str, Any]) -> list[SubTask]:
    return [SubTask("echo", {"text": word}) for word in payload["text"].split()]


def combine(parts: list[SubResult]) -> str:
    return " ".join(str(p.result.output) if p.result else "?" for p in parts)


async def main() -> None:
    spokes = {
        "writer-1": Peer("writer-1", handler=DemoHandler()),
        "writer-2": Peer("writer-2", handler=DemoHandler()),
        "echoer": Peer("echoer", handler=EchoOnly()),
    }
    client = Peer("client")
    hub = Peer("hub")
    async with client, hub, spokes["writer-1"], spokes["writer-2"], spokes["echoer"]:
        hub.add_partner("client", client.endpoint, (SECRET,))
        client.add_partner("hub", hub.endpoint, (SECRET,))
        for name, spoke in spokes.items():  # each spoke its own secret: none can sign as another
            spoke.add_partner("hub", hub.endpoint, (f"{SECRET}-{name}",))
        pool = PoolConfig(
            partner=[
                SynapsePartnerConfig(
                    agent_id=name,
                    endpoint=peer.endpoint,
                    secrets=[f"{SECRET}-{name}"],
                    weight=2.0 if name == "writer-2" else 1.0,
                )
                for name, peer in spokes.items()
            ]
        )
        plans = {"echo_all": FanOutPlan(split, combine, description="echo each word apart")}
        async with Router(hub, pool, plans=plans) as router:
            offered = await client.capabilities("hub")
            print("hub offers:", ", ".join(c.name for c in offered.capabilities))

            handle = await client.submit("hub", "text_generation", {"prompt": "spring"})
            async for event in handle:
                if event.kind == "p2p:task_need_info":  # asked by the spoke, via the hub
                    await handle.provide_info({"style": "modern"})
            outcome = await handle
            print("text_generation:", outcome.state, outcome.result and outcome.result.output)

            handle = await client.submit("hub", "portrait", {"subject": "Ada"})
            async for event in handle:
                if event.kind == "p2p:task_need_human":
                    await handle.approve({"authorized": True})
            outcome = await handle
            print("portrait:", outcome.state, outcome.result and outcome.result.output)

            outcome = await (await client.submit("hub", "echo_all", {"text": "one two three"}))
            print("echo_all:", outcome.state, outcome.result and outcome.result.output)

            await spokes["writer-2"].close(drain_timeout=0)  # the favourite goes down
            outcome = await (await client.submit("hub", "slow", {"steps": 2, "delay": 0.01}))
            print("slow after an outage:", outcome.state)
            for member in router.status():
                print(f"  {member['name']}: reachable={member['reachable']}")


if __name__ == "__main__":
    asyncio.run(main())
