"""Every A2A security scheme, declared in the card and enforced, over real loopback HTTP.

One agent accepts each scheme alone (API key in a header, a query parameter or a cookie,
HTTP Bearer, HTTP Basic, OAuth 2.0 JWTs of a local issuer); the `slow` skill needs an OAuth
token with scope `tasks:slow`, and `CancelTask` scope `tasks:cancel`. Tokens are minted
by the tests' issuer (joserfc): expired, for another audience or issuer, without the
scope, or signed by another key, each is refused.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from issuer import Issuer
from joserfc.jwk import ECKey
from seckit import AUDIENCE

from synapse.a2a import A2AClient, ClientCredentials, OAuthClient, enable_a2a
from synapse.a2a.client.auth import CredentialsMissing
from synapse.a2a.errors import A2AError
from synapse.a2a.server.security import (
    ApiKeyScheme,
    HttpBasicScheme,
    HttpBearerScheme,
    JwksSource,
    JwtValidator,
    OAuth2Scheme,
    OpenIdConnectScheme,
    SecurityPolicy,
)
from synapse.demo.handler import DemoHandler
from synapse.p2p.config import P2PConfig
from synapse.transport.peer import Peer

FAST = P2PConfig(max_retries=1, retry_base_delay=0.01, request_timeout=5)


@dataclass
class Agent:
    peer: Peer
    base: str
    issuer: Issuer

    @property
    def rpc(self) -> str:
        return self.base + "/a2a"


def oauth_scheme(issuer: Issuer) -> OAuth2Scheme:
    validator = JwtValidator(
        issuer=issuer.base, audience=AUDIENCE, jwks=JwksSource(issuer.jwks_url), leeway=0
    )
    return OAuth2Scheme(
        validator,
        token_url=issuer.token_url,
        scopes={"tasks:slow": "start slow tasks", "tasks:cancel": "cancel tasks"},
    )


@pytest.fixture
async def agent(issuer: Issuer) -> AsyncIterator[Agent]:
    policy = SecurityPolicy(
        {
            "apiKeyHeader": ApiKeyScheme({"hk-1": "alice"}, name="X-API-Key", location="header"),
            "apiKeyQuery": ApiKeyScheme({"qk-1": "bob"}, name="api_key", location="query"),
            "apiKeyCookie": ApiKeyScheme({"ck-1": "carol"}, name="a2a_key", location="cookie"),
            "bearer": HttpBearerScheme({"bt-1": "dave"}),
            "basic": HttpBasicScheme({"erin": "pw-erin"}),
            "oauth": oauth_scheme(issuer),
        },
        skill_requirements={"slow": [{"oauth": ["tasks:slow"]}]},
        method_scopes={"CancelTask": ["tasks:cancel"]},
    )
    peer = Peer("agent-s", handler=DemoHandler(), config=FAST)
    enable_a2a(peer, security=policy)
    await peer.start()
    try:
        yield Agent(peer, f"http://127.0.0.1:{peer.port}", issuer)
    finally:
        await peer.close(drain_timeout=0.2)


def send_body(task_type: str = "echo", payload: Any = None) -> dict[str, Any]:
    message = {
        "messageId": "m-1",
        "role": "ROLE_USER",
        "parts": [{"data": payload or {"text": "hi"}}],
        "metadata": {"task_type": task_type},
    }
    return {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": message}}


async def rpc(
    url: str,
    body: dict[str, Any],
    *,
    headers: dict[str, str] | None = None,
    params: dict[str, str] | None = None,
    cookies: dict[str, str] | None = None,
) -> tuple[int, dict[str, Any], dict[str, str]]:
    async with (
        aiohttp.ClientSession(cookies=cookies) as session,
        session.post(
            url,
            json=body,
            headers={"A2A-Version": "1.0", **(headers or {})},
            params=params,
        ) as response,
    ):
        return response.status, await response.json(), dict(response.headers)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def basic(user: str, password: str) -> dict[str, str]:
    raw = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {raw}"}


async def test_the_card_declares_every_scheme_and_the_skill_requirement(agent: Agent) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.get(agent.base + "/.well-known/agent-card.json") as response,
    ):
        card = await response.json()
    schemes = card["securitySchemes"]
    assert schemes["apiKeyHeader"]["apiKeySecurityScheme"] == {
        "description": "An API key the operator issued.",
        "location": "header",
        "name": "X-API-Key",
    }
    assert schemes["apiKeyQuery"]["apiKeySecurityScheme"]["location"] == "query"
    assert schemes["apiKeyCookie"]["apiKeySecurityScheme"]["location"] == "cookie"
    assert schemes["bearer"]["httpAuthSecurityScheme"]["scheme"] == "Bearer"
    assert schemes["basic"]["httpAuthSecurityScheme"]["scheme"] == "Basic"
    flow = schemes["oauth"]["oauth2SecurityScheme"]["flows"]["clientCredentials"]
    assert flow["tokenUrl"] == agent.issuer.token_url
    assert set(flow["scopes"]) == {"tasks:slow", "tasks:cancel"}
    assert len(card["securityRequirements"]) == 6  # each scheme alone
    slow = next(s for s in card["skills"] if s["id"] == "slow")
    assert slow["securityRequirements"] == [{"schemes": {"oauth": {"list": ["tasks:slow"]}}}]
    assert card["capabilities"]["extendedAgentCard"] is True


@pytest.mark.parametrize(
    ("headers", "params", "cookies"),
    [
        ({"X-API-Key": "hk-1"}, None, None),
        (None, {"api_key": "qk-1"}, None),
        (None, None, {"a2a_key": "ck-1"}),
        (bearer("bt-1"), None, None),
        (basic("erin", "pw-erin"), None, None),
    ],
    ids=["api-key-header", "api-key-query", "api-key-cookie", "bearer", "basic"],
)
async def test_each_static_credential_is_accepted_where_the_card_says(
    agent: Agent,
    headers: dict[str, str] | None,
    params: dict[str, str] | None,
    cookies: dict[str, str] | None,
) -> None:
    status, body, _ = await rpc(
        agent.rpc, send_body(), headers=headers, params=params, cookies=cookies
    )
    assert status == 200, body
    assert body["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"


@pytest.mark.parametrize(
    ("headers", "params", "cookies"),
    [
        ({}, None, None),
        ({"X-API-Key": "hk-2"}, None, None),
        ({"X-API-Key": "qk-1"}, None, None),  # a query key is not a header key
        (None, {"api_key": "hk-1"}, None),
        (None, None, {"a2a_key": "nope"}),
        (bearer("bt-2"), None, None),
        (basic("erin", "wrong"), None, None),
        (basic("mallory", "pw-erin"), None, None),
        ({"Authorization": "Basic !!!"}, None, None),
    ],
    ids=[
        "nothing",
        "unknown-header-key",
        "key-in-the-wrong-place",
        "query-key-of-the-header",
        "unknown-cookie",
        "unknown-bearer",
        "wrong-password",
        "unknown-user",
        "malformed-basic",
    ],
)
async def test_missing_or_wrong_credentials_are_401(
    agent: Agent,
    headers: dict[str, str] | None,
    params: dict[str, str] | None,
    cookies: dict[str, str] | None,
) -> None:
    status, body, response_headers = await rpc(
        agent.rpc, send_body(), headers=headers, params=params, cookies=cookies
    )
    assert status == 401
    assert body["error"]["code"] == -32106
    assert body["error"]["data"][0]["reason"] == "UNAUTHENTICATED"
    assert response_headers["WWW-Authenticate"]


async def test_a_token_of_the_issuer_is_accepted_and_names_the_principal(agent: Agent) -> None:
    token = agent.issuer.mint(sub="svc-reports")
    status, body, _ = await rpc(agent.rpc, send_body(), headers=bearer(token))
    assert status == 200, body
    task_id = body["result"]["task"]["id"]
    # The task belongs to the token's subject: an API-key caller does not see it.
    get = {"jsonrpc": "2.0", "id": 2, "method": "GetTask", "params": {"id": task_id}}
    status, body, _ = await rpc(
        agent.rpc, get, headers=bearer(agent.issuer.mint(sub="svc-reports"))
    )
    assert status == 200 and body["result"]["id"] == task_id
    status, body, _ = await rpc(agent.rpc, get, headers={"X-API-Key": "hk-1"})
    assert body["error"]["code"] == -32001


@pytest.mark.parametrize(
    "kind", ["expired", "wrong-audience", "wrong-issuer", "forged", "no-expiry", "not-yet-valid"]
)
async def test_bad_tokens_are_refused(agent: Agent, kind: str) -> None:
    issuer = agent.issuer
    now_expired = {"exp": 1_000_000, "iat": 999_000}
    tokens = {
        "expired": lambda: issuer.mint(**now_expired),
        "wrong-audience": lambda: issuer.mint(aud="https://another.agent/a2a"),
        "wrong-issuer": lambda: issuer.mint(iss="https://evil.example"),
        # Same kid, another key: the signature does not verify under the issuer's JWKS.
        "forged": lambda: issuer.mint(key=ECKey.generate_key("P-256", {"kid": "k1"})),
        "no-expiry": lambda: issuer.mint(exp=None),
        "not-yet-valid": lambda: issuer.mint(nbf=4_000_000_000),
    }
    status, body, headers = await rpc(agent.rpc, send_body(), headers=bearer(tokens[kind]()))
    assert status == 401, body
    assert body["error"]["code"] == -32106
    assert 'error="invalid_token"' in headers["WWW-Authenticate"]


async def test_a_token_signed_with_a_symmetric_key_or_none_is_refused(agent: Agent) -> None:
    """Algorithm confusion: HS256 keyed with the issuer's public key, and `alg: none`."""

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    claims = json.dumps(
        {"iss": agent.issuer.base, "aud": AUDIENCE, "sub": "x", "exp": 4_000_000_000}
    ).encode()
    none_header = b64(json.dumps({"alg": "none", "kid": "k1"}).encode())
    none = f"{none_header}.{b64(claims)}."
    public = json.dumps(agent.issuer.key.as_dict(private=False)).encode()
    hs_header = b64(json.dumps({"alg": "HS256", "kid": "k1"}).encode())
    signing_input = f"{hs_header}.{b64(claims)}"
    mac = hmac.new(public, signing_input.encode(), hashlib.sha256).digest()
    hs256 = f"{signing_input}.{b64(mac)}"
    for token in (none, hs256, "not.a.jwt", "garbage"):
        status, body, _ = await rpc(agent.rpc, send_body(), headers=bearer(token))
        assert status == 401, (token, body)
        assert body["error"]["code"] == -32106


async def test_a_skill_needs_its_scope(agent: Agent) -> None:
    slow = send_body("slow", {"steps": 1, "delay": 0.01})
    # A valid API key or token without the scope may not start a slow task: 403, -32107.
    for headers in ({"X-API-Key": "hk-1"}, bearer(agent.issuer.mint(scope="tasks:cancel"))):
        status, body, response_headers = await rpc(agent.rpc, slow, headers=headers)
        assert status == 403, body
        assert body["error"]["code"] == -32107
    assert 'scope="tasks:slow"' in response_headers["WWW-Authenticate"]
    status, body, _ = await rpc(
        agent.rpc, slow, headers=bearer(agent.issuer.mint(scope="tasks:slow other"))
    )
    assert status == 200, body
    assert body["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"


async def test_a_method_needs_its_scope(agent: Agent) -> None:
    token = agent.issuer.mint(sub="svc", scope="tasks:slow")
    start = send_body("slow", {"steps": 50, "delay": 0.05})
    start["params"]["configuration"] = {"returnImmediately": True}
    status, body, _ = await rpc(agent.rpc, start, headers=bearer(token))
    task_id = body["result"]["task"]["id"]
    cancel = {"jsonrpc": "2.0", "id": 3, "method": "CancelTask", "params": {"id": task_id}}
    status, body, _ = await rpc(agent.rpc, cancel, headers=bearer(token))
    assert (status, body["error"]["code"]) == (403, -32107)
    allowed = agent.issuer.mint(sub="svc", scope="tasks:cancel")
    status, body, _ = await rpc(agent.rpc, cancel, headers=bearer(allowed))
    assert status == 200, body
    assert body["result"]["status"]["state"] == "TASK_STATE_CANCELED"


async def test_our_client_obtains_tokens_with_client_credentials(agent: Agent) -> None:
    credentials = ClientCredentials(oauth=OAuthClient("client-1", "client-secret-1"))
    async with A2AClient(agent.base, credentials=credentials) as client:
        outcome = await (await client.send({"text": "hi"}, task_type="echo")).result(10)
        assert outcome.ok
        # The slow skill's requirement lists its scope: the client asks for it.
        slow = await client.send({"steps": 1, "delay": 0.01}, task_type="slow")
        assert (await slow.result(10)).ok
    scopes = [request.get("scope", "") for request in agent.issuer.token_requests]
    assert "" in scopes and "tasks:slow" in scopes
    assert len(agent.issuer.token_requests) == 2  # cached per scope set


async def test_our_client_sends_api_keys_where_the_card_says(agent: Agent) -> None:
    for name, key in (("apiKeyQuery", "qk-1"), ("apiKeyCookie", "ck-1"), ("apiKeyHeader", "hk-1")):
        credentials = ClientCredentials(api_keys={name: key})
        async with A2AClient(agent.base, credentials=credentials) as client:
            assert (await (await client.send({"text": name}, task_type="echo")).result(10)).ok
    credentials = ClientCredentials(basic=("erin", "pw-erin"))
    async with A2AClient(agent.base, credentials=credentials) as client:
        assert (await (await client.send({"text": "b"}, task_type="echo")).result(10)).ok
        # Basic does not meet the slow skill's requirement: said before anything is sent.
        with pytest.raises(CredentialsMissing, match="skill 'slow' asks for oauth"):
            await client.send({"steps": 1}, task_type="slow")


async def test_a_refused_client_secret_is_a_clear_error(agent: Agent) -> None:
    credentials = ClientCredentials(oauth=OAuthClient("client-1", "wrong"))
    async with A2AClient(agent.base, credentials=credentials) as client:
        with pytest.raises(A2AError, match="the issuer refused the token request: HTTP 401"):
            await client.send({"text": "hi"}, task_type="echo")


async def test_openid_connect_discovery_finds_the_issuer_keys(issuer: Issuer) -> None:
    policy = SecurityPolicy({"oidc": OpenIdConnectScheme(issuer.discovery_url, audience=AUDIENCE)})
    peer = Peer("agent-o", handler=DemoHandler(), config=FAST)
    enable_a2a(peer, security=policy)
    async with peer:
        url = f"http://127.0.0.1:{peer.port}/a2a"
        status, body, _ = await rpc(url, send_body(), headers=bearer(issuer.mint()))
        assert status == 200, body
        status, body, _ = await rpc(url, send_body(), headers=bearer(issuer.mint(aud="x")))
        assert status == 401
        status, body, _ = await rpc(
            url, send_body(), headers=bearer(issuer.mint(key=ECKey.generate_key("P-256")))
        )
        assert status == 401
        # Our client follows the discovery document to the token endpoint.
        credentials = ClientCredentials(oauth=OAuthClient("client-1", "client-secret-1"))
        async with A2AClient(f"http://127.0.0.1:{peer.port}", credentials=credentials) as client:
            assert (await (await client.send({"text": "o"}, task_type="echo")).result(10)).ok


async def test_an_unknown_kid_refetches_the_jwks_once_per_interval(issuer: Issuer) -> None:
    """Rotated issuer keys are picked up; forged kids cannot make us hammer the issuer."""
    source = JwksSource(issuer.jwks_url, min_refresh=3600)
    validator = JwtValidator(issuer=issuer.base, audience=AUDIENCE, jwks=source)
    await validator.validate(issuer.mint())
    first = source._fetched_at
    with pytest.raises(A2AError):
        await validator.validate(issuer.mint(key=ECKey.generate_key("P-256", {"kid": "k9"})))
    assert source._fetched_at == first  # not refetched within the interval
    rotating = JwksSource(issuer.jwks_url, min_refresh=0)
    validator = JwtValidator(issuer=issuer.base, audience=AUDIENCE, jwks=rotating)
    await validator.validate(issuer.mint())
    issuer.key = ECKey.generate_key("P-256", {"kid": "k2"})  # the issuer rotates its key
    claims = await validator.validate(issuer.mint(sub="after-rotation"))
    assert claims["sub"] == "after-rotation"


async def test_an_unreachable_issuer_is_a_retry_not_a_refusal(agent: Agent) -> None:
    """The token may be good: while the issuer's keys cannot be had the caller gets -32101
    (HTTP 503), and callers with other credentials are not affected."""
    token = agent.issuer.mint()
    await agent.issuer.stop()
    status, body, _ = await rpc(agent.rpc, send_body(), headers=bearer(token))
    assert (status, body["error"]["code"]) == (503, -32101)
    assert body["error"]["data"][0]["metadata"]["reason"] == "issuer_unavailable"
    status, body, _ = await rpc(agent.rpc, send_body(), headers={"X-API-Key": "hk-1"})
    assert status == 200


async def test_verified_tokens_are_cached_until_they_expire(
    issuer: Issuer, monkeypatch: pytest.MonkeyPatch
) -> None:
    import joserfc.jwt

    validator = JwtValidator(
        issuer=issuer.base, audience=AUDIENCE, jwks=JwksSource(issuer.jwks_url), leeway=0
    )
    checked: list[Any] = []
    real = joserfc.jwt.decode

    def counting(token: Any, *args: Any, **kwargs: Any) -> Any:
        checked.append(token)
        return real(token, *args, **kwargs)

    monkeypatch.setattr(joserfc.jwt, "decode", counting)
    token = issuer.mint(sub="cached")
    assert (await validator.validate(token))["sub"] == "cached"
    assert (await validator.validate(token))["sub"] == "cached"
    assert checked == [token]  # the second call did not verify again
    # A cached token past its expiry is checked again — and refused.
    expired = issuer.mint(exp=1_000_000, iat=999_000)
    validator._verified[expired] = ({"sub": "stale"}, 1_000_000.0)
    with pytest.raises(A2AError, match="access token refused"):
        await validator.validate(expired)
    assert expired not in validator._verified


async def test_an_unchanged_card_reuses_its_signature_a_changed_one_is_signed_again() -> None:
    from synapse.a2a import CardSigner, CardVerifier, wire

    key = ECKey.generate_key("P-256", {"kid": "c"})
    signer = CardSigner(key)
    verifier = CardVerifier(keys=[dict(key.as_dict(private=False))])
    first = signer.sign(wire.AgentCard(name="a"))
    again = signer.sign(wire.AgentCard(name="a"))
    assert again.signatures == first.signatures
    changed = signer.sign(wire.AgentCard(name="b"))
    assert changed.signatures != first.signatures
    await verifier.verify(wire.to_builtins(changed))


async def test_a_refused_obtained_token_is_replaced_once(agent: Agent) -> None:
    """The issuer rotates its key: the agent refuses our cached token (401), the client gets
    a new one and the call goes through."""
    credentials = ClientCredentials(oauth=OAuthClient("client-1", "client-secret-1"))
    async with A2AClient(agent.base, credentials=credentials) as client:
        assert (await (await client.send({"text": "1"}, task_type="echo")).result(10)).ok
        # Our cached token was signed by a key the agent will not accept any more.
        cached = next(iter(credentials._tokens))
        credentials._tokens[cached] = (
            agent.issuer.mint(key=ECKey.generate_key("P-256", {"kid": "gone"})),
            credentials._tokens[cached][1],
        )
        assert (await (await client.send({"text": "2"}, task_type="echo")).result(10)).ok
    assert len(agent.issuer.token_requests) == 2


async def test_an_authenticated_caller_without_the_skill_credential_is_403_not_401(
    agent: Agent,
) -> None:
    """A static bearer token is a valid credential, not an OAuth token: the slow skill is
    forbidden to it (403), it is not unauthenticated (401)."""
    slow = send_body("slow", {"steps": 1, "delay": 0.01})
    status, body, _ = await rpc(agent.rpc, slow, headers=bearer("bt-1"))
    assert (status, body["error"]["code"]) == (403, -32107)
    assert "skill 'slow' needs another credential" in body["error"]["message"]


async def test_every_jsonrpc_method_and_rest_route_needs_a_credential(agent: Agent) -> None:
    """No operation of either HTTP binding is served without a credential (the public card
    aside): each is refused 401 with the same ErrorInfo, and served with a valid key."""
    from synapse.a2a.routes import ROUTES
    from synapse.a2a.server.operations import METHODS

    for method in METHODS:
        body = {"jsonrpc": "2.0", "id": 7, "method": method, "params": {}}
        status, answer, headers = await rpc(agent.rpc, body)
        assert (status, answer["error"]["code"]) == (401, -32106), method
        assert answer["error"]["data"][0]["reason"] == "UNAUTHENTICATED"
        assert headers["WWW-Authenticate"]
    async with aiohttp.ClientSession() as session:
        for route in ROUTES:
            path = route.path({"id": "t-1", "taskId": "t-1"})
            for headers in ({}, {"X-API-Key": "wrong"}):
                async with session.request(
                    route.verb,
                    agent.rpc + path,
                    json={} if route.body else None,
                    headers={"A2A-Version": "1.0", **headers},
                ) as response:
                    error = (await response.json())["error"]
                    assert response.status == 401, (route, error)
                    assert error["status"] == "UNAUTHENTICATED"
                    assert error["details"][0]["reason"] == "UNAUTHENTICATED"
        async with session.get(
            agent.rpc + "/extendedAgentCard",
            headers={"A2A-Version": "1.0", "X-API-Key": "hk-1"},
        ) as response:
            assert response.status == 200
        async with session.get(agent.base + "/.well-known/agent-card.json") as response:
            assert response.status == 200


async def test_skill_and_method_scopes_over_rest(agent: Agent) -> None:
    async with aiohttp.ClientSession() as session:

        async def post(path: str, body: Any, token: str) -> tuple[int, Any]:
            async with session.post(
                agent.rpc + path,
                json=body,
                headers={"A2A-Version": "1.0", **bearer(token)},
            ) as response:
                return response.status, await response.json()

        slow = send_body("slow", {"steps": 50, "delay": 0.05})["params"]
        status, answer = await post("/message:send", slow, agent.issuer.mint(scope="x"))
        assert (status, answer["error"]["status"]) == (403, "PERMISSION_DENIED")
        slow["configuration"] = {"returnImmediately": True}
        status, answer = await post(
            "/message:send", slow, agent.issuer.mint(sub="s", scope="tasks:slow")
        )
        assert status == 200, answer
        task_id = answer["task"]["id"]
        status, answer = await post(
            f"/tasks/{task_id}:cancel", {}, agent.issuer.mint(sub="s", scope="tasks:slow")
        )
        assert (status, answer["error"]["status"]) == (403, "PERMISSION_DENIED")
        status, answer = await post(
            f"/tasks/{task_id}:cancel", {}, agent.issuer.mint(sub="s", scope="tasks:cancel")
        )
        assert status == 200 and answer["status"]["state"] == "TASK_STATE_CANCELED"


@pytest.mark.parametrize("binding", ["JSONRPC", "HTTP+JSON"])
async def test_our_client_sends_each_credential_on_each_http_binding(
    agent: Agent, binding: str
) -> None:
    for credentials in (
        ClientCredentials(api_keys={"apiKeyHeader": "hk-1"}),
        ClientCredentials(api_keys={"apiKeyQuery": "qk-1"}),
        ClientCredentials(api_keys={"apiKeyCookie": "ck-1"}),
        ClientCredentials(basic=("erin", "pw-erin")),
        ClientCredentials(bearer="bt-1"),
        ClientCredentials(oauth=OAuthClient("client-1", "client-secret-1")),
    ):
        async with A2AClient(agent.base, credentials=credentials, bindings=[binding]) as client:
            assert client.binding == binding
            handle = await client.send({"text": "b"}, task_type="echo", stream=True)
            assert (await handle.result(10)).ok
            assert (await client.get_task(handle.task_id)).id == handle.task_id
            await client.get_extended_card()


async def test_a_discovery_document_naming_another_issuer_is_not_trusted(issuer: Issuer) -> None:
    """OpenID Connect Discovery: the issuer must be the URL the document is under."""
    from aiohttp import web

    from synapse.a2a.server.security import IssuerUnavailable, Presented

    async def lying(_request: web.Request) -> web.Response:
        return web.json_response({"issuer": "https://evil.example", "jwks_uri": issuer.jwks_url})

    app = web.Application()
    app.router.add_get("/.well-known/openid-configuration", lying)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        base = f"http://127.0.0.1:{runner.addresses[0][1]}"
        scheme = OpenIdConnectScheme(base + "/.well-known/openid-configuration", audience=AUDIENCE)
        token = issuer.mint(iss="https://evil.example")
        with pytest.raises(IssuerUnavailable, match="not the URL it is under"):
            await scheme.authenticate(Presented({"authorization": f"Bearer {token}"}))
    finally:
        await runner.cleanup()


async def test_an_agent_reached_under_two_names_accepts_either_audience(issuer: Issuer) -> None:
    """Its HTTP URL and its gRPC address, say: a token for either passes, another is refused."""
    from synapse.a2a.server.security import AuthError, Presented

    grpc_audience = "agent.test:50051"
    validator = JwtValidator(
        issuer=issuer.base, audience=[AUDIENCE, grpc_audience], jwks=JwksSource(issuer.jwks_url)
    )
    scheme = OAuth2Scheme(validator, token_url=issuer.token_url)
    for audience in (AUDIENCE, grpc_audience, [grpc_audience, "elsewhere"]):
        token = issuer.mint(aud=audience)
        identity = await scheme.authenticate(Presented({"authorization": f"Bearer {token}"}))
        assert identity is not None
    with pytest.raises(AuthError):
        token = issuer.mint(aud="https://another.agent/a2a")
        await scheme.authenticate(Presented({"authorization": f"Bearer {token}"}))
    for bad in ([], "", [""]):
        with pytest.raises(ValueError, match="audience"):
            JwtValidator(issuer=issuer.base, audience=bad, jwks=JwksSource(issuer.jwks_url))


def test_what_a_call_presents_never_shows_its_credentials() -> None:
    from synapse.a2a.server.security import Presented

    presented = Presented(
        {"authorization": "Bearer s3cret-token"}, {"api_key": "qk-secret"}, {"k": "ck-secret"}
    )
    assert not any(secret in repr(presented) for secret in ("s3cret", "qk-secret", "ck-secret"))


async def test_a_jwt_subject_named_like_an_api_key_principal_is_another_principal(
    agent: Agent,
) -> None:
    """The API key hk-1 names `alice`; a JWT of the issuer with `sub: alice` is
    `ISSUER#alice`: it does not see alice's task, and alice does not see its."""
    status, body, _ = await rpc(agent.rpc, send_body(), headers={"X-API-Key": "hk-1"})
    assert status == 200, body
    task_id = body["result"]["task"]["id"]
    get = {"jsonrpc": "2.0", "id": 2, "method": "GetTask", "params": {"id": task_id}}
    jwt_alice = bearer(agent.issuer.mint(sub="alice"))
    status, body, _ = await rpc(agent.rpc, get, headers=jwt_alice)
    assert body["error"]["code"] == -32001, body
    status, body, _ = await rpc(agent.rpc, send_body(), headers=jwt_alice)
    assert status == 200, body
    theirs = {
        "jsonrpc": "2.0",
        "id": 3,
        "method": "GetTask",
        "params": {"id": body["result"]["task"]["id"]},
    }
    status, body, _ = await rpc(agent.rpc, theirs, headers={"X-API-Key": "hk-1"})
    assert body["error"]["code"] == -32001, body
