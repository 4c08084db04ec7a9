"""Every A2A security scheme, declared in the agent card and enforced on each call.

`SecurityPolicy` is the one place that decides, for every binding (JSON-RPC, HTTP+JSON/REST,
gRPC): each binding turns its call into a `Presented` (what the call presents: headers or
gRPC metadata, query parameters, cookies, the verified TLS client certificate), then asks
`await policy.authenticate(presented)` before it reads a body, `policy.authorize_method(...)`
once it knows the method, `await policy.authorize_skill(...)` before a new task of a skill
(task type) starts; `policy.declare(card)` writes the card's `securitySchemes`,
`securityRequirements` and each skill's `securityRequirements`. The schemes:

- `ApiKeyScheme`: `apiKeySecurityScheme` (`location` header, query or cookie; `name`); a key
  the operator issued;
- `HttpBearerScheme`: `httpAuthSecurityScheme` `Bearer`; an opaque token the operator issued;
- `HttpBasicScheme`: `httpAuthSecurityScheme` `Basic`; a user and password;
- `OAuth2Scheme`: `oauth2SecurityScheme` (client-credentials flow: token URL, scopes); a JWT
  access token (`Authorization: Bearer`) validated against the issuer's JWKS;
- `OpenIdConnectScheme`: `openIdConnectSecurityScheme` (discovery URL); a JWT of the
  discovered issuer, checked against its `jwks_uri`;
- `MutualTlsScheme`: `mtlsSecurityScheme`; the verified TLS client certificate (the peer
  must require one).

Requirements follow OpenAPI's rule, as A2A does: a list of alternatives, each naming the
schemes that must *all* be satisfied, with the scopes each must grant. Tokens are checked
with `joserfc` (signature against the issuer's keys, `iss`, `aud`, `exp`/`nbf`, algorithm
allow-list); nothing here parses or verifies a JWT by hand.

A missing or invalid credential is -32106 (HTTP 401 with a `WWW-Authenticate` challenge,
gRPC UNAUTHENTICATED); a valid one lacking a scope or the right to a skill is -32107 (HTTP
403, gRPC PERMISSION_DENIED).

gRPC has no query string and no cookie jar: over gRPC an API key declared `location: header`
or `location: query` comes in the metadata entry of its name (lower-cased, as gRPC metadata
keys are, and as the official SDK's clients send service parameters), one declared `cookie`
in a `cookie` metadata entry (as HTTP/2 carries cookies).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from http.cookies import CookieError, SimpleCookie
from typing import Any, Protocol

import structlog
from aiohttp import web

from synapse.a2a import wire
from synapse.a2a.errors import A2ACode, A2AError
from synapse.a2a.fetching import IssuerUnavailable, fetch_json
from synapse.transport.tls import map_principal, peer_certificate, pem_certificate_dict

log = structlog.get_logger("synapse.a2a.server.security")

#: Where the HTTP bindings keep a request's `Presented` (a typed
#: `web.RequestKey` where aiohttp has them).
REQUEST_KEY: Any = (
    web.RequestKey("synapse.a2a.auth", object) if hasattr(web, "RequestKey") else "synapse.a2a.auth"
)
#: Algorithms accepted for access tokens unless a scheme says otherwise (no `none`, no HMAC:
#: an issuer's public keys must not double as shared secrets).
DEFAULT_JWT_ALGORITHMS: tuple[str, ...] = (
    "Ed25519",
    "RS256",
    "RS384",
    "RS512",
    "PS256",
    "ES256",
    "ES384",
    "EdDSA",
)


class AuthError(A2AError):
    """A refused credential: 401 (`AUTHENTICATION_FAILED`) or 403 (`AUTHORIZATION_FAILED`)."""

    def __init__(self, message: str, *, forbidden: bool = False, challenge: str = "") -> None:
        super().__init__(
            A2ACode.AUTHORIZATION_FAILED if forbidden else A2ACode.AUTHENTICATION_FAILED,
            message,
            http_status=403 if forbidden else 401,
        )
        #: The `WWW-Authenticate` header value of the answer.
        self.www_authenticate = challenge


#: Headers a call may repeat, each a list: their values are joined with commas (RFC 9110
#: §5.3). Any other repeated header counts once, as its first value (a credential, say).
_LISTS = frozenset({"a2a-extensions", "x-a2a-extensions"})


def _add_header(headers: dict[str, str], name: str, value: str) -> None:
    if name in _LISTS and name in headers:
        headers[name] = f"{headers[name]},{value}"
    else:
        headers.setdefault(name, value)


@dataclass(frozen=True, slots=True)
class CallerIdentity:
    """Who a credential proved the caller is."""

    principal: str
    scheme: str
    scopes: frozenset[str] = frozenset()
    claims: Mapping[str, Any] = field(default_factory=dict)


#: Who the A2A call being served comes from, once a binding has authenticated it (its task
#: runs the operation in the same context); None outside a call.
CURRENT_CALLER: ContextVar[CallerIdentity | None] = ContextVar("a2a_caller", default=None)

#: What an authenticated caller sees beyond the public card: `(card, caller) → card`, given
#: the public card built afresh (change it in place or return another); the SDK's extended
#: card modifier. Per principal, scheme, scope or claim: `caller` says who it is.
ExtendedCard = Callable[[wire.AgentCard, CallerIdentity], wire.AgentCard]


class Scheme(Protocol):
    """One security scheme: its card entry and the check of its credential."""

    def card_entry(self) -> dict[str, Any]: ...

    def challenge(self) -> str: ...

    async def authenticate(self, presented: Presented) -> CallerIdentity | None:
        """The caller's identity; None when the call carries no such credential.

        Raises `AuthError` for a credential that is present but not valid.
        """
        ...


@dataclass(slots=True)
class Presented:
    """What one call presents, whatever its binding: the one input of every scheme.

    `headers` are lower-cased names (HTTP headers, or gRPC metadata); `query` the query
    parameters (over gRPC, the metadata: it has no query string); `cookies`; `certificate`
    the verified TLS client certificate in `ssl.getpeercert()` form, if any.
    """

    # Credentials: never in a repr (a log line, a traceback).
    headers: Mapping[str, str] = field(repr=False)
    query: Mapping[str, str] = field(default_factory=dict, repr=False)
    cookies: Mapping[str, str] = field(default_factory=dict, repr=False)
    certificate: Mapping[str, Any] | None = None
    binding: str = "http"
    #: What the schemes said so far (each scheme is asked at most once per call).
    seen: _Seen = field(default_factory=lambda: _Seen(), repr=False)

    @classmethod
    def from_http(cls, request: web.Request) -> Presented:
        headers: dict[str, str] = {}
        for name, value in request.headers.items():
            _add_header(headers, name.lower(), value)
        query = {name: request.query[name] for name in request.query}
        certificate = peer_certificate(request.transport)
        return cls(headers, query, dict(request.cookies), certificate, "http")

    @classmethod
    def from_grpc(
        cls, metadata: Iterable[tuple[str, Any]], auth_context: Mapping[str, Any]
    ) -> Presented:
        """A gRPC call: its invocation metadata and `ServicerContext.auth_context()`."""
        headers: dict[str, str] = {}
        cookies: dict[str, str] = {}
        for key, value in metadata:
            if not isinstance(value, str):
                continue  # `-bin` entries carry no credential
            name = key.lower()
            _add_header(headers, name, value)
            if name == "cookie":
                cookies.update(_cookies(value))
        certificate = None
        pem = auth_context.get("x509_pem_cert")
        if pem:
            raw = pem[0] if isinstance(pem, list | tuple) else pem
            certificate = pem_certificate_dict(raw if isinstance(raw, bytes) else str(raw).encode())
        return cls(headers, headers, cookies, certificate, "grpc")


def _cookies(header: str) -> dict[str, str]:
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(header)
    except CookieError:
        return {}
    return {name: morsel.value for name, morsel in jar.items()}


def _match(given: str, known: Mapping[str, str]) -> str | None:
    """The name of the secret equal to `given`, comparing every one in constant time."""
    found: str | None = None
    raw = given.encode("utf-8", "surrogatepass")
    for candidate, name in known.items():
        if hmac.compare_digest(raw, candidate.encode("utf-8", "surrogatepass")):
            found = name
    return found


def _bearer(presented: Presented) -> str | None:
    scheme, _, value = presented.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return None
    return value.strip() or None


# --- the schemes ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ApiKeyScheme:
    """An API key in a header, query parameter or cookie; `keys` maps each key to its principal."""

    keys: Mapping[str, str]
    name: str = "X-API-Key"
    location: str = "header"
    description: str = "An API key the operator issued."

    def __post_init__(self) -> None:
        if self.location not in ("header", "query", "cookie"):
            raise ValueError(f"API key location must be header, query or cookie: {self.location}")
        if not self.keys or any(not key for key in self.keys):
            raise ValueError("an API key scheme needs non-empty keys")

    def card_entry(self) -> dict[str, Any]:
        return {
            "apiKeySecurityScheme": {
                "description": self.description,
                "location": self.location,
                "name": self.name,
            }
        }

    def challenge(self) -> str:
        return f'ApiKey realm="a2a", {self.location}="{self.name}"'

    async def authenticate(self, presented: Presented) -> CallerIdentity | None:
        if self.location == "header":
            given = presented.headers.get(self.name.lower())
        elif self.location == "query":
            # Over gRPC the metadata stands for the query string (its keys are lower-case).
            name = self.name if presented.binding == "http" else self.name.lower()
            given = presented.query.get(name)
        else:
            given = presented.cookies.get(self.name)
        if not given:
            return None
        principal = _match(given, self.keys)
        if principal is None:
            raise AuthError(
                f"unknown API key in {self.location} {self.name!r}", challenge=self.challenge()
            )
        return CallerIdentity(principal, "apiKey")


@dataclass(frozen=True, slots=True)
class HttpBearerScheme:
    """Opaque bearer tokens the operator issued; `tokens` maps each token to its principal."""

    tokens: Mapping[str, str]
    bearer_format: str = ""
    # Worded without "token": the 0.3 TCK flags a public card that says it (as a secret).
    description: str = "Issued by the operator; sent as Authorization: Bearer on JSON-RPC calls."

    def card_entry(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"scheme": "Bearer", "description": self.description}
        if self.bearer_format:
            entry["bearerFormat"] = self.bearer_format
        return {"httpAuthSecurityScheme": entry}

    def challenge(self) -> str:
        return 'Bearer realm="a2a"'

    async def authenticate(self, presented: Presented) -> CallerIdentity | None:
        token = _bearer(presented)
        if token is None:
            return None
        principal = _match(token, self.tokens)
        if principal is None:
            raise AuthError(
                "unknown bearer token", challenge='Bearer realm="a2a", error="invalid_token"'
            )
        return CallerIdentity(principal, "bearer")


@dataclass(frozen=True, slots=True)
class HttpBasicScheme:
    """HTTP Basic: `users` maps each user name to its password; the principal is the user."""

    users: Mapping[str, str]
    description: str = "HTTP Basic with a user and password the operator issued."

    def card_entry(self) -> dict[str, Any]:
        return {"httpAuthSecurityScheme": {"scheme": "Basic", "description": self.description}}

    def challenge(self) -> str:
        return 'Basic realm="a2a", charset="UTF-8"'

    async def authenticate(self, presented: Presented) -> CallerIdentity | None:
        scheme, _, value = presented.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            user, sep, password = (
                base64.b64decode(value.strip(), validate=True).decode("utf-8").partition(":")
            )
        except (binascii.Error, UnicodeDecodeError):
            raise AuthError("malformed Basic credentials", challenge=self.challenge()) from None
        expected = self.users.get(user)
        # Compare even for an unknown user, so the time taken does not tell users apart.
        ok = hmac.compare_digest(
            password.encode("utf-8", "surrogatepass"),
            (expected if expected is not None else "\0unknown").encode("utf-8"),
        )
        if not sep or expected is None or not ok:
            raise AuthError("wrong user or password", challenge=self.challenge())
        return CallerIdentity(user, "basic")


class JwksSource:
    """The signing keys of an issuer: a JWKS URL fetched (and refetched for an unknown key
    id, at most every `min_refresh` s, so forged `kid`s cannot hammer the issuer), or a
    fixed key set."""

    def __init__(
        self,
        url: str | None = None,
        *,
        keys: Mapping[str, Any] | None = None,
        ssl: Any = True,
        min_refresh: float = 30.0,
        timeout: float = 10.0,
    ) -> None:
        from joserfc.jwk import KeySet

        if (url is None) == (keys is None):
            raise ValueError("a JWKS source needs a URL or a key set (one of them)")
        self.url = url
        self._ssl = ssl
        self._timeout = timeout
        self.min_refresh = min_refresh
        self._keys: KeySet | None = KeySet.import_key_set(dict(keys)) if keys is not None else None  # type: ignore[arg-type]
        self._fetched_at = -1e18
        self._lock = asyncio.Lock()

    async def key_set(self, kid: str | None = None) -> Any:
        from joserfc.jwk import KeySet

        if self.url is None:
            return self._keys
        stale = self._keys is None or (kid is not None and not _has_kid(self._keys, kid))
        if stale:
            async with self._lock:
                stale = self._keys is None or (kid is not None and not _has_kid(self._keys, kid))
                # Without any key yet, retry sooner: the issuer may have been down at start.
                interval = self.min_refresh if self._keys is not None else min(self.min_refresh, 1)
                if stale and time.monotonic() - self._fetched_at >= interval:
                    self._fetched_at = time.monotonic()
                    data = await fetch_json(self.url, ssl=self._ssl, timeout=self._timeout)
                    try:
                        self._keys = KeySet.import_key_set(data)
                    except Exception as exc:  # a JOSE error or a malformed set
                        raise IssuerUnavailable(
                            f"the issuer's JWKS at {self.url} is unusable: {exc}"
                        ) from exc
                    log.info("jwks_fetched", url=self.url, keys=len(self._keys.keys))
        if self._keys is None:
            raise IssuerUnavailable(f"no signing keys from {self.url}")
        return self._keys


def _has_kid(keys: Any, kid: str) -> bool:
    return any(key.kid == kid for key in keys.keys)


@dataclass(slots=True)
class JwtValidator:
    """Checks a JWT access token: signature (issuer's keys, allowed algorithms), `iss`,
    `aud`, `exp` (required), `nbf`/`iat`, with `leeway` seconds of clock skew."""

    issuer: str
    #: The audience the token must name; several (a sequence) when the agent is reached under
    #: several names (its HTTP URL and its gRPC address, say): any one of them will do.
    audience: str | Sequence[str]
    jwks: JwksSource
    algorithms: Sequence[str] = DEFAULT_JWT_ALGORITHMS
    leeway: int = 30
    #: The claim naming the principal.
    principal_claim: str = "sub"
    #: Tokens that verified, until they expire (at most `cache_size`): a client sending the
    #: same token on every call costs a lookup, not a signature check each time.
    cache_size: int = 1024
    _verified: dict[str, tuple[dict[str, Any], float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _audiences(self.audience)  # a bad audience is refused when configured

    def principal(self, claims: Mapping[str, Any]) -> str:
        """Who the token names, qualified by its issuer (`ISSUER#SUBJECT`): a subject is
        unique only within its issuer, so a JWT's `alice` never meets another issuer's, nor
        a static token or API key the operator named `alice`."""
        return f"{self.issuer}#{claims[self.principal_claim]}"

    async def validate(self, token: str) -> dict[str, Any]:
        hit = self._verified.get(token)
        if hit is not None:
            if time.time() < hit[1] + self.leeway:
                return dict(hit[0])
            del self._verified[token]
        claims = await self._validate(token)
        if self.cache_size > 0:
            if len(self._verified) >= self.cache_size:
                self._verified.pop(next(iter(self._verified)))
            self._verified[token] = (claims, float(claims["exp"]))
        return dict(claims)

    async def _validate(self, token: str) -> dict[str, Any]:
        from joserfc import jwt
        from joserfc.errors import JoseError
        from joserfc.jws import extract_compact

        challenge = 'Bearer realm="a2a", error="invalid_token"'
        try:
            kid = extract_compact(token.encode("ascii")).headers().get("kid")
        except (JoseError, ValueError, UnicodeEncodeError):
            raise AuthError("the access token is not a JWS", challenge=challenge) from None
        keys = await self.jwks.key_set(kid if isinstance(kid, str) else None)
        try:
            decoded = jwt.decode(token, keys, algorithms=list(self.algorithms))
            registry = jwt.JWTClaimsRegistry(
                leeway=self.leeway,
                iss={"essential": True, "value": self.issuer},
                aud={"essential": True, "values": _audiences(self.audience)},
                exp={"essential": True},
            )
            registry.validate(decoded.claims)
        except (JoseError, ValueError) as exc:
            reason = getattr(exc, "description", "") or type(exc).__name__
            raise AuthError(f"access token refused: {reason}", challenge=challenge) from None
        claims: dict[str, Any] = dict(decoded.claims)
        if not isinstance(claims.get(self.principal_claim), str):
            raise AuthError(f"access token has no {self.principal_claim!r}", challenge=challenge)
        return claims


def _audiences(audience: str | Sequence[str]) -> list[str]:
    values = [audience] if isinstance(audience, str) else list(audience)
    if not values or not all(isinstance(v, str) and v for v in values):
        raise ValueError("an audience is a non-empty string, or a list of them")
    return values


def token_scopes(claims: Mapping[str, Any]) -> frozenset[str]:
    """The scopes an access token grants: `scope` (space-separated, RFC 8693/9068) or `scp`."""
    raw = claims.get("scope", claims.get("scp"))
    if isinstance(raw, str):
        return frozenset(raw.split())
    if isinstance(raw, list):
        return frozenset(item for item in raw if isinstance(item, str))
    return frozenset()


@dataclass(slots=True)
class OAuth2Scheme:
    """OAuth 2.0 with JWT access tokens (client-credentials flow in the card)."""

    validator: JwtValidator
    token_url: str
    #: Scope → what it allows (the card lists them).
    scopes: Mapping[str, str] = field(default_factory=dict)
    metadata_url: str = ""
    description: str = "OAuth 2.0 access tokens (JWT) of the configured issuer."

    def card_entry(self) -> dict[str, Any]:
        flow: dict[str, Any] = {"tokenUrl": self.token_url, "scopes": dict(self.scopes)}
        entry: dict[str, Any] = {
            "description": self.description,
            "flows": {"clientCredentials": flow},
        }
        if self.metadata_url:
            entry["oauth2MetadataUrl"] = self.metadata_url
        return {"oauth2SecurityScheme": entry}

    def challenge(self) -> str:
        return 'Bearer realm="a2a"'

    async def authenticate(self, presented: Presented) -> CallerIdentity | None:
        token = _bearer(presented)
        if token is None:
            return None
        claims = await self.validator.validate(token)
        principal = self.validator.principal(claims)
        return CallerIdentity(principal, "oauth2", token_scopes(claims), claims)


class OpenIdConnectScheme:
    """OpenID Connect: the discovery document names the issuer and its `jwks_uri`."""

    def __init__(
        self,
        discovery_url: str,
        *,
        audience: str | Sequence[str],
        algorithms: Sequence[str] = DEFAULT_JWT_ALGORITHMS,
        leeway: int = 30,
        principal_claim: str = "sub",
        ssl: Any = True,
        description: str = "OpenID Connect tokens of the discovered issuer.",
    ) -> None:
        self.discovery_url = discovery_url
        _audiences(audience)
        self.audience = audience
        self.algorithms = algorithms
        self.leeway = leeway
        self.principal_claim = principal_claim
        self.ssl = ssl
        self.description = description
        self._validator: JwtValidator | None = None
        self._lock = asyncio.Lock()

    def card_entry(self) -> dict[str, Any]:
        return {
            "openIdConnectSecurityScheme": {
                "description": self.description,
                "openIdConnectUrl": self.discovery_url,
            }
        }

    def challenge(self) -> str:
        return 'Bearer realm="a2a"'

    async def validator(self) -> JwtValidator:
        async with self._lock:
            if self._validator is None:
                document = await fetch_json(self.discovery_url, ssl=self.ssl)
                issuer = document.get("issuer") if isinstance(document, dict) else None
                jwks_uri = document.get("jwks_uri") if isinstance(document, dict) else None
                if not isinstance(issuer, str) or not isinstance(jwks_uri, str):
                    raise IssuerUnavailable(f"{self.discovery_url} names no issuer and jwks_uri")
                suffix = "/.well-known/openid-configuration"
                if self.discovery_url.endswith(suffix) and issuer.rstrip("/") != (
                    self.discovery_url.removesuffix(suffix).rstrip("/")
                ):
                    # OpenID Connect Discovery 1.0, section 4.3: the issuer must be the URL
                    # the document was found under, or tokens of another issuer would pass.
                    raise IssuerUnavailable(
                        f"{self.discovery_url} names issuer {issuer!r}, not the URL it is under"
                    )
                self._validator = JwtValidator(
                    issuer=issuer,
                    audience=self.audience,
                    jwks=JwksSource(jwks_uri, ssl=self.ssl),
                    algorithms=self.algorithms,
                    leeway=self.leeway,
                    principal_claim=self.principal_claim,
                )
            return self._validator

    async def authenticate(self, presented: Presented) -> CallerIdentity | None:
        token = _bearer(presented)
        if token is None:
            return None
        validator = await self.validator()
        claims = await validator.validate(token)
        return CallerIdentity(
            validator.principal(claims), "openIdConnect", token_scopes(claims), claims
        )


@dataclass(frozen=True, slots=True)
class MutualTlsScheme:
    """The verified TLS client certificate. `names` maps certificate identities (agent URI,
    SAN, common name) to principals; without it, the certificate's first identity is the
    principal. Needs a peer that requires client certificates (`TLSConfig.client_ca`)."""

    names: Mapping[str, str] | None = None
    description: str = "A TLS client certificate issued by the operator's CA."

    def card_entry(self) -> dict[str, Any]:
        return {"mtlsSecurityScheme": {"description": self.description}}

    def challenge(self) -> str:
        return 'MutualTLS realm="a2a"'

    async def authenticate(self, presented: Presented) -> CallerIdentity | None:
        cert = presented.certificate
        if cert is None:
            return None
        principal = map_principal(cert, self.names)
        if principal is None:
            raise AuthError(
                "the client certificate is not one this agent knows", challenge=self.challenge()
            )
        return CallerIdentity(principal, "mtls")


# --- requirements and the policy ------------------------------------------------------------

#: One alternative: scheme name → scopes that scheme's credential must grant (all schemes of
#: the alternative must be satisfied).
Requirement = Mapping[str, Sequence[str]]


@dataclass(slots=True)
class _Seen:
    """What the schemes said about one request (each scheme is asked at most once)."""

    identities: dict[str, CallerIdentity | None] = field(default_factory=dict)
    errors: dict[str, AuthError] = field(default_factory=dict)
    identity: CallerIdentity | None = None


class SecurityPolicy:
    """The schemes an agent accepts and where each is required.

    - `requirements`: alternatives every call must satisfy (empty: every scheme is accepted
      alone, one of them required).
    - `skill_requirements`: skill (task type) id → alternatives a new task of it needs, in
      addition to the call's.
    - `method_scopes`: JSON-RPC method → scopes the caller's token must also grant.
    """

    def __init__(
        self,
        schemes: Mapping[str, Scheme],
        *,
        requirements: Sequence[Requirement] | None = None,
        skill_requirements: Mapping[str, Sequence[Requirement]] | None = None,
        method_scopes: Mapping[str, Iterable[str]] | None = None,
    ) -> None:
        if not schemes:
            raise ValueError("a security policy needs at least one scheme")
        self.schemes = dict(schemes)
        self.requirements: list[dict[str, list[str]]] = [
            {name: list(scopes) for name, scopes in alt.items()}
            for alt in (
                requirements if requirements is not None else [{name: []} for name in self.schemes]
            )
        ]
        self.skill_requirements = {
            skill: [{name: list(scopes) for name, scopes in alt.items()} for alt in alts]
            for skill, alts in (skill_requirements or {}).items()
        }
        self.method_scopes = {m: frozenset(s) for m, s in (method_scopes or {}).items()}
        for alternatives in [self.requirements, *self.skill_requirements.values()]:
            for alt in alternatives:
                unknown = set(alt) - set(self.schemes)
                if unknown:
                    raise ValueError(f"requirement names unknown schemes: {sorted(unknown)}")

    @classmethod
    def bearer_tokens(cls, tokens: Mapping[str, str]) -> SecurityPolicy:
        """The binding's historical setting: static bearer tokens → principals."""
        return cls({"bearer": HttpBearerScheme(tokens)})

    # --- the card -------------------------------------------------------------------------

    def declare(self, card: wire.AgentCard) -> wire.AgentCard:
        """`card` with the schemes and requirements this policy enforces."""
        card.security_schemes = {name: s.card_entry() for name, s in self.schemes.items()}
        card.security_requirements = [_requirement(alt) for alt in self.requirements]
        for skill in card.skills:
            alternatives = self.skill_requirements.get(skill.id)
            if alternatives:
                skill.security_requirements = [_requirement(alt) for alt in alternatives]
        card.capabilities.extended_agent_card = True
        return card

    # --- the checks -------------------------------------------------------------------------

    async def _identity(self, presented: Presented, name: str) -> CallerIdentity | None:
        seen = presented.seen
        if name not in seen.identities:
            try:
                seen.identities[name] = await self.schemes[name].authenticate(presented)
            except AuthError as exc:
                seen.identities[name] = None
                seen.errors[name] = exc
        return seen.identities[name]

    async def _satisfy(
        self, presented: Presented, alternatives: Sequence[Mapping[str, Sequence[str]]]
    ) -> tuple[CallerIdentity | None, list[str]]:
        """The identity of the first satisfied alternative, or None and the missing scopes."""
        missing_scopes: list[str] = []
        for alt in alternatives:
            first: CallerIdentity | None = None
            ok = True
            for name, scopes in alt.items():
                identity = await self._identity(presented, name)
                if identity is None:
                    ok = False
                    break
                lacking = [s for s in scopes if s not in identity.scopes]
                if lacking:
                    missing_scopes += lacking
                    ok = False
                    break
                first = first or identity
            if ok and first is not None:
                return first, []
        return None, missing_scopes

    def _refusal(self, seen: _Seen, missing_scopes: list[str], what: str) -> AuthError:
        if missing_scopes:
            return AuthError(
                f"{what} needs scope {' '.join(sorted(set(missing_scopes)))}",
                forbidden=True,
                challenge=f'Bearer realm="a2a", error="insufficient_scope", '
                f'scope="{" ".join(sorted(set(missing_scopes)))}"',
            )
        if seen.identity is not None or any(i is not None for i in seen.identities.values()):
            # The caller is authenticated (a skill asks for more): not allowed, not unknown.
            return AuthError(
                f"{what} needs another credential (see the agent card)", forbidden=True
            )
        if seen.errors:
            # The last scheme asked is the most specific one (Bearer before OAuth 2.0 …).
            return list(seen.errors.values())[-1]
        challenges = ", ".join(dict.fromkeys(s.challenge() for s in self.schemes.values()))
        return AuthError(
            "authentication required: see the agent card's securitySchemes",
            challenge=challenges,
        )

    async def authenticate(self, presented: Presented) -> CallerIdentity:
        """The caller's identity under the call requirements, or `AuthError`."""
        seen = presented.seen
        identity, missing = await self._satisfy(presented, self.requirements)
        if identity is None:
            raise self._refusal(seen, missing, "this agent")
        seen.identity = identity
        return identity

    def authorize_method(self, presented: Presented, method: str) -> None:
        """Refuse (403) a method whose scopes the caller's credential does not grant."""
        needed = self.method_scopes.get(method)
        if not needed:
            return
        seen = presented.seen
        granted = seen.identity.scopes if seen.identity is not None else frozenset()
        lacking = sorted(needed - granted)
        if lacking:
            raise self._refusal(_Seen(), lacking, method)

    async def authorize_skill(self, presented: Presented, skill: str | None) -> None:
        """Refuse (401/403) a new task of `skill` the caller may not start."""
        alternatives = self.skill_requirements.get(skill or "")
        if not alternatives:
            return
        seen = presented.seen
        identity, missing = await self._satisfy(presented, alternatives)
        if identity is None:
            raise self._refusal(seen, missing, f"skill {skill!r}")
        caller = seen.identity
        if caller is not None and identity.principal != caller.principal:
            # Two credentials naming different callers: which one would own the task?
            raise AuthError(
                f"skill {skill!r}: the credentials name different principals", forbidden=True
            )


def _requirement(alt: Mapping[str, Sequence[str]]) -> wire.SecurityRequirement:
    return wire.SecurityRequirement(
        schemes={name: wire.StringList(values=list(scopes)) for name, scopes in alt.items()}
    )


__all__ = [
    "CURRENT_CALLER",
    "DEFAULT_JWT_ALGORITHMS",
    "ApiKeyScheme",
    "AuthError",
    "CallerIdentity",
    "ExtendedCard",
    "HttpBasicScheme",
    "HttpBearerScheme",
    "IssuerUnavailable",
    "JwksSource",
    "JwtValidator",
    "MutualTlsScheme",
    "OAuth2Scheme",
    "OpenIdConnectScheme",
    "Presented",
    "Requirement",
    "Scheme",
    "SecurityPolicy",
    "token_scopes",
]
