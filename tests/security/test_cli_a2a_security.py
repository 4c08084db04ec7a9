"""`synapse serve --a2a` enforcing schemes from `[a2a_security]` and signing its card, and
`synapse send --a2a-agent` presenting credentials from files and requiring a signed card — each a
real process on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
from issuer import Issuer
from joserfc.jwk import ECKey
from seckit import AUDIENCE, free_port

ENV = {k: v for k, v in os.environ.items() if not k.startswith("SYNAPSE_")}


def synapse(*args: str) -> list[str]:
    return [sys.executable, "-m", "synapse.cli.main", *args]


@contextmanager
def serving(*args: str) -> Iterator[subprocess.Popen[str]]:
    """`synapse serve ARGS`, once it logged `serving_a2a` (the card is up).

    A thread reads its stderr line by line (a `select` on the pipe would miss lines the
    text wrapper already buffered); the test waits on the queue it fills.
    """
    process = subprocess.Popen(
        synapse("serve", *args),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    assert process.stderr is not None
    lines: queue.Queue[str | None] = queue.Queue()

    def drain() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=drain, daemon=True).start()
    seen: list[str] = []
    try:
        while not any("serving_a2a" in line for line in seen):
            line = lines.get(timeout=60)
            assert line is not None, seen
            seen.append(line)
        yield process
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


async def rpc(url: str, body: dict[str, Any], **kw: Any) -> tuple[int, dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            url, json=body, headers={"A2A-Version": "1.0", **kw.pop("headers", {})}, **kw
        ) as response,
    ):
        return response.status, await response.json()


SEND = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "SendMessage",
    "params": {"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "hi"}]}},
}


async def test_serve_enforces_configured_schemes_and_signs_its_card(
    issuer: Issuer, tmp_path: Path
) -> None:
    card_key = ECKey.generate_key("P-256")
    (tmp_path / "card.pem").write_bytes(card_key.as_pem(private=True))
    (tmp_path / "card.pub.pem").write_bytes(card_key.as_pem(private=False))
    (tmp_path / "other.pub.pem").write_bytes(ECKey.generate_key("P-256").as_pem(private=False))
    (tmp_path / "api-keys").write_text("# key=principal\nqk-123=alice\n")
    (tmp_path / "users").write_text("bob:pw-bob\n")
    (tmp_path / "my-api-key").write_text("qk-123\n")
    config = tmp_path / "agent.toml"
    config.write_text(
        textwrap.dedent(
            f"""
            agent_id = "agent-cli"
            a2a = true
            a2a_card_signing_key = "{tmp_path / "card.pem"}"
            a2a_card_signing_kid = "card-1"

            [a2a_security.schemes.key]
            type = "apiKey"
            location = "query"
            name = "api_key"
            keys_file = "api-keys"
            [a2a_security.schemes.basic]
            type = "basic"
            users_file = "users"
            [a2a_security.schemes.oauth]
            type = "oauth2"
            issuer = "{issuer.base}"
            audience = "{AUDIENCE}"
            jwks_url = "{issuer.jwks_url}"
            token_url = "{issuer.token_url}"
            scopes = {{ "tasks:slow" = "start slow tasks" }}
            [a2a_security.skills]
            slow = [{{ oauth = ["tasks:slow"] }}]
            """
        )
    )
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with serving("--config", str(config), "--port", str(port)):
        async with (
            aiohttp.ClientSession() as session,
            session.get(base + "/.well-known/agent-card.json") as response,
        ):
            card = json.loads(await response.read())
        assert set(card["securitySchemes"]) == {"key", "basic", "oauth"}
        assert card["signatures"]
        url = base + "/a2a"
        assert (await rpc(url, SEND))[0] == 401
        assert (await rpc(url, SEND, params={"api_key": "qk-123"}))[0] == 200
        assert (await rpc(url, SEND, params={"api_key": "nope"}))[0] == 401
        status, _ = await rpc(url, SEND, headers={"Authorization": f"Bearer {issuer.mint()}"})
        assert status == 200
        expired = issuer.mint(exp=1_000_000, iat=999_000)
        assert (await rpc(url, SEND, headers={"Authorization": f"Bearer {expired}"}))[0] == 401

        def send(*flags: str) -> subprocess.CompletedProcess[str]:
            argv = synapse("send", "--a2a-agent", base, *flags, "echo", '{"text": "signed"}')
            return subprocess.run(
                argv, env=ENV, capture_output=True, text=True, timeout=60, check=False
            )

        sent = await asyncio.to_thread(
            send,
            "--a2a-api-key-file",
            str(tmp_path / "my-api-key"),
            "--a2a-card-key",
            str(tmp_path / "card.pub.pem"),
            "--a2a-require-signed-card",
        )
        assert (sent.returncode, sent.stdout) == (0, "signed\n"), sent.stderr
        forged = await asyncio.to_thread(
            send,
            "--a2a-api-key-file",
            str(tmp_path / "my-api-key"),
            "--a2a-card-key",
            str(tmp_path / "other.pub.pem"),
            "--a2a-require-signed-card",
        )
        assert forged.returncode == 2
        assert "no signature of agent card 'agent-cli' verifies" in forged.stderr
        no_credentials = await asyncio.to_thread(send)
        assert no_credentials.returncode == 2
        assert "-32106" in no_credentials.stderr


async def test_serve_checks_client_certificates_against_the_configured_crl(
    tmp_path: Path,
) -> None:
    """`tls_crl` in the config file: a revoked client certificate is refused in the TLS
    handshake of the HTTP port and before any method on the gRPC port; a CRL that no CA we
    trust signed stops `serve` at start, in one line."""
    import ssl

    import pytest
    import trustme
    from seckit import Pki

    from synapse.a2a.wire import grpc_available

    (tmp_path / "pki").mkdir()
    (tmp_path / "rogue").mkdir()
    pki = Pki(trustme.CA(), tmp_path / "pki")
    cert, key = pki.issue("agent-crl", "agent-crl")
    good, revoked = pki.issue("app", "app"), pki.issue("old-app", "old-app")
    crl = pki.crl(revoked[0])
    grpc_port = free_port()
    config = tmp_path / "agent.toml"
    config.write_text(
        textwrap.dedent(
            f"""
            agent_id = "agent-crl"
            a2a = true
            tls_cert = "{cert}"
            tls_key = "{key}"
            tls_client_ca = "{pki.ca_file}"
            tls_ca = "{pki.ca_file}"
            tls_crl = "{crl}"
            [a2a_security.schemes.cert]
            type = "mtls"
            """
        )
    )
    port = free_port()
    grpc_flags = ("--a2a-grpc-port", str(grpc_port)) if grpc_available() else ()
    with serving("--config", str(config), "--port", str(port), *grpc_flags):
        base = f"https://127.0.0.1:{port}"

        def context(pair: tuple[Path, Path]) -> ssl.SSLContext:
            made = ssl.create_default_context(cafile=str(pki.ca_file))
            made.load_cert_chain(str(pair[0]), str(pair[1]))
            return made

        async with aiohttp.ClientSession() as session:
            url = base + "/a2a"
            async with session.post(
                url, json=SEND, headers={"A2A-Version": "1.0"}, ssl=context(good)
            ) as response:
                assert response.status == 200
            with pytest.raises(aiohttp.ClientError):
                async with session.post(url, json=SEND, ssl=context(revoked)):
                    pass
        if grpc_available():
            import grpc
            from a2a.types import a2a_pb2, a2a_pb2_grpc

            def channel(pair: tuple[Path, Path]) -> grpc.aio.Channel:
                credentials = grpc.ssl_channel_credentials(
                    pki.ca_file.read_bytes(), pair[1].read_bytes(), pair[0].read_bytes()
                )
                return grpc.aio.secure_channel(f"127.0.0.1:{grpc_port}", credentials)

            listing = a2a_pb2.ListTasksRequest()
            version = (("a2a-version", "1.0"),)
            async with channel(good) as ok:
                await a2a_pb2_grpc.A2AServiceStub(ok).ListTasks(listing, metadata=version)
            async with channel(revoked) as bad:
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await a2a_pb2_grpc.A2AServiceStub(bad).ListTasks(listing, metadata=version)
                assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    rogue = Pki(trustme.CA(), tmp_path / "rogue")
    config.write_text(config.read_text().replace(str(crl), str(rogue.crl())))
    started = await asyncio.to_thread(
        subprocess.run,
        synapse("serve", "--config", str(config), "--port", str(free_port())),
        env=ENV,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert started.returncode == 2
    assert "is not signed by a CA of" in started.stderr


async def test_a_private_issuer_is_reached_through_the_configured_ca(tmp_path: Path) -> None:
    """`[a2a_security]` OAuth 2.0 and OpenID Connect schemes fetch the issuer's JWKS and
    discovery document verified against `tls_ca`: an issuer with a certificate of the
    operator's CA works, and without `tls_ca` its keys cannot be had (a retry, not a pass)."""
    import pytest
    import trustme
    from issuer import Issuer
    from seckit import Pki

    from synapse.a2a.server.security import IssuerUnavailable, Presented
    from synapse.cli.main import build_parser
    from synapse.cli.security_settings import a2a_policy
    from synapse.cli.settings import Settings
    from synapse.transport.tls import TLSConfig

    (tmp_path / "pki").mkdir()
    pki = Pki(trustme.CA(), tmp_path / "pki")
    cert, key = pki.issue("issuer", "issuer")
    served = TLSConfig(cert=cert, key=key).server_context()
    issuer = Issuer(audience=AUDIENCE, ssl_context=served)
    await issuer.start()
    try:
        config = tmp_path / "agent.toml"
        schemes = f"""
            [a2a_security.schemes.oauth]
            type = "oauth2"
            issuer = "{issuer.base}"
            audience = "{AUDIENCE}"
            jwks_url = "{issuer.jwks_url}"
            token_url = "{issuer.token_url}"
            [a2a_security.schemes.oidc]
            type = "openIdConnect"
            discovery_url = "{issuer.discovery_url}"
            audience = "{AUDIENCE}"
            """
        token = issuer.mint(sub="svc")
        for ca_line, works in ((f'tls_ca = "{pki.ca_file}"', True), ("", False)):
            config.write_text(textwrap.dedent(ca_line + "\n" + schemes))
            argv = build_parser().parse_args(["serve", "--config", str(config)])
            policy = a2a_policy(Settings.load(argv, {}), {})
            for name in ("oauth", "oidc"):
                presented = Presented({"authorization": f"Bearer {token}"})
                if works:
                    identity = await policy.schemes[name].authenticate(presented)
                    assert identity is not None
                    assert identity.principal == f"{issuer.base}#svc"  # ISSUER#SUBJECT
                else:
                    with pytest.raises(IssuerUnavailable):
                        await policy.schemes[name].authenticate(presented)
    finally:
        await issuer.stop()


async def test_send_over_grpc_with_mutual_tls(tmp_path: Path) -> None:
    """`serve --a2a` with TLS, client certificates and an mTLS scheme on its gRPC port;
    `send --a2a-agent --a2a-binding GRPC` with `--tls-*` presents its certificate there."""
    import pytest
    import trustme
    from seckit import Pki

    from synapse.a2a.wire import grpc_available

    if not grpc_available():
        pytest.skip("grpcio missing: pip install '.[grpc]'")
    (tmp_path / "pki").mkdir()
    pki = Pki(trustme.CA(), tmp_path / "pki")
    cert, key = pki.issue("agent-g", "agent-g")
    app_cert, app_key = pki.issue("app", "app")
    config = tmp_path / "agent.toml"
    config.write_text(
        textwrap.dedent(
            f"""
            agent_id = "agent-g"
            a2a = true
            tls_cert = "{cert}"
            tls_key = "{key}"
            tls_client_ca = "{pki.ca_file}"
            [a2a_security.schemes.cert]
            type = "mtls"
            names = {{ app = "the-app" }}
            """
        )
    )
    port, grpc_port = free_port(), free_port()
    with serving("--config", str(config), "--port", str(port), "--a2a-grpc-port", str(grpc_port)):

        def send(*flags: str) -> subprocess.CompletedProcess[str]:
            argv = synapse(
                "send", "--a2a-agent", f"https://127.0.0.1:{port}", "--a2a-binding", "GRPC",
                "--tls-ca", str(pki.ca_file), *flags, "echo", '{"text": "grpc mtls"}',
            )  # fmt: skip
            return subprocess.run(
                argv, env=ENV, capture_output=True, text=True, timeout=60, check=False
            )

        sent = await asyncio.to_thread(
            send, "--tls-client-cert", str(app_cert), "--tls-client-key", str(app_key)
        )
        assert (sent.returncode, sent.stdout) == (0, "grpc mtls\n"), sent.stderr
        refused = await asyncio.to_thread(send)  # no client certificate: not even the card
        assert refused.returncode == 2
