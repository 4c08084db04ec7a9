"""The lease protocol of replicas, modelled and explored state by state.

Replicas of one agent share one PostgreSQL database (`synapse.store.leases`,
`synapse.transport.replicas`). This model follows the statements the code runs for one task,
with two replicas, the messages of a sender that retries until acknowledged, and the
callbacks each applied message makes:

- **claim**: the first message claims the task's lease (the claim reads the dedup entry in the
  same statement); a replica that holds no lease forwards a message to the holder named in
  the lease row, or takes the task over when the lease has run out by *its own* clock (the
  two replicas' clocks may differ), reading the stored task;
- **commit**: a message applied in memory is committed in two steps, the fence (the lease row
  checked and share-locked, the lease extended) and the writes with the commit; a fenced-out
  commit writes nothing, answers 503, and lets the task go;
- **renew**: a replica renews the lease it holds before it runs out (unless paused or dead),
  and lets the task go when the row says the lease is someone else's;
- **takeover scan**: a replica takes over a task whose lease ran out by its clock;
- **outbox claims**: a callback is posted by the lease holder only when it is the task's
  oldest row; once answered, its row's removal is committed.

Faults: a replica killed (its memory lost, restarted later), a replica paused for as long as
the schedule likes (past the lease's TTL), time passing. Invariants in every state: no
acknowledged message lost, no message applied twice, at most one replica writing the task (a
fenced commit always under the current lease), and no task held by a replica with no commit
of it in flight. Liveness: from every state, without faults, every message is acknowledged
and every callback delivered.

The three defects found in replicas before this model existed are switches of `LeaseFixes`
(each `False` puts the defect back); `explore_leases` finds each one again, and nothing with
all three fixed (`tests/model/test_model_leases.py`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from synapse.model.checker import reaching

#: The lease's time to live, in ticks of the model's clock.
TTL = 2
#: Each replica's clock against the true time (ticks): the second one runs ahead, within
#: the bound the deployment guide gives (under half a TTL).
SKEWS = (0, 1)
MESSAGES = ("m1", "m2")


@dataclass(frozen=True, slots=True)
class LeaseFixes:
    """Which fixes the model runs with (all, as the code does)."""

    #: A takeover skips a lease row locked by a fenced commit in flight (`SKIP LOCKED`), so
    #: the successor reads the task after that commit or not at all. Without: it read the
    #: task while the old owner's commit was landing, and overwrote what that commit wrote.
    takeover_waits_for_fenced_commit: bool = True
    #: A callback's row removal is committed as soon as it was answered. Without: it waited
    #: for the next commit, which an idle replica never makes: the next callback, "behind"
    #: it, was never claimed.
    removal_committed_at_once: bool = True
    #: A commit fenced out releases the hold of its own task. Without: the task stayed held
    #: on that replica for ever, and every later message about it waited there.
    fenced_out_releases_its_task: bool = True


@dataclass(frozen=True, slots=True)
class _Replica:
    alive: bool = True
    paused: bool = False
    #: The lease epoch this replica believes it holds.
    held: int | None = None
    #: Its in-memory copy of the task: the messages applied, in order.
    memory: tuple[str, ...] | None = None
    #: A commit in flight: (the task it writes, its epoch, the message, fenced yet).
    commit: tuple[tuple[str, ...], int, str, bool] | None = None
    #: The task is held (a message of it being committed): nothing else applies meanwhile.
    hold: bool = False
    #: Callbacks answered whose rows' removal is not committed yet.
    buffered: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class _World:
    #: The lease row: (holder, epoch, ticks left): left < 0 has run out by the true clock.
    lease: tuple[int, int, int] | None = None
    #: A fenced commit in flight holds the lease row's lock.
    locked: int | None = None
    #: The stored task: the messages applied, in order (None: not stored).
    row: tuple[str, ...] | None = None
    dedup: frozenset[str] = frozenset()
    #: The task's outbox rows (the index of the message each answers), oldest first.
    outbox: tuple[int, ...] = ()
    delivered: frozenset[int] = frozenset()
    acked: frozenset[str] = frozenset()
    replicas: tuple[_Replica, ...] = (_Replica(), _Replica())
    kills: int = 0
    pauses: int = 0


@dataclass(frozen=True, slots=True)
class _Move:
    words: str
    fault: bool
    after: _World


@dataclass
class LeaseResult:
    fixes: LeaseFixes
    states: int = 0
    transitions: int = 0
    seconds: float = 0.0
    #: Invariant → the shortest trace that breaks it, in words.
    violations: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def summary(self) -> str:
        verdict = ", ".join(self.violations) or "no violation"
        return (
            f"{self.states:,} states, {self.transitions:,} transitions in "
            f"{self.seconds:.1f} s: {verdict}"
        )


# --- the moves ---------------------------------------------------------------------------


def _with(world: _World, index: int, **changes: object) -> _World:
    replicas = list(world.replicas)
    replicas[index] = replace(replicas[index], **changes)  # type: ignore[arg-type]
    return replace(world, replicas=tuple(replicas))


def _expired_for(world: _World, index: int) -> bool:
    """The lease has run out by replica `index`'s clock."""
    return world.lease is not None and world.lease[2] < SKEWS[index]


def _apply(world: _World, index: int, message: str) -> _World | None:
    """Replica `index`, which believes it holds the task, takes `message`: answered from the
    dedup entry, or applied in memory and its commit started; None if it cannot now."""
    replica = world.replicas[index]
    assert replica.held is not None
    if replica.hold or replica.commit is not None:
        return None  # one message of a task at a time: it waits (the sender retries)
    if message in world.dedup:
        return replace(world, acked=world.acked | {message})
    memory = (*(replica.memory or ()), message)
    return _with(world, index, commit=(memory, replica.held, message, False), hold=True)


def _take_over(world: _World, index: int, fixes: LeaseFixes) -> _World | None:
    assert world.lease is not None
    if world.locked is not None and fixes.takeover_waits_for_fenced_commit:
        return None  # the row is locked by a fenced commit: skipped, the sender retries
    epoch = world.lease[1] + 1
    world = replace(world, lease=(index, epoch, TTL + SKEWS[index]))
    return _with(world, index, held=epoch, memory=world.row or ())


def _receive(world: _World, index: int, message: str, fixes: LeaseFixes) -> _World | None:
    """`message` posted to replica `index` (through the balancer): routed as
    `Replicas.route` does; None when nothing changes (refused or waiting: retried)."""
    replica = world.replicas[index]
    if replica.held is not None:
        return _apply(world, index, message)
    if world.lease is None:
        if world.row is not None:
            return None
        # A new task: its lease claimed, with the message's dedup entry read.
        world = replace(world, lease=(index, 1, TTL + SKEWS[index]))
        world = _with(world, index, held=1, memory=())
        return _apply(world, index, message)
    holder = world.lease[0]
    if _expired_for(world, index):
        taken = _take_over(world, index, fixes)
        return _apply(taken, index, message) if taken is not None else None
    if holder == index:
        return None  # ours by the row, not in memory: its stored copy's writes are fenced
    owner = world.replicas[holder]
    if not owner.alive or owner.paused or owner.held != world.lease[1]:
        return None  # unreachable, or it does not hold the task: 503, retried
    return _apply(world, holder, message)


def _moves(world: _World, fixes: LeaseFixes, kills: int, pauses: int) -> Iterator[_Move]:
    # Time passes, unless a live holder is due to renew first (its lease loop renews every
    # third of the TTL: in a run without faults, a live replica's lease never runs out).
    due = any(
        r.alive
        and not r.paused
        and world.lease is not None
        and world.lease[0] == i
        and r.held == world.lease[1]
        and world.lease[2] <= SKEWS[i] + 1
        for i, r in enumerate(world.replicas)
    )
    if not due and world.lease is not None and world.lease[2] > -2:
        lease = world.lease
        yield _Move("time passes", False, replace(world, lease=(lease[0], lease[1], lease[2] - 1)))
    for i, r in enumerate(world.replicas):
        name = f"e{i + 1}"
        if not r.alive:
            yield _Move(f"{name} restarts", False, _with(world, i, alive=True))
            continue
        if world.kills < kills:
            dead = _with(replace(world, kills=world.kills + 1), i, **_forgotten(alive=False))
            if world.locked == i:
                dead = replace(dead, locked=None)  # its transaction rolled back
            yield _Move(f"{name} is killed", True, dead)
        if r.paused:
            yield _Move(f"{name} resumes", False, _with(world, i, paused=False))
            continue
        if world.pauses < pauses:
            paused = _with(replace(world, pauses=world.pauses + 1), i, paused=True)
            yield _Move(f"{name} is paused", True, paused)
        for message in MESSAGES:
            if message not in world.acked:
                after = _receive(world, i, message, fixes)
                if after is not None:
                    yield _Move(f"{message} posted to {name}", False, after)
        yield from _replica_moves(world, i, name, r, fixes)


def _forgotten(**changes: object) -> dict[str, object]:
    """What a replica keeps when it lets the task go (or dies): nothing."""
    return {
        "held": None,
        "memory": None,
        "commit": None,
        "hold": False,
        "buffered": (),
        **changes,
    }


def _replica_moves(
    world: _World, i: int, name: str, r: _Replica, fixes: LeaseFixes
) -> Iterator[_Move]:
    lease = world.lease
    if r.commit is not None and not r.commit[3]:
        memory, epoch, message, _ = r.commit
        if lease is not None and lease[0] == i and lease[1] == epoch:
            # The fence: the lease row checked, share-locked and extended, in the commit.
            fenced = replace(world, locked=i, lease=(i, epoch, TTL + SKEWS[i]))
            fenced = _with(fenced, i, commit=(memory, epoch, message, True))
            yield _Move(f"{name} fences its commit of {message}", False, fenced)
        else:
            # Fenced out: nothing written, 503; the task is let go here.
            hold = not fixes.fenced_out_releases_its_task
            yield _Move(
                f"{name}'s commit of {message} is fenced out",
                False,
                _with(world, i, **_forgotten(hold=hold)),
            )
    if r.commit is not None and r.commit[3]:
        memory, epoch, message, _ = r.commit
        outbox = (*world.outbox, MESSAGES.index(message))
        if not fixes.removal_committed_at_once:  # the next commit writes them
            outbox = tuple(row for row in outbox if row not in r.buffered)
        done = replace(
            world,
            locked=None,
            row=memory,
            dedup=world.dedup | {message},
            outbox=outbox,
            acked=world.acked | {message},
        )
        buffered = () if not fixes.removal_committed_at_once else r.buffered
        yield _Move(
            f"{name} commits {message}",
            False,
            _with(done, i, commit=None, hold=False, memory=memory, buffered=buffered),
        )
    if r.held is not None and lease is not None:
        if lease[0] == i and lease[1] == r.held:
            if lease[2] < TTL + SKEWS[i]:
                yield _Move(
                    f"{name} renews", False, replace(world, lease=(i, r.held, TTL + SKEWS[i]))
                )
            oldest = world.outbox[0] if world.outbox else None
            if oldest is not None and oldest not in r.buffered:
                # Claimed (the oldest row, by the lease holder), posted and answered.
                delivered = world.delivered | {oldest}
                if fixes.removal_committed_at_once or len(world.outbox) == 1:
                    # (Even before the fix, the last row's removal was committed at once.)
                    posted = replace(world, delivered=delivered, outbox=world.outbox[1:])
                else:
                    posted = _with(
                        replace(world, delivered=delivered), i, buffered=(*r.buffered, oldest)
                    )
                yield _Move(f"{name} posts callback {oldest + 1}", False, posted)
        elif r.commit is None:
            # Its renewal finds the lease someone else's: the task is let go here (its
            # hold, if a fenced-out commit left one, is not this path's to touch).
            yield _Move(
                f"{name} finds its lease lost", False, _with(world, i, **_forgotten(hold=r.hold))
            )
    if r.held is None and lease is not None and world.row is not None and _expired_for(world, i):
        taken = _take_over(world, i, fixes)
        if taken is not None:
            yield _Move(f"{name} takes the task over", False, taken)


# --- the invariants ----------------------------------------------------------------------


def _acknowledged_kept(world: _World) -> str | None:
    lost = world.acked - set(world.row or ())
    return f"acknowledged and not in the stored task: {sorted(lost)}" if lost else None


def _applied_once(world: _World) -> str | None:
    row = world.row or ()
    twice = sorted({m for m in row if row.count(m) > 1})
    return f"applied twice: {twice}" if twice else None


def _one_writer(world: _World) -> str | None:
    for i, r in enumerate(world.replicas):
        lease = world.lease
        if (
            r.commit is not None
            and r.commit[3]
            and lease is not None
            and lease[:2] != (i, r.commit[1])
        ):
            return f"e{i + 1} writes under epoch {r.commit[1]}, the lease is {lease}"
    return None


def _held_only_while_committing(world: _World) -> str | None:
    for i, r in enumerate(world.replicas):
        if r.hold and r.commit is None:
            return f"e{i + 1} holds the task with no commit of it in flight"
    return None


INVARIANTS: dict[str, Callable[[_World], str | None]] = {
    "acknowledged_messages_are_kept": _acknowledged_kept,
    "each_message_applied_once": _applied_once,
    "one_writer_at_a_time": _one_writer,
    "held_only_while_committing": _held_only_while_committing,
}


def _done(world: _World) -> bool:
    return (
        world.acked == set(MESSAGES)
        and not world.outbox
        and all(r.commit is None and not r.buffered for r in world.replicas)
    )


# --- the exploration ---------------------------------------------------------------------


def explore_leases(
    fixes: LeaseFixes = LeaseFixes(), *, kills: int = 1, pauses: int = 1
) -> LeaseResult:
    """Every state of the model with `fixes`, at most `kills` kills and `pauses` pauses in a
    history; the invariants checked in each, and liveness over the whole graph (from every
    state, moves that are not faults acknowledge every message and deliver every callback)."""
    started = time.monotonic()
    result = LeaseResult(fixes)
    first = _World()
    index: dict[_World, int] = {first: 0}
    parents: list[tuple[int, str]] = [(-1, "")]
    fair_into: list[list[int]] = [[]]
    finished: list[int] = []
    frontier: deque[tuple[int, _World]] = deque([(0, first)])

    def trace(state: int) -> tuple[str, ...]:
        words = []
        while state > 0:
            state, move = parents[state]
            words.append(move)
        return tuple(reversed(words))

    while frontier:
        state, world = frontier.popleft()
        if _done(world):
            finished.append(state)
        for move in _moves(world, fixes, kills, pauses):
            result.transitions += 1
            reached = index.get(move.after)
            if reached is None:
                reached = index[move.after] = len(parents)
                parents.append((state, move.words))
                fair_into.append([])
                for name, check in INVARIANTS.items():
                    if name not in result.violations and check(move.after):
                        result.violations[name] = trace(reached)
                frontier.append((reached, move.after))
            if not move.fault:
                fair_into[reached].append(state)
    result.states = len(parents)
    live = reaching(finished, fair_into)
    stuck = next((s for s in range(result.states) if s not in live), None)
    if stuck is not None:
        result.violations["every_message_acknowledged_and_callback_delivered"] = trace(stuck)
    result.seconds = time.monotonic() - started
    return result


__all__ = ["INVARIANTS", "LeaseFixes", "LeaseResult", "explore_leases"]
