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

The calls run on the event loop, one short statement per partner per heartbeat interval; the
SQL lives with the store (`synapse.store.partners`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from synapse.logs import get_logger
from synapse.runtime.listener import MessageEvent, RuntimeListener
from synapse.store.partners import PartnerView, SharedPartners
from synapse.store.shared import SharedStore
from synapse.types import Heartbeat

log = get_logger("synapse.runtime.liveness")


class SharedLiveness(RuntimeListener):
    """The engine's `partner_watch` and a runtime listener, for one replica."""

    def __init__(
        self,
        store: SharedStore,
        replica_id: str,
        *,
        heartbeat_interval: float,
        on_heard: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.replica_id = replica_id
        self.partners = SharedPartners(store, replica_id)
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
            shared, mine = self.partners.beat(partner, last_heard, now=now, until=now + self.lease)
        except Exception as exc:  # the database is away: judge and beat on our own
            log.warning("partner_liveness_unavailable", partner=partner, error=repr(exc))
            return last_heard, True
        if shared > last_heard and self.on_heard is not None:
            self.on_heard(partner)
        if mine:
            self.beats_sent += 1
        return shared, mine

    def heard(self, partner: str, at: float) -> None:
        """`partner` proved alive here at `at`: the other replicas count it too."""
        try:
            self.partners.heard(partner, at)
        except Exception as exc:
            log.warning("partner_liveness_unavailable", partner=partner, error=repr(exc))

    def on_message(self, event: MessageEvent) -> None:
        # A heartbeat answered, or one received and accepted (its reply is on its way).
        if isinstance(event.message, Heartbeat) and event.direction in ("reply_in", "reply_out"):
            self.heard(event.partner, self.clock())

    def status(self) -> dict[str, PartnerView]:
        """Every partner the replicas know of, as they share it."""
        return self.partners.views()


__all__ = ["PartnerView", "SharedLiveness"]
