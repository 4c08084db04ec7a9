"""Signed agent cards: our server signs, our client verifies (pinned keys or a JWKS URL) and
refuses forged or unsigned cards when told to; signatures interoperate with the SDK's."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from joserfc.jwk import ECKey, KeySet, OKPKey, RSAKey

from synapse.a2a import A2AClient, CardSignatureError, CardSigner, CardVerifier, enable_a2a
from synapse.a2a.card_signing import canonical_card, load_key
from synapse.demo.handler import DemoHandler
from synapse.transport.peer import Peer


@pytest.fixture
def signing_key() -> ECKey:
    return ECKey.generate_key("P-256", {"kid": "card-key-1"})


@pytest.fixture
async def signed_agent(signing_key: ECKey) -> AsyncIterator[str]:
    peer = Peer("agent-signed", handler=DemoHandler())
    enable_a2a(peer, card_signer=CardSigner(signing_key))
    async with peer:
        yield f"http://127.0.0.1:{peer.port}"


class FakeAgent:
    """Serves whatever card (bytes) a test gives it, at the well-known path."""

    def __init__(self) -> None:
        self.card = b"{}"
        self.jwks: dict[str, Any] = {"keys": []}
        self.runner: web.AppRunner | None = None
        self.base = ""

    async def start(self) -> None:
        app = web.Application()

        async def card(_request: web.Request) -> web.Response:
            return web.Response(body=self.card, content_type="application/json")

        async def jwks(_request: web.Request) -> web.Response:
            return web.json_response(self.jwks)

        app.router.add_get("/.well-known/agent-card.json", card)
        app.router.add_get("/jwks.json", jwks)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.base = f"http://127.0.0.1:{self.runner.addresses[0][1]}"


@pytest.fixture
async def fake() -> AsyncIterator[FakeAgent]:
    agent = FakeAgent()
    await agent.start()
    try:
        yield agent
    finally:
        assert agent.runner is not None
        await agent.runner.cleanup()


async def fetch_card(base: str) -> dict[str, Any]:
    import aiohttp

    async with (
        aiohttp.ClientSession() as session,
        session.get(base + "/.well-known/agent-card.json") as response,
    ):
        card: dict[str, Any] = json.loads(await response.read())
        return card


def public(key: Any) -> dict[str, Any]:
    return dict(key.as_dict(private=False))


async def test_a_signed_card_verifies_under_the_pinned_key(
    signed_agent: str, signing_key: ECKey
) -> None:
    card = await fetch_card(signed_agent)
    [signature] = card["signatures"]
    assert set(signature) == {"protected", "signature"}
    verifier = CardVerifier(keys=[public(signing_key)])
    async with A2AClient(signed_agent, card_verifier=verifier, require_signed_card=True) as client:
        assert client.card_verified
        assert (await (await client.send({"text": "hi"}, task_type="echo")).result(10)).ok
    verified = await verifier.verify(json.dumps(card).encode())
    assert verified.kid == "card-key-1"


async def test_a_forged_card_is_refused_by_a_client_that_requires_signatures(
    signed_agent: str, signing_key: ECKey, fake: FakeAgent
) -> None:
    card = await fetch_card(signed_agent)
    # The attacker keeps the signature but points the interface at itself.
    card["supportedInterfaces"][0]["url"] = "http://attacker.example/a2a"
    fake.card = json.dumps(card).encode()
    verifier = CardVerifier(keys=[public(signing_key)])
    client = A2AClient(fake.base, card_verifier=verifier, require_signed_card=True)
    with pytest.raises(CardSignatureError, match="no signature of agent card 'agent-signed'"):
        await client.discover()
    await client.close()
    # Without `require_signed_card` the card is used, and marked as not verified.
    lenient = A2AClient(fake.base, card_verifier=verifier)
    await lenient.discover()
    assert not lenient.card_verified
    await lenient.close()


@pytest.mark.parametrize(
    "change",
    [
        lambda c: c["skills"][0].__setitem__("description", "now I do everything"),
        lambda c: c.__setitem__("name", "agent-signed "),
        lambda c: c["capabilities"].__setitem__("pushNotifications", True),
        lambda c: c.__setitem__(
            "securitySchemes", {"k": {"apiKeySecurityScheme": {"location": "query", "name": "k"}}}
        ),
        lambda c: c.__setitem__("iconUrl", "http://x/i.png"),
    ],
    ids=["skill", "name", "capability", "scheme-added", "member-added"],
)
async def test_any_change_breaks_the_signature(
    signed_agent: str, signing_key: ECKey, change: Any
) -> None:
    card = await fetch_card(signed_agent)
    verifier = CardVerifier(keys=[public(signing_key)])
    await verifier.verify(card)
    change(card)
    with pytest.raises(CardSignatureError) as caught:
        await verifier.verify(card)
    assert caught.value.reason == "bad_signature"


async def test_unsigned_cards_and_untrusted_keys_are_refused(
    signed_agent: str, signing_key: ECKey, fake: FakeAgent
) -> None:
    card = await fetch_card(signed_agent)
    unsigned = {k: v for k, v in card.items() if k != "signatures"}
    verifier = CardVerifier(keys=[public(signing_key)])
    with pytest.raises(CardSignatureError, match="is not signed") as caught:
        await verifier.verify(unsigned)
    assert caught.value.reason == "unsigned"
    # Signed by the attacker's key, even one with the trusted kid, with a jku to its JWKS.
    attacker = ECKey.generate_key("P-256", {"kid": "card-key-1"})
    fake.jwks = KeySet([attacker]).as_dict(private=False)
    forged = CardSigner(attacker, jku=fake.base + "/jwks.json")
    from synapse.a2a import wire

    resigned = forged.sign(wire.AgentCard(**{"name": "agent-signed"}))
    with pytest.raises(CardSignatureError, match="no signature"):
        await verifier.verify(wire.to_builtins(resigned))


async def test_a_jwks_url_and_key_rotation(fake: FakeAgent) -> None:
    old = ECKey.generate_key("P-256", {"kid": "old"})
    new = OKPKey.generate_key("Ed25519", {"kid": "new"})
    fake.jwks = KeySet([old]).as_dict(private=False)
    verifier = CardVerifier(jwks_url=fake.base + "/jwks.json", min_refresh=0)
    peer = Peer("agent-rot", handler=DemoHandler())
    server = enable_a2a(peer, card_signer=CardSigner(old))
    async with peer:
        await verifier.verify(await fetch_card(f"http://127.0.0.1:{peer.port}"))
        # The operator publishes the new key, then signs with it.
        fake.jwks = KeySet([old, new]).as_dict(private=False)
        server.card_signer = CardSigner(new).sign
        card = await fetch_card(f"http://127.0.0.1:{peer.port}")
        assert (await verifier.verify(card)).kid == "new"


def test_keys_load_from_pem_and_jwk_files(tmp_path: Any) -> None:
    rsa = RSAKey.generate_key(2048)
    (tmp_path / "k.pem").write_bytes(rsa.as_pem(private=True))
    loaded = load_key(str(tmp_path / "k.pem"), kid="rsa-1")
    assert loaded.kid == "rsa-1" and loaded.is_private
    signer = CardSigner(loaded)
    assert signer.alg == "RS256" and signer.public_jwk["kid"] == "rsa-1"
    (tmp_path / "k.jwk").write_text(json.dumps(ECKey.generate_key("P-256").as_dict(private=True)))
    assert load_key(str(tmp_path / "k.jwk")).kid  # a thumbprint when none is given
    with pytest.raises(ValueError, match="private key"):
        CardSigner(public(loaded))


async def test_signatures_interoperate_with_the_official_sdk(
    signed_agent: str, signing_key: ECKey
) -> None:
    jwt = pytest.importorskip("jwt", reason="the SDK's signing needs PyJWT (a2a-sdk[signing])")
    from a2a.types.a2a_pb2 import AgentCard
    from a2a.utils.signing import create_agent_card_signer, create_signature_verifier
    from google.protobuf.json_format import MessageToDict, ParseDict

    # The SDK verifies the card our server signed ...
    ours = await fetch_card(signed_agent)
    sdk_card = ParseDict(ours, AgentCard(), ignore_unknown_fields=True)
    sdk_public = jwt.PyJWK(public(signing_key))
    create_signature_verifier(lambda kid, jku: sdk_public, ["ES256"])(sdk_card)
    # ... and we verify a card the SDK signed.
    sdk_key = ECKey.generate_key("P-256", {"kid": "sdk-1"})
    private = jwt.PyJWK(dict(sdk_key.as_dict(private=True)))
    theirs = ParseDict(
        {k: v for k, v in ours.items() if k != "signatures"},
        AgentCard(),
        ignore_unknown_fields=True,
    )
    theirs.name = "agent-from-the-sdk ✓"
    # (A `jku: null` in the protected header, which RFC 7515 does not allow, is refused.)
    header: Any = {"kid": "sdk-1", "alg": "ES256", "typ": "JOSE"}
    create_agent_card_signer(private, header)(theirs)
    verified = await CardVerifier(keys=[public(sdk_key)]).verify(MessageToDict(theirs))
    assert verified.kid == "sdk-1" and verified.card.name == "agent-from-the-sdk ✓"
    assert canonical_card(MessageToDict(theirs)) == canonical_card(verified.card)


async def test_the_verifier_plugs_into_the_router_card_policy(
    signed_agent: str, signing_key: ECKey, fake: FakeAgent
) -> None:
    """`synapse.router` takes a `Callable[[bytes], bool]`: a `CardVerifier` is one."""
    from synapse.router.trust import judge_card

    raw = json.dumps(await fetch_card(signed_agent)).encode()
    pinned = CardVerifier(keys=[public(signing_key)])
    assert judge_card(raw, required=True, verifier=pinned).accepted
    forged = json.loads(raw)
    forged["skills"][0]["id"] = "everything"
    verdict = judge_card(json.dumps(forged).encode(), required=True, verifier=pinned)
    assert not verdict.accepted
    assert not pinned(b"not json") and not pinned(b"[]")
    # A JWKS verifier checks without I/O once refreshed.
    fake.jwks = KeySet([signing_key]).as_dict(private=False)
    by_url = CardVerifier(jwks_url=fake.base + "/jwks.json")
    assert not by_url(raw)  # nothing fetched yet
    await by_url.refresh()
    assert by_url(raw)


@pytest.mark.parametrize("binding", ["JSONRPC", "HTTP+JSON", "GRPC"])
async def test_the_extended_card_is_verified_on_every_binding(
    signing_key: ECKey, binding: str
) -> None:
    """The authenticated extended card is checked like the public one: signed by the agent,
    it verifies after any binding's round trip; one that does not verify is refused."""
    from synapse.a2a.wire import grpc_available

    if binding == "GRPC" and not grpc_available():
        pytest.skip("grpcio missing: pip install '.[grpc]'")
    peer = Peer("agent-xc", handler=DemoHandler())
    enable_a2a(
        peer,
        card_signer=CardSigner(signing_key),
        tokens={"tok": "alice"},
        grpc_port=0 if binding == "GRPC" else None,
    )
    async with peer:
        base = f"http://127.0.0.1:{peer.port}"
        pinned = CardVerifier(keys=[dict(signing_key.as_dict(private=False))])
        async with A2AClient(
            base, token="tok", bindings=[binding], card_verifier=pinned, require_signed_card=True
        ) as client:
            assert client.binding == binding
            extended = await client.get_extended_card()
            assert extended.name == "agent-xc" and extended.signatures
        other = ECKey.generate_key("P-256", {"kid": "card-key-1"})
        stranger = CardVerifier(keys=[dict(other.as_dict(private=False))])
        client = A2AClient(
            base, token="tok", bindings=[binding], card_verifier=stranger, require_signed_card=False
        )
        async with client:
            assert not client.card_verified
            client.require_signed_card = True
            with pytest.raises(CardSignatureError):
                await client.get_extended_card()
