"""Duplicated, reordered and late messages, clock skew, and slow clients (issue 7 §4).

The peer under test runs in its own process (`peer_proc.py`, SQLite store, fast config). The
test speaks as its registered partner with raw, hand-signed envelopes (`RawPartner`) and
receives the peer's callbacks on a `Sink` it runs itself, so it can send what no well-behaved
peer would: the same bytes twice, a message after the one that should have come later, a
reply held back until a callback has overtaken it, timestamps from a skewed clock, a body
trickled a few bytes at a time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import aiohttp
import pytest
from faultkit import (
    SECRET,
    PeerProcess,
    RawPartner,
    Sink,
    assert_applied_once,
    eventually,
    free_ports,
    sign,
    status_updates,
)

from synapse.types import SIGNATURE_HEADER

pytestmark = pytest.mark.slow

E, R = "agent-e", "agent-r"
WINDOW = 300.0  # P2PConfig.replay_window (the default)
Spawn = Callable[..., PeerProcess]


@dataclass
class Executor:
    """`agent-e` in a process; the test is `agent-r`, with its callback sink."""

    peer: PeerProcess
    raw: RawPartner
    sink: Sink


@pytest.fixture
async def executor(spawn: Spawn) -> AsyncIterator[Executor]:
    pe, ps = free_ports(2)
    sink = Sink(R, ps)
    await sink.start()
    peer = spawn(E, pe, {R: sink.endpoint})
    await peer.start()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as session:
        yield Executor(peer, RawPartner(R, sink.endpoint, E, peer.endpoint, session), sink)
    await sink.close()


async def test_duplicates_get_the_stored_reply_byte_for_byte_and_run_once(
    executor: Executor,
) -> None:
    raw, sink, peer = executor.raw, executor.sink, executor.peer
    request = raw.task_request("dup-1", "echo", {"text": "once"})
    body, headers = sign(request, SECRET)

    # The original and five copies at once: the copies wait for the original's reply.
    first, *copies = await asyncio.gather(*(raw.post_bytes(body, headers) for _ in range(6)))
    assert first.status == 200 and first.type == "p2p:task_confirm", first
    assert all(c.body == first.body for c in copies)
    assert {c.headers[SIGNATURE_HEADER] for c in copies} == {first.headers[SIGNATURE_HEADER]}
    # A retry (same id, new timestamp and signature): the stored reply again.
    retry = await raw.post(raw.restamped(request, skew=-5))
    assert (retry.status, retry.body) == (200, first.body)

    # Another message reusing the id is refused.
    reused = {**raw.task_request("dup-2", "echo", {"text": "other"}), "id": request["id"]}
    refused = await raw.post(reused)
    assert refused.status == 400 and refused.payload["code"] == "invalid_params"
    assert refused.payload["details"]["reason"] == "id_reused"

    await eventually(
        lambda: _true(len(sink.of_type("task_complete")) == 1), timeout=10, what="completion"
    )
    # Late: the request again after the task completed — the same bytes as the first time.
    late = await raw.post(raw.restamped(request))
    assert (late.status, late.body) == (200, first.body)
    # A re-request of the same task under a new message id: the original decision, no rerun.
    again = await raw.post(raw.task_request("dup-1", "echo", {"text": "once"}))
    assert again.status == 200 and again.type == "p2p:task_confirm"
    assert again.payload == first.payload
    # A cancel arriving after the end: 409, and nothing changes.
    cancel = await raw.post(raw.envelope("task_cancel", {"task_id": "dup-1"}))
    assert cancel.status == 409 and cancel.payload["code"] == "task_already_completed"

    # Crash the executor and start it again on its store: the dedup table survived.
    await peer.crash()
    await peer.start()
    after = await raw.post_bytes(body, headers)
    assert (after.status, after.body) == (200, first.body)
    assert after.headers[SIGNATURE_HEADER] == first.headers[SIGNATURE_HEADER]

    # Restarted from the same store: a re-execution would have begun as it restored its tasks.
    await eventually(
        lambda: _idle(peer), timeout=10, what="nothing left to deliver after the restart"
    )
    assert peer.executions() == {f"{R}/dup-1": 1}
    assert len(sink.of_type("task_complete")) == 1
    tasks = await peer.tasks()
    assert list(tasks) == ["dup-1"] and tasks["dup-1"]["state"] == "completed"


async def test_out_of_order_messages_to_the_executor(executor: Executor) -> None:
    raw, peer = executor.raw, executor.peer
    # A cancel that overtook its task_request: the task does not exist yet.
    early_cancel = await raw.post(raw.envelope("task_cancel", {"task_id": "ooo-1"}))
    assert early_cancel.status == 404 and early_cancel.payload["code"] == "task_not_found"
    # Information nobody asked for yet (the task is executing, not info_needed).
    slow = await raw.post(raw.task_request("ooo-1", "slow", {"steps": 50, "delay": 0.1}))
    assert slow.type == "p2p:task_confirm"
    info = await raw.post(
        raw.envelope("task_info_provided", {"task_id": "ooo-1", "fields": {"x": 1}})
    )
    assert info.status == 400 and info.payload["code"] == "invalid_params"
    assert info.payload["details"]["state"] == "executing"
    # The cancel, now in order, is acknowledged; a second cancel (new id) is late: 409.
    cancel = await raw.post(raw.envelope("task_cancel", {"task_id": "ooo-1"}))
    assert cancel.status == 200 and cancel.payload == {"task_id": "ooo-1", "state": "cancelled"}
    late = await raw.post(raw.envelope("task_cancel", {"task_id": "ooo-1"}))
    assert late.status == 409
    tasks = await peer.tasks()
    assert tasks["ooo-1"]["state"] == "cancelled"
    assert_applied_once(tasks["ooo-1"])


async def test_reordered_and_late_callbacks_at_the_requester(spawn: Spawn) -> None:
    """R in a process; the test is its executor and holds back the reply to task_request."""
    pr, ps = free_ports(2)
    sink = Sink(E, ps)
    sink.decision = lambda m: (
        "p2p:task_confirm",
        {"task_id": m["payload"]["task"]["id"], "confirmed": True},
    )
    sink.hold = "task_request"
    await sink.start()
    r = spawn(R, pr, {E: sink.endpoint})
    await r.start()
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as session:
            raw = RawPartner(E, sink.endpoint, R, r.endpoint, session)
            [task_id] = await r.submit(E, "echo", {"text": "x"}, prefix="race")
            await asyncio.wait_for(sink.held.wait(), 10)  # our confirm is held back

            # A status update overtakes the confirm: an implicit confirm (specs/protocol.md,
            # 'Task states').
            update = raw.envelope(
                "task_status_update",
                {"task_id": task_id, "status": "executing", "message": "executing"},
            )
            # An older progress update, POSTed late (after the completion) below.
            progress = raw.envelope(
                "task_status_update",
                {"task_id": task_id, "status": "executing", "progress": 50},
            )
            ack = await raw.post(update)
            assert ack.status == 200 and ack.type == "p2p:ack", ack
            assert (await r.states([task_id]))[task_id] == "executing"

            sink.release()  # the confirm arrives after the callback that implied it
            await eventually(
                lambda: _true(len(sink.of_type("task_request")) == 1), timeout=5, what="request"
            )
            # The held confirm was answered and applied once R has nothing left to deliver.
            await eventually(lambda: _idle(r), timeout=10, what="the late confirm applied")
            assert (await r.states([task_id]))[task_id] == "executing"  # never backwards

            done = raw.envelope(
                "task_complete",
                {"task_id": task_id, "result": {"output_type": "text", "output": "x"}},
            )
            task_ack = await raw.post(done)
            assert task_ack.status == 200
            assert task_ack.payload == {"task_id": task_id, "state": "completed"}
            # The older update arrives after the completion: refused, nothing changes.
            late = await raw.post(progress)
            assert late.status == 409 and late.payload["code"] == "task_already_completed"
            # Duplicates of both applied callbacks: their stored replies, byte for byte.
            assert (await raw.post(raw.restamped(done))).body == task_ack.body
            assert (await raw.post(raw.restamped(update))).body == ack.body

            task = (await r.tasks())[task_id]
            assert task["state"] == "completed" and task["output"] == "x"
            assert status_updates(task) == [update["id"]]
            assert_applied_once(task)
            states = [h[1] for h in task["history"]]
            assert states == ["pending", "executing", "completed"], task["history"]
    finally:
        await sink.close()


async def test_clock_skew_inside_the_window_is_accepted_outside_it_stale(
    executor: Executor,
) -> None:
    raw, peer = executor.raw, executor.peer
    for n, skew in enumerate((-(WINDOW - 30), WINDOW - 30, -(WINDOW - 2))):
        request = raw.envelope("heartbeat", {"status": "ok", "active_tasks": 0})
        reply = await raw.post(raw.restamped(request, skew=skew))
        assert reply.status == 200 and reply.type == "p2p:heartbeat", (skew, reply)
        accepted = await raw.post(
            raw.restamped(raw.task_request(f"skew-in-{n}", "echo", {"text": "t"}), skew=skew)
        )
        assert accepted.status == 200 and accepted.type == "p2p:task_confirm", (skew, accepted)

    before = await peer.tasks()
    for n, skew in enumerate((-(WINDOW + 30), WINDOW + 30, -10 * WINDOW)):
        request = raw.task_request(f"skew-out-{n}", "echo", {"text": "t"})
        reply = await raw.post(raw.restamped(request, skew=skew))
        assert reply.status == 403, (skew, reply)
        assert reply.payload["code"] == "permission_denied"
        assert reply.payload["details"]["reason"] == "stale"
        assert "server_time" in reply.payload["details"]
        assert not reply.signed  # specs/protocol.md, 'Signatures': a 403 is never signed
        # A stale refusal is not remembered: the same message, re-stamped, goes through.
        fresh = await raw.post(raw.restamped(request))
        assert fresh.status == 200 and fresh.type == "p2p:task_confirm", fresh
    after = await peer.tasks()
    assert set(after) - set(before) == {f"skew-out-{n}" for n in range(3)}
    assert peer.executions().get(f"{R}/skew-out-0") == 1


async def test_a_slow_body_client_does_not_block_other_requests(executor: Executor) -> None:
    raw, peer = executor.raw, executor.peer
    port = int(peer.endpoint.split(":")[2].split("/")[0])

    midway = asyncio.Semaphore(0)  # released once per client in the middle of its body

    async def trickle(n: int, *, finish: bool) -> bytes:
        """Send the headers at once, then the body 8 bytes every 0.1 s."""
        message = raw.envelope("heartbeat", {"status": "ok", "active_tasks": 0})
        body, headers = sign(message, SECRET)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            head = (
                f"POST /synapse/callback HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                f"Content-Type: application/json\r\n"
                f"{SIGNATURE_HEADER}: {headers[SIGNATURE_HEADER]}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode())
            await writer.drain()
            sent = body if finish else body[: len(body) // 2]
            for i in range(0, len(sent), 8):
                writer.write(sent[i : i + 8])
                await writer.drain()
                if i == 16:
                    midway.release()
                await asyncio.sleep(0.1)  # the slowness under test, not a synchronisation
            if not finish:
                await asyncio.sleep(1.0)
                return b""
            return await asyncio.wait_for(reader.read(), 10)
        finally:
            writer.close()

    slow = [asyncio.create_task(trickle(n, finish=n % 2 == 0)) for n in range(6)]
    for _ in slow:  # every slow client is connected and in the middle of its body
        await asyncio.wait_for(midway.acquire(), 10)
    latencies = []
    for n in range(20):
        started = time.perf_counter()
        if n % 2:
            reply = await raw.post(raw.envelope("heartbeat", {"status": "ok", "active_tasks": 0}))
            assert reply.status == 200 and reply.type == "p2p:heartbeat"
        else:
            reply = await raw.post(raw.task_request(f"fast-{n}", "echo", {"text": "t"}))
            assert reply.status == 200 and reply.type == "p2p:task_confirm"
        latencies.append(time.perf_counter() - started)
    assert not any(t.done() for t in slow), "the slow clients should still be sending"
    assert max(latencies) < 1.0, latencies

    answers = await asyncio.wait_for(asyncio.gather(*slow), 30)
    for n, answer in enumerate(answers):
        if n % 2 == 0:  # the finished ones were answered in full
            assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
            assert b'"type":"p2p:heartbeat"' in answer
    await peer.wait_final([f"fast-{n}" for n in range(0, 20, 2)], timeout=10)


async def _true(value: bool) -> bool:
    return value


async def _idle(peer: PeerProcess) -> bool:
    return bool((await peer.stats())["pending_deliveries"] == 0)
