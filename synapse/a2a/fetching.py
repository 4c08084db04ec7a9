"""Fetching the JSON documents both sides of A2A need from an issuer or an agent (a JWKS, an
OpenID discovery document): the server checks tokens with them, the client checks signed cards.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import msgspec

from synapse.a2a.errors import A2ACode, A2AError


class IssuerUnavailable(A2AError):
    """The issuer's keys or discovery document cannot be had: the credential may well be
    good, so the caller is told to retry (-32101, HTTP 503), not that it is refused."""

    def __init__(self, message: str) -> None:
        super().__init__(
            A2ACode.AGENT_NOT_READY, message, {"reason": "issuer_unavailable"}, http_status=503
        )


async def fetch_json(url: str, *, ssl: Any = True, timeout: float = 10.0) -> Any:
    """GET a JSON document (a JWKS, an OpenID discovery document)."""
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
            session.get(url, ssl=ssl, allow_redirects=False) as response,
        ):
            if response.status != 200:
                raise IssuerUnavailable(f"{url} answered HTTP {response.status}")
            return msgspec.json.decode(await response.read())
    except (aiohttp.ClientError, TimeoutError, msgspec.DecodeError) as exc:
        raise IssuerUnavailable(f"cannot fetch {url}: {exc!r}") from exc


__all__ = ["IssuerUnavailable", "fetch_json"]
