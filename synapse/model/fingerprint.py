"""What two states of the model share when they are the same state.

Only the messages that may still arrive somewhere count (those queued, or on the network):
what the deduplication tables, the answers given and the histories hold of any other message
can never matter again. Their ids are renamed by the order they were made in (each side mints
ids in order); every time is relative to now. Two worlds with equal fingerprints have the
same futures, so the checker explores one of them.
"""

from __future__ import annotations

from typing import Any

from synapse.model.world import ReplyOnTheWay, Side, World, reply_kind
from synapse.p2p.engine import EngineTimer


def fingerprint(world: World) -> tuple[Any, ...]:
    """The state `world` is (see the module's docstring)."""
    live = _live_ids(world)
    ranked = sorted(live, key=_mint_order)
    names = {i: f"{_minter(i)}{n}" for n, i in enumerate(ranked)}
    return (
        _side_key(world, world.r, names),
        _side_key(world, world.e, names),
        tuple(sorted(item.key(world, names) for item in world.net)),
        tuple(sorted((who, names[i], k) for (who, i), k in world.answers.items() if i in names)),
        (world.losses, world.stalls, world.failures, world.waits, world.cancels, world.lates),
        world.exhaustions,
    )


def _live_ids(world: World) -> set[str]:
    """The ids of the messages that may still arrive, and of the pending question."""
    found: set[str] = set()
    for side in (world.r, world.e):
        found.update(m.id for m in side.queue)
        rec = side.record()
        if rec is not None and rec.need_human_id:
            found.add(rec.need_human_id)
    for item in world.net:
        found.add(item.sent.id if isinstance(item, ReplyOnTheWay) else item.message.id)
    return found


def _side_key(world: World, side: Side, names: dict[str, str]) -> tuple[Any, ...]:
    rec = side.record()
    task: tuple[Any, ...] = ()
    if rec is not None:
        last = rec.history[-1] if rec.history else None
        task = (
            rec.state,
            frozenset(
                names[t.message_id]
                for t in rec.history
                if t.message_id is not None and t.message_id in names
            ),
            (last.from_state, last.event) if last is not None else None,
            names.get(rec.need_human_id or ""),
            tuple(sorted(rec.provided)),
            rec.handler_started,
            rec.cancel_requested,
            rec.cancel_sent,
            rec.result is not None,
            rec.error.code if rec.error is not None else None,
            round(rec.executed_time, 6),
        )
    timers = tuple(
        sorted(
            (kind, round(when - world.now, 6))
            for (kind, _), when in side.engine.timer_deadlines().items()
            if kind is not EngineTimer.HEARTBEAT
        )
    )
    return (
        task,
        timers,
        side.engine.counts(),
        tuple(names[m.id] for m in side.queue),
        side.queue.sending,
        frozenset((names[i], reply_kind(v[0]), v[1]) for i, v in side.dedup.items() if i in names),
        side.handler,
        side.progress_left,
        side.info_left,
        side.human_left,
        side.outcomes,
        side.parked,
        side.withdrawable is not None,
    )


def _minter(message_id: str) -> str:
    """Who made a message id: `msg-e12` → "e"."""
    return message_id.split("-", 1)[1].rstrip("0123456789")


def _mint_order(message_id: str) -> tuple[str, int]:
    tail = message_id.split("-", 1)[1]
    digits = tail[len(tail.rstrip("0123456789")) :]
    return _minter(message_id), int(digits or 0)


__all__ = ["fingerprint"]
