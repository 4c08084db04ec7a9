"""Who may use the console: sign-in schemes, sessions, CSRF tokens.

A scheme (`ConsoleAuth`) turns what the sign-in form posts into a `Reviewer`, and may also
accept a bearer token for API clients. `TokenAuth` is the built-in one: each reviewer has a
secret token. Another scheme (an identity provider, a JWT) plugs in by implementing the same
two methods.

A signed-in browser holds an opaque session cookie (HttpOnly, SameSite=Strict, scoped to the
console's path); every state-changing request must also carry the session's CSRF token in
`X-CSRF-Token` (or the `csrf_token` form field), which a page of another origin cannot read.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Reviewer:
    """A signed-in person: becomes `human_decision.decided_by`."""

    user_id: str
    user_name: str = ""
    role: str = "reviewer"


class ConsoleAuth(Protocol):
    """A sign-in scheme of the console."""

    #: Shown on the sign-in page, e.g. "token".
    scheme: str

    def sign_in(self, form: Mapping[str, str]) -> Reviewer | None:
        """The reviewer the sign-in form identifies, or None."""
        ...

    def bearer(self, token: str) -> Reviewer | None:
        """The reviewer an `Authorization: Bearer` token identifies (API clients), or None."""
        ...


class TokenAuth:
    """Sign in with a secret token; each token names one reviewer."""

    scheme = "token"

    def __init__(self, tokens: Mapping[str, Reviewer | str]) -> None:
        if not tokens:
            raise ValueError("TokenAuth needs at least one token")
        self._tokens: dict[str, Reviewer] = {}
        for token, who in tokens.items():
            if len(token) < 16:
                raise ValueError("console tokens must be at least 16 characters long")
            self._tokens[token] = who if isinstance(who, Reviewer) else Reviewer(user_id=who)

    def bearer(self, token: str) -> Reviewer | None:
        found: Reviewer | None = None
        given = token.encode()
        # Compare with every token, in constant time each, so timing tells nothing.
        for candidate, reviewer in self._tokens.items():
            if hmac.compare_digest(candidate.encode(), given):
                found = reviewer
        return found

    def sign_in(self, form: Mapping[str, str]) -> Reviewer | None:
        return self.bearer(form.get("token", ""))


@dataclass(slots=True)
class Session:
    reviewer: Reviewer
    csrf_token: str
    expires_at: float


class Sessions:
    """Signed-in browsers, in memory: a restart signs everyone out."""

    def __init__(self, lifetime: float = 8 * 3600.0) -> None:
        self.lifetime = lifetime
        self._sessions: dict[str, Session] = {}

    def create(self, reviewer: Reviewer) -> tuple[str, Session]:
        self._purge()
        session_id = secrets.token_urlsafe(32)
        session = Session(reviewer, secrets.token_urlsafe(32), time.monotonic() + self.lifetime)
        self._sessions[session_id] = session
        return session_id, session

    def get(self, session_id: str | None) -> Session | None:
        if not session_id:
            return None
        session = self._sessions.get(session_id)
        if session is None or session.expires_at <= time.monotonic():
            self._sessions.pop(session_id, None)
            return None
        return session

    def end(self, session_id: str | None) -> None:
        if session_id:
            self._sessions.pop(session_id, None)

    def _purge(self) -> None:
        now = time.monotonic()
        for key in [k for k, s in self._sessions.items() if s.expires_at <= now]:
            del self._sessions[key]


def csrf_ok(session: Session, given: str | None) -> bool:
    return given is not None and hmac.compare_digest(session.csrf_token.encode(), given.encode())


__all__ = ["ConsoleAuth", "Reviewer", "Session", "Sessions", "TokenAuth", "csrf_ok"]
