"""Signed one-click links: a decision (approve, reject, or open the form) on one question of
one task, for one reviewer, until an expiry, signed with HMAC-SHA256.

A link's token is `base64url(claims) "." base64url(HMAC(key, base64url(claims)))`, the claims
being the JSON object `{"t": task id, "q": question id, "a": action, "r": reviewer, "e": expiry
(epoch seconds), "n": nonce}`. Reading one checks the signature first (in constant time), then
the expiry; the pages check that it was issued for the question the task asks now (a link of
an earlier question of the same task decides nothing), that its reviewer is one the
configuration names now and was sent that question, and the gate that its nonce was not used
yet (a used link is kept in the task's audit trail).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Final, Literal

import msgspec

from synapse.types.errors import SynapseException

LinkAction = Literal["approve", "reject", "form"]
LINK_ACTIONS: Final = ("approve", "reject", "form")
#: Tokens longer than this are refused before anything is decoded.
MAX_TOKEN = 1024


class LinkRefused(SynapseException):
    """A link that decides nothing: `status` is the HTTP status to answer with."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class _Claims(msgspec.Struct, frozen=True):
    t: str
    a: str
    r: str
    e: int
    n: str
    #: The question's id (a link made before links named their question has none, and
    #: decides nothing).
    q: str = ""


@dataclass(frozen=True, slots=True)
class Link:
    task_id: str
    action: LinkAction
    reviewer: str
    expires: int
    nonce: str
    #: The id of the question it was issued for (`OpenQuestion.id`).
    question: str = ""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class LinkSigner:
    def __init__(self, key: bytes) -> None:
        self._key = key

    def _mac(self, body: str) -> str:
        return _b64(hmac.new(self._key, body.encode(), hashlib.sha256).digest())

    def nonce_of(self, name: str) -> str:
        """A nonce derived from `name` under this key: the same name, the same nonce."""
        return hmac.new(self._key, b"nonce:" + name.encode(), hashlib.sha256).hexdigest()[:16]

    def sign(
        self,
        task_id: str,
        action: LinkAction,
        reviewer: str,
        expires: float,
        nonce: str | None = None,
        question: str = "",
    ) -> str:
        claims = _Claims(
            task_id, action, reviewer, int(expires), nonce or secrets.token_hex(8), question
        )
        body = _b64(msgspec.json.encode(claims))
        return f"{body}.{self._mac(body)}"

    def read(self, token: str, now: float) -> Link:
        """The link `token` is, if it is genuine and not expired; else `LinkRefused`."""
        if len(token) > MAX_TOKEN or token.count(".") != 1:
            raise LinkRefused(403, "this link is not one of ours")
        body, mac = token.split(".")
        if not hmac.compare_digest(mac, self._mac(body)):
            raise LinkRefused(403, "this link's signature does not hold: it was not made here")
        try:
            claims = msgspec.json.decode(_unb64(body), type=_Claims)
        except (ValueError, msgspec.DecodeError):
            raise LinkRefused(403, "this link is not one of ours") from None
        if claims.a not in LINK_ACTIONS:
            raise LinkRefused(403, "this link is not one of ours")
        if now >= claims.e:
            raise LinkRefused(410, "this link has expired: the time to decide is over")
        action: LinkAction = claims.a  # type: ignore[assignment]
        return Link(claims.t, action, claims.r, claims.e, claims.n, claims.q)


__all__ = ["LINK_ACTIONS", "Link", "LinkAction", "LinkRefused", "LinkSigner"]
