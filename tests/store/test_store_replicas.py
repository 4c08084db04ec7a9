"""What replicas of one agent share on a real PostgreSQL server beyond task leases: outbox
claims (one message of a task in flight at a time, in order, even as the lease moves),
partner liveness and heartbeats, and retention purges that delete each row once."""

from __future__ import annotations

import asyncio
from typing import Any

from storekit import T0, FakeClock, outbox_item

from synapse.p2p.commands import Submit
from synapse.p2p.config import P2PConfig
from synapse.p2p.engine import Engine, Outgoing, PartnerReachability, Step, TaskKey
from synapse.runtime.liveness import SharedLiveness
from synapse.store.leases import Ownership
from synapse.store.postgres import PostgresStore
from synapse.types import Heartbeat

TASK = TaskKey("agent-r", "t-1")


async def verdict(owner: Ownership, message_id: str) -> str:
    """One claim attempt, as `claim_delivery` makes it (which waits on busy/behind)."""
    now = owner.clock()
    epoch = owner.held.get(TASK, -1)
    rows = await owner.store.execute(
        "SELECT verdict FROM synapse_claim_outbox(%s, %s, %s, %s, %s)",
        (message_id, owner.replica_id, epoch, now, now + owner.ttl),
    )
    return str(rows[0][0])


async def claimed_now(owner: Ownership) -> list[str]:
    """The task's rows under a claim that has not expired."""
    rows = await owner.store.execute(
        "SELECT message_id FROM outbox WHERE task_id = %s AND claimed_until >= %s ORDER BY ord",
        (TASK.task_id, owner.clock()),
    )
    return [str(r[0]) for r in rows]


async def test_one_message_of_a_task_in_flight_at_a_time_in_order_as_the_lease_moves(
    pair,  # type: ignore[no-untyped-def]
) -> None:
    (a, b), clock = pair
    assert await a.claim(TASK)
    # Sequence numbers from different blocks: the order is the order written (ord), not seq.
    for seq in (7000, 12, 5000):
        a.store.add_outbox(outbox_item(seq, f"m{seq}"))
    await a.store.commit()
    first, second, third = "m7000", "m12", "m5000"

    # The owner writes its rows claimed by itself, until its lease runs out: no other
    # replica may send them meanwhile, and its own first POST of each needs no claim.
    assert await claimed_now(a) == [first, second, third]
    assert await b.claim_delivery(outbox_item(7000, first)) == "lost"  # not b's task
    assert await verdict(b, first) == "lost"
    assert await verdict(a, second) == "behind"  # the oldest goes first
    clock.now += 5
    sent = a.store.execute
    statements: list[str] = []

    async def counted(query: str, params: Any = ()) -> Any:
        statements.append(query)
        return await sent(query, params)

    a.store.execute = counted  # type: ignore[method-assign]
    assert await a.claim_delivery(outbox_item(7000, first)) == "send"
    assert statements == []  # written claimed under the lease still held: no claim to make
    a.store.execute = sent  # type: ignore[method-assign]

    clock.now += 6  # a stops renewing: its lease runs out, and its claims with it
    assert await verdict(a, first) == "busy"  # ours, but run out: no new POST
    assert await b.take_over(TASK) is not None
    assert await verdict(a, second) == "lost"
    assert await b.claim_delivery(outbox_item(7000, first)) == "send"  # b sends it again
    assert await verdict(b, second) == "behind"  # and the rest after it, in order
    assert await claimed_now(b) == [first]

    b.store.remove_outbox(first)  # delivered
    await b.store.commit()
    assert await b.claim_delivery(outbox_item(12, second)) == "send"
    assert await verdict(b, third) == "behind"
    a.store.remove_outbox(second)  # the old owner's word on it counts for nothing
    await a.store.commit()
    assert await claimed_now(b) == [second]
    b.store.remove_outbox(second)
    await b.store.commit()
    assert await b.claim_delivery(outbox_item(5000, third)) == "send"
    b.store.remove_outbox(third)
    await b.store.commit()
    assert await b.claim_delivery(outbox_item(5000, third)) == "gone"


async def test_a_message_behind_one_this_replica_delivered_is_claimed_without_another_commit(
    pair,  # type: ignore[no-untyped-def]
) -> None:
    """A task's next message waits ('behind') until the one before it leaves the database.
    When this replica delivered that one and its row's removal is still only buffered here,
    the claim commits it and goes on: an idle replica makes no other commit that would."""
    (a, _), clock = pair
    assert await a.claim(TASK)
    for seq in (1, 2):
        a.store.add_outbox(outbox_item(seq, f"m{seq}"))
    await a.store.commit()
    clock.now += 8  # past the fast path of rows written claimed: each POST claims its row
    assert await a.claim_delivery(outbox_item(1, "m1")) == "send"
    a.store.remove_outbox("m1")  # answered; its removal is buffered, nothing commits it
    assert await asyncio.wait_for(a.claim_delivery(outbox_item(2, "m2")), 10) == "send"
    assert await claimed_now(a) == ["m2"]


def beats(step: Step, partner: str) -> int:
    return sum(
        1
        for out in step.outgoing
        if isinstance(out, Outgoing) and isinstance(out.message, Heartbeat)
    )


def unreachable(step: Step) -> bool:
    return any(isinstance(a, PartnerReachability) and not a.reachable for a in step.actions)


async def test_heartbeats_go_from_one_replica_and_count_for_all(pg_url: str) -> None:
    clock = FakeClock()
    config = P2PConfig(heartbeat_interval=10, missed_heartbeat_limit=3)
    stores = [PostgresStore(pg_url), PostgresStore(pg_url)]
    heard_elsewhere: list[str] = []
    engines, watches = [], []
    for n, store in enumerate(stores):
        engine = Engine(agent_id="agent-e", endpoint="http://lb/synapse", config=config)
        watch = SharedLiveness(
            store,
            f"replica-{n}",
            heartbeat_interval=10,
            clock=clock,
            on_heard=heard_elsewhere.append if n == 1 else None,
        )
        engine.partner_watch = watch
        engine.submit(Submit("agent-p", "echo", {"text": "x"}, task_id=f"t{n}"), clock.now)
        engines.append(engine)
        watches.append(watch)
    try:
        for _ in range(6):  # 60 s: twice the limit, with only replica 0 hearing the partner
            clock.now += 10
            steps = [engine.on_timer(clock.now) for engine in engines]
            assert [beats(step, "agent-p") for step in steps] == [1, 0]  # one heartbeat
            assert not any(unreachable(step) for step in steps)
            watches[0].heard("agent-p", clock.now + 0.1)  # its reply, at replica 0
        assert engines[1].is_reachable("agent-p")  # judged on what replica 0 heard
        assert heard_elsewhere  # replica 1 was told (its parked deliveries go on)
        assert watches[0].status()["agent-p"].beat_holder == "replica-0"

        # Replica 0 goes away: replica 1 takes the heartbeats over once its lease lapses.
        sent = []
        for _ in range(3):
            clock.now += 10
            sent.append(beats(engines[1].on_timer(clock.now), "agent-p"))
        assert sent[-1] == 1 and sent.count(1) >= 2
        assert watches[1].status()["agent-p"].beat_holder == "replica-1"

        # Nobody hears from the partner now: after the limit, it is judged unreachable.
        judged = False
        for _ in range(4):
            clock.now += 10
            judged = judged or unreachable(engines[1].on_timer(clock.now))
        assert judged and not engines[1].is_reachable("agent-p")
    finally:
        for store in stores:
            await store.close()


async def test_replicas_purging_together_delete_each_row_once(pg_url: str) -> None:
    stores = [PostgresStore(pg_url) for _ in range(3)]
    try:
        rows = [(f"r{n}", f"t{n}", "executor", "completed", T0 - 100, b"{}") for n in range(3000)]
        conn = stores[0]
        for start in range(0, len(rows), 500):
            batch = rows[start : start + 500]
            values = ",".join(["(%s,%s,%s,%s,%s,%s)"] * len(batch))
            await conn.execute(
                "INSERT INTO tasks (requester, task_id, role, state, updated_at, record) "
                f"VALUES {values}",
                [v for row in batch for v in row],
            )

        async def purge_all(store: PostgresStore) -> int:
            total = 0
            while True:
                removed = await store.purge(finished_before=T0, now=T0, limit=200)
                total += removed
                if removed == 0:
                    return total

        counts = await asyncio.gather(*(purge_all(store) for store in stores))
        assert sum(counts) == 3000  # every row once: none twice, none left
        assert stores[0].count_tasks() == 0
    finally:
        for store in stores:
            await store.close()
