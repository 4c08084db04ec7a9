"""The official A2A SDK's client against our enforced schemes, where the SDK supports them.

The SDK's `AuthInterceptor` reads the card's `securityRequirements` and sends, from a
`CredentialService`, a Bearer token (HTTP Bearer, OAuth 2.0 and OpenID Connect schemes) or
an API key in a header; it has nothing for query or cookie API keys, Basic or mTLS, which
the SDK covers through its httpx client (headers, client certificate) instead.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from a2a.client import ClientCallContext, ClientConfig, ClientFactory
from a2a.client.auth.credentials import CredentialService
from a2a.client.auth.interceptor import AuthInterceptor
from a2a.client.errors import A2AClientError
from a2a.types.a2a_pb2 import Message, SendMessageRequest
from google.protobuf.json_format import MessageToDict, ParseDict
from issuer import Issuer
from seckit import AUDIENCE, Pki

from synapse.a2a import enable_a2a
from synapse.a2a.server.security import (
    ApiKeyScheme,
    HttpBasicScheme,
    HttpBearerScheme,
    JwksSource,
    JwtValidator,
    MutualTlsScheme,
    OAuth2Scheme,
    OpenIdConnectScheme,
    SecurityPolicy,
)
from synapse.demo.handler import DemoHandler
from synapse.p2p.config import P2PConfig
from synapse.transport.peer import Peer
from synapse.transport.tls import TLSConfig

FAST = P2PConfig(max_retries=1, retry_base_delay=0.01, request_timeout=5)


class Fixed(CredentialService):
    """One credential per scheme name, whatever the call context."""

    def __init__(self, credentials: dict[str, str]) -> None:
        self.credentials = credentials

    async def get_credentials(self, name: str, context: ClientCallContext | None) -> str | None:
        return self.credentials.get(name)


def message(text: str = "hi") -> SendMessageRequest:
    value = {"messageId": f"m-{text}", "role": "ROLE_USER", "parts": [{"text": text}]}
    return SendMessageRequest(message=ParseDict(value, Message()))


async def last_state(
    base_url: str, http: httpx.AsyncClient, interceptors: list[Any], binding: str = "JSONRPC"
) -> str:
    config = ClientConfig(streaming=False, httpx_client=http, supported_protocol_bindings=[binding])
    client = await ClientFactory(config).create_from_url(base_url, interceptors=interceptors)
    try:
        events = [MessageToDict(event) async for event in client.send_message(message())]
    finally:
        await client.close()
    state: str = events[-1]["task"]["status"]["state"]
    return state


@pytest.fixture
async def secured(issuer: Issuer) -> AsyncIterator[str]:
    validator = JwtValidator(
        issuer=issuer.base, audience=AUDIENCE, jwks=JwksSource(issuer.jwks_url)
    )
    policy = SecurityPolicy(
        {
            "key": ApiKeyScheme({"sdk-key": "sdk-user"}, name="X-Agent-Key"),
            "bearer": HttpBearerScheme({"sdk-token": "sdk-bearer"}),
            "basic": HttpBasicScheme({"sdk": "sdk-pw"}),
            "oauth": OAuth2Scheme(validator, token_url=issuer.token_url),
            "oidc": OpenIdConnectScheme(issuer.discovery_url, audience=AUDIENCE),
        }
    )
    peer = Peer("agent-sdk", handler=DemoHandler(), config=FAST)
    enable_a2a(peer, security=policy)
    async with peer:
        yield f"http://127.0.0.1:{peer.port}"


@pytest.mark.parametrize("binding", ["JSONRPC", "HTTP+JSON"])
@pytest.mark.parametrize("scheme", ["key", "bearer", "oauth", "oidc"])
async def test_the_sdk_auth_interceptor_meets_each_scheme_it_knows(
    secured: str, issuer: Issuer, scheme: str, binding: str
) -> None:
    credential = {
        "key": "sdk-key",
        "bearer": "sdk-token",
        "oauth": issuer.mint(sub="sdk-oauth"),
        "oidc": issuer.mint(sub="sdk-oidc"),
    }[scheme]
    async with httpx.AsyncClient(timeout=10) as http:
        interceptor = AuthInterceptor(Fixed({scheme: credential}))
        state = await last_state(secured, http, [interceptor], binding)
        assert state == "TASK_STATE_COMPLETED"


async def test_the_sdk_with_basic_credentials_in_its_http_client(secured: str) -> None:
    async with httpx.AsyncClient(timeout=10, auth=("sdk", "sdk-pw")) as http:
        assert await last_state(secured, http, []) == "TASK_STATE_COMPLETED"


@pytest.mark.parametrize("binding", ["JSONRPC", "HTTP+JSON"])
@pytest.mark.parametrize(
    "credentials",
    [{}, {"key": "wrong"}, {"bearer": "wrong"}, {"oauth": "e30.e30.e30"}],
    ids=["none", "wrong-key", "wrong-bearer", "forged-token"],
)
async def test_the_sdk_is_refused_without_a_valid_credential(
    secured: str, credentials: dict[str, str], binding: str
) -> None:
    async with httpx.AsyncClient(timeout=10) as http:
        with pytest.raises(A2AClientError, match="401"):
            await last_state(secured, http, [AuthInterceptor(Fixed(credentials))], binding)


async def test_mutual_tls_scheme_with_the_sdk_client(pki: Pki, rogue_pki: Pki) -> None:
    cert, key = pki.issue("agent-m", "agent-m")
    tls = TLSConfig(cert=cert, key=key, client_ca=pki.ca_file)
    policy = SecurityPolicy({"mtls": MutualTlsScheme({"partner-app": "app"})})
    peer = Peer("agent-m", handler=DemoHandler(), config=FAST, tls=tls)
    server = enable_a2a(peer, security=policy)
    async with peer:
        base = f"https://127.0.0.1:{peer.port}"
        assert server.card().security_schemes == {
            "mtls": {"mtlsSecurityScheme": {"description": MutualTlsScheme().description}}
        }

        def context(pair: tuple[Any, Any] | None) -> ssl.SSLContext:
            ctx = ssl.create_default_context(cafile=str(pki.ca_file))
            if pair is not None:
                ctx.load_cert_chain(str(pair[0]), str(pair[1]))
            return ctx

        app = pki.issue("app", "partner-app")
        async with httpx.AsyncClient(timeout=10, verify=context(app)) as http:
            assert await last_state(base, http, []) == "TASK_STATE_COMPLETED"
        # A certificate of our CA that maps to no principal: 401.
        stranger = pki.issue("stranger", "stranger")
        async with httpx.AsyncClient(timeout=10, verify=context(stranger)) as http:
            card = await http.get(base + "/.well-known/agent-card.json")
            assert card.status_code == 200
            refused = await http.post(
                base + "/a2a",
                json={"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "x"}},
                headers={"A2A-Version": "1.0"},
            )
            assert refused.status_code == 401
            assert refused.json()["error"]["code"] == -32106
        # No certificate, or one of another CA: the handshake fails.
        for pair in (None, rogue_pki.issue("app", "partner-app")):
            async with httpx.AsyncClient(timeout=10, verify=context(pair)) as http:
                with pytest.raises(httpx.HTTPError):
                    await http.get(base + "/.well-known/agent-card.json")


async def test_our_client_over_mutual_tls_with_a_custom_ca(pki: Pki) -> None:
    from synapse.a2a import A2AClient, A2AError, ClientCredentials

    cert, key = pki.issue("agent-m", "agent-m")
    tls = TLSConfig(cert=cert, key=key, client_ca=pki.ca_file)
    peer = Peer("agent-m", handler=DemoHandler(), config=FAST, tls=tls)
    enable_a2a(peer, security=SecurityPolicy({"mtls": MutualTlsScheme()}))
    async with peer:
        base = f"https://127.0.0.1:{peer.port}"
        app_cert, app_key = pki.issue("app", "app")
        mine = TLSConfig(ca=pki.ca_file, client_cert=app_cert, client_key=app_key)
        credentials = ClientCredentials(client_certificate=True)
        async with A2AClient(base, ssl=mine.client_context(), credentials=credentials) as client:
            outcome = await (await client.send({"text": "tls"}, task_type="echo")).result(10)
            assert outcome.ok
            task = await client.get_task(outcome.task.id if outcome.task else "")
            assert task.status.state == "TASK_STATE_COMPLETED"
        # Without a certificate the handshake fails: not even the card can be read.
        bare = TLSConfig(ca=pki.ca_file).client_context()
        client = A2AClient(base, ssl=bare)
        with pytest.raises(A2AError, match="cannot fetch"):
            await client.discover()
        await client.close()


def test_a_card_says_client_certificates_are_required_whenever_they_are(pki: Pki) -> None:
    """The TLS handshake of a peer with `client_ca` (`--tls-client-ca`) refuses any caller
    without a certificate: its card says so (`mtlsSecurityScheme`, in every requirement),
    with or without a security policy of its own, and declares it once."""
    cert, key = pki.issue("agent-q", "agent-q")
    required = TLSConfig(cert=cert, key=key, client_ca=pki.ca_file)
    for tls, policy in (
        (required, None),
        (required, SecurityPolicy({"mtls": MutualTlsScheme()})),
        (required, SecurityPolicy({"key": ApiKeyScheme({"k": "app"})})),
        (TLSConfig(cert=cert, key=key), None),
    ):
        server = enable_a2a(
            Peer("agent-q", handler=DemoHandler(), tls=tls),
            security=policy,
            public_url="https://agent-q.example",  # the card, without starting the peer
        )
        card = server.card()
        mtls = [n for n, s in (card.security_schemes or {}).items() if "mtlsSecurityScheme" in s]
        if tls.requires_client_cert:
            assert len(mtls) == 1, card.security_schemes
            assert card.security_requirements
            assert all(mtls[0] in r.schemes for r in card.security_requirements)
        else:
            assert mtls == [] and not card.security_requirements
        if policy is not None and "key" in policy.schemes:
            assert all("key" in r.schemes for r in card.security_requirements or [])


def test_the_mtls_scheme_without_client_certificates_is_refused_at_start(pki: Pki) -> None:
    """A card must not declare a scheme no caller could ever meet."""
    policy = SecurityPolicy({"mtls": MutualTlsScheme()})
    cert, key = pki.issue("agent-n", "agent-n")
    for tls in (None, TLSConfig(cert=cert, key=key)):
        with pytest.raises(ValueError, match="requires client certificates"):
            enable_a2a(Peer("agent-n", handler=DemoHandler(), tls=tls), security=policy)
    required = TLSConfig(cert=cert, key=key, client_ca=pki.ca_file)
    enable_a2a(Peer("agent-n", handler=DemoHandler(), tls=required), security=policy)


async def test_our_client_knows_its_tls_settings_present_a_certificate(pki: Pki) -> None:
    from synapse.a2a import A2AClient, ClientCredentials

    cert, key = pki.issue("agent-m", "agent-m")
    tls = TLSConfig(cert=cert, key=key, client_ca=pki.ca_file)
    peer = Peer("agent-m", handler=DemoHandler(), config=FAST, tls=tls)
    enable_a2a(peer, security=SecurityPolicy({"mtls": MutualTlsScheme()}))
    async with peer:
        app_cert, app_key = pki.issue("app", "app")
        mine = TLSConfig(ca=pki.ca_file, client_cert=app_cert, client_key=app_key)
        credentials = ClientCredentials()  # no flag: the TLS settings say it
        async with A2AClient(
            f"https://127.0.0.1:{peer.port}", tls=mine, credentials=credentials
        ) as client:
            assert (await (await client.send({"text": "t"}, task_type="echo")).result(10)).ok
