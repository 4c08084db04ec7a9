"""Task ownership for replicas of one agent sharing a PostgreSQL database.

Every task has at most one owner at a time: the replica holding its lease (a row of
`leases`: holder, epoch, expiry). The owner runs the task's handler, arms its timers and
sends its callbacks; any other replica that receives a message about the task forwards it to
the owner (`synapse.transport.replicas`). The owner renews its leases every third of the TTL;
a replica that stops renewing (killed, paused, cut off) loses them once the TTL has passed,
and another replica takes the task over with the epoch one higher.

Fencing: every write of a task (its row, its history, its outbox rows and their removal) is
tagged with the epoch its writer holds the lease at. A batch first checks every tag in one
statement (`synapse_fence_many`), which share-locks the lease rows still ours, then writes
only the tasks whose leases hold: the writes of a task taken over are dropped (never retried),
the task is let go here (its handler and deliveries stop), and a message whose own effects
were dropped is answered 503 (nothing acknowledged). The other tasks of the batch are written:
one lost lease never takes another task's writes down with it. A takeover
(`UPDATE ... epoch = epoch + 1`) waits for a fenced batch in progress, so the successor reads
the task after that batch or not at all, and reads it only once the lease is its own.

Delivery: before each POST the sending replica claims the message's outbox row
(`claim_delivery`): only the oldest live row of a task can be claimed, by the lease holder,
and not while another replica's claim runs; claims are renewed with the leases and expire with
them. So one message of a task is in flight at a time, in order, even while its lease moves.
"""

from __future__ import annotations

import asyncio
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from synapse.logs import get_logger
from synapse.p2p.dedup import DedupKey
from synapse.p2p.engine import TaskKey
from synapse.store.base import OutboxItem, Snapshot, StoreUnavailable
from synapse.store.shared import SharedStore
from synapse.store.sql import DEDUP_COLUMNS
from synapse.store.sql import FINAL as _FINAL

log = get_logger("synapse.store.leases")

_DEDUP_COLUMNS = ", ".join(f"d.{column}" for column in DEDUP_COLUMNS.split(", "))

#: Default lease TTL: a dead replica's tasks are taken over within about this long.
DEFAULT_LEASE_TTL = 10.0

#: Tasks a replica whose lease expired (or never had one) may be taken over for: still live,
#: or final with a callback not yet delivered.
_ORPHANED = (
    f"(t.state NOT IN {_FINAL} OR EXISTS (SELECT 1 FROM outbox o WHERE o.requester = "
    "t.requester AND o.task_id = t.task_id AND o.dead_reason IS NULL))"
)


#: What `claim_delivery` decided: send the message; it is gone (delivered or dropped by
#: another replica: nothing to send); the task's lease is lost (let the task go).
Verdict = Literal["send", "gone", "lost"]


@dataclass(frozen=True, slots=True)
class Lease:
    holder: str
    url: str | None
    epoch: int
    expires_at: float


def new_replica_id() -> str:
    """Unique per process (a restarted replica is a new one: its old leases expire)."""
    return f"{socket.gethostname()}-{secrets.token_hex(4)}"


class Ownership:
    """This replica's leases, and the database side of acquiring, renewing and losing them."""

    def __init__(
        self,
        store: SharedStore,
        *,
        agent_id: str,
        url: str,
        ttl: float = DEFAULT_LEASE_TTL,
        replica_id: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if ttl <= 0:
            raise ValueError("the lease TTL must be positive")
        self.store = store
        self.agent_id = agent_id
        self.url = url
        self.ttl = ttl
        self.replica_id = replica_id or new_replica_id()
        self.clock = clock
        #: The epoch of each lease this replica holds, and when it was taken.
        self.held: dict[TaskKey, int] = {}
        self.claimed_at: dict[TaskKey, float] = {}
        #: When the leases held at the last renewal run out (as this replica's clock says).
        self.renewed_until = 0.0
        #: Outbox rows this replica wrote already claimed, with the lease (task, epoch) they
        #: were written under: their first POST needs no claim (`claim_delivery`).
        self.preclaimed: dict[str, tuple[TaskKey, int]] = {}
        #: Tasks whose lease this replica claimed as not stored, and which it has not written
        #: since: a lookup of one needs no statement (`unstored`).
        self.unwritten: set[TaskKey] = set()
        #: Told of each task whose lease turned out lost (a fenced-out write, a renewal):
        #: the runtime lets it go (`synapse.transport.replicas`).
        self.on_lost: Callable[[TaskKey], None] | None = None
        #: The secret this agent's replicas share (made by the first to `register`): a
        #: replica vouches with it for a person it passes on to another.
        self.replica_key = b""
        store.fence = self
        store.load_override = self.take_over_at_start

    # --- fencing (the store tags every write of a task with its epoch) ----------------------

    def epoch_for(self, key: TaskKey, *, create: bool) -> int:
        if create:
            self.unwritten.discard(key)  # the task's record is being written
        epoch = self.held.get(key)
        if epoch is not None:
            return epoch
        if not create:
            return -1  # no lease of ours: the write is dropped
        # A task this replica creates (a task_request it accepted, a task it submits): its
        # first write takes the lease, and is dropped if another replica has it.
        self.held[key] = 1
        self.claimed_at[key] = self.clock()
        return 0

    def claim_until(self) -> float:
        return self.clock() + self.ttl

    def let_go(self, key: TaskKey) -> None:
        """A finished task left this replica's memory (its record durable, its last callback
        answered): its lease is given back by the next commit, with no round trip of its own,
        so that the leases table holds the tasks in flight, not every task of the last TTL.
        A late message about the task is answered from the store by whichever replica gets
        it; the task is never claimed again (a stored task is only taken over)."""
        epoch = self.held.get(key)
        if epoch is not None:
            self._forget(key)
            self.store.give_back_lease(key, self.replica_id, epoch)

    def preclaim(self, message_id: str, key: TaskKey) -> float | None:
        """An outbox row this replica writes under `key`'s lease is written claimed by it,
        until the lease runs out (renewed with the lease): returns that time, or None when
        the lease is not ours (the write is fenced out anyway)."""
        epoch = self.held.get(key)
        if epoch is None:
            return None
        self.preclaimed[message_id] = (key, epoch)
        return self.lease_until(key)

    def _forget(self, key: TaskKey) -> None:
        """This replica holds `key`'s lease no more: nothing it knew under it still holds
        (its outbox rows written claimed are forgotten at the next renewal)."""
        del self.held[key]
        self.claimed_at.pop(key, None)
        self.unwritten.discard(key)

    def unstored(self, key: TaskKey) -> bool:
        return key in self.unwritten and key in self.held

    def lease_until(self, key: TaskKey) -> float:
        """When `key`'s lease runs out, as far as this replica knows: a TTL after it was
        taken or last renewed."""
        return max(self.claimed_at.get(key, 0.0) + self.ttl, self.renewed_until)

    def fenced_out(self, tags: frozenset[tuple[TaskKey, int]]) -> frozenset[TaskKey]:
        lost = set()
        for key, epoch in tags:
            # Only the lease the write was made under: a stale write (made before this
            # replica lost the task and took it back) must not drop the lease held now.
            if self.held.get(key) == (1 if epoch == 0 else epoch):
                lost.add(key)
                self._forget(key)
                if self.on_lost is not None:
                    self.on_lost(key)
        return frozenset(lost)

    # --- delivery ---------------------------------------------------------------------------

    async def claim_delivery(self, item: OutboxItem) -> Verdict:
        """May this replica POST `item` now? Claims its outbox row (see the module's
        docstring), waiting while another replica's claim on the task's messages runs."""
        key = item.key
        written = self.preclaimed.pop(item.message_id, None)
        if (
            written is not None
            and key is not None
            and written == (key, self.held.get(key))
            and self.clock() < self.lease_until(key) - self.ttl / 3
        ):
            # Written by this replica under the lease it still holds at that epoch, claimed
            # by it in the same fenced transaction: no other replica may claim the row while
            # the lease holds, and the task's older rows went first (one queue per task).
            return "send"
        flushed = False
        while True:
            epoch = self.held.get(key) if key is not None else None
            if epoch is None:
                return "lost"
            now = self.clock()
            rows = await self._aexecute(
                "SELECT verdict, busy_until FROM synapse_claim_outbox(%s, %s, %s, %s, %s)",
                (item.message_id, self.replica_id, epoch, now, now + self.ttl),
            )
            verdict, until = str(rows[0][0]), float(str(rows[0][1]))
            if verdict == "claimed":
                return "send"
            if verdict in ("gone", "lost"):
                log.info("delivery_" + verdict, message_id=item.message_id, replica=self.replica_id)
                if verdict == "lost" and key is not None and self.held.get(key) == epoch:
                    self.fenced_out(frozenset({(key, epoch)}))
                return "gone" if verdict == "gone" else "lost"
            # Busy or behind: another replica's claim runs until `until` (its replica
            # died or froze: the claim expires with its leases); a claim being made, or an
            # older message still to go, is a matter of moments.
            log.info("delivery_waits", message_id=item.message_id, verdict=verdict)
            if verdict == "behind" and await self._flush_removals() and not flushed:
                flushed = True
                continue  # the first time, ask again at once
            wait = until - now if verdict == "busy" and until > now else self.ttl / 10
            await asyncio.sleep(min(max(wait, 0.01), self.ttl))

    async def _flush_removals(self) -> bool:
        """A claim is behind an older message: it may be one this replica delivered, its
        row's removal still buffered here (its commit failed), written by the next commit,
        which on an idle replica may never come. Commit now (nothing buffered: no
        statement); whether it was written."""
        try:
            await self.store.commit()
        except StoreUnavailable:
            return False
        return True

    # --- the database -----------------------------------------------------------------------

    def _execute(self, query: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        # At start-up only (in a thread, before anything else writes): the store's
        # autocommit connection. Everything later goes through `_aexecute`.
        return self.store.read_rows(query, params)

    async def _aexecute(
        self, query: str, params: tuple[object, ...] = ()
    ) -> list[tuple[object, ...]]:
        return await self.store.execute(query, params)

    def register(self) -> None:
        """Say where this replica can be reached (forwarded messages go there)."""
        self._execute(
            "INSERT INTO replicas (replica_id, agent_id, url, seen_at) VALUES (%s, %s, %s, %s) "
            "ON CONFLICT (replica_id) DO UPDATE SET url = excluded.url, seen_at = excluded.seen_at",
            (self.replica_id, self.agent_id, self.url, self.clock()),
        )
        # The first replica of the agent to start makes the key; the others read it. (A
        # statement's snapshot may miss a key another replica committed meanwhile: read
        # again.)
        for _ in range(3):
            rows = self._execute(
                "WITH made AS (INSERT INTO replica_keys (agent_id, key) VALUES (%s, %s) "
                "ON CONFLICT DO NOTHING RETURNING key) SELECT key FROM made UNION ALL "
                "SELECT key FROM replica_keys WHERE agent_id = %s",
                (self.agent_id, secrets.token_bytes(32), self.agent_id),
            )
            if rows and isinstance(key := rows[0][0], bytes | memoryview):
                self.replica_key = bytes(key)
                return
        raise StoreUnavailable("the replicas' shared key could not be read")

    async def lookup(self, key: TaskKey) -> Lease | None:
        rows = await self._aexecute(
            "SELECT l.holder, r.url, l.epoch, l.expires_at FROM leases l "
            "LEFT JOIN replicas r ON r.replica_id = l.holder "
            "WHERE l.requester = %s AND l.task_id = %s",
            (key.requester, key.task_id),
        )
        if not rows:
            return None
        holder, url, epoch, expires_at = rows[0]
        return Lease(
            str(holder), None if url is None else str(url), int(str(epoch)), float(str(expires_at))
        )

    async def claim(self, key: TaskKey, dedup: DedupKey | None = None) -> bool:
        """Take the lease of a task nobody leases yet; False if another replica has it.
        `dedup`: the key of the message that brings the task, whose dedup entry the same
        statement reads, for the store to answer its next lookup without a round trip."""
        if key in self.held:
            return True
        # Never the lease of a task already stored (finished, its lease given back): that
        # one is only ever taken over, from what the database holds.
        claim = (
            "INSERT INTO leases (requester, task_id, holder, epoch, expires_at) "
            "SELECT %s, %s, %s, 1, %s WHERE NOT EXISTS (SELECT 1 FROM tasks "
            "WHERE requester = %s AND task_id = %s) ON CONFLICT DO NOTHING RETURNING epoch"
        )
        params: tuple[object, ...] = (
            key.requester,
            key.task_id,
            self.replica_id,
            self.clock() + self.ttl,
            key.requester,
            key.task_id,
        )
        if dedup is None:
            claimed = bool(await self._aexecute(claim, params))
        else:
            rows = await self._aexecute(
                f"WITH claimed AS ({claim}) SELECT (SELECT epoch FROM claimed), "
                f"{_DEDUP_COLUMNS} FROM (VALUES (1)) v "
                "LEFT JOIN dedup d ON d.sender = %s AND d.message_id = %s",
                (*params, *dedup),
            )
            claimed = rows[0][0] is not None
            if claimed:
                self.store.remember_dedup(dedup, rows[0][1:])
        if claimed:
            self.held[key] = 1
            self.claimed_at[key] = self.clock()
            # Claimed only if not stored, and only the holder writes it: until this replica
            # writes it, looking the task up needs no statement.
            self.unwritten.add(key)
            return True
        return False

    async def take_over(self, key: TaskKey) -> Snapshot | None:
        """The task, if its lease has expired and it is orphaned: the lease is ours now."""
        now = self.clock()
        # Taken unless the task is over with nothing left to deliver. A lease with no task
        # row is taken too: its holder claimed it for a task_request and died (or failed
        # to commit) before writing the task.
        # A lease row locked by a write or renewal in progress (its holder is alive, or
        # froze mid-transaction) is skipped, not waited for: waiting would hand out a lease
        # already run out by the time it is granted. The caller answers 503; the sender
        # retries. Our own lease can be taken too: this is only asked about a task this
        # replica does not hold in memory (a lease it let go of, see `renew`).
        rows = await self._aexecute(
            "WITH mine AS (SELECT l.requester, l.task_id FROM leases l "
            "WHERE l.requester = %s AND l.task_id = %s AND l.expires_at < %s "
            "AND NOT EXISTS (SELECT 1 FROM tasks t "
            "WHERE t.requester = l.requester AND t.task_id = l.task_id "
            "AND NOT " + _ORPHANED + ") FOR UPDATE OF l SKIP LOCKED) "
            "UPDATE leases l SET holder = %s, epoch = l.epoch + 1, expires_at = %s "
            "FROM mine m WHERE l.requester = m.requester AND l.task_id = m.task_id "
            "RETURNING l.epoch",
            (key.requester, key.task_id, now, self.replica_id, now + self.ttl),
        )
        if not rows:
            return None
        self.held[key] = int(str(rows[0][0]))
        self.claimed_at[key] = now
        log.info(
            "task_taken_over", task_id=key.task_id, requester=key.requester, epoch=self.held[key]
        )
        return self.store.task_snapshot(key)

    def _orphans_query(self, limit: int) -> tuple[str, tuple[object, ...]]:
        now = self.clock()
        return (
            "WITH orphans AS (SELECT l.requester, l.task_id FROM leases l JOIN tasks t "
            "ON t.requester = l.requester AND t.task_id = l.task_id "
            "WHERE l.expires_at < %s AND (l.holder <> %s OR (l.requester, l.task_id) NOT IN "
            "(SELECT * FROM unnest(%s::text[], %s::text[]))) AND " + _ORPHANED + " "
            "LIMIT %s FOR UPDATE OF l SKIP LOCKED) "
            "UPDATE leases l SET holder = %s, epoch = l.epoch + 1, expires_at = %s "
            "FROM orphans o WHERE l.requester = o.requester AND l.task_id = o.task_id "
            "RETURNING l.requester, l.task_id, l.epoch",
            (
                now,
                self.replica_id,
                [k.requester for k in self.held],
                [k.task_id for k in self.held],
                limit,
                self.replica_id,
                now + self.ttl,
            ),
        )

    def _unleased_query(self, limit: int) -> tuple[str, tuple[object, ...]]:
        """Orphaned tasks with no lease row at all (a store a single process used before,
        or a lease given back while a callback was still to be delivered). Read from the
        live tasks (a partial index) and the live outbox rows, never from the finished
        tasks: the scan costs what is in flight, not what is stored (`synapse_lease_unleased`
        looks tasks up only by key, whatever the statistics say)."""
        return (
            "SELECT leased_requester, leased_task_id, leased_epoch "
            "FROM synapse_lease_unleased(%s, %s, %s)",
            (self.replica_id, self.clock() + self.ttl, limit),
        )

    async def take_over_expired(self, limit: int = 100) -> Snapshot:
        """Every orphaned task whose lease expired or is missing (up to `limit`); rows
        another replica is taking over at the same moment are skipped. A lease of ours that
        ran out (a slow renewal) is not taken over but renewed: its epoch is unchanged.

        Both statements run before any lease is counted as held: from the moment a lease is
        held, messages about its task are applied here, and the runtime must have the task
        restored by then (no await between `held` and the caller's `restore`). A message
        applied in between would be built on the store's copy, and the snapshot read before
        it would then overwrite its effects: its callbacks queued after the task's end."""
        orphans = await self._aexecute(*self._orphans_query(limit))
        unleased = await self._aexecute(*self._unleased_query(limit))
        return self._snapshot_of([*orphans, *unleased])

    def _snapshot_of(self, rows: list[tuple[object, ...]]) -> Snapshot:
        snapshot = Snapshot()
        for requester, task_id, epoch in rows:
            key = TaskKey(str(requester), str(task_id))
            self.held[key] = int(str(epoch))
            self.claimed_at[key] = self.clock()
            part = self.store.task_snapshot(key)
            snapshot.tasks.extend(part.tasks)
            snapshot.outbox.extend(part.outbox)
        if rows:
            log.info(
                "tasks_taken_over",
                count=len(rows),
                replica=self.replica_id,
                tasks=sorted(str(task_id) for _, task_id, _ in rows)[:20],
            )
        return snapshot

    def take_over_at_start(self) -> Snapshot:
        """At start-up: register, lease the live tasks nobody leases (a store used by a
        single process before) and take over the expired ones."""
        self.register()
        snapshot = self._snapshot_of(self._execute(*self._unleased_query(10_000)))
        more = self._snapshot_of(self._execute(*self._orphans_query(10_000)))
        snapshot.tasks.extend(more.tasks)
        snapshot.outbox.extend(more.outbox)
        return snapshot

    async def renew(self, keep: set[TaskKey]) -> set[TaskKey]:
        """Extend the leases of the tasks in `keep`, give back the others we hold; returns
        the leases found lost (taken over while we were away).

        Only leases held when the renewal starts are judged: one claimed meanwhile is not in
        the UPDATE's snapshot yet, and one claimed less than a TTL ago may belong to a
        message still being processed (its task not in `keep` yet) or to a first write not
        committed yet (its row not there yet).
        """
        now = self.clock()
        before = dict(self.held)
        release = [
            key
            for key in before
            if key not in keep and now - self.claimed_at.get(key, 0.0) > self.ttl
        ]
        if release:
            await self._aexecute(
                "DELETE FROM leases WHERE holder = %s AND (requester, task_id) IN "
                "(SELECT * FROM unnest(%s::text[], %s::text[]))",
                (self.replica_id, [k.requester for k in release], [k.task_id for k in release]),
            )
            for key in release:
                if self.held.get(key) == before[key]:
                    self._forget(key)
        # Only the leases this replica knows it holds, at their epochs: a lease the database
        # gives us but memory does not hold (a task let go) is left to expire and be taken
        # over, by any replica (this one too), from what is stored.
        held = list(self.held.items())
        # One statement per period, whatever this replica holds: the leases, the claims of
        # the outbox rows being delivered (they live as long as their tasks' leases: a claim
        # of a task taken over while this replica was away is left to expire), and the
        # replica's own row.
        rows = await self._aexecute(
            "WITH renewed AS (UPDATE leases l SET expires_at = %s "
            "FROM unnest(%s::text[], %s::text[], %s::bigint[]) AS h(r, t, e) "
            "WHERE l.holder = %s AND l.requester = h.r AND l.task_id = h.t AND l.epoch = h.e "
            "RETURNING l.requester, l.task_id, l.epoch), "
            "claims AS (UPDATE outbox o SET claimed_until = %s FROM leases l "
            "WHERE o.claimed_by = %s AND l.requester = o.requester AND l.task_id = o.task_id "
            "AND l.holder = %s RETURNING 1), "
            "seen AS (UPDATE replicas SET seen_at = %s WHERE replica_id = %s RETURNING 1) "
            "SELECT requester, task_id, epoch FROM renewed",
            (
                now + self.ttl,
                [k.requester for k, _ in held],
                [k.task_id for k, _ in held],
                [e for _, e in held],
                self.replica_id,
                now + self.ttl,
                self.replica_id,
                self.replica_id,
                now,
                self.replica_id,
            ),
        )
        still = {(TaskKey(str(r), str(t)), int(str(e))) for r, t, e in rows}
        self.renewed_until = now + self.ttl
        # Rows written claimed whose task is not ours any more (or whose write was undone)
        # will never be delivered from here: forget them.
        self.preclaimed = {
            message_id: (key, epoch)
            for message_id, (key, epoch) in self.preclaimed.items()
            if self.held.get(key) == epoch
        }
        self.unwritten &= self.held.keys()
        lost = {
            key
            for key, epoch in before.items()
            if key not in release
            and (key, epoch) not in still
            and self.held.get(key) == epoch
            and not self._maybe_unwritten(key, epoch, now)
        }
        for key in lost:
            self._forget(key)
            if self.on_lost is not None:
                self.on_lost(key)
        if lost:
            log.warning(
                "leases_lost",
                count=len(lost),
                replica=self.replica_id,
                tasks=sorted(key.task_id for key in lost)[:20],
            )
        return lost

    def _maybe_unwritten(self, key: TaskKey, epoch: int, now: float) -> bool:
        """Whether a lease the renewal did not find may be one whose row is not written yet:
        one claimed by the first write of a task this replica creates has no row until that
        write commits, which may be under way. Judged once a TTL has passed since the claim
        (before that, another replica takes it over only with a clock ahead of ours, and
        the fence keeps our writes out meanwhile)."""
        return epoch == 1 and now - self.claimed_at.get(key, 0.0) <= self.ttl

    async def release_all(self) -> None:
        """On a clean stop: hand every lease back at once (no TTL to wait for)."""
        await self._aexecute(
            "UPDATE leases SET expires_at = 0 WHERE holder = %s", (self.replica_id,)
        )
        await self._aexecute(
            "UPDATE outbox SET claimed_until = 0 WHERE claimed_by = %s", (self.replica_id,)
        )
        self.held.clear()
        self.claimed_at.clear()
        self.unwritten.clear()
        self.preclaimed.clear()


__all__ = ["DEFAULT_LEASE_TTL", "Lease", "Ownership", "new_replica_id"]
