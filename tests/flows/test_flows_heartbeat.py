"""Heartbeats between two real peers: sent both ways while they have tasks in flight together,
answered with the replier's own status, and no longer sent once nothing is in flight."""

from __future__ import annotations

import asyncio
import dataclasses

from aiohttp import web
from flowkit import FAST, WAIT, E, PairFactory, R, collect, eventually

from synapse.p2p.engine import Engine
from synapse.runtime.listener import RuntimeListener
from synapse.runtime.sender import DeliveryError
from synapse.types import HeartbeatStatus, Message, TaskState

INTERVAL = 0.05
BEATING = dataclasses.replace(FAST, heartbeat_interval=INTERVAL)


def beating(engine: Engine, partner: str) -> bool:
    """Whether `engine` has a heartbeat to `partner` armed."""
    return ("heartbeat", partner) in engine._timers


async def test_heartbeats_flow_both_ways_while_tasks_are_in_flight(
    make_pair: PairFactory,
) -> None:
    async with make_pair("body", config=BEATING) as pair:
        handle = await pair.r.submit(E, "slow", {"steps": 10, "delay": 0.05})
        await eventually(lambda: len(pair.seen(R, "in", "heartbeat")) >= 3)
        await eventually(lambda: len(pair.seen(E, "in", "heartbeat")) >= 3)
        await collect(handle)
        assert (await asyncio.wait_for(handle, WAIT)).ok

        for receiver, sender in ((E, R), (R, E)):
            beats = pair.seen(receiver, "in", "heartbeat")
            replies = pair.seen(receiver, "reply_out", "heartbeat")
            by_request = {r.message.reply_to: r for r in replies}
            for beat in beats:
                assert beat.message.from_.agent_id == sender
                assert beat.message.payload.status is HeartbeatStatus.OK
                # The replier answers with its own status, to the very heartbeat.
                assert by_request[beat.message.id].message.payload.status is HeartbeatStatus.OK
            # Sent while the task was in flight: one task with the recipient.
            assert any(b.message.payload.active_tasks == 1 for b in beats)
            # Every heartbeat a peer sent was seen leaving it and its reply coming back.
            sent = pair.seen(sender, "out", "heartbeat")
            assert {s.message.id for s in sent} >= {b.message.id for b in beats}
            answered = {s.message.reply_to for s in pair.seen(sender, "reply_in", "heartbeat")}
            assert answered >= {b.message.id for b in beats}
        pair.assert_signed_in_mode()

        # Nothing in flight any more: the heartbeats stop. Each side's heartbeat timer for the
        # other is disarmed (one already due may still have gone), so no further one can leave.
        await eventually(
            lambda: (
                not beating(pair.r.protocol.engine, E) and not beating(pair.e.protocol.engine, R)
            )
        )
        assert pair.r.protocol.engine.in_flight_with(E) == 0
        assert pair.e.protocol.engine.in_flight_with(R) == 0
        pair.assert_states_agree(handle.task_id, TaskState.COMPLETED)


async def test_ping_answers_with_the_partners_status(make_pair: PairFactory) -> None:
    async with make_pair("header") as pair:
        status, rtt = await asyncio.wait_for(pair.r.ping(E), WAIT)
        assert status.status is HeartbeatStatus.OK and status.active_tasks == 0
        assert 0 < rtt < WAIT
        pair.e.protocol.engine.draining = True
        status, _ = await asyncio.wait_for(pair.r.ping(E), WAIT)
        assert status.status is HeartbeatStatus.DRAINING
        pair.e.protocol.engine.draining = False
        pair.assert_signed_in_mode()


async def test_no_heartbeats_without_tasks_in_flight(make_pair: PairFactory) -> None:
    async with make_pair("header", config=BEATING) as pair:
        # No heartbeat timer is armed, so none can ever leave (instead of waiting to see none);
        # a task arms one, which shows the probe can tell.
        assert not beating(pair.r.protocol.engine, E) and not beating(pair.e.protocol.engine, R)
        assert [s for s in pair.timeline if s.type == "p2p:heartbeat"] == []
        handle = await pair.r.submit(E, "echo", {"text": "x"})
        assert beating(pair.r.protocol.engine, E)
        assert (await asyncio.wait_for(handle, WAIT)).ok


class _Failures(RuntimeListener):
    def __init__(self) -> None:
        self.count = 0

    def on_delivery_failed(self, message: Message, partner: str, error: DeliveryError) -> None:
        self.count += 1


async def test_parked_callbacks_go_on_as_soon_as_the_partner_is_heard(
    make_pair: PairFactory,
) -> None:
    """E's callbacks, parked once its retries ran out against R, go on when R is heard from
    (R's next message), not only after a heartbeat: hearing R stops E's heartbeats to it,
    so a parked callback waiting for one waited until it became a dead letter (seen as 300
    tasks stuck `confirmed` for two minutes under a connection flood on a busy machine)."""
    rare = dataclasses.replace(FAST, heartbeat_interval=3600.0, max_retries=1)
    async with make_pair("header", config=rare) as pair:
        failures = _Failures()
        pair.e.protocol.listeners.append(failures)
        r_runner = pair.r._runner
        assert r_runner is not None
        sites = list(r_runner.sites)
        for site in sites:
            await site.stop()  # R stops listening: E's callbacks meet a refused connection
        first = await pair.r.submit(E, "echo", {"text": "parked"})
        await eventually(lambda: failures.count >= 1)  # its first callback, retries run out
        await web.TCPSite(r_runner, "127.0.0.1", pair.r.port, reuse_address=True).start()
        second = await pair.r.submit(E, "echo", {"text": "heard"})  # E hears from R
        outcomes = await asyncio.wait_for(asyncio.gather(first.result(), second.result()), WAIT)
        assert all(o.state is TaskState.COMPLETED for o in outcomes), outcomes
        assert not pair.seen(E, "out", "heartbeat")  # nothing waited for a heartbeat
