"""What the replicas of one agent share about each partner, in PostgreSQL (the `partners`
table): the latest time any of them heard from it, and which of them heartbeats it now.

The SQL of partner liveness lives here, with the store; `synapse.runtime.liveness` decides
when to call it. Each call is one short statement on the store's autocommit connection (no
row lock held across an await).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from synapse.store.shared import SharedStore

_BEAT = (
    "INSERT INTO partners AS p (partner, last_heard, beat_holder, beat_until) "
    "VALUES (%(partner)s, %(heard)s, %(me)s, %(until)s) ON CONFLICT (partner) DO UPDATE SET "
    "last_heard = GREATEST(p.last_heard, excluded.last_heard), "
    "beat_holder = CASE WHEN p.beat_holder IS NULL OR p.beat_holder = excluded.beat_holder "
    "OR p.beat_until < %(now)s THEN excluded.beat_holder ELSE p.beat_holder END, "
    "beat_until = CASE WHEN p.beat_holder IS NULL OR p.beat_holder = excluded.beat_holder "
    "OR p.beat_until < %(now)s THEN excluded.beat_until ELSE p.beat_until END "
    "RETURNING last_heard, beat_holder"
)
_HEARD = (
    "INSERT INTO partners AS p (partner, last_heard) VALUES (%s, %s) "
    "ON CONFLICT (partner) DO UPDATE SET last_heard = GREATEST(p.last_heard, excluded.last_heard)"
)
_VIEWS = (
    "SELECT p.partner, p.last_heard, p.beat_holder, p.beat_until, "
    "(SELECT count(*) FROM outbox o WHERE o.partner = p.partner "
    "AND o.dead_reason IS NULL) FROM partners p"
)


@dataclass(frozen=True, slots=True)
class PartnerView:
    """What the replicas share about one partner."""

    last_heard: float
    beat_holder: str | None
    beat_until: float | None
    #: Outbox messages to it not delivered yet, whichever replica queued them.
    backlog: int


class SharedPartners:
    """The `partners` table of one PostgreSQL store, as one replica uses it."""

    def __init__(self, store: SharedStore, replica_id: str) -> None:
        self.store = store
        self.replica_id = replica_id

    def beat(self, partner: str, heard: float, *, now: float, until: float) -> tuple[float, bool]:
        """Publish that we last heard from `partner` at `heard`, and take or renew its
        heartbeat lease (until `until`) if no other replica holds it at `now`. Returns the
        latest time any replica heard from it, and whether this replica holds the lease."""
        rows = self.store.read_rows(
            _BEAT,
            {"partner": partner, "heard": heard, "me": self.replica_id, "until": until, "now": now},
        )
        return float(rows[0][0]), rows[0][1] == self.replica_id

    def heard(self, partner: str, at: float) -> None:
        """`partner` proved alive here at `at`."""
        self.store.read_rows(_HEARD, (partner, at))

    def views(self) -> dict[str, PartnerView]:
        """Every partner the replicas know of, as they share it."""
        rows: list[Any] = self.store.read_rows(_VIEWS)
        return {
            str(partner): PartnerView(
                float(heard),
                None if holder is None else str(holder),
                None if until is None else float(until),
                int(backlog),
            )
            for partner, heard, holder, until, backlog in rows
        }


__all__ = ["PartnerView", "SharedPartners"]
