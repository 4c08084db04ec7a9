"""Cost as the work grows: per task with up to 100,000 tasks in flight, and per partner with
up to 10,000 partners.

    python -m benchmarks.scaling [--quick]

One executor `P2PProtocol` in this process, as `synapse serve` runs it (the engine, its one
timer heap, the memory store, a handler task per executing task, delivery workers); its
callbacks are acknowledged in process, so no socket enters the figures, only what the peer
itself does per unit of work. Each figure is measured at every size on the same peer, and is
flat if the cost per unit at the largest size is within 1.25× of the smallest's: nothing on a
hot path scans all tasks or all partners.

- **Tasks in flight** (1,000, 10,000, 100,000; each executing, TaskTimeout and deadline armed,
  its handler awaiting): memory per task (what Python allocated and still holds while the
  tasks of that size were added, ÷ how many; tracemalloc); the cost of a new task (1,500 more
  `task_request`s: decoded, judged, stored, confirmed, a handler started, the `executing`
  callback delivered) and of a message about a task in flight (1,500 `task_cancel`s of tasks
  drawn at random among them: found, moved, its timers and handler dropped, the `cancelled`
  callback delivered).
- **Partners** (100, 1,000, 10,000; each a requester with one task in flight, so each is
  heartbeated): memory per partner (its task included); the cost of a heartbeat (a round:
  the heartbeat timer of every partner fires, each heartbeat is sent and its reply read) and
  of a request from one partner among them (1,500 `task_request`s from partners drawn at
  random).

Flat is judged on memory and on bytecodes (the Python bytecodes an operation runs, counted
with `sys.settrace`: deterministic, and a Python scan over all tasks or partners would grow
it). CPU (`time.process_time()` of this process) is given beside them: it also moves with the
caches and the machine, by up to a third between runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import gc
import random
import sys
import time
import tracemalloc
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from types import FrameType
from typing import Any

from benchmarks._common import Section, Table, quiet_logging, quiet_structlog
from benchmarks.memory import E_ID, E_URL, _Idle
from synapse.cli import speed

#: Flat: the cost per unit at the largest size within this factor of the smallest's.
FLAT = 1.25
#: New tasks, cancels and requests timed at each size (over `ROUNDS` rounds).
OPERATIONS = 1_500
#: Operations of each kind whose bytecodes are counted at each size (before the timed ones).
TRACED = 100
#: Rounds timed of each operation at each size (the least is kept: what a round costs
#: without the machine's interruptions).
ROUNDS = 5
#: Rounds of heartbeats timed at each number of partners (the least is kept).
HEARTBEAT_ROUNDS = 3


def _traced_start() -> int:
    gc.collect()
    tracemalloc.start()
    return tracemalloc.get_traced_memory()[0]


def _traced_stop(before: int) -> int:
    """Bytes allocated and still held since `_traced_start` (tracemalloc: only Python's
    allocations, none of the allocator's slack; timing is done with it stopped)."""
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return held


class _Partners:
    """Every requester of the test, in process: acknowledges each callback and answers each
    heartbeat as the partner it was sent to."""

    def __init__(self) -> None:
        self.heartbeats = 0
        self.callbacks = 0

    async def send_callback(self, partner: str, message: Any, *, retry: bool = True) -> Any:
        from synapse.types import (
            Ack,
            AckPayload,
            Heartbeat,
            HeartbeatPayload,
            Sender,
            build_reply_now,
        )

        sender = Sender(agent_id=partner, endpoint=f"http://127.0.0.1:8001/{partner}")
        if isinstance(message, Heartbeat):
            self.heartbeats += 1
            payload = HeartbeatPayload(status=message.payload.status, active_tasks=1)
            return build_reply_now(Heartbeat, payload, request=message, sender=sender)
        self.callbacks += 1
        return build_reply_now(Ack, AckPayload(), request=message, sender=sender)


class _Peer:
    """The executor under test, its partners, a clock that can be moved ahead, and the
    messages it is sent (each encoded and decoded, as over HTTP)."""

    def __init__(self, capacity: int) -> None:
        from synapse.p2p.config import P2PConfig
        from synapse.runtime.protocol import P2PProtocol

        self.offset = 0.0
        self.partners = _Partners()
        self.config = P2PConfig(max_concurrent_tasks=capacity, max_tasks_per_partner=capacity)
        self.protocol = P2PProtocol(
            agent_id=E_ID,
            endpoint=E_URL,
            config=self.config,
            handler=_Idle(),
            sender=self.partners,
            clock=lambda: time.time() + self.offset,
        )
        self.deadline = datetime.now(UTC) + timedelta(hours=2)
        self.sent = 0

    async def request(self, requester: str, task_id: str) -> None:
        from synapse.types import (
            Sender,
            TaskRequest,
            TaskRequestPayload,
            TaskSpec,
            build_message_now,
        )

        self.sent += 1
        message = build_message_now(
            TaskRequest,
            TaskRequestPayload(
                task=TaskSpec(
                    id=task_id,
                    type="echo",
                    deadline=self.deadline + timedelta(milliseconds=self.sent),
                    payload={"text": task_id},
                )
            ),
            sender=Sender(agent_id=requester, endpoint=f"http://127.0.0.1:8001/{requester}"),
            to=E_ID,
        )
        await self._receive(message)

    async def cancel(self, requester: str, task_id: str) -> None:
        from synapse.types import Sender, TaskCancel, TaskCancelPayload, build_message_now

        message = build_message_now(
            TaskCancel,
            TaskCancelPayload(task_id=task_id, reason="scaling benchmark"),
            sender=Sender(agent_id=requester, endpoint=f"http://127.0.0.1:8001/{requester}"),
            to=E_ID,
        )
        await self._receive(message)

    async def _receive(self, message: Any) -> None:
        from synapse.types import decode_typed, encode_message

        await self.protocol.handle_message(decode_typed(encode_message(message)))

    async def settle(self) -> None:
        """Until every callback is delivered and every handler started (bounded)."""
        for _ in range(2_000):
            await asyncio.sleep(0)
            if not self.protocol.pending_deliveries and not self.protocol._background:
                break
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.01)

    def executing(self) -> int:
        return sum(rec.state.value == "executing" for rec in self.protocol.engine.tasks.values())


async def _timed(
    operations: list[Callable[[], Awaitable[None]]], peer: _Peer
) -> tuple[float, float]:
    """CPU seconds per operation, its callbacks delivered (the least of `ROUNDS` rounds), and
    the Python bytecodes one costs (the first `TRACED` operations, counted)."""
    traced = min(TRACED, len(operations) // 2)  # a smoke run has few
    with _counting() as counted:
        await _round(operations[:traced], peer)
    rest = operations[traced:]
    size = max(1, len(rest) // ROUNDS)
    rounds = [await _round(rest[n * size : (n + 1) * size], peer) for n in range(ROUNDS)]
    return min(rounds), counted[0] / traced


async def _round(operations: list[Callable[[], Awaitable[None]]], peer: _Peer) -> float:
    with _collector_paused():
        started = time.process_time()
        for n, operation in enumerate(operations, 1):
            await operation()
            if n % 250 == 0:
                await asyncio.sleep(0)  # let handlers start and callbacks go, as a server would
        await peer.settle()
        return (time.process_time() - started) / len(operations)


@contextlib.contextmanager
def _counting() -> Iterator[list[int]]:
    """The bytecodes this thread's Python runs inside the block (`sys.settrace` with opcode
    events: a coroutine resumed is traced too). Unlike CPU time, the count does not move
    with the machine or the caches: a scan over all tasks or partners in Python shows as
    a count that grows with them."""
    counted = [0]

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "opcode":
            counted[0] += 1
        return local

    def entered(frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        return local

    sys.settrace(entered)
    try:
        yield counted
    finally:
        sys.settrace(None)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """The cyclic collector off while a round is timed (and run before it): whether one of
    its full collections, whose cost grows with the heap, falls inside a round or not would
    move the figures by a third. Its cost per object made does not grow with the heap (a full
    collection waits until the objects that survived since the last one are a quarter of
    those it holds), so pausing it hides no scan of ours."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def _tasks(sizes: tuple[int, ...], operations: int) -> list[dict[str, float]]:
    peer = _Peer(capacity=sizes[-1] + 4 * operations)
    await peer.protocol.start()
    rng = random.Random(45)
    rows: list[dict[str, float]] = []
    live: list[str] = []  # the tasks in flight, by id
    made = 0
    try:
        await peer.request("agent-r", "warm-up")
        await peer.settle()

        async def add(task_id: str) -> None:
            await peer.request("agent-r", task_id)
            live.append(task_id)

        for size in sizes:
            before, added = _traced_start(), size - len(live)
            while len(live) < size:
                made += 1
                await add(f"task-{made:08d}")
                if made % 500 == 0:
                    await peer.settle()
            await peer.settle()
            memory = _traced_stop(before) / added
            fresh = [f"new-{size}-{n:05d}" for n in range(operations)]
            per_new, new_bytecodes = await _timed([functools.partial(add, t) for t in fresh], peer)
            doomed = set(rng.sample(range(len(live)), operations))
            cancels = [live[n] for n in doomed]
            live[:] = [task for n, task in enumerate(live) if n not in doomed]
            per_cancel, cancel_bytecodes = await _timed(
                [functools.partial(peer.cancel, "agent-r", t) for t in cancels], peer
            )
            if peer.executing() != len(live) + 1:  # the warm-up task too
                raise RuntimeError(f"{peer.executing()} executing, {len(live) + 1} expected")
            rows.append(
                {
                    "size": size,
                    "memory": memory,
                    "new": new_bytecodes,
                    "cancel": cancel_bytecodes,
                    "new_cpu": per_new,
                    "cancel_cpu": per_cancel,
                }
            )
    finally:
        await peer.protocol.close()
    return rows


async def _partners(sizes: tuple[int, ...], operations: int) -> list[dict[str, float]]:
    rows: list[dict[str, float]] = []
    rng = random.Random(10)
    for size in sizes:
        peer = _Peer(capacity=size + 2 * operations)
        await peer.protocol.start()
        try:
            await peer.request("warm-up", "warm-up")
            await peer.settle()
            names = [f"agent-{n:06d}" for n in range(size)]
            before = _traced_start()
            for n, name in enumerate(names):
                await peer.request(name, f"first-{n:06d}")
                if n % 500 == 499:
                    await peer.settle()
            await peer.settle()
            memory = _traced_stop(before) / size
            # Rounds of heartbeats: every partner's heartbeat timer fires at once.
            rounds = []
            for _ in range(HEARTBEAT_ROUNDS):
                peer.offset += peer.config.heartbeat_interval + 1
                beats = peer.partners.heartbeats
                with _collector_paused():
                    started = time.process_time()
                    peer.protocol.apply(peer.protocol.engine.on_timer(peer.protocol.clock()))
                    await peer.settle()
                    rounds.append((time.process_time() - started) / size)
                if peer.partners.heartbeats - beats < size:
                    raise RuntimeError(
                        f"{peer.partners.heartbeats - beats} heartbeats, {size} partners"
                    )
            per_heartbeat = min(rounds)
            peer.offset += peer.config.heartbeat_interval + 1
            with _counting() as counted:
                peer.protocol.apply(peer.protocol.engine.on_timer(peer.protocol.clock()))
                await peer.settle()
            heartbeat_bytecodes = counted[0] / size
            picked = [rng.choice(names) for _ in range(operations)]
            per_request, request_bytecodes = await _timed(
                [
                    functools.partial(peer.request, who, f"more-{n:05d}")
                    for n, who in enumerate(picked)
                ],
                peer,
            )
            rows.append(
                {
                    "size": size,
                    "memory": memory,
                    "heartbeat": heartbeat_bytecodes,
                    "request": request_bytecodes,
                    "heartbeat_cpu": per_heartbeat,
                    "request_cpu": per_request,
                }
            )
        finally:
            await peer.protocol.close()
    return rows


def _flat(rows: list[dict[str, float]], key: str) -> float:
    """The cost per unit at the largest size ÷ the smallest's."""
    return rows[-1][key] / rows[0][key]


def run(
    tasks: tuple[int, ...] = (1_000, 10_000, 100_000),
    partners: tuple[int, ...] = (100, 1_000, 10_000),
    operations: int = OPERATIONS,
) -> Section:
    with quiet_structlog():
        return _run(tasks, partners, operations)


def _run(task_sizes: tuple[int, ...], partner_sizes: tuple[int, ...], operations: int) -> Section:
    started = time.monotonic()
    section = Section(
        "scaling",
        "Cost as the work grows: per task in flight and per partner",
        "python -m benchmarks.scaling",
    )
    # As `synapse serve` runs: uvloop if installed, its collector thresholds.
    by_task = speed.run_server(_tasks(task_sizes, operations))
    by_partner = speed.run_server(_partners(partner_sizes, operations))
    tasks = Table(
        ["tasks in flight", "memory per task added", "new task", "cancel of one of them"],
        title="Tasks in flight (executing, TaskTimeout and deadline armed, handler awaiting): "
        "bytecodes / CPU per operation",
    )
    for row in by_task:
        tasks.add(
            f"{row['size']:,}",
            f"{row['memory'] / 1024:,.2f} KiB",
            f"{row['new']:,.0f} / {row['new_cpu'] * 1e6:,.0f} µs",
            f"{row['cancel']:,.0f} / {row['cancel_cpu'] * 1e6:,.0f} µs",
        )
    partners = Table(
        ["partners", "memory per partner", "heartbeat", "request from one of them"],
        title="Partners (each a requester with one task in flight, heartbeated): "
        "bytecodes / CPU per operation",
    )
    for row in by_partner:
        partners.add(
            f"{row['size']:,}",
            f"{row['memory'] / 1024:,.2f} KiB",
            f"{row['heartbeat']:,.0f} / {row['heartbeat_cpu'] * 1e6:,.0f} µs",
            f"{row['request']:,.0f} / {row['request_cpu'] * 1e6:,.0f} µs",
        )
    section.tables += [tasks, partners]
    section.figures |= {
        "scaling.tasks.largest": by_task[-1]["size"],
        "scaling.partners.largest": by_partner[-1]["size"],
    }
    judged = (
        ("tasks", by_task, ("new", "cancel")),
        ("partners", by_partner, ("heartbeat", "request")),
    )
    for kind, rows, operations_of in judged:
        section.figures[f"scaling.{kind}.memory_ratio"] = _flat(rows, "memory")
        for operation in operations_of:
            section.figures[f"scaling.{kind}.{operation}_ratio"] = _flat(rows, operation)
            section.figures[f"scaling.{kind}.{operation}_cpu_ratio"] = _flat(
                rows, f"{operation}_cpu"
            )
        for row in rows:
            prefix = f"scaling.{kind}{row['size']}"
            section.figures[f"{prefix}.memory_bytes"] = row["memory"]
            for operation in operations_of:
                section.figures[f"{prefix}.{operation}_bytecodes"] = row[operation]
                section.figures[f"{prefix}.{operation}_seconds"] = row[f"{operation}_cpu"]
    ratios = ", ".join(
        f"{name} {section.figures[key]:.2f}×"
        for name, key in (
            ("memory per task", "scaling.tasks.memory_ratio"),
            ("bytecodes per new task", "scaling.tasks.new_ratio"),
            ("per cancel", "scaling.tasks.cancel_ratio"),
            ("memory per partner", "scaling.partners.memory_ratio"),
            ("bytecodes per heartbeat", "scaling.partners.heartbeat_ratio"),
            ("per request", "scaling.partners.request_ratio"),
        )
    )
    cpu = ", ".join(
        f"{name} {section.figures[key]:.2f}×"
        for name, key in (
            ("new task", "scaling.tasks.new_cpu_ratio"),
            ("cancel", "scaling.tasks.cancel_cpu_ratio"),
            ("heartbeat", "scaling.partners.heartbeat_cpu_ratio"),
            ("request", "scaling.partners.request_cpu_ratio"),
        )
    )
    section.notes += [
        f"Largest size ÷ smallest, per unit (flat: ≤ {FLAT}×): {ratios}. CPU per operation, "
        f"the same ratio: {cpu}.",
        f"Flat is judged on memory and on bytecodes: the Python bytecodes of {TRACED} "
        "operations of each kind, counted (`sys.settrace`), ÷ the operations. The count does "
        "not move with the machine: a Python scan over all tasks or partners would grow it "
        "with them. CPU time moves with the caches (a heap of 100,000 tasks fits in none) and "
        "with the machine by up to a third between runs; it is given for scale.",
        "Memory: what Python allocated and still holds (tracemalloc) while the tasks or "
        "partners of that size were added, ÷ how many were added; for tasks, the marginal "
        "cost of a task at that size. CPU is `time.process_time()` of this process, timed "
        "with tracemalloc stopped and the cyclic collector paused (its full collections, "
        "whose cost grows with the heap, run once the objects made since the last are a "
        "quarter of those it holds: constant per object made, but a round that catches one "
        f"is a third dearer): {operations - TRACED:,} operations at each size in {ROUNDS} "
        f"rounds, {HEARTBEAT_ROUNDS} rounds of heartbeats, the least of each kept.",
        "One executor P2PProtocol in this process (memory store), callbacks acknowledged in "
        "process: the figures are the peer's own work per unit, without sockets. Each task's "
        "handler is an asyncio task awaiting forever: its memory includes it, its coroutine "
        "and its ExecutionContext, the record, its two timer entries and the deduplication "
        "entry of its request.",
    ]
    section.seconds = time.monotonic() - started
    return section


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scaling", description=__doc__)
    parser.add_argument(
        "--quick", action="store_true", help="small sizes only (a smoke test, not a figure)"
    )
    args = parser.parse_args(argv)
    quiet_logging()
    section = run((200, 400, 800), (20, 40, 80), 50) if args.quick else run()
    print(section.text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
