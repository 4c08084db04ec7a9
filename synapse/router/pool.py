"""The partner pool of a router: its configuration (TOML) and what the router knows of each
partner (capabilities, reachability, load), and the choice of a partner for a task.

Only partners named here are ever used: a `task_reject` suggesting another agent is followed
only when that agent is in the pool, and an A2A card never adds a partner by itself.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import msgspec

from synapse.types import HeartbeatStatus

MemberKind = Literal["synapse", "a2a"]


class SynapsePartnerConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`[[partner]]`: a Synapse peer, discovered with `capability_query`."""

    agent_id: str
    endpoint: str
    #: Shared HMAC secrets, newest first (the first one signs).
    secrets: list[str] = msgspec.field(default_factory=list)
    #: Relative share of the load: a partner of weight 2 gets twice the tasks of weight 1.
    weight: float = 1.0
    #: Only these task types go to it (default: every type it offers).
    task_types: list[str] | None = None


class A2APartnerConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`[[a2a]]`: an A2A v1.0 agent, discovered from its agent card."""

    #: The partner's name in the pool (pins, logs, `suggested_agent_id`).
    name: str
    #: Its base URL (the card is at `/.well-known/agent-card.json`) or the card's URL.
    url: str
    token: str | None = None
    weight: float = 1.0
    task_types: list[str] | None = None
    #: Overrides the pool's `require_signed_cards` for this agent.
    require_signed_card: bool | None = None
    #: The card's JSON-RPC URL may be on another origin than `url` (off by default: a
    #: poisoned card must not redirect tasks elsewhere).
    allow_foreign_interface: bool = False


class PoolConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A router's pool (`synapse serve --route FILE`; docs/routing.md)."""

    partner: list[SynapsePartnerConfig] = msgspec.field(default_factory=list)
    a2a: list[A2APartnerConfig] = msgspec.field(default_factory=list)
    #: Task type → the only partners it may go to (equal loads: in this order).
    pin: dict[str, list[str]] = msgspec.field(default_factory=dict)
    #: Seconds between refreshes of every partner (a failing partner is refreshed at once).
    refresh_interval: float = 30.0
    #: Use only A2A agents whose card carries a signature that verifies.
    require_signed_cards: bool = False
    #: `MODULE:ATTR` of a card verifier (a callable: card JSON bytes → bool).
    card_verifier: str | None = None
    #: `MODULE:ATTR` of a result check (task type, `TaskResult` → bool); a partner whose
    #: result fails it is quarantined.
    result_check: str | None = None
    #: Failed result checks before a partner is quarantined.
    quarantine_after: int = 1
    #: Seconds a quarantine lasts (0: until the router restarts).
    quarantine_for: float = 0.0
    #: Retries of a `task_request` whose delivery failed in a way that leaves it unknown
    #: whether the partner got it (a timeout, a 502); a refused connection fails over at once.
    request_retries: int = 2
    #: Seconds a request that may have reached its partner (retries ran out in doubt) is
    #: asked again before the task fails; it is never sent to another partner meanwhile.
    in_doubt_for: float = 60.0
    #: How long a task without a deadline may look for a partner that accepts it.
    failover_timeout: float = 60.0
    #: Session affinity: a task whose `context.session_id` the router has seen goes to the
    #: partner that accepted the session's previous task, while it can take it.
    sticky_sessions: bool = False
    #: Routers a task may pass through (`context.metadata.route_hops`): routers that route to
    #: each other would otherwise pass a task around for ever.
    max_hops: int = 8

    def __post_init__(self) -> None:
        names = [p.agent_id for p in self.partner] + [a.name for a in self.a2a]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"partner names must be unique in the pool: {duplicates}")
        weights = [(p.agent_id, p.weight) for p in self.partner] + [
            (a.name, a.weight) for a in self.a2a
        ]
        for p in self.partner:
            if not p.secrets or not all(p.secrets):
                # Unsigned partners could be impersonated: a pool is trusted, so it is signed.
                raise ValueError(f'partner {p.agent_id!r} needs a secret (secret = "…")')
        for name, weight in weights:
            if not weight > 0:
                raise ValueError(f"weight of {name!r} must be positive")
        for task_type, pinned in self.pin.items():
            unknown = [p for p in pinned if p not in names]
            if unknown:
                raise ValueError(f"pin {task_type!r} names partners not in the pool: {unknown}")
        if self.refresh_interval <= 0 or self.failover_timeout <= 0 or self.in_doubt_for <= 0:
            raise ValueError("refresh_interval, failover_timeout and in_doubt_for must be positive")
        if self.max_hops < 1:
            raise ValueError("max_hops must be at least 1")
        if self.request_retries < 0 or self.quarantine_after < 1 or self.quarantine_for < 0:
            raise ValueError("request_retries ≥ 0, quarantine_after ≥ 1, quarantine_for ≥ 0")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> PoolConfig:
        """From parsed TOML; a `secret = "…"` of a partner stands for `secrets = ["…"]`."""
        data = dict(data)
        partners = []
        for entry in data.get("partner", []):
            if isinstance(entry, dict) and "secret" in entry:
                entry = dict(entry)
                entry["secrets"] = [entry.pop("secret"), *entry.get("secrets", [])]
            partners.append(entry)
        if partners:
            data["partner"] = partners
        try:
            return msgspec.convert(data, cls)
        except msgspec.ValidationError as exc:
            raise ValueError(f"bad pool configuration: {exc}") from None

    @classmethod
    def load(cls, path: str | Path) -> PoolConfig:
        """Read a TOML pool file (docs/routing.md shows one)."""
        try:
            with open(path, "rb") as file:
                data = tomllib.load(file)
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{path}: not TOML: {exc}") from None
        return cls.from_mapping(data)


@dataclass(slots=True)
class Member:
    """What the router knows of one pool partner."""

    name: str
    kind: MemberKind
    weight: float = 1.0
    #: Configured restriction (None: whatever it offers).
    task_types: frozenset[str] | None = None
    #: Discovered: the task types it offers (capability_response, or the card's skills).
    offers: frozenset[str] = frozenset()
    #: Discovered: `capability_response.max_concurrent_tasks` (None: unknown, A2A).
    max_concurrent: int | None = None
    #: False until a refresh reached it, and after a failure until one reaches it again.
    reachable: bool = False
    status: HeartbeatStatus = HeartbeatStatus.OK
    #: Its heartbeat's `active_tasks`: tasks it has in flight with us, as it counts them.
    remote_active: int = 0
    #: Our sub-tasks with it that are not final.
    in_flight: int = 0
    #: It asked us to come back later (`alternatives.retry_after`, `rate_limited`).
    busy_until: float = 0.0
    failed_checks: int = 0
    quarantined_until: float | None = None
    #: Why it cannot be used right now (unreachable, card refused, quarantined …).
    note: str = ""
    last_refresh: float | None = None
    #: Tasks it has accepted since the router started.
    confirmed: int = 0

    @property
    def load(self) -> int:
        return max(self.in_flight, self.remote_active)

    def quarantined(self, now: float) -> bool:
        until = self.quarantined_until
        return until is not None and (until == float("inf") or now < until)

    def can_do(self, task_type: str) -> bool:
        allowed = self.task_types is None or task_type in self.task_types
        return allowed and task_type in self.offers

    def has_room(self, now: float) -> bool:
        if not self.reachable or self.quarantined(now) or now < self.busy_until:
            return False
        if self.status is not HeartbeatStatus.OK:
            return False
        return self.max_concurrent is None or self.load < self.max_concurrent

    def view(self, now: float) -> dict[str, Any]:
        """A JSON-able summary (logs, `Router.status()`)."""
        return {
            "name": self.name,
            "kind": self.kind,
            "weight": self.weight,
            "reachable": self.reachable,
            "offers": sorted(self.offers),
            "in_flight": self.in_flight,
            "remote_active": self.remote_active,
            "max_concurrent": self.max_concurrent,
            "status": self.status.value,
            "quarantined": self.quarantined(now),
            "busy_for": max(0.0, self.busy_until - now),
            "accepted": self.confirmed,
            "note": self.note,
        }


@dataclass(slots=True)
class Pool:
    """Every member, and the choice of one for a task."""

    members: dict[str, Member] = field(default_factory=dict)
    pins: Mapping[str, Sequence[str]] = field(default_factory=dict)

    @classmethod
    def of(cls, config: PoolConfig) -> Pool:
        members: dict[str, Member] = {}
        for p in config.partner:
            types = frozenset(p.task_types) if p.task_types is not None else None
            members[p.agent_id] = Member(p.agent_id, "synapse", p.weight, types)
        for a in config.a2a:
            types = frozenset(a.task_types) if a.task_types is not None else None
            members[a.name] = Member(a.name, "a2a", a.weight, types)
        return cls(members, dict(config.pin))

    def __contains__(self, name: object) -> bool:
        return name in self.members

    def get(self, name: str) -> Member | None:
        return self.members.get(name)

    def task_types(self, now: float) -> set[str]:
        """Every task type some usable (reachable, not quarantined) member offers."""
        types: set[str] = set()
        for m in self.members.values():
            if m.reachable and not m.quarantined(now):
                types |= {t for t in m.offers if m.can_do(t) and self._pinned_ok(t, m.name)}
        return types

    def _pinned_ok(self, task_type: str, name: str) -> bool:
        pinned = self.pins.get(task_type)
        return pinned is None or name in pinned

    def capable(self, task_type: str, now: float, exclude: Iterable[str] = ()) -> list[Member]:
        """Members that offer `task_type` (pins honoured) and are not quarantined, best first:
        those with room, then the least loaded per weight, then pin order, then the heavier."""
        excluded = set(exclude)
        pinned = list(self.pins.get(task_type, ()))
        found = [
            m
            for m in self.members.values()
            if m.name not in excluded
            and m.can_do(task_type)
            and not m.quarantined(now)
            and (not pinned or m.name in pinned)
        ]

        def rank(m: Member) -> tuple[int, float, int, float, str]:
            order = pinned.index(m.name) if pinned else 0
            return (0 if m.has_room(now) else 1, m.load / m.weight, order, -m.weight, m.name)

        return sorted(found, key=rank)

    def choose(self, task_type: str, now: float, exclude: Iterable[str] = ()) -> Member | None:
        """The member a new task of `task_type` goes to: capable, reachable, with room, least
        loaded per weight; None if there is none right now."""
        for m in self.capable(task_type, now, exclude):
            if m.has_room(now):
                return m
        return None

    def next_room(self, task_type: str, now: float, exclude: Iterable[str] = ()) -> float | None:
        """When a reachable capable member that asked us to wait has room again (None: no
        such member)."""
        times = [
            m.busy_until
            for m in self.capable(task_type, now, exclude)
            if m.reachable and m.busy_until > now
        ]
        return min(times) if times else None


__all__ = [
    "A2APartnerConfig",
    "Member",
    "MemberKind",
    "Pool",
    "PoolConfig",
    "SynapsePartnerConfig",
]
