"""TLS and mTLS over real loopback sockets, with certificates of a test CA (trustme).

Two peers serve https, each requiring client certificates of the test CA; each presents its
own certificate (a SAN naming its agent id) when it calls the other.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import aiohttp
import pytest
from seckit import Pki

from synapse.demo.handler import DemoHandler
from synapse.p2p.config import P2PConfig
from synapse.transport.client import DeliveryError, HttpClient
from synapse.transport.partners import Partner
from synapse.transport.peer import Peer
from synapse.transport.tls import (
    TLSConfig,
    certificate_identities,
    certificate_names_agent,
    map_principal,
)
from synapse.types import Heartbeat, HeartbeatPayload, Nack, Sender, TaskState, build_message_now

FAST = P2PConfig(max_retries=0, retry_base_delay=0.01, retry_max_delay=0.05, request_timeout=5)
R, E = "agent-r", "agent-e"


def heartbeat(sender: str, endpoint: str, to: str) -> Heartbeat:
    message: Heartbeat = build_message_now(
        Heartbeat, HeartbeatPayload(), sender=Sender(agent_id=sender, endpoint=endpoint), to=to
    )
    return message


async def test_a_task_runs_over_mutual_tls(pki: Pki) -> None:
    r = Peer(R, handler=DemoHandler(), config=FAST, tls=pki.peer_tls(R))
    e = Peer(E, handler=DemoHandler(), config=FAST, tls=pki.peer_tls(E))
    async with r, e:
        assert r.endpoint.startswith("https://127.0.0.1:")
        r.add_partner(E, e.endpoint, ("secret-r-e",))
        e.add_partner(R, r.endpoint, ("secret-r-e",))
        handle = await r.submit(E, "echo", {"text": "over TLS"})
        outcome = await handle.result(timeout=10)
        assert outcome.state is TaskState.COMPLETED
        assert outcome.result is not None and outcome.result.output == "over TLS"


async def test_a_client_without_a_certificate_is_refused_in_the_handshake(pki: Pki) -> None:
    e = Peer(E, handler=DemoHandler(), config=FAST, tls=pki.peer_tls(E))
    async with e:
        e.add_partner(R, "https://127.0.0.1:1/synapse/callback", ("s",))
        no_cert = TLSConfig(ca=pki.ca_file)  # verifies the server, presents nothing
        async with HttpClient(FAST, tls=no_cert) as client:
            partner = Partner(E, e.endpoint, ("s",))
            with pytest.raises(DeliveryError) as caught:
                await client.exchange(partner, heartbeat(R, "https://127.0.0.1:1/x", E))
        assert caught.value.status is None  # no HTTP at all: the handshake failed


async def test_a_certificate_of_another_ca_is_refused(pki: Pki, rogue_pki: Pki) -> None:
    e = Peer(E, handler=DemoHandler(), config=FAST, tls=pki.peer_tls(E))
    async with e:
        cert, key = rogue_pki.issue(R, R)
        rogue = TLSConfig(ca=pki.ca_file, client_cert=cert, client_key=key)
        async with HttpClient(FAST, tls=rogue) as client:
            with pytest.raises(DeliveryError) as caught:
                await client.exchange(Partner(E, e.endpoint, ("s",)), heartbeat(R, "https://x/", E))
        assert caught.value.status is None


async def test_a_certificate_must_name_the_sender_agent(pki: Pki) -> None:
    """agent-c's valid certificate cannot carry a message that says it is from agent-r."""
    e = Peer(E, handler=DemoHandler(), config=FAST, tls=pki.peer_tls(E))
    async with e:
        r_endpoint = "https://127.0.0.1:9/synapse/callback"
        e.add_partner(R, r_endpoint, ("secret-r-e",))
        cert, key = pki.issue("agent-c", "agent-c")
        other = TLSConfig(ca=pki.ca_file, client_cert=cert, client_key=key)
        async with HttpClient(FAST, tls=other) as client:
            reply = await client.exchange(
                Partner(E, e.endpoint, ("secret-r-e",)), heartbeat(R, r_endpoint, E)
            )
        assert reply.status == 403
        assert isinstance(reply.message, Nack)
        assert reply.message.payload.code == "permission_denied"
        assert reply.message.payload.details == {"reason": "certificate"}
        assert not reply.verified  # a 403 is never signed
        # The same message with agent-r's own certificate goes through.
        own_cert, own_key = pki.issue(R, R)
        own = TLSConfig(ca=pki.ca_file, client_cert=own_cert, client_key=own_key)
        async with HttpClient(FAST, tls=own) as client:
            reply = await client.exchange(
                Partner(E, e.endpoint, ("secret-r-e",)), heartbeat(R, r_endpoint, E)
            )
        assert reply.status == 200 and reply.verified


async def test_the_client_verifies_the_server(pki: Pki, rogue_pki: Pki) -> None:
    """A server whose certificate the client's CA did not issue is not talked to."""
    cert, key = rogue_pki.issue(E, E)
    e = Peer(E, handler=DemoHandler(), config=FAST, tls=TLSConfig(cert=cert, key=key))
    async with e:
        async with HttpClient(FAST, tls=TLSConfig(ca=pki.ca_file)) as client:
            with pytest.raises(DeliveryError) as caught:
                await client.exchange(Partner(E, e.endpoint, ()), heartbeat(R, "https://x/", E))
        assert "certificate" in str(caught.value).lower()
        # Without a custom CA, the system store does not know the test CA either.
        async with HttpClient(FAST) as client:
            with pytest.raises(DeliveryError):
                await client.exchange(Partner(E, e.endpoint, ()), heartbeat(R, "https://x/", E))


async def test_plain_http_to_a_tls_peer_gets_no_answer(pki: Pki) -> None:
    e = Peer(E, handler=DemoHandler(), config=FAST, tls=pki.peer_tls(E, require_clients=False))
    async with e:
        plain = e.endpoint.replace("https://", "http://")
        async with aiohttp.ClientSession() as session:
            with pytest.raises(aiohttp.ClientError):
                async with session.post(plain, data=b"{}") as response:
                    await response.read()


def test_tls_settings_are_checked_when_made(pki: Pki, tmp_path: Path) -> None:
    cert, key = pki.issue("x", "x")
    with pytest.raises(ValueError, match="both a certificate and its key"):
        TLSConfig(cert=cert)
    with pytest.raises(ValueError, match="needs --tls-cert"):
        TLSConfig(client_ca=pki.ca_file)
    with pytest.raises(ValueError, match="cannot load"):
        TLSConfig(cert=tmp_path / "missing.crt", key=key).server_context()
    context = TLSConfig(cert=cert, key=key, client_ca=pki.ca_file).server_context()
    assert context is not None and context.verify_mode is ssl.CERT_REQUIRED


def test_certificate_identities_and_agent_mapping() -> None:
    cert = {
        "subject": ((("commonName", "gateway"),),),
        "subjectAltName": (("URI", "synapse:agent:agent-r"), ("DNS", "r.example")),
    }
    assert certificate_identities(cert) == ["agent-r", "r.example", "gateway"]
    # Agent URIs, when present, are the only agents a certificate speaks for.
    assert certificate_names_agent(cert, "agent-r")
    assert not certificate_names_agent(cert, "r.example")
    plain = {"subject": ((("commonName", "agent-x"),),), "subjectAltName": (("DNS", "x"),)}
    assert certificate_names_agent(plain, "agent-x") and not certificate_names_agent(plain, "y")
    assert map_principal(plain) == "x"
    assert map_principal(plain, {"agent-x": "alice"}) == "alice"
    assert map_principal(plain, {"nobody": "bob"}) is None
