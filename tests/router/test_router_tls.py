"""A router whose A2A partner serves mutual TLS with a private CA: the router reads the card
and calls the agent with its peer's TLS settings (the CA, its client certificate)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import trustme
from routerkit import FAST, SECRET

from synapse.a2a import enable_a2a
from synapse.a2a.server.security import MutualTlsScheme, SecurityPolicy
from synapse.demo.handler import DemoHandler
from synapse.router import Router
from synapse.router.pool import A2APartnerConfig, PoolConfig
from synapse.runtime.runtime_base import TaskUndeliverable
from synapse.transport.partners import Partner
from synapse.transport.peer import Peer
from synapse.transport.tls import TLSConfig

sys.path.insert(0, str(Path(__file__).parent.parent / "security"))
from seckit import Pki


@pytest.mark.parametrize("hub_has_tls", [True, False], ids=["hub-tls", "hub-without-tls"])
async def test_the_router_reaches_an_a2a_agent_over_mutual_tls(
    tmp_path: Path, hub_has_tls: bool
) -> None:
    pki = Pki(trustme.CA(), tmp_path)
    cert, key = pki.issue("secure-agent", "secure-agent")
    agent = Peer(
        "secure-agent",
        handler=DemoHandler(),
        config=FAST,
        tls=TLSConfig(cert=cert, key=key, client_ca=pki.ca_file),
    )
    enable_a2a(agent, security=SecurityPolicy({"mtls": MutualTlsScheme({"hub": "hub"})}))
    hub_cert, hub_key = pki.issue("hub", "hub")
    hub_tls = TLSConfig(ca=pki.ca_file, client_cert=hub_cert, client_key=hub_key)
    async with agent, Peer("client", config=FAST) as client:
        hub = Peer(
            "hub",
            config=FAST,
            partners=[Partner("client", client.endpoint, (SECRET,))],
            tls=hub_tls if hub_has_tls else None,
        )
        pool = PoolConfig(
            a2a=[A2APartnerConfig(name="secure-agent", url=f"https://127.0.0.1:{agent.port}")]
        )
        async with hub, Router(hub, pool) as router:
            client.add_partner("hub", hub.endpoint, (SECRET,))
            offers = {m["name"]: m for m in router.status()}
            if not hub_has_tls:
                # Without our CA and certificate the agent cannot be reached: the hub,
                # reaching none of its pool, takes no task (503 agent_not_ready, which a
                # requester retries), rather than refusing the type for good.
                assert offers["secure-agent"]["reachable"] is False
                handle = await client.submit("hub", "echo", {"text": "x"})
                with pytest.raises(TaskUndeliverable, match="HTTP 503"):
                    await handle.result(timeout=10)
                return
            handle = await client.submit("hub", "echo", {"text": "over mtls"})
            outcome = await handle.result(timeout=10)
            assert outcome.ok, (outcome, offers)
            assert outcome.result is not None and outcome.result.output == "over mtls"
