"""Partners: the peers we know from configuration, and URL normalization to compare endpoints.

specs/protocol.md, 'Transport': a peer knows each partner's agent id, callback endpoint and secrets;
it POSTs only
to that endpoint, and refuses a message whose `from.endpoint` differs from it once both are
normalized per RFC 3986 §6.2.2 (case of scheme and host, default port, empty path = `/`; we also
normalize percent-encodings, which RFC 3986 §6.2.2.2 counts in the same syntax-based step).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

from synapse.types.signing import Secret, Secrets, secrets_of

DEFAULT_PORTS: dict[str, int] = {"http": 80, "https": 443}

_PERCENT = re.compile(r"%([0-9A-Fa-f]{2})")
_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")


def _normalize_percent(text: str) -> str:
    """Uppercase percent-encodings, and decode those of unreserved characters (§6.2.2.2)."""

    def fix(match: re.Match[str]) -> str:
        char = chr(int(match.group(1), 16))
        return char if char in _UNRESERVED else "%" + match.group(1).upper()

    return _PERCENT.sub(fix, text)


def normalize_url(url: str) -> str:
    """The RFC 3986 syntax-based normal form of `url`, for comparing endpoints.

    Lowercases scheme and host, drops the scheme's default port (80 for http, 443 for
    https), turns an empty path into `/` and normalizes percent-encodings. Userinfo, path,
    query and fragment are otherwise kept as they are (dot-segments are not removed).
    Raises `ValueError` if `url` has no scheme and host or a bad port.
    """
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    if not scheme or not parts.netloc:
        raise ValueError(f"not an absolute URL with a host: {url!r}")
    userinfo, at, hostport = parts.netloc.rpartition("@")
    if hostport.startswith("["):  # IPv6 literal: the port follows the closing bracket
        end = hostport.find("]")
        if end < 0:
            raise ValueError(f"unclosed IPv6 literal in {url!r}")
        host, rest = hostport[: end + 1], hostport[end + 1 :]
        if rest and not rest.startswith(":"):
            raise ValueError(f"bad authority in {url!r}")
        port_text = rest[1:]
    else:
        host, _, port_text = hostport.partition(":")
    if not host:
        raise ValueError(f"no host in {url!r}")
    port: int | None = None
    if port_text:
        if not port_text.isdigit() or int(port_text) > 65535:
            raise ValueError(f"bad port in {url!r}")
        port = int(port_text)
    if port == DEFAULT_PORTS.get(scheme):
        port = None
    netloc = _normalize_percent(host.lower())
    if port is not None:
        netloc = f"{netloc}:{port}"
    if at:
        netloc = f"{_normalize_percent(userinfo)}@{netloc}"
    path = _normalize_percent(parts.path) or "/"
    return urlunsplit(
        (scheme, netloc, path, _normalize_percent(parts.query), _normalize_percent(parts.fragment))
    )


def same_endpoint(a: str, b: str) -> bool:
    """True if `a` and `b` are the same URL after `normalize_url`; a malformed one never is."""
    try:
        return normalize_url(a) == normalize_url(b)
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class Partner:
    """A peer from our configuration: who it is, where it receives POSTs, what we share.

    `secrets` are newest first: we sign with the newest and accept any (rotation). A partner
    with no secrets exchanges unsigned messages.
    """

    agent_id: str
    #: The URL the partner receives POSTs on: the only address we ever POST to for it.
    endpoint: str
    #: Kept out of `repr`, so that logging a partner never leaks them.
    secrets: tuple[Secret, ...] = field(default=(), repr=False)
    #: `endpoint` in normal form, computed once (and checked: a bad URL fails at configuration).
    normalized_endpoint: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.agent_id:
            raise ValueError("a partner needs an agent id")
        object.__setattr__(self, "secrets", secrets_of(self.secrets, repr(self.agent_id)))
        if any(not secret for secret in self.secrets):
            raise ValueError(f"empty secret for partner {self.agent_id!r}")
        object.__setattr__(self, "normalized_endpoint", normalize_url(self.endpoint))

    @property
    def signing_secret(self) -> Secret | None:
        """The newest secret, used to sign what we send; None if we share none."""
        return self.secrets[0] if self.secrets else None

    def is_endpoint(self, url: str) -> bool:
        """True if `url` is this partner's registered endpoint (after normalization)."""
        if url == self.endpoint:  # what a partner sends on every message: skip normalizing
            return True
        try:
            return normalize_url(url) == self.normalized_endpoint
        except ValueError:
            return False


class PartnerRegistry:
    """The partners of one peer, by agent id."""

    def __init__(self, partners: Iterable[Partner] = ()) -> None:
        self._partners: dict[str, Partner] = {}
        for partner in partners:
            self.add(partner)

    @classmethod
    def from_mapping(
        cls,
        endpoints: Mapping[str, str],
        secrets: Mapping[str, Secrets] | None = None,
        *,
        default_secrets: Secrets = (),
    ) -> PartnerRegistry:
        """Partners from `{agent_id: endpoint}`, with per-partner secrets (newest first)
        where given and `default_secrets` otherwise (the command line's `--secret`)."""
        secrets = secrets or {}
        unknown = set(secrets) - set(endpoints)
        if unknown:
            raise ValueError(f"secrets for unknown partners: {sorted(unknown)}")
        default = secrets_of(default_secrets, "every partner (default_secrets)")
        return cls(
            Partner(agent_id, endpoint, secrets_of(secrets.get(agent_id, default), agent_id))
            for agent_id, endpoint in endpoints.items()
        )

    def add(self, partner: Partner) -> None:
        """Register `partner`, replacing any partner with the same agent id."""
        self._partners[partner.agent_id] = partner

    def remove(self, agent_id: str) -> None:
        self._partners.pop(agent_id, None)

    def get(self, agent_id: str) -> Partner | None:
        return self._partners.get(agent_id)

    def by_endpoint(self, url: str) -> Partner | None:
        """The partner whose registered endpoint is `url` (after normalization), if any."""
        for partner in self._partners.values():
            if partner.is_endpoint(url):
                return partner
        return None

    def __getitem__(self, agent_id: str) -> Partner:
        return self._partners[agent_id]

    def __contains__(self, agent_id: object) -> bool:
        return agent_id in self._partners

    def __iter__(self) -> Iterator[Partner]:
        return iter(list(self._partners.values()))

    def __len__(self) -> int:
        return len(self._partners)

    def __repr__(self) -> str:
        return f"PartnerRegistry({sorted(self._partners)!r})"

    def shared_secrets(self) -> list[tuple[str, ...]]:
        """Groups of partners (agent ids, sorted) that have at least one secret in common.

        A secret known to two partners lets either of them sign as the other: each group is
        a partner that can impersonate another.
        """
        holders: dict[bytes, set[str]] = {}
        for partner in self._partners.values():
            for secret in partner.secrets:
                raw = secret.encode("utf-8") if isinstance(secret, str) else bytes(secret)
                holders.setdefault(raw, set()).add(partner.agent_id)
        groups = {tuple(sorted(ids)) for ids in holders.values() if len(ids) > 1}
        return sorted(groups)

    def check_distinct_secrets(self, *, allow_shared: bool = False) -> None:
        """Refuse (ValueError) partners that share a secret, unless `allow_shared`.

        The secrets themselves never appear in the message: only who shares one.
        """
        if allow_shared:
            return
        groups = self.shared_secrets()
        if groups:
            named = "; ".join(", ".join(group) for group in groups)
            raise ValueError(
                f"partners share a secret ({named}): any of them could sign messages as "
                "another; give each partner its own secret, or allow it explicitly "
                "(allow_shared_secrets=True, `--allow-shared-secret`)"
            )
