"""A local OAuth 2.0 / OpenID Connect issuer for the tests, served by aiohttp on loopback.

It publishes its discovery document and JWKS, grants client-credentials tokens (JWTs
signed by its key with `joserfc`), and mints any token a test asks for — expired, for
another audience or issuer, with other scopes, or signed by a key nobody trusts.
"""

from __future__ import annotations

import ssl
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import BasicAuth, web
from joserfc import jwt
from joserfc.jwk import ECKey, KeySet


@dataclass
class Issuer:
    audience: str
    clients: dict[str, str] = field(default_factory=lambda: {"client-1": "client-secret-1"})
    key: ECKey = field(default_factory=lambda: ECKey.generate_key("P-256", {"kid": "k1"}))
    base: str = ""
    token_requests: list[dict[str, str]] = field(default_factory=list)
    runner: web.AppRunner | None = None
    #: Serve https with this context (a certificate of the test CA) instead of http.
    ssl_context: ssl.SSLContext | None = None

    @property
    def discovery_url(self) -> str:
        return self.base + "/.well-known/openid-configuration"

    @property
    def jwks_url(self) -> str:
        return self.base + "/jwks"

    @property
    def token_url(self) -> str:
        return self.base + "/token"

    def mint(self, *, key: ECKey | None = None, alg: str = "ES256", **claims: Any) -> str:
        now = int(time.time())
        values: dict[str, Any] = {
            "iss": self.base,
            "aud": self.audience,
            "sub": "client-1",
            "iat": now,
            "exp": now + 300,
            "jti": uuid.uuid4().hex,
        }
        values.update(claims)
        values = {k: v for k, v in values.items() if v is not None}
        signing = key or self.key
        header = {"alg": alg, **({"kid": signing.kid} if signing.kid else {})}
        return jwt.encode(header, values, signing, algorithms=[alg])

    async def _discovery(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "issuer": self.base,
                "jwks_uri": self.jwks_url,
                "token_endpoint": self.token_url,
                "grant_types_supported": ["client_credentials"],
            }
        )

    async def _jwks(self, request: web.Request) -> web.Response:
        return web.json_response(KeySet([self.key]).as_dict(private=False))

    async def _token(self, request: web.Request) -> web.Response:
        form = dict(await request.post())
        self.token_requests.append({k: str(v) for k, v in form.items()})
        try:
            auth = BasicAuth.decode(request.headers.get("Authorization", ""))
        except ValueError:
            return web.json_response({"error": "invalid_client"}, status=401)
        if self.clients.get(auth.login) != auth.password:
            return web.json_response({"error": "invalid_client"}, status=401)
        if form.get("grant_type") != "client_credentials":
            return web.json_response({"error": "unsupported_grant_type"}, status=400)
        scope = str(form.get("scope", ""))
        token = self.mint(sub=auth.login, scope=scope or None)
        return web.json_response(
            {"access_token": token, "token_type": "Bearer", "expires_in": 300, "scope": scope}
        )

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/.well-known/openid-configuration", self._discovery)
        app.router.add_get("/jwks", self._jwks)
        app.router.add_post("/token", self._token)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0, ssl_context=self.ssl_context)
        await site.start()
        port = self.runner.addresses[0][1]
        scheme = "https" if self.ssl_context is not None else "http"
        self.base = f"{scheme}://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
