"""Signed agent cards (A2A v1.0 `AgentCard.signatures`): sign ours, verify others'.

The signed bytes are the RFC 8785 (JCS) form of the card's JSON without `signatures`, with
empty strings, lists and objects left out (what the official SDK signs and checks). Each
signature is a JWS compact serialization split in its parts: `protected` (base64url header
with `alg` and `kid`) and `signature`; the payload is never carried, the verifier rebuilds it
from the card as received — so any change to the card, one byte of a skill or a URL, breaks
it.

    signer = CardSigner(private_jwk)                        # the server: every card it serves
    verifier = CardVerifier(keys=[public_jwk])              # or CardVerifier(jwks_url=...)
    card = await verifier.verified(raw_card_bytes)          # CardSignatureError if not

A card is *trusted* only when one of its signatures verifies under a key the verifier was
given (pinned keys, or the JWKS at a URL it was configured with); a `jku` or key in the
card itself is never followed — the card cannot vouch for itself.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import rfc8785
import structlog

from synapse.a2a import wire
from synapse.a2a.errors import A2ACode, A2AError

log = structlog.get_logger("synapse.a2a.card_signing")

#: Algorithms accepted in card signatures (asymmetric only: a card is public).
CARD_ALGORITHMS: tuple[str, ...] = (
    "ES256",
    "ES384",
    "ES512",
    "Ed25519",
    "EdDSA",
    "RS256",
    "PS256",
)
#: Nesting beyond this has no canonical form here (extension params are attacker-shaped).
MAX_DEPTH = 64


class CardSignatureError(A2AError):
    """The card is unsigned, or none of its signatures verifies under a trusted key."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(A2ACode.INVALID_AGENT_RESPONSE, message, {"reason": reason})
        self.reason = reason


def _clean(value: Any, depth: int = 1) -> Any:
    """Drop empty strings, lists and objects (and nulls), recursively; None if all empty."""
    if depth > MAX_DEPTH:
        raise CardSignatureError("the card nests too deeply to canonicalize", reason="depth")
    if isinstance(value, dict):
        cleaned = {k: c for k, v in value.items() if (c := _clean(v, depth + 1)) is not None}
        return cleaned or None
    if isinstance(value, list):
        items = [c for v in value if (c := _clean(v, depth + 1)) is not None]
        return items or None
    if value is None or (isinstance(value, str) and not value):
        return None
    return value


def canonical_card(card: wire.AgentCard | Mapping[str, Any]) -> bytes:
    """The bytes a card signature covers."""
    value = wire.to_builtins(card) if isinstance(card, wire.AgentCard) else dict(card)
    value.pop("signatures", None)
    cleaned = _clean(value) or {}
    try:
        canonical: bytes = rfc8785.dumps(cleaned)
    except (rfc8785.CanonicalizationError, ValueError, TypeError) as exc:
        raise CardSignatureError(
            f"the card has no canonical form: {exc}", reason="canonical"
        ) from None
    return canonical


def _import_key(key: Any) -> Any:
    from joserfc import jwk

    if isinstance(key, jwk.ECKey | jwk.RSAKey | jwk.OKPKey):
        return key
    if isinstance(key, Mapping):
        return jwk.import_key(dict(key), key.get("kty"))
    raise TypeError(f"not a JWK: {type(key).__name__}")


def load_key(path: str, *, kid: str | None = None) -> Any:
    """A key from a file: a JWK (JSON) or PEM (EC, RSA or Ed25519; private for signing)."""
    from joserfc import jwk

    with open(path, "rb") as file:
        data = file.read()
    key: Any = None
    if data.lstrip().startswith(b"{"):
        decoded = msgspec.json.decode(data)
        if not isinstance(decoded, dict):
            raise ValueError(f"{path} is not a JWK")
        key = _import_key(decoded)
    else:
        for key_type in ("EC", "RSA", "OKP"):
            try:
                key = jwk.import_key(data, key_type)
                break
            except Exception:  # not that kind of key: try the next
                continue
        if key is None:
            raise ValueError(f"{path} is neither a JWK nor an EC, RSA or Ed25519 PEM key")
    if kid is not None or key.kid is None:
        as_dict = {**key.as_dict(private=key.is_private), "kid": kid or key.thumbprint()}
        key = _import_key(as_dict)
    return key


def _default_alg(key: Any) -> str:
    kty = key.key_type
    if kty == "EC":
        return {"P-256": "ES256", "P-384": "ES384", "P-521": "ES512"}[key.curve_name]
    if kty == "OKP":
        return "Ed25519" if key.curve_name == "Ed25519" else "EdDSA"  # RFC 9864 names
    return "RS256"


class CardSigner:
    """Adds our signature to each card the server serves (`A2AServer(card_signer=...)`)."""

    def __init__(
        self, key: Any, *, kid: str | None = None, alg: str | None = None, jku: str | None = None
    ) -> None:
        self.key = _import_key(key)
        if not self.key.is_private:
            raise ValueError("signing a card needs a private key")
        self.kid = kid or self.key.kid or self.key.thumbprint()
        self.alg = alg or _default_alg(self.key)
        self.jku = jku
        #: The card last signed (its JSON without signatures) and our signature of it: the
        #: card is built on every request, and mostly does not change.
        self._last: tuple[bytes, wire.AgentCardSignature] | None = None

    @property
    def public_jwk(self) -> dict[str, Any]:
        """The JWK to pin (or publish in a JWKS) to verify our cards."""
        public: dict[str, Any] = dict(self.key.as_dict(private=False))
        public.update({"kid": self.kid, "alg": self.alg, "use": "sig"})
        return public

    def sign(self, card: wire.AgentCard) -> wire.AgentCard:
        others = [s for s in card.signatures if _kid(s) != self.kid]
        plain = wire.encode(msgspec.structs.replace(card, signatures=[]))
        if self._last is not None and self._last[0] == plain:
            ours = self._last[1]
        else:
            from joserfc import jws

            protected: dict[str, Any] = {"alg": self.alg, "kid": self.kid, "typ": "JOSE"}
            if self.jku:
                protected["jku"] = self.jku
            compact = jws.serialize_compact(
                protected, canonical_card(card), self.key, algorithms=[self.alg]
            )
            head, _, signature = compact.split(".")
            ours = wire.AgentCardSignature(protected=head, signature=signature)
            self._last = (plain, ours)
        card.signatures = [*others, ours]
        return card


def _kid(signature: wire.AgentCardSignature) -> str | None:
    import base64

    try:
        header = msgspec.json.decode(
            base64.urlsafe_b64decode(signature.protected + "=" * (-len(signature.protected) % 4))
        )
    except (ValueError, msgspec.DecodeError):
        return None
    kid = header.get("kid") if isinstance(header, dict) else None
    return kid if isinstance(kid, str) else None


@dataclass(frozen=True, slots=True)
class VerifiedCard:
    card: wire.AgentCard
    #: The key id whose signature verified.
    kid: str | None


class CardVerifier:
    """Verifies agent-card signatures against pinned keys and/or a JWKS URL.

    Reusable by any code that must act only on cards whose signature verifies: routing,
    discovery, the A2A client (`A2AClient(card_verifier=..., require_signed_card=True)`).
    """

    def __init__(
        self,
        *,
        keys: Iterable[Any] = (),
        jwks_url: str | None = None,
        algorithms: Sequence[str] = CARD_ALGORITHMS,
        ssl: Any = True,
        min_refresh: float = 30.0,
    ) -> None:
        from joserfc.jwk import KeySet

        self.pinned = KeySet([_import_key(key) for key in keys])
        self.jwks_url = jwks_url
        self.algorithms = list(algorithms)
        if not self.pinned.keys and jwks_url is None:
            raise ValueError("a card verifier needs pinned keys or a JWKS URL")
        self._ssl = ssl
        self._min_refresh = min_refresh
        self._fetched: Any = None
        self._fetched_at = -1e18
        self._lock = asyncio.Lock()

    async def _key_sets(self, kids: set[str | None]) -> list[Any]:
        # Pinned keys are tried one by one, whatever `kid` the card names: pinning is by key.
        sets: list[Any] = list(self.pinned.keys)
        if self.jwks_url is None:
            return sets
        known = {k.kid for k in self._fetched.keys} if self._fetched is not None else set()
        if self._fetched is None or not kids <= known:
            async with self._lock:
                if (
                    time.monotonic() - self._fetched_at >= self._min_refresh
                    or self._fetched is None
                ):
                    from joserfc.jwk import KeySet

                    from synapse.a2a.fetching import fetch_json

                    self._fetched_at = time.monotonic()
                    try:
                        self._fetched = KeySet.import_key_set(
                            await fetch_json(self.jwks_url, ssl=self._ssl)
                        )
                    except Exception as exc:  # unreachable, not JSON, not a key set
                        log.warning("card_jwks_unavailable", url=self.jwks_url, error=str(exc))
        if self._fetched is not None:
            sets.append(self._fetched)
        return sets

    async def verify(self, raw: bytes | Mapping[str, Any]) -> VerifiedCard:
        """The card if one of its signatures verifies; `CardSignatureError` otherwise."""
        value, card = _parse(raw)
        kids = {_kid(s) for s in card.signatures}
        return self._check(value, card, await self._key_sets(kids))

    async def verified(self, raw: bytes | Mapping[str, Any]) -> wire.AgentCard:
        return (await self.verify(raw)).card

    async def refresh(self) -> None:
        """Fetch the JWKS now (for `verify_now` and `__call__`, which never fetch)."""
        self._fetched_at = -1e18
        await self._key_sets({"\0refresh"})

    def verify_now(self, raw: bytes | Mapping[str, Any]) -> VerifiedCard:
        """`verify` without I/O: the pinned keys and the JWKS as last fetched."""
        value, card = _parse(raw)
        keys: list[Any] = list(self.pinned.keys)
        if self._fetched is not None:
            keys.append(self._fetched)
        return self._check(value, card, keys)

    def __call__(self, raw: bytes) -> bool:
        """True only if the card's signature verifies (`synapse.router`'s `CardVerifier`)."""
        try:
            self.verify_now(raw)
        except CardSignatureError as exc:
            log.info("card_refused", reason=exc.reason)
            return False
        except (msgspec.DecodeError, ValueError, TypeError):
            return False
        return True

    def _check(
        self, value: dict[str, Any], card: wire.AgentCard, key_sets: list[Any]
    ) -> VerifiedCard:
        from joserfc import jws
        from joserfc.errors import JoseError

        payload = canonical_card(value)
        for signature in card.signatures:
            compact = f"{signature.protected}.{_b64(payload)}.{signature.signature}"
            for keys in key_sets:
                try:
                    jws.deserialize_compact(compact, keys, algorithms=self.algorithms)
                except (JoseError, ValueError):
                    continue
                return VerifiedCard(card, _kid(signature))
        kids = {_kid(s) for s in card.signatures}
        raise CardSignatureError(
            f"no signature of agent card {card.name!r} verifies under a trusted key "
            f"(key ids in the card: {', '.join(sorted(k or '?' for k in kids))})",
            reason="bad_signature",
        )


def _parse(raw: bytes | Mapping[str, Any]) -> tuple[dict[str, Any], wire.AgentCard]:
    try:
        value = msgspec.json.decode(raw) if isinstance(raw, bytes | bytearray) else dict(raw)
    except msgspec.DecodeError as exc:
        raise CardSignatureError(f"the agent card is not JSON: {exc}", reason="malformed") from exc
    if not isinstance(value, dict):
        raise CardSignatureError("the agent card is not a JSON object", reason="malformed")
    try:
        card = msgspec.convert(value, wire.AgentCard)
    except msgspec.ValidationError as exc:
        raise CardSignatureError(f"not an agent card: {exc}", reason="malformed") from exc
    if not card.signatures:
        raise CardSignatureError(
            f"agent card {card.name!r} is not signed, and signed cards are required",
            reason="unsigned",
        )
    return value, card


def _b64(data: bytes) -> str:
    import base64

    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


__all__ = [
    "CARD_ALGORITHMS",
    "CardSignatureError",
    "CardSigner",
    "CardVerifier",
    "VerifiedCard",
    "canonical_card",
    "load_key",
]
