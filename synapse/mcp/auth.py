"""Who may call `synapse mcp --http`: bearer tokens, and OAuth 2.0 access tokens (JWTs checked
against the issuer's keys), as on the A2A side. The MCP SDK's bearer middleware asks these
verifiers and answers 401 with a `WWW-Authenticate` challenge for anything else."""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from dataclasses import dataclass

from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken, TokenVerifier

from synapse.a2a.errors import A2AError
from synapse.a2a.server.security import JwtValidator, token_scopes


class StaticTokens(TokenVerifier):
    """Fixed bearer tokens, each naming its principal (`--mcp-token TOKEN=NAME`)."""

    def __init__(self, tokens: Mapping[str, str]) -> None:
        if not tokens:
            raise ValueError("no tokens given")
        for name in tokens.values():
            if "#" in name:  # `ISSUER#SUBJECT` names an OAuth principal (see `JwtTokens`)
                raise ValueError(f"a token's name may not contain '#': {name!r}")
        self._tokens = dict(tokens)

    async def verify_token(self, token: str) -> AccessToken | None:
        for known, principal in self._tokens.items():
            # Every token compared in constant time: no early exit tells which one was close.
            if hmac.compare_digest(known.encode(), token.encode()):
                return AccessToken(token=token, client_id=principal, scopes=[], subject=principal)
        return None


@dataclass(frozen=True, slots=True)
class JwtTokens(TokenVerifier):
    """OAuth 2.0 access tokens: JWTs of `validator.issuer` for `validator.audience`."""

    validator: JwtValidator

    async def verify_token(self, token: str) -> AccessToken | None:
        try:
            claims = await self.validator.validate(token)
        except A2AError:
            return None
        # Qualified by the issuer: a JWT's `alice` is never a static token's `alice`.
        principal = self.validator.principal(claims)
        return AccessToken(
            token=token,
            client_id=str(claims.get("client_id") or claims.get("azp") or principal),
            scopes=sorted(token_scopes(claims)),
            expires_at=int(claims["exp"]),
            subject=principal,
            claims=claims,
        )


class AnyOf(TokenVerifier):
    """The first verifier that accepts the token decides."""

    def __init__(self, *verifiers: TokenVerifier) -> None:
        self.verifiers = verifiers

    async def verify_token(self, token: str) -> AccessToken | None:
        for verifier in self.verifiers:
            access = await verifier.verify_token(token)
            if access is not None:
                return access
        return None


def current_principal() -> str | None:
    """Who sent the request being served: `--mcp-token`'s name, or a JWT's `ISSUER#SUB`;
    None without authentication (stdio, or HTTP without tokens)."""
    access = get_access_token()
    if access is None:
        return None
    return access.subject or access.client_id


__all__ = ["AnyOf", "JwtTokens", "StaticTokens", "current_principal"]
