"""Tenants: one agent serving several isolated namespaces of tasks.

A2A requests may name a `tenant` (a REST path's first segment, `/{tenant}/tasks/...`, or the
`tenant` member of a JSON-RPC or gRPC request). The caller's principal is scoped to it before
the operation runs, so everything keyed by the principal is per tenant too: the tasks it
starts (the tenant is part of each task's stored requester), the tasks it may read, cancel,
subscribe to and list, their push configurations, the deduplication of its retries. A task of
one tenant is not found from another, nor from no tenant. `enable_a2a(tenants=...)` says which
tenants each principal may name (per credential: the principal its token or scheme gives);
naming another is refused (`-32107`, HTTP 403). Without it, any tenant is a namespace of the
caller's own.

The scoped principal of `alice` in tenant `acme` is `@acme:alice` (the tenant percent-encoded,
so it holds no `:`); a principal that itself begins with `@` is written `@@…` when it names no
tenant, so that no two (principal, tenant) pairs share a scope. A principal naming no tenant
is unchanged: tasks stored before tenants existed keep their keys.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from urllib.parse import quote

from synapse.a2a.errors import A2ACode, A2AError
from synapse.a2a.server.view import REQUESTER_PREFIX

_MARK = "@"


def scoped(principal: str, tenant: str) -> str:
    """`principal` within `tenant` ("" for none)."""
    if tenant:
        return f"{_MARK}{quote(tenant, safe='')}:{principal}"
    return _MARK + principal if principal.startswith(_MARK) else principal


def unscoped(principal: str) -> str:
    """The caller's own principal, without the tenant it acts in."""
    if principal.startswith(_MARK + _MARK):
        return principal[1:]
    if principal.startswith(_MARK):
        return principal.partition(":")[2]
    return principal


def requester_of(principal: str) -> str:
    """The virtual requester of a (scoped) principal's tasks, one string for all of them
    (every task's key holds it)."""
    return sys.intern(REQUESTER_PREFIX + principal)


class Tenants:
    """Which tenants each principal may name (None: any)."""

    def __init__(self, allowed: Mapping[str, Iterable[str]] | None = None) -> None:
        self.allowed = None if allowed is None else {p: frozenset(ts) for p, ts in allowed.items()}

    def scope(self, principal: str, tenant: str) -> str:
        if tenant and self.allowed is not None and tenant not in self.allowed.get(principal, ()):
            raise A2AError(
                A2ACode.AUTHORIZATION_FAILED,
                f"tenant {tenant!r} is not open to this caller",
                {"reason": "tenant_not_allowed", "tenant": tenant},
                http_status=403,
            )
        return scoped(principal, tenant)


__all__ = ["Tenants", "requester_of", "scoped", "unscoped"]
