"""Every A2A security scheme over the gRPC binding, enforced by the same verifier as the HTTP
bindings, over real loopback gRPC: API keys (metadata for header and query keys, `cookie`
for cookie keys), HTTP Bearer and Basic, OAuth 2.0 JWTs of the tests' issuer (expired,
wrong audience, wrong issuer, wrong scope, forged: refused), OpenID Connect discovery, and
mutual TLS with the test CA (missing, foreign or unmapped client certificates refused).
Refusals are UNAUTHENTICATED or PERMISSION_DENIED with the ErrorInfo the other bindings give.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from issuer import Issuer
from joserfc.jwk import ECKey
from seckit import AUDIENCE, Pki

from synapse.a2a import A2AClient, ClientCredentials, OAuthClient, enable_a2a
from synapse.a2a.errors import A2ACode, A2AError
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
from synapse.a2a.wire import grpc_available
from synapse.demo.handler import DemoHandler
from synapse.p2p.config import P2PConfig
from synapse.transport.peer import Peer
from synapse.transport.tls import TLSConfig

pytestmark = pytest.mark.skipif(
    not grpc_available(), reason="grpcio missing: pip install '.[grpc]'"
)

FAST = P2PConfig(max_retries=1, retry_base_delay=0.01, request_timeout=5)
VERSION = ("a2a-version", "1.0")


@dataclass
class GrpcAgent:
    peer: Peer
    base: str
    target: str
    issuer: Issuer


def full_policy(issuer: Issuer) -> SecurityPolicy:
    validator = JwtValidator(
        issuer=issuer.base, audience=AUDIENCE, jwks=JwksSource(issuer.jwks_url), leeway=0
    )
    oauth = OAuth2Scheme(
        validator,
        token_url=issuer.token_url,
        scopes={"tasks:slow": "start slow tasks", "tasks:cancel": "cancel tasks"},
    )
    return SecurityPolicy(
        {
            "apiKeyHeader": ApiKeyScheme({"hk-1": "alice"}, name="X-API-Key", location="header"),
            "apiKeyQuery": ApiKeyScheme({"qk-1": "bob"}, name="api_key", location="query"),
            "apiKeyCookie": ApiKeyScheme({"ck-1": "carol"}, name="a2a_key", location="cookie"),
            "bearer": HttpBearerScheme({"bt-1": "dave"}),
            "basic": HttpBasicScheme({"erin": "pw-erin"}),
            "oauth": oauth,
        },
        skill_requirements={"slow": [{"oauth": ["tasks:slow"]}]},
        method_scopes={"CancelTask": ["tasks:cancel"]},
    )


@pytest.fixture
async def agent(issuer: Issuer) -> AsyncIterator[GrpcAgent]:
    peer = Peer("agent-g", handler=DemoHandler(), config=FAST)
    server = enable_a2a(peer, security=full_policy(issuer), grpc_port=0)
    await peer.start()
    try:
        assert server.grpc is not None
        yield GrpcAgent(
            peer, f"http://127.0.0.1:{peer.port}", f"127.0.0.1:{server.grpc.port}", issuer
        )
    finally:
        await peer.close(drain_timeout=0.2)


def send_request(task_type: str = "echo", payload: Any = None, **configuration: Any) -> Any:
    from a2a.types import a2a_pb2
    from google.protobuf.json_format import ParseDict

    value = {
        "message": {
            "messageId": f"m-{uuid.uuid4().hex}",  # each message its own (retries share one)
            "role": "ROLE_USER",
            "parts": [{"data": payload or {"text": "hi"}}],
            "metadata": {"taskType": task_type},
        },
        "configuration": configuration,
    }
    return ParseDict(value, a2a_pb2.SendMessageRequest())


def basic(user: str, password: str) -> tuple[str, str]:
    return ("authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())


def bearer(token: str) -> tuple[str, str]:
    return ("authorization", f"Bearer {token}")


async def call(
    target: str,
    method: str,
    request: Any,
    metadata: tuple[tuple[str, str], ...],
    credentials: Any = None,
) -> Any:
    """One call of `method` (a streaming one: every event), over a fresh channel."""
    import grpc
    from a2a.types import a2a_pb2_grpc

    channel = (
        grpc.aio.secure_channel(target, credentials)
        if credentials is not None
        else grpc.aio.insecure_channel(target)
    )
    async with channel:
        stub = a2a_pb2_grpc.A2AServiceStub(channel)
        answer = getattr(stub, method)(request, metadata=(VERSION, *metadata), timeout=10)
        if method in ("SendStreamingMessage", "SubscribeToTask"):
            return [event async for event in answer]
        return await answer


def error_info(exc: Any) -> tuple[str, str]:
    from google.rpc import error_details_pb2, status_pb2

    trailers = dict(exc.trailing_metadata() or ())
    status = status_pb2.Status.FromString(trailers["grpc-status-details-bin"])
    info = error_details_pb2.ErrorInfo()
    status.details[0].Unpack(info)
    return info.reason, info.domain


async def refused(
    target: str, method: str, request: Any, metadata: Any, code: str, reason: str = ""
) -> Any:
    import grpc

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call(target, method, request, metadata)
    exc = caught.value
    assert exc.code() == grpc.StatusCode[code], exc.details()
    assert error_info(exc) == (reason or code, "a2a-protocol.org")
    return exc


@pytest.mark.parametrize(
    "metadata",
    [
        (("x-api-key", "hk-1"),),
        (("api_key", "qk-1"),),
        (("cookie", "other=1; a2a_key=ck-1"),),
        (bearer("bt-1"),),
        (basic("erin", "pw-erin"),),
    ],
    ids=["api-key-header", "api-key-query", "api-key-cookie", "bearer", "basic"],
)
async def test_each_static_credential_is_accepted_over_grpc(
    agent: GrpcAgent, metadata: tuple[tuple[str, str], ...]
) -> None:
    from a2a.types import a2a_pb2

    sent = await call(agent.target, "SendMessage", send_request(), metadata)
    assert sent.task.status.state == a2a_pb2.TASK_STATE_COMPLETED


@pytest.mark.parametrize(
    "metadata",
    [
        (),
        (("x-api-key", "hk-2"),),
        (("x-api-key", "qk-1"),),  # a query key is not a header key
        (("cookie", "a2a_key=nope"),),
        (bearer("bt-2"),),
        (basic("erin", "wrong"),),
        (("authorization", "Basic !!!"),),
    ],
    ids=[
        "nothing",
        "unknown-key",
        "key-in-the-wrong-place",
        "unknown-cookie",
        "unknown-bearer",
        "wrong-password",
        "malformed-basic",
    ],
)
async def test_missing_or_wrong_credentials_are_unauthenticated(
    agent: GrpcAgent, metadata: tuple[tuple[str, str], ...]
) -> None:
    exc = await refused(agent.target, "SendMessage", send_request(), metadata, "UNAUTHENTICATED")
    assert dict(exc.trailing_metadata())["www-authenticate"]


@pytest.mark.parametrize(
    "kind", ["expired", "wrong-audience", "wrong-issuer", "forged", "no-expiry", "garbage"]
)
async def test_bad_tokens_are_refused_over_grpc(agent: GrpcAgent, kind: str) -> None:
    issuer = agent.issuer
    token = {
        "expired": lambda: issuer.mint(exp=1_000_000, iat=999_000),
        "wrong-audience": lambda: issuer.mint(aud="https://another.agent/a2a"),
        "wrong-issuer": lambda: issuer.mint(iss="https://evil.example"),
        "forged": lambda: issuer.mint(key=ECKey.generate_key("P-256", {"kid": "k1"})),
        "no-expiry": lambda: issuer.mint(exp=None),
        "garbage": lambda: "not.a.jwt",
    }[kind]()
    exc = await refused(
        agent.target, "SendMessage", send_request(), (bearer(token),), "UNAUTHENTICATED"
    )
    assert 'error="invalid_token"' in dict(exc.trailing_metadata())["www-authenticate"]


async def test_scopes_per_skill_and_per_method_over_grpc(agent: GrpcAgent) -> None:
    from a2a.types import a2a_pb2

    slow = send_request("slow", {"steps": 1, "delay": 0.01})
    for metadata in ((("x-api-key", "hk-1"),), (bearer(agent.issuer.mint(scope="other")),)):
        exc = await refused(agent.target, "SendMessage", slow, metadata, "PERMISSION_DENIED")
    assert 'scope="tasks:slow"' in dict(exc.trailing_metadata())["www-authenticate"]
    # The streaming method is judged the same way.
    await refused(
        agent.target, "SendStreamingMessage", slow, (("x-api-key", "hk-1"),), "PERMISSION_DENIED"
    )
    allowed = (bearer(agent.issuer.mint(sub="svc", scope="tasks:slow")),)
    sent = await call(agent.target, "SendMessage", slow, allowed)
    assert sent.task.status.state == a2a_pb2.TASK_STATE_COMPLETED
    long = send_request("slow", {"steps": 50, "delay": 0.05}, returnImmediately=True)
    started = await call(agent.target, "SendMessage", long, allowed)
    cancel = a2a_pb2.CancelTaskRequest(id=started.task.id)
    await refused(agent.target, "CancelTask", cancel, allowed, "PERMISSION_DENIED")
    canceller = (bearer(agent.issuer.mint(sub="svc", scope="tasks:cancel")),)
    canceled = await call(agent.target, "CancelTask", cancel, canceller)
    assert canceled.status.state == a2a_pb2.TASK_STATE_CANCELED


async def test_every_route_needs_credentials_over_grpc(agent: GrpcAgent) -> None:
    """Streams, subscriptions, push configurations, the extended card, listing: each refused
    without a credential, each served with one — and a task is its principal's only."""
    from a2a.types import a2a_pb2

    key = (("x-api-key", "hk-1"),)
    events = await call(agent.target, "SendStreamingMessage", send_request(), key)
    assert events[-1].status_update.status.state == a2a_pb2.TASK_STATE_COMPLETED
    task_id = events[0].task.id
    requests = {
        "SendStreamingMessage": send_request(),
        "SubscribeToTask": a2a_pb2.SubscribeToTaskRequest(id=task_id),
        "GetTask": a2a_pb2.GetTaskRequest(id=task_id),
        "ListTasks": a2a_pb2.ListTasksRequest(),
        "CancelTask": a2a_pb2.CancelTaskRequest(id=task_id),
        "CreateTaskPushNotificationConfig": a2a_pb2.TaskPushNotificationConfig(
            task_id=task_id, url="https://hooks.example/a"
        ),
        "ListTaskPushNotificationConfigs": a2a_pb2.ListTaskPushNotificationConfigsRequest(
            task_id=task_id
        ),
        "GetTaskPushNotificationConfig": a2a_pb2.GetTaskPushNotificationConfigRequest(
            task_id=task_id, id="x"
        ),
        "DeleteTaskPushNotificationConfig": a2a_pb2.DeleteTaskPushNotificationConfigRequest(
            task_id=task_id, id="x"
        ),
        "GetExtendedAgentCard": a2a_pb2.GetExtendedAgentCardRequest(),
    }
    from synapse.a2a import grpc_proto

    assert {*requests, "SendMessage"} == set(grpc_proto.METHODS)  # every method of the service
    for method, request in requests.items():
        await refused(agent.target, method, request, (), "UNAUTHENTICATED")
    card = await call(agent.target, "GetExtendedAgentCard", requests["GetExtendedAgentCard"], key)
    assert set(card.security_schemes) >= {"apiKeyHeader", "oauth"}
    got = await call(agent.target, "GetTask", requests["GetTask"], key)
    assert got.id == task_id
    # Another principal does not see alice's task.
    await refused(
        agent.target,
        "GetTask",
        requests["GetTask"],
        (bearer("bt-1"),),
        "NOT_FOUND",
        "TASK_NOT_FOUND",
    )


async def test_openid_connect_over_grpc(issuer: Issuer) -> None:
    from a2a.types import a2a_pb2

    policy = SecurityPolicy({"oidc": OpenIdConnectScheme(issuer.discovery_url, audience=AUDIENCE)})
    peer = Peer("agent-go", handler=DemoHandler(), config=FAST)
    server = enable_a2a(peer, security=policy, grpc_port=0)
    async with peer:
        target = f"127.0.0.1:{server.grpc.port}"
        sent = await call(target, "SendMessage", send_request(), (bearer(issuer.mint()),))
        assert sent.task.status.state == a2a_pb2.TASK_STATE_COMPLETED
        for token in (issuer.mint(aud="x"), issuer.mint(key=ECKey.generate_key("P-256"))):
            await refused(
                target, "SendMessage", send_request(), (bearer(token),), "UNAUTHENTICATED"
            )
        credentials = ClientCredentials(oauth=OAuthClient("client-1", "client-secret-1"))
        async with A2AClient(
            f"http://127.0.0.1:{peer.port}", credentials=credentials, bindings=["GRPC"]
        ) as client:
            assert client.binding == "GRPC"
            assert (await (await client.send({"text": "o"}, task_type="echo")).result(10)).ok


async def test_our_grpc_client_sends_what_the_card_asks_for(agent: GrpcAgent) -> None:
    oauth = ClientCredentials(oauth=OAuthClient("client-1", "client-secret-1"))
    async with A2AClient(agent.base, credentials=oauth, bindings=["GRPC"]) as client:
        assert client.binding == "GRPC"
        assert (await (await client.send({"text": "hi"}, task_type="echo")).result(10)).ok
        # The slow skill's requirement lists its scope: the client asks for it.
        slow = await client.send({"steps": 1, "delay": 0.01}, task_type="slow", stream=True)
        assert (await slow.result(10)).ok
    scopes = [request.get("scope", "") for request in agent.issuer.token_requests]
    assert "" in scopes and "tasks:slow" in scopes
    for credentials in (
        ClientCredentials(api_keys={"apiKeyHeader": "hk-1"}),
        ClientCredentials(api_keys={"apiKeyQuery": "qk-1"}),
        ClientCredentials(api_keys={"apiKeyCookie": "ck-1"}),
        ClientCredentials(basic=("erin", "pw-erin")),
        ClientCredentials(bearer="bt-1"),
    ):
        async with A2AClient(agent.base, credentials=credentials, bindings=["GRPC"]) as client:
            assert (await (await client.send({"text": "k"}, task_type="echo")).result(10)).ok
    async with A2AClient(
        agent.base, credentials=ClientCredentials(bearer="wrong"), bindings=["GRPC"]
    ) as client:
        with pytest.raises(A2AError) as caught:
            await client.send({"text": "k"}, task_type="echo")
        assert caught.value.code == A2ACode.AUTHENTICATION_FAILED
    # A valid token without the skill's scope: the agent's PERMISSION_DENIED comes back as
    # the authorization error (-32107), not as an authentication failure.
    unscoped = ClientCredentials(bearer=agent.issuer.mint(sub="svc", scope="other"))
    async with A2AClient(agent.base, credentials=unscoped, bindings=["GRPC"]) as client:
        with pytest.raises(A2AError) as caught:
            await client.send({"steps": 1}, task_type="slow")
        assert caught.value.code == A2ACode.AUTHORIZATION_FAILED
        assert "tasks:slow" in caught.value.message


# --- mutual TLS over gRPC ------------------------------------------------------------------------


def channel_credentials(pki: Pki, pair: tuple[Any, Any] | None) -> Any:
    import grpc

    if pair is None:
        return grpc.ssl_channel_credentials(root_certificates=pki.ca_file.read_bytes())
    return grpc.ssl_channel_credentials(
        root_certificates=pki.ca_file.read_bytes(),
        private_key=pair[1].read_bytes(),
        certificate_chain=pair[0].read_bytes(),
    )


async def test_mutual_tls_over_grpc(pki: Pki, rogue_pki: Pki) -> None:
    import grpc
    from a2a.types import a2a_pb2

    cert, key = pki.issue("agent-gm", "agent-gm")
    tls = TLSConfig(cert=cert, key=key, client_ca=pki.ca_file)
    names = {"partner-app": "app", "other-app": "other"}
    policy = SecurityPolicy({"mtls": MutualTlsScheme(names)})
    peer = Peer("agent-gm", handler=DemoHandler(), config=FAST, tls=tls)
    server = enable_a2a(peer, security=policy, grpc_port=0)
    async with peer:
        target = f"127.0.0.1:{server.grpc.port}"
        app = pki.issue("app", "partner-app")
        sent = await call(target, "SendMessage", send_request(), (), channel_credentials(pki, app))
        assert sent.task.status.state == a2a_pb2.TASK_STATE_COMPLETED
        # The certificate names the same principal on every binding: the task made over gRPC
        # is app's over JSON-RPC too, and not another certificate's.
        import ssl

        import aiohttp

        async def http_get_task(pair: tuple[Any, Any]) -> dict[str, Any]:
            context = ssl.create_default_context(cafile=str(pki.ca_file))
            context.load_cert_chain(str(pair[0]), str(pair[1]))
            body = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": sent.task.id}}
            async with (
                aiohttp.ClientSession() as session,
                session.post(
                    f"https://127.0.0.1:{peer.port}/a2a",
                    json=body,
                    headers={"A2A-Version": "1.0"},
                    ssl=context,
                ) as response,
            ):
                answer: dict[str, Any] = await response.json()
                return answer

        assert (await http_get_task(app))["result"]["id"] == sent.task.id
        other = await http_get_task(pki.issue("other", "other-app"))
        assert other["error"]["code"] == -32001  # not found: not its task
        # A certificate of our CA that maps to no principal: UNAUTHENTICATED.
        stranger = channel_credentials(pki, pki.issue("stranger", "stranger"))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call(target, "SendMessage", send_request(), (), stranger)
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert error_info(caught.value) == ("UNAUTHENTICATED", "a2a-protocol.org")
        # No certificate, one of another CA, or no TLS at all: the handshake fails.
        for credentials in (
            channel_credentials(pki, None),
            channel_credentials(pki, rogue_pki.issue("app", "partner-app")),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call(target, "SendMessage", send_request(), (), credentials)
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call(target, "SendMessage", send_request(), ())
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        # Our client over gRPC with TLS: the card over https, the channel with our cert.
        app_cert, app_key = app
        mine = TLSConfig(ca=pki.ca_file, client_cert=app_cert, client_key=app_key)
        credentials = ClientCredentials(client_certificate=True)
        async with A2AClient(
            f"https://127.0.0.1:{peer.port}", tls=mine, credentials=credentials, bindings=["GRPC"]
        ) as client:
            assert client.binding == "GRPC"
            outcome = await (await client.send({"text": "tls"}, task_type="echo")).result(10)
            assert outcome.ok


# --- the official SDK's gRPC client ---------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["apiKeyHeader", "bearer", "oauth"])
async def test_the_sdk_grpc_client_meets_each_scheme_it_knows(
    agent: GrpcAgent, scheme: str
) -> None:
    """The SDK's `AuthInterceptor` sends Bearer tokens and header API keys as service
    parameters, which its gRPC transport puts in the metadata (lower-cased)."""
    import grpc
    import httpx
    from a2a.client import ClientConfig, ClientFactory
    from a2a.client.auth.interceptor import AuthInterceptor
    from a2a.client.errors import A2AClientError
    from google.protobuf.json_format import MessageToDict
    from test_a2a_sdk_security import Fixed, message

    credential = {"apiKeyHeader": "hk-1", "bearer": "bt-1", "oauth": agent.issuer.mint()}[scheme]

    async def state(credentials: dict[str, str]) -> str:
        async with httpx.AsyncClient(timeout=10) as http:
            config = ClientConfig(
                streaming=False,
                httpx_client=http,
                supported_protocol_bindings=["GRPC"],
                grpc_channel_factory=grpc.aio.insecure_channel,
            )
            client = await ClientFactory(config).create_from_url(
                agent.base, interceptors=[AuthInterceptor(Fixed(credentials))]
            )
            try:
                events = [MessageToDict(e) async for e in client.send_message(message())]
            finally:
                await client.close()
        result: str = events[-1]["task"]["status"]["state"]
        return result

    assert await state({scheme: credential}) == "TASK_STATE_COMPLETED"
    with pytest.raises(A2AClientError):
        await state({scheme: "wrong"})
    with pytest.raises(A2AClientError):
        await state({})


async def test_the_sdk_grpc_client_over_mutual_tls(pki: Pki) -> None:
    """The SDK's gRPC client on a channel of its own with our CA and a client certificate:
    served when the certificate maps to a principal, refused when it does not."""
    import ssl

    import grpc
    import httpx
    from a2a.client import ClientConfig, ClientFactory
    from a2a.client.errors import A2AClientError
    from google.protobuf.json_format import MessageToDict
    from test_a2a_sdk_security import message

    cert, key = pki.issue("agent-sm", "agent-sm")
    tls = TLSConfig(cert=cert, key=key, client_ca=pki.ca_file)
    policy = SecurityPolicy({"mtls": MutualTlsScheme({"partner-app": "app"})})
    peer = Peer("agent-sm", handler=DemoHandler(), config=FAST, tls=tls)
    enable_a2a(peer, security=policy, grpc_port=0, bindings=["GRPC", "JSONRPC"])
    async with peer:
        base = f"https://127.0.0.1:{peer.port}"

        async def state(pair: tuple[Any, Any]) -> str:
            verify = ssl.create_default_context(cafile=str(pki.ca_file))
            verify.load_cert_chain(str(pair[0]), str(pair[1]))
            credentials = channel_credentials(pki, pair)
            async with httpx.AsyncClient(timeout=10, verify=verify) as http:
                config = ClientConfig(
                    streaming=True,
                    httpx_client=http,
                    supported_protocol_bindings=["GRPC"],
                    grpc_channel_factory=lambda url: grpc.aio.secure_channel(url, credentials),
                )
                client = await ClientFactory(config).create_from_url(base)
                try:
                    events = [MessageToDict(e) async for e in client.send_message(message())]
                finally:
                    await client.close()
            last = events[-1]
            result: str = (last.get("task") or last["statusUpdate"])["status"]["state"]
            return result

        assert await state(pki.issue("app", "partner-app")) == "TASK_STATE_COMPLETED"
        with pytest.raises(A2AClientError, match="UNAUTHENTICATED"):
            await state(pki.issue("stranger", "stranger"))


async def test_an_unreachable_issuer_is_unavailable_over_grpc(agent: GrpcAgent) -> None:
    """As over HTTP (503, -32101): the token may be good, the caller is told to retry."""
    token = agent.issuer.mint()
    await agent.issuer.stop()
    exc = await refused(
        agent.target,
        "SendMessage",
        send_request(),
        (bearer(token),),
        "UNAVAILABLE",
        "AGENT_NOT_READY",
    )
    from google.rpc import error_details_pb2, status_pb2

    status = status_pb2.Status.FromString(dict(exc.trailing_metadata())["grpc-status-details-bin"])
    info = error_details_pb2.ErrorInfo()
    status.details[0].Unpack(info)
    assert dict(info.metadata) == {"reason": "issuer_unavailable"}
    # Our client reports it alike on every binding.
    for binding in ("GRPC", "HTTP+JSON", "JSONRPC"):
        async with A2AClient(
            agent.base, credentials=ClientCredentials(bearer=token), bindings=[binding]
        ) as client:
            with pytest.raises(A2AError) as caught:
                await client.send({"text": "x"}, task_type="echo")
            assert caught.value.code == A2ACode.AGENT_NOT_READY, binding
            assert caught.value.metadata.get("reason") == "issuer_unavailable", binding


async def test_the_grpc_port_serves_tls_with_an_encrypted_key(pki: Pki) -> None:
    """gRPC takes unencrypted PEM only: the key (and its password) of the peer's TLS settings
    is decrypted in memory; a client that does not trust our CA is refused."""
    import grpc
    from a2a.types import a2a_pb2
    from cryptography.hazmat.primitives import serialization

    cert, key = pki.issue("agent-ge", "agent-ge")
    loaded = serialization.load_pem_private_key(key.read_bytes(), None)
    encrypted = key.with_suffix(".enc.key")
    encrypted.write_bytes(
        loaded.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"key-password"),
        )
    )
    tls = TLSConfig(cert=cert, key=encrypted, key_password="key-password")
    peer = Peer("agent-ge", handler=DemoHandler(), config=FAST, tls=tls)
    server = enable_a2a(peer, security=SecurityPolicy.bearer_tokens({"t": "x"}), grpc_port=0)
    async with peer:
        target = f"127.0.0.1:{server.grpc.port}"
        trusted = channel_credentials(pki, None)
        sent = await call(target, "SendMessage", send_request(), (bearer("t"),), trusted)
        assert sent.task.status.state == a2a_pb2.TASK_STATE_COMPLETED
        with pytest.raises(grpc.aio.AioRpcError) as caught:  # plaintext to a TLS port
            await call(target, "SendMessage", send_request(), (bearer("t"),))
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        # Our client: the card over https, then gRPC over TLS, verified against our CA.
        async with A2AClient(
            f"https://127.0.0.1:{peer.port}",
            tls=TLSConfig(ca=pki.ca_file),
            token="t",
            bindings=["GRPC"],
        ) as client:
            assert (await (await client.send({"text": "e"}, task_type="echo")).result(10)).ok
        # Without our CA, gRPC's default roots do not know the server: refused.
        client = A2AClient(
            f"https://127.0.0.1:{peer.port}",
            ssl=TLSConfig(ca=pki.ca_file).client_context(),
            token="t",
            bindings=["GRPC"],
        )
        async with client:
            with pytest.raises(A2AError, match="cannot reach"):
                await client.send({"text": "e"}, task_type="echo")
