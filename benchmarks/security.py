"""What the security mechanisms cost: run by hand, one process, loopback only.

    python -m benchmarks.security [--seconds 2]

- CPU per check: a JWT access token validated (joserfc, ES256, fixed key set), a card
  signed and verified (ES256, RFC 8785), against the HMAC-SHA256 Synapse signature;
- requests per second of A2A `GetTask` through the binding without authentication, with an
  API key and with a JWT, and of Synapse heartbeats over plain HTTP, TLS and mTLS (one
  keep-alive connection; the TLS handshake is paid once);
- requests per second of A2A `ListTasks` over gRPC (one channel): no authentication, an API
  key, a JWT, mTLS, and mTLS with the client certificate checked against a CRL on each call.

Figures depend on the machine and its load: compare the rows of one run with each other.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks._common import Table, quiet_logging


def per_call(fn: Callable[[], Any], seconds: float) -> float:
    """Microseconds of one call of `fn`, over `seconds`."""
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(50):
            fn()
        count += 50
    return (time.perf_counter() - start) / count * 1e6


async def rate(call: Callable[[], Awaitable[Any]], seconds: float) -> float:
    await call()  # connect (and handshake) first
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        await call()
        count += 1
    return count / (time.perf_counter() - start)


def crypto_table(seconds: float) -> Table:
    from joserfc import jwt
    from joserfc.jwk import ECKey, KeySet

    from synapse.a2a import wire
    from synapse.a2a.card import build_card
    from synapse.a2a.card_signing import CardSigner, CardVerifier, canonical_card
    from synapse.demo.handler import DemoHandler
    from synapse.types.signing import header_signature

    key = ECKey.generate_key("P-256", {"kid": "k"})
    now = int(time.time())
    claims = {"iss": "https://i", "aud": "https://a", "sub": "s", "exp": now + 3600}
    token = jwt.encode({"alg": "ES256", "kid": "k"}, claims, key)
    keys = KeySet([key])

    def validate_uncached() -> None:
        decoded = jwt.decode(token, keys, algorithms=["ES256"])
        jwt.JWTClaimsRegistry(
            iss={"essential": True, "value": "https://i"},
            aud={"essential": True, "value": "https://a"},
            exp={"essential": True},
        ).validate(decoded.claims)

    card = build_card(
        DemoHandler().get_capabilities(),
        name="bench",
        description="",
        interfaces=[
            wire.AgentInterface(
                url="http://127.0.0.1/a2a",
                protocol_binding=wire.JSONRPC_BINDING,
                protocol_version=wire.PROTOCOL_VERSION,
            )
        ],
        version="1",
        default_task_type="echo",
        push_notifications=False,
        bearer=False,
    )
    signer = CardSigner(key)
    signed = wire.to_builtins(signer.sign(card))
    verifier = CardVerifier(keys=[key.as_dict(private=False)])
    loop = asyncio.new_event_loop()
    body = wire.encode(card)
    table = Table(["check", "µs per call"], title="CPU per check (one core)")
    table.add(
        f"HMAC-SHA256 header signature (Synapse, {len(body)} B body)",
        f"{per_call(lambda: header_signature('secret', body), seconds):.1f}",
    )
    table.add(
        "JWT access token validated (ES256, first time)",
        f"{per_call(validate_uncached, seconds):.1f}",
    )
    table.add(
        "card canonicalized (RFC 8785)", f"{per_call(lambda: canonical_card(card), seconds):.1f}"
    )
    fresh = CardSigner(key)

    def sign_fresh() -> None:
        fresh._last = None
        fresh.sign(card)

    table.add("card signed (ES256)", f"{per_call(sign_fresh, seconds):.1f}")
    table.add(
        "card served again unchanged (signature reused)",
        f"{per_call(lambda: signer.sign(card), seconds):.1f}",
    )
    table.add(
        "card verified (ES256)",
        f"{per_call(lambda: loop.run_until_complete(verifier.verify(signed)), seconds):.1f}",
    )
    loop.close()
    return table


def jwt_issuer() -> tuple[Any, str]:
    """A validator for a throw-away issuer (its JWKS in memory) and a token it accepts."""
    from joserfc import jwt
    from joserfc.jwk import ECKey

    from synapse.a2a.server.security import JwksSource, JwtValidator

    key = ECKey.generate_key("P-256", {"kid": "k"})
    jwks = JwksSource(keys={"keys": [dict(key.as_dict(private=False))]})
    validator = JwtValidator(issuer="https://i", audience="https://a", jwks=jwks)
    token = jwt.encode(
        {"alg": "ES256", "kid": "k"},
        {"iss": "https://i", "aud": "https://a", "sub": "s", "exp": int(time.time()) + 3600},
        key,
    )
    return validator, token


async def a2a_table(seconds: float) -> Table:

    from synapse.a2a import enable_a2a
    from synapse.a2a.server.security import (
        ApiKeyScheme,
        OAuth2Scheme,
        SecurityPolicy,
    )
    from synapse.demo.handler import DemoHandler
    from synapse.transport.peer import Peer

    validator, token = jwt_issuer()
    table = Table(["A2A GetTask, one connection", "requests/s"], title="A2A authentication")
    cases: list[tuple[str, Any, dict[str, str]]] = [
        ("no authentication", None, {}),
        (
            "API key (header)",
            SecurityPolicy({"k": ApiKeyScheme({"key-1": "a"})}),
            {"X-API-Key": "key-1"},
        ),
        (
            "OAuth 2.0 JWT (ES256)",
            SecurityPolicy({"o": OAuth2Scheme(validator, token_url="https://i/token")}),
            {"Authorization": f"Bearer {token}"},
        ),
    ]
    for name, policy, headers in cases:
        peer = Peer("bench-a2a", handler=DemoHandler())
        enable_a2a(peer, security=policy)
        async with peer, aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{peer.port}/a2a"
            body = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "none"}}

            async def call(url: str = url, body: Any = body, headers: Any = headers) -> None:
                async with session.post(
                    url, json=body, headers={"A2A-Version": "1.0", **headers}
                ) as response:
                    assert response.status == 200, await response.text()
                    await response.read()

            table.add(name, f"{await rate(call, seconds):,.0f}")
    return table


async def tls_table(seconds: float) -> Table:
    import trustme

    from synapse.demo.handler import DemoHandler
    from synapse.transport.peer import Peer
    from synapse.transport.tls import TLSConfig

    table = Table(["Synapse ping (heartbeat), one connection", "round trips/s"], title="TLS")
    with tempfile.TemporaryDirectory() as tmp:
        ca = trustme.CA()
        ca_file = Path(tmp, "ca.pem")
        ca.cert_pem.write_to_path(str(ca_file))

        def issue(name: str) -> tuple[Path, Path]:
            cert = ca.issue_cert("127.0.0.1", name, common_name=name)
            crt, key = Path(tmp, f"{name}.crt"), Path(tmp, f"{name}.key")
            cert.cert_chain_pems[0].write_to_path(str(crt))
            cert.private_key_pem.write_to_path(str(key))
            return crt, key

        (r_crt, r_key), (e_crt, e_key) = issue("agent-r"), issue("agent-e")
        cases: list[tuple[str, TLSConfig | None, TLSConfig | None]] = [
            ("plain HTTP", None, None),
            ("TLS", TLSConfig(ca=ca_file), TLSConfig(cert=e_crt, key=e_key)),
            (
                "mTLS",
                TLSConfig(ca=ca_file, client_cert=r_crt, client_key=r_key),
                TLSConfig(cert=e_crt, key=e_key, client_ca=ca_file),
            ),
        ]
        for name, r_tls, e_tls in cases:
            e = Peer("agent-e", handler=DemoHandler(), tls=e_tls)
            r = Peer("agent-r", handler=DemoHandler(), tls=r_tls, serve=False)
            async with e:
                r.add_partner("agent-e", e.endpoint, ("s-r-e",))
                async with r:
                    e.add_partner("agent-r", r.endpoint, ("s-r-e",))

                    async def ping(r: Peer = r) -> None:
                        await r.ping("agent-e")

                    table.add(name, f"{await rate(ping, seconds):,.0f}")
    return table


async def grpc_table(seconds: float) -> Table:
    import grpc
    import trustme
    from a2a.types import a2a_pb2, a2a_pb2_grpc
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization

    from synapse.a2a import enable_a2a
    from synapse.a2a.server.security import (
        ApiKeyScheme,
        MutualTlsScheme,
        OAuth2Scheme,
        SecurityPolicy,
    )
    from synapse.demo.handler import DemoHandler
    from synapse.transport.peer import Peer
    from synapse.transport.tls import TLSConfig

    validator, token = jwt_issuer()
    table = Table(["A2A ListTasks over gRPC, one channel", "requests/s"], title="gRPC")
    with tempfile.TemporaryDirectory() as tmp:
        ca = trustme.CA()
        ca_file = Path(tmp, "ca.pem")
        ca.cert_pem.write_to_path(str(ca_file))
        leaf = ca.issue_cert("127.0.0.1", "agent", common_name="agent")
        app = ca.issue_cert("app", common_name="app")
        files = {}
        for name, blob in (
            ("agent.crt", leaf.cert_chain_pems[0]),
            ("agent.key", leaf.private_key_pem),
        ):
            files[name] = Path(tmp, name)
            blob.write_to_path(str(files[name]))
        ca_cert = x509.load_pem_x509_certificate(ca.cert_pem.bytes())
        ca_key = serialization.load_pem_private_key(ca.private_key_pem.bytes(), None)
        now = datetime.datetime.now(datetime.UTC)
        crl = (
            x509.CertificateRevocationListBuilder()
            .issuer_name(ca_cert.subject)
            .last_update(now)
            .next_update(now + datetime.timedelta(days=1))
            .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
        )
        crl_file = Path(tmp, "crl.pem")
        crl_file.write_bytes(crl.public_bytes(serialization.Encoding.PEM))  # noqa: ASYNC240
        mtls = TLSConfig(cert=files["agent.crt"], key=files["agent.key"], client_ca=ca_file)
        channel_credentials = grpc.ssl_channel_credentials(
            ca.cert_pem.bytes(), app.private_key_pem.bytes(), app.cert_chain_pems[0].bytes()
        )
        cases: list[tuple[str, Any, TLSConfig | None, tuple[tuple[str, str], ...]]] = [
            ("no authentication", None, None, ()),
            ("API key (metadata)", SecurityPolicy({"k": ApiKeyScheme({"key-1": "a"})}), None,
             (("x-api-key", "key-1"),)),
            ("OAuth 2.0 JWT (ES256)",
             SecurityPolicy({"o": OAuth2Scheme(validator, token_url="https://i/token")}), None,
             (("authorization", f"Bearer {token}"),)),
            ("mTLS", SecurityPolicy({"m": MutualTlsScheme()}), mtls, ()),
            ("mTLS + CRL", SecurityPolicy({"m": MutualTlsScheme()}),
             dataclasses.replace(mtls, crl=crl_file), ()),
        ]  # fmt: skip
        for name, policy, tls, metadata in cases:
            peer = Peer("bench-grpc", handler=DemoHandler(), tls=tls)
            server = enable_a2a(peer, security=policy, grpc_port=0)
            async with peer:
                target = f"127.0.0.1:{server.grpc.port}"
                channel = (
                    grpc.aio.secure_channel(target, channel_credentials)
                    if tls is not None
                    else grpc.aio.insecure_channel(target)
                )
                async with channel:
                    stub = a2a_pb2_grpc.A2AServiceStub(channel)
                    full = (("a2a-version", "1.0"), *metadata)

                    async def call(stub: Any = stub, full: Any = full) -> None:
                        await stub.ListTasks(a2a_pb2.ListTasksRequest(), metadata=full)

                    table.add(name, f"{await rate(call, seconds):,.0f}")
    return table


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.security")
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    quiet_logging()
    print(crypto_table(args.seconds).text(), end="\n\n")
    print(asyncio.run(a2a_table(args.seconds)).text(), end="\n\n")
    print(asyncio.run(tls_table(args.seconds)).text(), end="\n\n")
    print(asyncio.run(grpc_table(args.seconds)).text())


if __name__ == "__main__":
    main()
