"""Our A2A client's credentials: whatever the agent card asks for, sent the way it asks.

    credentials = ClientCredentials(
        oauth=OAuthClient("my-client", client_secret),     # client-credentials flow
        api_keys={"apiKey": "k-123"},                      # by scheme name ("*": any)
        basic=("alice", password), bearer=None,
    )
    async with A2AClient(url, credentials=credentials) as client: ...

After discovery, the first alternative of the card's `securityRequirements` (and, for a new
task of a skill, of that skill's) whose every scheme we hold a credential for is used: an
API key goes in the header, query parameter or cookie the card names; Bearer and Basic in
`Authorization`; OAuth 2.0 and OpenID Connect tokens are obtained from the card's token URL
(or the discovery document's `token_endpoint`) with the client-credentials grant, for the
scopes the requirement lists, cached until shortly before they expire; mTLS needs the
client certificate of the client's TLS settings.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import aiohttp
import msgspec
import structlog

from synapse.a2a import wire
from synapse.a2a.errors import A2ACode, A2AError

log = structlog.get_logger("synapse.a2a.client.auth")

#: A token is renewed this many seconds before it expires.
RENEW_MARGIN = 30.0


@dataclass(frozen=True, slots=True)
class OAuthClient:
    """An OAuth 2.0 client registered with the agent's issuer."""

    client_id: str
    client_secret: str = field(repr=False)
    #: Override the card's token URL (an issuer reached at another address, say).
    token_url: str | None = None
    #: Scopes asked for beyond those the card's requirement lists.
    extra_scopes: Sequence[str] = ()


@dataclass(slots=True)
class RequestAuth:
    """What to add to one request."""

    headers: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    cookies: dict[str, str] = field(default_factory=dict)

    def merge(self, other: RequestAuth) -> None:
        self.headers.update(other.headers)
        self.params.update(other.params)
        self.cookies.update(other.cookies)

    def header_items(self) -> dict[str, str]:
        headers = dict(self.headers)
        if self.cookies:
            headers["Cookie"] = "; ".join(f"{k}={quote(v)}" for k, v in self.cookies.items())
        return headers


class CredentialsMissing(A2AError):
    """The card asks for credentials this client was not given."""

    def __init__(self, message: str) -> None:
        super().__init__(A2ACode.AUTHENTICATION_FAILED, message, {"reason": "no_credentials"})


@dataclass
class ClientCredentials:
    """The credentials an `A2AClient` may present (each used only where a card asks)."""

    bearer: str | None = field(default=None, repr=False)
    basic: tuple[str, str] | None = field(default=None, repr=False)
    #: Scheme name → API key; the key `*` serves any API-key scheme.
    api_keys: Mapping[str, str] = field(default_factory=dict, repr=False)
    oauth: OAuthClient | None = None
    #: True when the client's TLS settings present a certificate (mTLS schemes).
    client_certificate: bool = False
    timeout: float = 10.0
    ssl: Any = True
    _tokens: dict[tuple[str, tuple[str, ...]], tuple[str, float]] = field(
        default_factory=dict, repr=False
    )
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)

    # --- choosing -----------------------------------------------------------------------------

    def _can(self, name: str, scheme: Mapping[str, Any]) -> bool:
        if "apiKeySecurityScheme" in scheme:
            return name in self.api_keys or "*" in self.api_keys
        if "httpAuthSecurityScheme" in scheme:
            kind = str(scheme["httpAuthSecurityScheme"].get("scheme", "")).lower()
            return (kind == "bearer" and self.bearer is not None) or (
                kind == "basic" and self.basic is not None
            )
        if "oauth2SecurityScheme" in scheme or "openIdConnectSecurityScheme" in scheme:
            return self.oauth is not None or self.bearer is not None
        if "mtlsSecurityScheme" in scheme:
            return self.client_certificate
        return False

    async def for_card(self, card: wire.AgentCard, *, skill: str | None = None) -> RequestAuth:
        """The credentials of a call to the agent of `card` (a new task of `skill`, if any)."""
        auth = await self._satisfy(card, card.security_requirements, "the agent")
        if skill is not None:
            for declared in card.skills:
                if declared.id == skill and declared.security_requirements:
                    extra = await self._satisfy(
                        card, declared.security_requirements, f"skill {skill!r}"
                    )
                    auth.merge(extra)
        return auth

    async def _satisfy(
        self,
        card: wire.AgentCard,
        requirements: Sequence[wire.SecurityRequirement],
        what: str,
    ) -> RequestAuth:
        if not requirements:
            return RequestAuth()
        for requirement in requirements:
            alternative = requirement.schemes
            schemes = {n: card.security_schemes.get(n) for n in alternative}
            if all(s is not None and self._can(n, s) for n, s in schemes.items()):
                auth = RequestAuth()
                for name, scheme in schemes.items():
                    assert scheme is not None
                    auth.merge(await self._apply(name, scheme, alternative[name].values))
                return auth
        wanted = " or ".join("+".join(r.schemes) or "(nothing)" for r in requirements)
        raise CredentialsMissing(f"{what} asks for {wanted}; this client has none of them")

    async def _apply(
        self, name: str, scheme: Mapping[str, Any], scopes: Sequence[str]
    ) -> RequestAuth:
        auth = RequestAuth()
        if "apiKeySecurityScheme" in scheme:
            spec = scheme["apiKeySecurityScheme"]
            key = self.api_keys.get(name) or self.api_keys["*"]
            location, param = str(spec.get("location", "header")).lower(), str(spec.get("name"))
            if location == "query":
                auth.params[param] = key
            elif location == "cookie":
                auth.cookies[param] = key
            else:
                auth.headers[param] = key
        elif "httpAuthSecurityScheme" in scheme:
            kind = str(scheme["httpAuthSecurityScheme"].get("scheme", "")).lower()
            if kind == "basic" and self.basic is not None:
                raw = f"{self.basic[0]}:{self.basic[1]}".encode()
                auth.headers["Authorization"] = "Basic " + base64.b64encode(raw).decode()
            elif self.bearer is not None:
                auth.headers["Authorization"] = f"Bearer {self.bearer}"
        elif "oauth2SecurityScheme" in scheme or "openIdConnectSecurityScheme" in scheme:
            if self.oauth is None:
                assert self.bearer is not None
                auth.headers["Authorization"] = f"Bearer {self.bearer}"
            else:
                token_url = self.oauth.token_url or await self._token_url(scheme)
                token = await self.access_token(token_url, [*scopes, *self.oauth.extra_scopes])
                auth.headers["Authorization"] = f"Bearer {token}"
        return auth

    async def _token_url(self, scheme: Mapping[str, Any]) -> str:
        if "oauth2SecurityScheme" in scheme:
            flows = scheme["oauth2SecurityScheme"].get("flows") or {}
            flow = flows.get("clientCredentials") or {}
            url = flow.get("tokenUrl")
            if not isinstance(url, str) or not url:
                raise CredentialsMissing(
                    "the card's OAuth 2.0 scheme has no clientCredentials flow"
                )
            return url
        discovery = scheme["openIdConnectSecurityScheme"].get("openIdConnectUrl")
        document = await self._get_json(str(discovery))
        url = document.get("token_endpoint") if isinstance(document, dict) else None
        if not isinstance(url, str):
            raise CredentialsMissing(f"{discovery} names no token_endpoint")
        return url

    def forget(self) -> bool:
        """Drop the tokens obtained so far (the agent refused one); True if there were any."""
        had = bool(self._tokens)
        self._tokens.clear()
        return had

    # --- the client-credentials grant ----------------------------------------------------------

    async def access_token(self, token_url: str, scopes: Sequence[str]) -> str:
        """A token for `scopes` from `token_url` (cached until `RENEW_MARGIN` before expiry)."""
        assert self.oauth is not None
        key = (token_url, tuple(sorted(set(scopes))))
        async with self._lock:
            cached = self._tokens.get(key)
            if cached is not None and cached[1] - RENEW_MARGIN > time.monotonic():
                return cached[0]
            form = {"grant_type": "client_credentials"}
            if key[1]:
                form["scope"] = " ".join(key[1])
            # RFC 6749 §2.3.1: id and secret form-urlencoded, then HTTP Basic.
            pair = (
                f"{quote(self.oauth.client_id, safe='')}:{quote(self.oauth.client_secret, safe='')}"
            )
            basic = "Basic " + base64.b64encode(pair.encode()).decode()
            try:
                async with (
                    aiohttp.ClientSession(
                        timeout=aiohttp.ClientTimeout(total=self.timeout)
                    ) as session,
                    session.post(
                        token_url,
                        data=form,
                        headers={"Authorization": basic},
                        ssl=self.ssl,
                        allow_redirects=False,
                    ) as response,
                ):
                    body = await response.read()
                    status = response.status
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise A2AError(
                    A2ACode.AUTHENTICATION_FAILED, f"token request failed: {exc!r}"
                ) from exc
            try:
                data = msgspec.json.decode(body)
            except msgspec.DecodeError:
                data = None
            token = data.get("access_token") if isinstance(data, dict) else None
            if status != 200 or not isinstance(token, str):
                error = data.get("error") if isinstance(data, dict) else None
                raise A2AError(
                    A2ACode.AUTHENTICATION_FAILED,
                    f"the issuer refused the token request: HTTP {status} {error or ''}".strip(),
                )
            expires_in = data.get("expires_in")
            lifetime = float(expires_in) if isinstance(expires_in, int | float) else 300.0
            self._tokens[key] = (token, time.monotonic() + lifetime)
            log.info("access_token_obtained", token_url=token_url, scopes=list(key[1]))
            return token

    async def _get_json(self, url: str) -> Any:
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout)) as session,
                session.get(url, ssl=self.ssl, allow_redirects=False) as response,
            ):
                return msgspec.json.decode(await response.read())
        except (aiohttp.ClientError, TimeoutError, msgspec.DecodeError) as exc:
            raise A2AError(A2ACode.AUTHENTICATION_FAILED, f"cannot fetch {url}: {exc!r}") from exc


__all__ = [
    "ClientCredentials",
    "CredentialsMissing",
    "OAuthClient",
    "RequestAuth",
]
