"""Task leases on a real PostgreSQL server: claims, renewal, takeover, and fenced writes."""

from __future__ import annotations

import copy

import pytest
from storekit import Duo

from synapse.p2p.engine import TaskKey
from synapse.store.base import FencedOut
from synapse.store.memory import MemoryStore


async def test_one_replica_claims_a_new_task_and_the_other_sees_it(pair) -> None:  # type: ignore[no-untyped-def]
    (a, b), _ = pair
    key = TaskKey("agent-r", "t-1")
    assert await a.claim(key) is True
    assert await b.claim(key) is False  # taken: b forwards to a
    lease = await b.lookup(key)
    assert lease is not None and lease.holder == a.replica_id and lease.url == a.url
    assert lease.epoch == 1


async def test_a_replica_that_stopped_renewing_is_fenced_out(pair) -> None:  # type: ignore[no-untyped-def]
    (a, b), clock = pair
    lost: list[TaskKey] = []
    a.on_lost = lost.append
    duo = Duo(MemoryStore(), a.store)
    key = duo.submit()  # a's first write of the task claims its lease
    await a.store.commit()
    assert a.held == {key: 1}
    clock.now += 11  # a is frozen past its lease
    assert await b.take_over(key) is not None  # b owns it now, at epoch 2
    assert b.held == {key: 2}
    duo.complete(key)  # a wakes up and writes as if it still owned the task
    await a.store.commit()  # its writes of the task are dropped, not the commit
    record = b.store.get_task(key)
    assert record is not None and record.state.value == "executing"
    assert (await a.store.execute("SELECT 1 FROM transitions WHERE to_state = 'completed'")) == []
    assert lost == [key] and key not in a.held  # a lets the task go at once
    assert await a.renew(set()) == set()


async def test_one_lost_lease_does_not_take_other_tasks_writes_down(pair) -> None:  # type: ignore[no-untyped-def]
    """The takeover race: a batch carries the writes of many tasks; one of them taken over
    must cost only its own writes, or a task completed (and its callback sent) would stay
    `executing` in the database and be failed by a later takeover."""
    (a, b), clock = pair
    duo = Duo(MemoryStore(), a.store)
    kept, taken = duo.submit(task_id="kept"), duo.submit(task_id="taken")
    await a.store.commit()
    clock.now += 11
    assert await b.take_over(taken) is not None
    duo.complete(kept)  # a has not renewed yet: it still thinks it owns both
    duo.complete(taken)
    await a.store.commit()
    done = a.store.get_task(kept)
    assert done is not None and done.state.value == "completed"
    stolen = b.store.get_task(taken)
    assert stolen is not None and stolen.state.value == "executing"
    rows = await a.store.execute("SELECT task_id FROM transitions WHERE to_state = 'completed'")
    assert rows == [("kept",)]  # the history of `kept` only


async def test_a_message_about_a_task_taken_over_is_refused_and_the_rest_written(pair) -> None:  # type: ignore[no-untyped-def]
    (a, b), clock = pair
    duo = Duo(MemoryStore(), a.store)
    kept, taken = duo.submit(task_id="kept"), duo.submit(task_id="taken")
    other = duo.submit(task_id="other")
    await a.store.commit()
    clock.now += 11
    assert await b.take_over(taken) is not None
    duo.complete(kept)  # buffered by someone else, before the message's own writes
    mark = a.store.mark()
    duo.complete(taken)  # the message's own writes, about the task taken over
    # While that commit runs, another caller buffers a write (here: when the loss is told).
    a.on_lost = lambda _key: [duo.progress(other, n) for n in range(10, 100, 10)]
    with pytest.raises(FencedOut) as refused:
        await a.store.commit(discard_after=mark)
    assert refused.value.keys == frozenset({taken})
    a.store.discard(mark)  # what the runtime does next: it must not drop the other write
    done = a.store.get_task(kept)
    assert done is not None and done.state.value == "completed"
    stolen = b.store.get_task(taken)
    assert stolen is not None and stolen.state.value == "executing"
    await a.store.commit()  # nothing of the refused message is tried again
    rows = await a.store.execute("SELECT task_id FROM transitions WHERE to_state = 'completed'")
    assert rows == [("kept",)]
    rows = await a.store.execute(
        "SELECT count(*) FROM transitions WHERE task_id = 'other' "
        "AND event = 'send task_status_update'"
    )
    assert rows == [(9,)]  # every one of the other caller's writes


async def test_renewal_keeps_leases_alive_and_gives_back_finished_ones(pair) -> None:  # type: ignore[no-untyped-def]
    (a, b), clock = pair
    live, done = TaskKey("agent-r", "live"), TaskKey("agent-r", "done")
    assert await a.claim(live) and await a.claim(done)
    clock.now += 11  # older than a TTL: `done` may be given back
    assert await a.renew({live}) == set()
    assert set(a.held) == {live}
    lease = await b.lookup(live)
    assert lease is not None and lease.expires_at == clock.now + 10
    assert await b.lookup(done) is None
    assert await b.take_over(live) is None  # renewed: not expired


async def test_a_stale_write_fenced_out_does_not_drop_the_lease_taken_back(pair) -> None:  # type: ignore[no-untyped-def]
    """A write buffered under epoch 1, committed after this replica lost the task and took
    it back (epoch 3): dropped, and the lease held now stays (else the replica would let go
    of a task whose lease the database still gives it, and nobody would deliver it)."""
    (a, b), clock = pair
    lost: list[TaskKey] = []
    a.on_lost = lost.append
    duo = Duo(MemoryStore(), a.store)
    key = duo.submit()
    await a.store.commit()
    duo.progress(key, 50)  # buffered under epoch 1, not committed yet
    stale = a.store.mark()
    clock.now += 11
    assert await b.take_over(key) is not None  # epoch 2
    clock.now += 11
    del a.held[key]  # as its renewal would have found: lost
    assert await a.take_over(key) is not None  # back, at epoch 3
    assert a.held == {key: 3} and stale > 0
    await a.store.commit()  # the stale progress is dropped
    assert a.held == {key: 3} and lost == []
    record = a.store.get_task(key)
    assert record is not None and record.history[-1].event.value != "send task_status_update"
    assert await b.renew({key}) == {key}  # b learns it is gone
    assert await a.renew({key}) == set()  # a still holds it


async def test_a_stored_task_whose_lease_was_given_back_is_never_claimed_again(pair) -> None:  # type: ignore[no-untyped-def]
    """b finished a task and gave its lease back; a, which ran the task before it froze,
    remembers it as it was: neither its claim nor its first write may take the lease (a
    stored task is only ever taken over), so the final row stays as b left it."""
    (a, b), clock = pair
    duo = Duo(MemoryStore(), a.store)
    key = duo.submit()
    await a.store.commit()
    stale = copy.deepcopy(duo.record("e", key))  # what a remembers: executing
    clock.now += 11
    assert await b.take_over(key) is not None
    duo.e_store = b.store  # b completes it
    duo.complete(key)
    await b.store.commit()
    clock.now += 11
    await b.renew(set())  # finished: the lease is given back
    assert await b.lookup(key) is None

    a.held.clear()  # a let go of the task, but a late write of its own is still coming
    assert await a.claim(key) is False
    a.store.put_task(stale, [])
    await a.store.commit()
    stored = b.store.get_task(key)
    assert stored is not None and stored.state.value == "completed"
    assert await a.lookup(key) is None and key not in a.held


async def test_a_finished_task_gives_its_lease_back_with_the_next_commit(pair) -> None:  # type: ignore[no-untyped-def]
    """The leases table holds the tasks in flight: a finished task's lease goes as the task
    leaves memory, in the next commit (no statement of its own); a late message about it is
    then handled by whichever replica gets it, from the store, and nobody claims it again."""
    (a, b), _ = pair
    duo = Duo(MemoryStore(), a.store)
    key = duo.submit()
    duo.complete(key)
    await a.store.commit()
    assert a.held == {key: 1}
    commits = a.store.commits
    a.let_go(key)  # what the runtime's eviction of the finished task does
    assert key not in a.held
    assert await a.store.execute("SELECT 1 FROM leases") != []  # not yet: with the next commit
    await a.store.commit()
    assert a.store.commits == commits + 1
    assert await a.store.execute("SELECT 1 FROM leases") == []
    assert await b.lookup(key) is None  # no owner: a late message is handled where it lands
    stored = b.store.get_task(key)
    assert stored is not None and stored.state.value == "completed"  # answered from here
    assert await b.claim(key) is False  # a stored task is never claimed again
    assert (await b.take_over_expired()).tasks == []  # nor taken over: it is finished


async def test_the_periodic_scan_counts_a_lease_as_held_only_with_its_task_read(pair) -> None:  # type: ignore[no-untyped-def]
    """From the moment a lease counts as held, messages about its task are applied here. The
    scan takes leases in two statements (expired ones, then missing ones): had the first
    statement's leases counted as held while the second ran, a message applied meanwhile
    (from the store's copy) would be overwritten by the snapshot read before it, and its
    callbacks queued after the task's end."""
    (a, b), clock = pair
    duo = Duo(MemoryStore(), a.store)
    key = duo.submit()
    await a.store.commit()
    clock.now += 11  # a stopped renewing: its lease ran out
    held_at_each_statement: list[set[TaskKey]] = []
    run = b._aexecute

    async def watched(query: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        held_at_each_statement.append(set(b.held))
        return await run(query, params)

    b._aexecute = watched  # type: ignore[method-assign]
    taken = await b.take_over_expired()
    assert [record.key for record in taken.tasks] == [key] and b.held == {key: 2}
    assert held_at_each_statement == [set(), set()]


async def test_a_task_just_claimed_is_looked_up_without_a_statement(pair) -> None:  # type: ignore[no-untyped-def]
    """Claimed as not stored, and written only by its lease holder: until this replica writes
    it, the task is not in the database, and looking it up (the engine does, for every new
    task_request) costs no round trip. Once written, the lookup reads the database again."""
    (a, _), _ = pair
    key = TaskKey("agent-r", "t-1")
    assert await a.claim(key)
    read = a.store.read_rows
    statements: list[str] = []

    def counted(query: str, params: object = ()) -> list[tuple[object, ...]]:
        statements.append(query)
        return read(query, params)  # type: ignore[arg-type]

    a.store.read_rows = counted  # type: ignore[method-assign]
    assert a.store.get_task(key) is None
    assert statements == []
    duo = Duo(MemoryStore(), a.store)
    duo.submit()  # the replica writes the task (its record, its history)
    await a.store.commit()
    stored = a.store.get_task(key)
    assert stored is not None and stored.state.value == "executing"
    assert statements  # read from the database now


async def test_a_renewal_during_a_new_tasks_first_commit_keeps_its_lease(pair) -> None:  # type: ignore[no-untyped-def]
    """A task this replica creates (a submit, an A2A message) takes its lease with its first
    write. A renewal that runs while that write is buffered or committing finds no row yet:
    the lease is not lost (it was let go, and the task handed to another replica a TTL
    later, its stream at this replica left waiting)."""
    (a, b), clock = pair
    lost: list[TaskKey] = []
    a.on_lost = lost.append
    duo = Duo(MemoryStore(), a.store)
    key = duo.submit()  # buffered: the lease is claimed by this write's commit
    assert a.held == {key: 1}
    assert await a.renew({key}) == set()  # the renewal's tick comes first
    assert lost == [] and a.held == {key: 1}
    await a.store.commit()
    clock.now += 5
    assert await a.renew({key}) == set()  # now its row is there, and renewed
    clock.now += 8  # past the first expiry: renewed, so not taken over
    assert await b.take_over(key) is None
    assert a.held == {key: 1} and lost == []


async def test_a_new_tasks_lease_whose_first_commit_never_came_is_let_go_after_a_ttl(pair) -> None:  # type: ignore[no-untyped-def]
    """The other side of the rule above: a claim whose write was never committed (the
    commit failed, or was discarded) is judged lost once a TTL has passed."""
    (a, _), clock = pair
    lost: list[TaskKey] = []
    a.on_lost = lost.append
    duo = Duo(MemoryStore(), a.store)
    key = duo.submit()
    a.store.discard(0)  # the write is undone before any commit
    assert await a.renew({key}) == set()
    clock.now += 11
    assert await a.renew({key}) == {key}
    assert lost == [key] and key not in a.held
