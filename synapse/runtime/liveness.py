"""Partner liveness shared by the replicas of one agent (the `partners` table).

On one machine a peer heartbeats each partner it has work with and judges it unreachable
after `missed_heartbeat_limit` silent intervals. N replicas doing that on their own would send
the partner N heartbeats an interval, and each would judge it on what it alone heard. Instead:

- *Last heard* is shared: when its heartbeat is due, each replica publishes the latest time it
  heard from the partner and reads back the latest any replica did; a heartbeat answered (or
  received) is published at once. The engine judges reachability on that shared time, so a
  heartbeat answered at replica A counts for replica B.
- *Heartbeats* go from one replica at a time: the one holding the partner's heartbeat lease
  (`beat_holder`, until `beat_until`), which it renews with each beat; if it stops (it died,
  or has nothing in flight with the partner any more) another replica takes the lease over at
  its next due heartbeat.
- *Backlog* (messages waiting for the partner) is the shared outbox itself: any replica with
  rows parked for the partner keeps heartbeating it, and when another replica hears from the
  partner, the parked deliveries here go on (`P2PProtocol.partner_alive`).

The calls run on the event loop, one short statement on the store's autocommit connection per
partner per heartbeat interval (no row lock is ever held across an await: nothing waits).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from synapse.logs import get_logger
from synapse.runtime.listener import MessageEvent, RuntimeListener
from synapse.store.postgres import PostgresStore
from synapse.types import Heartbeat

log = get_logger("synapse.runtime.liveness")

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


@dataclass(frozen=True, slots=True)
class PartnerView:
    """What the replicas share about one partner."""

    last_heard: float
    beat_holder: str | None
    beat_until: float | None
    #: Outbox messages to it not delivered yet, whichever replica queued them.
    backlog: int


class SharedLiveness(RuntimeListener):
    """The engine's `partner_watch` and a runtime listener, for one replica."""

    def __init__(
        self,
        store: PostgresStore,
        replica_id: str,
        *,
        heartbeat_interval: float,
        on_heard: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.replica_id = replica_id
        #: The heartbeat lease lasts one and a half intervals: renewed by every beat.
        self.lease = 1.5 * heartbeat_interval
        #: Told when another replica heard from a partner since we last looked.
        self.on_heard = on_heard
        self.clock = clock
        self.beats_sent = 0

    def beat(self, partner: str, last_heard: float, now: float) -> tuple[float, bool]:
        """A heartbeat to `partner` is due: publish `last_heard`, take or renew the
        partner's heartbeat lease if free; returns the latest time any replica heard from
        the partner and whether this replica sends the heartbeat."""
        try:
            rows = self.store.read_rows(
                _BEAT,
                {
                    "partner": partner,
                    "heard": last_heard,
                    "me": self.replica_id,
                    "until": now + self.lease,
                    "now": now,
                },
            )
        except Exception as exc:  # the database is away: judge and beat on our own
            log.warning("partner_liveness_unavailable", partner=partner, error=repr(exc))
            return last_heard, True
        shared, holder = float(rows[0][0]), rows[0][1]
        if shared > last_heard and self.on_heard is not None:
            self.on_heard(partner)
        mine = holder == self.replica_id
        if mine:
            self.beats_sent += 1
        return shared, mine

    def heard(self, partner: str, at: float) -> None:
        """`partner` proved alive here at `at`: the other replicas count it too."""
        try:
            self.store.read_rows(_HEARD, (partner, at))
        except Exception as exc:
            log.warning("partner_liveness_unavailable", partner=partner, error=repr(exc))

    def on_message(self, event: MessageEvent) -> None:
        # A heartbeat answered, or one received and accepted (its reply is on its way).
        if isinstance(event.message, Heartbeat) and event.direction in ("reply_in", "reply_out"):
            self.heard(event.partner, self.clock())

    def status(self) -> dict[str, PartnerView]:
        """Every partner the replicas know of, as they share it."""
        rows: list[Any] = self.store.read_rows(
            "SELECT p.partner, p.last_heard, p.beat_holder, p.beat_until, "
            "(SELECT count(*) FROM outbox o WHERE o.partner = p.partner "
            "AND o.dead_reason IS NULL) FROM partners p"
        )
        return {
            str(partner): PartnerView(
                float(heard),
                None if holder is None else str(holder),
                None if until is None else float(until),
                int(backlog),
            )
            for partner, heard, holder, until, backlog in rows
        }


__all__ = ["PartnerView", "SharedLiveness"]
