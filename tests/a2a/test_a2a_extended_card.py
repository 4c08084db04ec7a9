"""A distinct extended card (`enable_a2a(extended_card=...)`): what an authenticated caller
sees beyond the public card, per principal and scope, on every binding, with Synapse's
client and the official SDK's; signed as the public card is; refused without credentials.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest
from a2a.client import ClientCallContext
from a2a.types.a2a_pb2 import GetExtendedAgentCardRequest
from a2akit import GRPC_PRESENT, SDK_BINDINGS, fast_config, open_sdk_client
from joserfc.jwk import ECKey

from synapse.a2a import A2AClient, CallerIdentity, SecurityPolicy, enable_a2a, wire
from synapse.a2a.card_signing import CardSigner, CardVerifier
from synapse.a2a.server.security import ApiKeyScheme
from synapse.demo.handler import DemoHandler
from synapse.transport.peer import Peer

KEYS = {"key-alice": "alice", "key-bob": "bob"}
AUDIT = wire.AgentSkill(id="audit", name="Audit", description="Reads every task's audit trail")
MEMBERS = wire.AgentSkill(id="members", name="Members", description="What members may ask")


def extend(card: wire.AgentCard, caller: CallerIdentity) -> wire.AgentCard:
    """Every authenticated caller sees the members' skill; alice sees the audit skill too."""
    card.skills.append(MEMBERS)
    if caller.principal == "alice":
        card.skills.append(AUDIT)
    card.description = f"{card.description} (as seen by {caller.principal})".strip()
    return card


@dataclass
class Served:
    base: str
    grpc_address: str | None
    signer: CardSigner


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    signer = CardSigner(ECKey.generate_key("P-256", {"kid": "card-key"}))
    peer = Peer("agent-x", handler=DemoHandler(), config=fast_config())
    server = enable_a2a(
        peer,
        security=SecurityPolicy({"apiKey": ApiKeyScheme(KEYS, name="X-API-Key")}),
        extended_card=extend,
        card_signer=signer,
        grpc_port=0 if GRPC_PRESENT else None,
    )
    await peer.start()
    try:
        grpc_address = f"127.0.0.1:{server.grpc.port}" if server.grpc is not None else None
        yield Served(f"http://127.0.0.1:{peer.port}", grpc_address, signer)
    finally:
        await peer.close(drain_timeout=0.1)


def skill_ids(card: wire.AgentCard) -> list[str]:
    return [skill.id for skill in card.skills]


@pytest.mark.parametrize("binding", SDK_BINDINGS)
async def test_each_caller_sees_its_extended_card_on_every_binding(
    served: Served, binding: str
) -> None:
    verifier = CardVerifier(keys=[served.signer.public_jwk])
    async with A2AClient(served.base) as anonymous_view:
        public = await anonymous_view.discover()
    assert public.capabilities.extended_agent_card is True
    assert "audit" not in skill_ids(public) and "members" not in skill_ids(public)
    seen: dict[str, list[str]] = {}
    for key, principal in KEYS.items():
        async with A2AClient(
            served.base,
            headers={"X-API-Key": key},
            bindings=[binding],
            card_verifier=verifier,
            require_signed_card=True,
        ) as client:
            card = await client.get_extended_card()  # its signature checked
        seen[principal] = skill_ids(card)
        assert card.description.endswith(f"(as seen by {principal})")
    assert seen["alice"] == [*skill_ids(public), "members", "audit"]
    assert seen["bob"] == [*skill_ids(public), "members"]


async def test_without_credentials_the_extended_card_is_refused(served: Served) -> None:
    request = {"jsonrpc": "2.0", "id": "1", "method": "GetExtendedAgentCard", "params": {}}
    async with httpx.AsyncClient(timeout=10) as http:
        refused = await http.post(
            f"{served.base}/a2a", json=request, headers={"A2A-Version": "1.0"}
        )
        assert refused.status_code == 401
        rest = await http.get(
            f"{served.base}/a2a/extendedAgentCard", headers={"A2A-Version": "1.0"}
        )
        assert rest.status_code == 401
        public = await http.get(f"{served.base}/.well-known/agent-card.json")
    assert "audit" not in [skill["id"] for skill in public.json()["skills"]]


@pytest.mark.parametrize("binding", SDK_BINDINGS)
async def test_the_official_sdk_reads_the_extended_card(served: Served, binding: str) -> None:
    async with httpx.AsyncClient(timeout=10) as http:
        client = await open_sdk_client(served.base, binding, http)
        try:
            context = ClientCallContext(service_parameters={"X-API-Key": "key-alice"})
            card = await client.get_extended_agent_card(
                GetExtendedAgentCardRequest(), context=context
            )
        finally:
            await client.close()
    assert [skill.id for skill in card.skills][-2:] == ["members", "audit"]
    assert card.description.endswith("(as seen by alice)")
    assert card.signatures  # signed, as the public card is


async def test_a_security_policy_alone_serves_the_public_card_and_no_policy_refuses() -> None:
    guarded = Peer("agent-g", handler=DemoHandler(), config=fast_config())
    enable_a2a(guarded, tokens={"tok": "carol"})
    open_peer = Peer("agent-o", handler=DemoHandler(), config=fast_config())
    enable_a2a(open_peer)
    async with guarded, open_peer:
        async with A2AClient(f"http://127.0.0.1:{guarded.port}", token="tok") as client:
            card = await client.get_extended_card()
            assert skill_ids(card) == skill_ids(await client.discover())
        async with A2AClient(f"http://127.0.0.1:{open_peer.port}") as client:
            assert (await client.discover()).capabilities.extended_agent_card is False
            with pytest.raises(Exception, match="extended"):
                await client.get_extended_card()


async def test_an_extended_card_without_a_security_policy_is_served_to_anyone() -> None:
    """An operator may offer more to every caller without authentication (it is still a
    distinct card): the caller is `anonymous`."""
    peer = Peer("agent-n", handler=DemoHandler(), config=fast_config())
    enable_a2a(peer, extended_card=extend)
    async with peer, A2AClient(f"http://127.0.0.1:{peer.port}") as client:
        public = await client.discover()
        assert public.capabilities.extended_agent_card is True
        card = await client.get_extended_card()
    assert skill_ids(card) == [*skill_ids(public), "members"]
    assert card.description.endswith("(as seen by anonymous)")
