"""What a router trusts: A2A cards (signature policy) and partners' results (quarantine).

A card says what an agent claims; a router must not route on a claim alone (card poisoning).
The policy here decides which cards are used; the cryptography of card signatures (JWS over
the card, A2A v1.0) is a `CardVerifier` plugged in from outside, so the router works with
whichever verifier the deployment trusts.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from synapse.types import TaskResult

#: Given the card's raw JSON (the bytes as served), True only if a signature on it verifies
#: under a key the deployment trusts. It must not raise for a bad card (return False).
CardVerifier = Callable[[bytes], bool]

#: Given the task type and a partner's result, True if the result is acceptable. A partner
#: whose results fail it `quarantine_after` times is quarantined.
ResultCheck = Callable[[str, TaskResult], bool]


@dataclass(frozen=True, slots=True)
class CardVerdict:
    """Whether a card may be used, and why not."""

    accepted: bool
    reason: str = ""
    signed: bool = False


def card_signatures(raw: bytes) -> list[Any]:
    """The `signatures` of a card's JSON (A2A v1.0 `AgentCard.signatures`), if any."""
    try:
        data = json.loads(raw)
    except ValueError:
        return []
    signatures = data.get("signatures") if isinstance(data, dict) else None
    return signatures if isinstance(signatures, list) else []


def judge_card(raw: bytes, *, required: bool, verifier: CardVerifier | None) -> CardVerdict:
    """The pool's card policy.

    - A card with signatures is used only if the verifier accepts it; a signature that does
      not verify is refused whether or not signatures are required (a forged signature is
      worse than none).
    - When signatures are required, an unsigned card is refused, and so is every card when
      no verifier is configured (nothing could be verified).
    - When they are not required, an unsigned card is used.
    """
    signed = bool(card_signatures(raw))
    if signed:
        if verifier is None:
            if required:
                return CardVerdict(False, "signed cards are required but no verifier is set", True)
            return CardVerdict(True, "signature not checked (no verifier)", True)
        try:
            ok = bool(verifier(raw))
        except Exception as exc:  # a verifier's bug refuses the card, never crashes routing
            return CardVerdict(False, f"card verifier raised {exc!r}", True)
        return CardVerdict(ok, "" if ok else "card signature does not verify", True)
    if required:
        return CardVerdict(False, "card is not signed and the pool requires signed cards")
    return CardVerdict(True)


def same_origin(a: str, b: str) -> bool:
    """Same scheme, host and port (default ports made explicit)."""
    pa, pb = urlsplit(a), urlsplit(b)
    defaults = {"http": 80, "https": 443}

    def origin(p: Any) -> tuple[str, str, int | None]:
        return (p.scheme, (p.hostname or "").lower(), p.port or defaults.get(p.scheme))

    return origin(pa) == origin(pb)


def load_callable(spec: str, what: str) -> Callable[..., Any]:
    """`MODULE:ATTR` → the callable it names (for the TOML's `card_verifier`, `result_check`)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"bad {what} {spec!r}: expected MODULE:ATTR")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot load {what} {spec!r}: {exc}") from exc
    if not callable(target):
        raise ValueError(f"{what} {spec!r} is not callable")
    return target  # type: ignore[no-any-return]


__all__ = [
    "CardVerdict",
    "CardVerifier",
    "ResultCheck",
    "card_signatures",
    "judge_card",
    "load_callable",
    "same_origin",
]
