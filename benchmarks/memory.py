"""Memory: bytes per stored finished task (in memory and in SQLite) and per in-flight task.

    python -m benchmarks.memory [--quick]

- Finished tasks, in memory: a requester engine and an executor engine run N `echo` tasks to
  completion, sans-IO, every message crossing as bytes (encoded, then decoded by the receiver,
  so that the two sides share no object). `tracemalloc` counts what each engine's task records
  hold: the memory freed when that engine is dropped, divided by N. N = 10,000 and 100,000.
- Finished tasks, in SQLite: the same records written to a `SqliteStore` (one row per task,
  one per transition), file size ÷ N, after the store is closed (WAL checkpointed).
- In flight: an executor `P2PProtocol` given N `task_request`s (deadline 1 h ahead) by an
  in-process requester that acknowledges its callbacks; the handler awaits forever. Counted:
  the engine's record and its timers, alone, and with the runtime's handler task, context and
  bookkeeping.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from benchmarks._common import Section, Table, quiet_logging, quiet_structlog
from synapse.p2p.commands import Complete, Submit

R_ID, E_ID = "agent-r", "agent-e"
R_URL, E_URL = "http://127.0.0.1:8001/synapse/callback", "http://127.0.0.1:8002/synapse/callback"
KIB = 1024


def _engines() -> tuple[Any, Any]:
    from synapse.p2p.engine import Engine

    r = Engine(agent_id=R_ID, endpoint=R_URL)
    e = Engine(agent_id=E_ID, endpoint=E_URL, capabilities=lambda: ["echo"])
    return r, e


def _run_echo_tasks(r: Any, e: Any, count: int, start: float) -> None:
    """`count` echo tasks from `r` to `e`, start to finish, every message through bytes."""
    from synapse.types import TaskResult, decode_typed, encode_message

    def post(sender: Any, receiver: Any, out: Any, now: float) -> Any:
        step = receiver.receive(decode_typed(encode_message(out.message)), now)
        sender.on_reply(out.message, decode_typed(encode_message(step.reply)), now)
        return step

    now = start
    for i in range(count):
        now += 0.001
        _, step = r.submit(Submit(E_ID, "echo", {"text": f"hello {i}"}), now)
        e_step = post(r, e, step.outgoing[0], now)
        key = e_step.actions[0].key  # StartExecution
        for out in e_step.outgoing:  # task_status_update{executing}
            post(e, r, out, now)
        done = e.handle(Complete(key, TaskResult(output_type="text", output=f"hello {i}")), now)
        for out in done.outgoing:  # task_complete
            post(e, r, out, now)


def _freed_by(drop: Callable[[], None]) -> int:
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    drop()
    gc.collect()
    return before - tracemalloc.get_traced_memory()[0]


def finished_in_memory(count: int) -> dict[str, float]:
    """Bytes per finished task held by the requester's and the executor's engine."""
    gc.collect()
    tracemalloc.start()
    try:
        holder: dict[str, Any] = {}
        holder["r"], holder["e"] = _engines()
        _run_echo_tasks(holder["r"], holder["e"], count, time.time())
        assert all(rec.state.value == "completed" for rec in holder["r"].tasks.values())
        records = (len(holder["r"].tasks), len(holder["e"].tasks))
        r_bytes = _freed_by(lambda: holder.pop("r"))
        e_bytes = _freed_by(lambda: holder.pop("e"))
    finally:
        tracemalloc.stop()
    assert records == (count, count)
    return {"requester": r_bytes / count, "executor": e_bytes / count}


def finished_in_sqlite(count: int, directory: Path) -> dict[str, float]:
    """Bytes of SQLite file per finished task, for each role's store, and rows per task."""
    from synapse.store import SqliteStore

    r, e = _engines()
    _run_echo_tasks(r, e, count, time.time())
    out: dict[str, float] = {}
    for role, engine in (("requester", r), ("executor", e)):
        path = directory / f"{role}-{count}.sqlite"
        store = SqliteStore(path)
        store.load()
        for rec in engine.tasks.values():
            store.put_task(rec, rec.history)
        asyncio.run(_close(store))
        size = sum(p.stat().st_size for p in directory.glob(f"{path.name}*"))
        out[role] = size / count
        out[f"{role}_rows"] = (
            count + sum(len(rec.history) for rec in engine.tasks.values())
        ) / count
    return out


async def _close(store: Any) -> None:
    await store.commit()
    await store.close()


class _Acknowledger:
    """The requester side of the in-flight test: acknowledges every callback, in process."""

    def __init__(self) -> None:
        from synapse.types import Sender

        self.sender = Sender(agent_id=R_ID, endpoint=R_URL)

    async def send_callback(self, partner: str, message: Any, *, retry: bool = True) -> Any:
        from synapse.types import Ack, AckPayload, Heartbeat, HeartbeatPayload, build_reply_now

        if isinstance(message, Heartbeat):
            payload = HeartbeatPayload(status=message.payload.status, active_tasks=0)
            return build_reply_now(Heartbeat, payload, request=message, sender=self.sender)
        return build_reply_now(Ack, AckPayload(), request=message, sender=self.sender)


class _Idle:
    def get_capabilities(self) -> list[str]:
        return ["echo"]

    def validate_task(self, task_type: str, payload: dict[str, Any]) -> Any:
        from synapse.p2p.engine import Validation

        return Validation()

    async def execute_task(self, ctx: Any, task_type: str, payload: dict[str, Any]) -> Any:
        await asyncio.Event().wait()


async def _in_flight(count: int) -> dict[str, float]:
    from synapse.p2p.config import P2PConfig
    from synapse.runtime.protocol import P2PProtocol
    from synapse.types import (
        Sender,
        TaskRequest,
        TaskRequestPayload,
        TaskSpec,
        build_message_now,
        decode_typed,
        encode_message,
    )

    protocol = P2PProtocol(
        agent_id=E_ID,
        endpoint=E_URL,
        config=P2PConfig(max_concurrent_tasks=count + 10),
        handler=_Idle(),
        sender=_Acknowledger(),
    )
    await protocol.start()
    requester = Sender(agent_id=R_ID, endpoint=R_URL)
    deadline = datetime.now(UTC) + timedelta(hours=1)
    # Warm up (first-use caches, the partner's heartbeat timer), then count from here.
    await protocol.handle_message(_request(requester, "warm-up", deadline))
    await asyncio.sleep(0.01)
    timers_before = len(protocol.engine._timers)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(count):
            message = build_message_now(
                TaskRequest,
                TaskRequestPayload(
                    task=TaskSpec(
                        id=f"task-{i:08d}",
                        type="echo",
                        deadline=deadline + timedelta(milliseconds=i),
                        payload={"text": f"idle {i}"},
                    )
                ),
                sender=requester,
                to=E_ID,
            )
            await protocol.handle_message(decode_typed(encode_message(message)))
            if i % 500 == 499:
                await asyncio.sleep(0)  # let handlers start and callbacks go
        for _ in range(1000):  # bounded: the callbacks are acknowledged in process
            if not protocol.pending_deliveries:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        gc.collect()
        total = tracemalloc.get_traced_memory()[0] - before
        engine = protocol.engine
        executing = sum(rec.state.value == "executing" for rec in engine.tasks.values())
        timers = len(engine._timers)
        # The engine's share: what is left once the runtime's per-task objects are gone.
        for task in list(protocol._running.values()):
            task.cancel()
        await asyncio.sleep(0.05)
        protocol._running.clear()
        gc.collect()
        engine_only = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
        await protocol.close()
    assert executing == count + 1, executing
    return {
        "runtime": total / count,
        "engine": engine_only / count,
        "timers_per_task": (timers - timers_before) / count,
    }


def _request(requester: Any, task_id: str, deadline: datetime) -> Any:
    from synapse.types import TaskRequest, TaskRequestPayload, TaskSpec, build_message_now

    return build_message_now(
        TaskRequest,
        TaskRequestPayload(
            task=TaskSpec(id=task_id, type="echo", deadline=deadline, payload={"text": "x"})
        ),
        sender=requester,
        to=E_ID,
    )


def run(counts: tuple[int, ...] = (10_000, 100_000), in_flight: int = 10_000) -> Section:
    with quiet_structlog():
        return _run(counts, in_flight)


def _run(counts: tuple[int, ...], in_flight: int) -> Section:
    started = time.monotonic()
    section = Section(
        "memory",
        "Memory: bytes per stored finished task and per in-flight task",
        "python -m benchmarks.memory",
    )
    finished = Table(
        [
            "finished echo tasks",
            "requester engine B/task",
            "executor engine B/task",
            "requester SQLite B/task",
            "executor SQLite B/task",
            "SQLite rows/task",
        ],
        title="Finished tasks (records with their history, result and decision)",
    )
    with tempfile.TemporaryDirectory() as tmp:
        for count in counts:
            mem = finished_in_memory(count)
            disk = finished_in_sqlite(count, Path(tmp))
            finished.add(
                f"{count:,}",
                f"{mem['requester']:,.0f}",
                f"{mem['executor']:,.0f}",
                f"{disk['requester']:,.0f}",
                f"{disk['executor']:,.0f}",
                f"{disk['executor_rows']:.0f} / {disk['requester_rows']:.0f}",
            )
            section.figures |= {
                f"memory.finished{count}.requester_bytes": mem["requester"],
                f"memory.finished{count}.executor_bytes": mem["executor"],
                f"memory.finished{count}.requester_sqlite_bytes": disk["requester"],
                f"memory.finished{count}.executor_sqlite_bytes": disk["executor"],
            }
    flight = asyncio.run(_in_flight(in_flight))
    live = Table(
        ["in-flight executor tasks", "engine record + timers B/task", "with handler task B/task"],
        title="In flight (executing, TaskTimeout and deadline armed, handler awaiting)",
    )
    live.add(f"{in_flight:,}", f"{flight['engine']:,.0f}", f"{flight['runtime']:,.0f}")
    section.figures |= {
        f"memory.inflight{in_flight}.engine_bytes": flight["engine"],
        f"memory.inflight{in_flight}.runtime_bytes": flight["runtime"],
        f"memory.inflight{in_flight}.timers_per_task": flight["timers_per_task"],
    }
    section.tables += [finished, live]
    section.notes += [
        "Engine figures: tracemalloc, the memory freed when that engine is dropped ÷ tasks; "
        "each side decoded its own copy of every message from bytes, as over HTTP.",
        "SQLite: file size after close ÷ tasks; rows/task = executor / requester (one task "
        "row plus one row per state transition).",
        f"In flight: {flight['timers_per_task']:.0f} timer entries per task (TaskTimeout and "
        "deadline; heartbeats are one timer per partner, not per task). The handler column "
        "adds the asyncio task running the handler, its coroutine and ExecutionContext.",
        "Not counted: the transport's deduplication table, which keeps every reply for "
        "dedup_window (600 s) whatever becomes of the task.",
    ]
    section.seconds = time.monotonic() - started
    return section


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.memory", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="1,000 tasks only (a smoke test)")
    args = parser.parse_args(argv)
    quiet_logging()
    section = run((1_000,), 1_000) if args.quick else run()
    print(section.text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
