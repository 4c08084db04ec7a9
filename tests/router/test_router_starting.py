"""A router that cannot reach its pool yet takes no task: 503 `agent_not_ready`, which a
requester retries, and not `capability_lacking`, which it takes as final (the simulation
with a router found it: a hub whose first refreshes were lost on the network refused every
task of the next minute for a type its spokes did offer)."""

from __future__ import annotations

import socket

import pytest
from routerkit import FAST, SECRET, secret_of, spoke_partner, until

from synapse.demo.handler import DemoHandler
from synapse.router import PoolConfig, Router
from synapse.router.pool import SynapsePartnerConfig
from synapse.runtime.runtime_base import TaskUndeliverable
from synapse.transport.partners import Partner
from synapse.transport.peer import Peer
from synapse.types import TaskState


def reserved_port() -> socket.socket:
    """A bound, not listening, socket: its port refuses connections until the spoke takes it."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


async def test_a_router_reaching_none_of_its_pool_answers_not_ready_then_routes() -> None:
    held = reserved_port()
    port = held.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}/synapse/callback"
    pool = PoolConfig(
        partner=[SynapsePartnerConfig("spoke", endpoint, [secret_of("spoke")])],
        refresh_interval=0.2,
    )
    async with Peer("client", config=FAST) as client:
        hub = Peer("hub", config=FAST, partners=[Partner("client", client.endpoint, (SECRET,))])
        async with hub, Router(hub, pool) as router:
            client.add_partner("hub", hub.endpoint, (SECRET,))
            assert router.status()[0]["reachable"] is False
            handle = await client.submit("hub", "echo", {"text": "too early"})
            with pytest.raises(TaskUndeliverable, match="HTTP 503"):
                await handle.result(timeout=10)
            held.close()
            spoke = Peer("spoke", handler=DemoHandler(), config=FAST, port=port, partners=[])
            async with spoke:
                spoke.add_partner("hub", hub.endpoint, spoke_partner(hub, "spoke").secrets)
                await until(lambda: hub.protocol.ready, "the hub ready once it reached the spoke")
                handle = await client.submit("hub", "echo", {"text": "now"})
                outcome = await handle.result(timeout=10)
                assert outcome.state is TaskState.COMPLETED, outcome
