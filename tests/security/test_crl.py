"""Certificate revocation (`TLSConfig.crl`, `--tls-crl`) over real loopback TLS, with CRLs
the test CA makes and signs with `cryptography`: a revoked client certificate is refused by
the server (in the handshake for HTTP, before any method for gRPC), a revoked server
certificate by the client (HTTP and gRPC), and the check fails closed (no CRL of the
issuer, an expired CRL, a CRL nobody we trust signed).
"""

from __future__ import annotations

import dataclasses
import ssl
from pathlib import Path

import pytest
from seckit import Pki

from synapse.a2a import A2AClient, A2AError, ClientCredentials, enable_a2a
from synapse.a2a.server.security import MutualTlsScheme, SecurityPolicy
from synapse.a2a.wire import grpc_available
from synapse.demo.handler import DemoHandler
from synapse.p2p.config import P2PConfig
from synapse.transport.client import DeliveryError, HttpClient
from synapse.transport.partners import Partner
from synapse.transport.peer import Peer
from synapse.transport.tls import RevocationList, TLSConfig
from synapse.types import Heartbeat, HeartbeatPayload, Sender, TaskState, build_message_now

FAST = P2PConfig(max_retries=0, retry_base_delay=0.01, retry_max_delay=0.05, request_timeout=5)
R, E, X = "agent-r", "agent-e", "agent-x"
grpc_only = pytest.mark.skipif(not grpc_available(), reason="grpcio missing: pip install '.[grpc]'")


def heartbeat(sender: str, to: str) -> Heartbeat:
    message: Heartbeat = build_message_now(
        Heartbeat,
        HeartbeatPayload(),
        sender=Sender(agent_id=sender, endpoint="https://127.0.0.1:9/x"),
        to=to,
    )
    return message


def with_crl(tls: TLSConfig, crl: Path) -> TLSConfig:
    return dataclasses.replace(tls, crl=crl)


async def test_a_revoked_client_certificate_is_refused_in_the_handshake(pki: Pki) -> None:
    r_tls, e_tls = pki.peer_tls(R), pki.peer_tls(E)
    x_cert, x_key = pki.issue(X, X)
    crl = pki.crl(x_cert)  # agent-x's certificate is revoked, the others are not
    r = Peer(R, handler=DemoHandler(), config=FAST, tls=with_crl(r_tls, crl))
    e = Peer(E, handler=DemoHandler(), config=FAST, tls=with_crl(e_tls, crl))
    async with r, e:
        r.add_partner(E, e.endpoint, ("secret-r-e",))
        e.add_partner(R, r.endpoint, ("secret-r-e",))
        outcome = await (await r.submit(E, "echo", {"text": "checked"})).result(timeout=10)
        assert outcome.state is TaskState.COMPLETED
        revoked = TLSConfig(ca=pki.ca_file, client_cert=x_cert, client_key=x_key)
        async with HttpClient(FAST, tls=revoked) as client:
            with pytest.raises(DeliveryError) as caught:
                await client.exchange(Partner(E, e.endpoint, ("s",)), heartbeat(X, E))
        assert caught.value.status is None  # no HTTP at all: the handshake failed
    # The same certificate, not revoked, passes the handshake (and HTTP answers: agent-x
    # is no partner of agent-e's, a refusal in a signed nack, not a failed handshake).
    unrevoked = pki.crl(name="empty.crl")
    e_fresh = Peer(E, handler=DemoHandler(), config=FAST, tls=with_crl(e_tls, unrevoked))
    async with e_fresh, HttpClient(FAST, tls=revoked) as client:
        reply = await client.exchange(Partner(E, e_fresh.endpoint, ("s",)), heartbeat(X, E))
        assert reply.status >= 400


async def test_a_revoked_server_certificate_is_refused_by_the_client(pki: Pki) -> None:
    e_tls = pki.peer_tls(E, require_clients=False)
    assert e_tls.cert is not None
    crl = pki.crl(Path(e_tls.cert))
    e = Peer(E, handler=DemoHandler(), config=FAST, tls=e_tls)
    enable_a2a(e)
    async with e:
        checking = TLSConfig(ca=pki.ca_file, crl=crl)
        async with HttpClient(FAST, tls=checking) as client:
            with pytest.raises(DeliveryError) as caught:
                await client.exchange(Partner(E, e.endpoint, ("s",)), heartbeat(R, E))
            assert caught.value.status is None
        client_a2a = A2AClient(f"https://127.0.0.1:{e.port}", tls=checking)
        with pytest.raises(A2AError, match="certificate revoked"):
            await client_a2a.discover()
        await client_a2a.close()
        # Without the CRL the same server is trusted.
        async with A2AClient(f"https://127.0.0.1:{e.port}", tls=TLSConfig(ca=pki.ca_file)):
            pass


@grpc_only
async def test_revocation_over_grpc_both_ways(pki: Pki) -> None:
    import grpc
    from a2a.types import a2a_pb2
    from test_a2a_grpc_security import call, channel_credentials, error_info, send_request

    cert, key = pki.issue("agent-gc", "agent-gc")
    app, revoked_app = pki.issue("app", "app"), pki.issue("old-app", "old-app")
    crl = pki.crl(revoked_app[0], cert)  # a client's certificate, and the server's own
    tls = TLSConfig(cert=cert, key=key, client_ca=pki.ca_file, crl=crl)
    peer = Peer("agent-gc", handler=DemoHandler(), config=FAST, tls=tls)
    server = enable_a2a(peer, security=SecurityPolicy({"mtls": MutualTlsScheme()}), grpc_port=0)
    async with peer:
        target = f"127.0.0.1:{server.grpc.port}"
        sent = await call(target, "SendMessage", send_request(), (), channel_credentials(pki, app))
        assert sent.task.status.state == a2a_pb2.TASK_STATE_COMPLETED
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call(
                target, "SendMessage", send_request(), (), channel_credentials(pki, revoked_app)
            )
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "revoked" in (caught.value.details() or "")
        assert error_info(caught.value) == ("UNAUTHENTICATED", "a2a-protocol.org")
        # Our gRPC client with the CRL refuses the server, whose certificate it revokes (the
        # card is read over a context that does not check, to reach the gRPC channel).
        mine = TLSConfig(ca=pki.ca_file, client_cert=app[0], client_key=app[1], crl=crl)
        plain = TLSConfig(ca=pki.ca_file, client_cert=app[0], client_key=app[1])
        client = A2AClient(
            f"https://127.0.0.1:{peer.port}",
            tls=mine,
            ssl=plain.client_context(),
            credentials=ClientCredentials(client_certificate=True),
            bindings=["GRPC"],
        )
        async with client:
            assert client.binding == "GRPC"
            with pytest.raises(A2AError, match="certificate revoked"):
                await client.send({"text": "x"}, task_type="echo")
        without = dataclasses.replace(mine, crl=None)
        async with A2AClient(
            f"https://127.0.0.1:{peer.port}",
            tls=without,
            credentials=ClientCredentials(client_certificate=True),
            bindings=["GRPC"],
        ) as client:
            assert (await (await client.send({"text": "y"}, task_type="echo")).result(10)).ok


def test_the_revocation_list_fails_closed(pki: Pki, rogue_pki: Pki) -> None:
    good, revoked = pki.issue("good", "good"), pki.issue("bad", "bad")
    checks = RevocationList(pki.crl(revoked[0]), pki.ca_file)
    assert checks.why_revoked(good[0].read_bytes()) is None
    assert checks.why_revoked(revoked[0].read_bytes()) == "the certificate is revoked"
    foreign = rogue_pki.issue("other", "other")
    assert "no CRL of the certificate's issuer" in (
        checks.why_revoked(foreign[0].read_bytes()) or ""
    )
    stale = RevocationList(pki.crl(name="stale.crl", expired=True), pki.ca_file)
    assert stale.why_revoked(good[0].read_bytes()) == (
        "the CRL of the certificate's issuer has expired"
    )
    # A CRL signed by a CA we do not trust is refused when loaded.
    with pytest.raises(ValueError, match="is not signed by a CA of"):
        RevocationList(rogue_pki.crl(), pki.ca_file)
    with pytest.raises(ValueError, match="holds no PEM CRL"):
        RevocationList(pki.ca_file, pki.ca_file)


async def test_an_expired_crl_refuses_every_client_in_the_handshake(pki: Pki) -> None:
    """OpenSSL's VERIFY_CRL_CHECK_LEAF as configured: a stale CRL is no licence."""
    e_tls = with_crl(pki.peer_tls(E), pki.crl(name="stale.crl", expired=True))
    e = Peer(E, handler=DemoHandler(), config=FAST, tls=e_tls)
    async with e:
        cert, key = pki.issue(R, R)
        async with HttpClient(
            FAST, tls=TLSConfig(ca=pki.ca_file, client_cert=cert, client_key=key)
        ) as c:
            with pytest.raises(DeliveryError) as caught:
                await c.exchange(Partner(E, e.endpoint, ("s",)), heartbeat(R, E))
        assert caught.value.status is None


def test_the_contexts_check_the_leaf_against_the_crl(pki: Pki) -> None:
    tls = with_crl(pki.peer_tls(E), pki.crl())
    server = tls.server_context()
    assert server is not None and server.verify_flags & ssl.VERIFY_CRL_CHECK_LEAF
    assert tls.client_context().verify_flags & ssl.VERIFY_CRL_CHECK_LEAF
    assert not pki.peer_tls(R).client_context().verify_flags & ssl.VERIFY_CRL_CHECK_LEAF


async def test_a_renewed_crl_is_picked_up_without_a_restart(pki: Pki) -> None:
    """The operator renews the CRL file in place (a newly revoked certificate; an expired CRL
    replaced by a current one): `reload_crls` loads it into the running peer's contexts."""
    import os

    from synapse.transport.tls import reload_crls

    x_cert, x_key = pki.issue(X, X)
    crl = pki.crl(name="live.crl", expired=True)
    e = Peer(E, handler=DemoHandler(), config=FAST, tls=with_crl(pki.peer_tls(E), crl))
    x_tls = TLSConfig(ca=pki.ca_file, client_cert=x_cert, client_key=x_key)

    async def handshake() -> bool:
        async with HttpClient(FAST, tls=x_tls) as client:
            try:
                await client.exchange(Partner(E, e.endpoint, ("s",)), heartbeat(X, E))
            except DeliveryError as exc:
                assert exc.status is None
                return False
            return True

    renewals = [240.0]

    def renew(*revoked: Path) -> None:
        # Each renewal is younger than the last (CRLs are issued minutes or hours apart).
        renewals.append(renewals[-1] - 60)
        made = pki.crl(*revoked, name="next.crl", age=renewals[-1])
        os.replace(made, crl)
        stat = os.stat(crl)  # a distinct mtime even within the file system's granularity
        os.utime(crl, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))

    async with e:
        # The peer looks at the file every CRL_REFRESH s (reload_crls is called here directly).
        assert e._crl_refresh is not None and not e._crl_refresh.done()
        assert not await handshake()  # the CRL is expired: everyone is refused
        assert reload_crls() == 0  # nothing changed yet
        renew()
        assert reload_crls() >= 1
        assert await handshake()  # a current CRL that revokes nothing
        renew(x_cert)
        assert reload_crls() >= 1
        assert not await handshake()  # x is revoked now
    assert e._crl_refresh is None
    # The gRPC path's RevocationList follows the file too.
    checks = RevocationList(crl, pki.ca_file)
    assert checks.why_revoked(x_cert.read_bytes()) == "the certificate is revoked"
    renew()
    assert reload_crls() >= 1
    assert checks.why_revoked(x_cert.read_bytes()) is None
    # A broken renewal keeps what was loaded (and is logged).
    crl.write_text("not a CRL")
    reload_crls()
    assert checks.why_revoked(x_cert.read_bytes()) is None


def test_one_crl_file_for_the_client_and_the_server_ca(pki: Pki, rogue_pki: Pki) -> None:
    """One `--tls-crl` file serves both sides: CRLs of the client CA and of the server CA
    (here: two CAs), each signed by one of ours; of two CRLs of one CA the later counts."""
    ours, theirs = pki.issue("client-app", "client-app"), rogue_pki.issue("server", "server")
    older = pki.crl(ours[0], name="older.crl", age=3600)  # revoked an hour ago ...
    newer = pki.crl(name="newer.crl", age=60)  # ... and reinstated since
    other = rogue_pki.crl(theirs[0], name="other.crl")
    bundle = pki.directory / "bundle.crl"
    bundle.write_bytes(newer.read_bytes() + older.read_bytes() + other.read_bytes())
    tls = TLSConfig(cert=ours[0], key=ours[1], client_ca=pki.ca_file, ca=rogue_pki.ca_file)
    checks = dataclasses.replace(tls, crl=bundle).revocation_list()
    assert checks is not None
    assert checks.why_revoked(ours[0].read_bytes()) is None
    assert checks.why_revoked(theirs[0].read_bytes()) == "the certificate is revoked"
    with pytest.raises(ValueError, match="is not signed by a CA of"):
        dataclasses.replace(tls, ca=None, crl=bundle).revocation_list()
