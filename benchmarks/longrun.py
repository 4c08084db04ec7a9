"""Running for months: memory and store size over many finished tasks, GC pauses, restart.

    python -m benchmarks.longrun [--quick] [--tasks N] [--block N] [--json PATH] [--plot PATH]

- An executor `Peer` runs in its own process (the demo handler, signatures on, the real
  transport with its deduplication table). This process is its requester: a `Peer` with the
  memory store that submits `echo` tasks over loopback HTTP, 64 at a time, and awaits each.
- After every block of tasks the executor reports its RSS (`/proc/self/status` VmRSS), the
  size of its store on disk (file + WAL) and the longest full garbage collection (generation
  2, timed with `gc.callbacks`) so far.
- Three runs: the memory store (default retention; at most `max_finished_in_memory` finished
  tasks kept), SQLite with the default retention (7 days: every task kept), and SQLite with a
  short retention (`retain` 5 s; dedup window 30 s, replay window 15 s) where the file must
  stop growing.
- Restart: an SQLite file holding 100,000 retained finished tasks (written directly through
  `SqliteStore`) and 100 live ones; the time from process start to the first request answered
  200, and the in-process recovery time.

"RSS per finished task after warm-up" is (RSS at the end − RSS after the first block) ÷ the
tasks after the first block.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks._common import ROOT, Section, Table, free_port, quiet_logging, quiet_structlog

SECRET = "bench-secret"
E_ID, R_ID = "bench-e", "bench-r"
KIB = 1024
CONCURRENCY = 64


# --- the executor process ------------------------------------------------------------------


class GcWatch:
    """The longest pause of each generation's collections (`gc.callbacks`)."""

    def __init__(self) -> None:
        self.started = 0.0
        self.longest = [0.0, 0.0, 0.0]
        self.full = 0
        self.started_cpu = 0.0
        self.full_cpu = 0.0
        #: Off during the benchmark's own `gc.collect()` (not a pause the peer causes).
        self.paused = False
        gc.callbacks.append(self)

    def reset(self) -> None:
        self.longest = [0.0, 0.0, 0.0]
        self.full = 0
        self.full_cpu = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if self.paused:
            return
        if phase == "start":
            self.started = time.perf_counter()
            self.started_cpu = time.thread_time()
            return
        took = time.perf_counter() - self.started
        generation = info.get("generation", 0)
        self.longest[generation] = max(self.longest[generation], took)
        if generation == 2:
            self.full += 1
            # CPU time of this thread: the collector's own work, without the time another
            # process of a loaded machine held the CPU meanwhile.
            self.full_cpu = max(self.full_cpu, time.thread_time() - self.started_cpu)


def rss_kib() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def store_bytes(path: str) -> int:
    if path == "memory":
        return 0
    return sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))


async def executor(args: argparse.Namespace) -> None:
    from aiohttp import web

    from synapse.demo.handler import DemoHandler
    from synapse.p2p.config import P2PConfig
    from synapse.store import open_store
    from synapse.transport.partners import Partner
    from synapse.transport.peer import Peer

    quiet_logging()
    watch = GcWatch()
    config = P2PConfig(
        retain=args.retain,
        replay_window=args.replay_window,
        dedup_window=2 * args.replay_window,
        heartbeat_interval=5.0,
    )
    peer = Peer(
        E_ID,
        partners=[Partner(R_ID, args.partner, (SECRET,))],
        handler=DemoHandler(),
        port=args.port,
        config=config,
        store=open_store(args.store),
    )

    async def ready(_request: web.Request) -> web.Response:
        # The restart's probe: answered at once (no wait for deliveries, no collection).
        return web.json_response({"in_memory": len(peer.protocol.engine.tasks)})

    async def stats(_request: web.Request) -> web.Response:
        # The requester counts a task done on its final callback; the executor lets it go
        # once that callback's acknowledgement is in and committed: wait (bounded) for the
        # deliveries still under way, so what is counted is what stays.
        for _ in range(500):  # at most 5 s
            if not peer.protocol._queues:
                break
            await asyncio.sleep(0.01)
        watch.paused = True
        gc.collect()  # what is left is what is held, not garbage not collected yet
        tracked = gc.get_objects()  # what a full collection scans (the frozen heap aside)
        watch.paused = False
        by_type: dict[str, int] = {}
        for obj in tracked:
            name = type(obj).__qualname__
            by_type[name] = by_type.get(name, 0) + 1
        top = dict(sorted(by_type.items(), key=lambda item: -item[1])[:8])
        del tracked
        return web.json_response(
            {
                "rss_kib": rss_kib(),
                "store_bytes": store_bytes(args.store),
                "gc_full_max_ms": watch.longest[2] * 1000,
                "gc_full_cpu_max_ms": watch.full_cpu * 1000,
                "gc_any_max_ms": max(watch.longest) * 1000,
                "gc_full": watch.full,
                "in_memory": len(peer.protocol.engine.tasks),
                "gc_tracked": sum(by_type.values()),
                "gc_tracked_top": top,
                # CPU seconds of the executor process: per task, a loaded machine barely
                # disturbs it (wall-clock throughput it does).
                "cpu_s": time.process_time(),
            }
        )

    peer.app_hooks.append(lambda app: app.router.add_get("/bench/stats", stats))
    peer.app_hooks.append(lambda app: app.router.add_get("/bench/ready", ready))
    started = time.perf_counter()
    await peer.start()
    recovery = time.perf_counter() - started
    from synapse.cli.serve import freeze_startup_heap

    freeze_startup_heap()  # as `synapse serve` does
    watch.reset()  # the collections of imports and start-up are not the peer at work
    print(json.dumps({"ready": True, "recovery_s": recovery}), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    import signal

    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await peer.close(drain_timeout=0)


# --- the requester (this process) ----------------------------------------------------------


class Executor:
    def __init__(self, store: str, port: int, partner: str, retain: float, replay: float) -> None:
        self.port = port
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks.longrun",
                "--worker",
                "--store",
                store,
                "--port",
                str(port),
                "--partner",
                partner,
                "--retain",
                str(retain),
                "--replay-window",
                str(replay),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the executor exited ({self.proc.wait()})")
        self.ready: dict[str, Any] = json.loads(line)
        self.ready_after = time.perf_counter() - self.started

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/synapse/callback"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


async def _stats(session: Any, port: int, what: str = "stats") -> dict[str, Any]:
    async with session.get(f"http://127.0.0.1:{port}/bench/{what}") as response:
        data: dict[str, Any] = await response.json()
        return data


async def _run_tasks(
    store: str, tasks: int, block: int, *, retain: float, replay: float
) -> list[dict[str, Any]]:
    import aiohttp

    from synapse.p2p.config import P2PConfig
    from synapse.transport.partners import Partner
    from synapse.transport.peer import Peer

    r_port, e_port = free_port(), free_port()
    r_url = f"http://127.0.0.1:{r_port}/synapse/callback"
    ex = Executor(store, e_port, r_url, retain, replay)
    config = P2PConfig(
        replay_window=replay,
        dedup_window=2 * replay,
        retain=retain,
        max_finished_in_memory=1000,
        heartbeat_interval=5.0,
    )
    peer = Peer(R_ID, partners=[Partner(E_ID, ex.url, (SECRET,))], port=r_port, config=config)
    rows: list[dict[str, Any]] = []
    try:
        await peer.start()
        async with aiohttp.ClientSession() as session:
            rows.append({"tasks": 0, "seconds": 0.0, **await _stats(session, e_port)})
            done = 0
            while done < tasks:
                size = min(block, tasks - done)
                started = time.perf_counter()

                async def worker(queue: Any) -> None:
                    for n in queue:
                        handle = await peer.submit(E_ID, "echo", {"text": f"hello {n}"})
                        outcome = await handle
                        if not outcome.ok:
                            raise RuntimeError(f"task ended {outcome.state.value}")

                numbers = iter(range(size))
                await asyncio.gather(*(worker(numbers) for _ in range(CONCURRENCY)))
                seconds = time.perf_counter() - started
                done += size
                stats = await _stats(session, e_port)
                rows.append({"tasks": done, "seconds": seconds, **stats})
                print(
                    f"    {store if store == 'memory' else 'sqlite'} retain={retain:g}: "
                    f"{done} tasks, {size / seconds:.0f}/s, rss {stats['rss_kib']} KiB, "
                    f"store {stats['store_bytes'] / 1e6:.1f} MB, "
                    f"full GC max {stats['gc_full_max_ms']:.1f} ms "
                    f"({stats['gc_full_cpu_max_ms']:.1f} ms CPU, {stats['gc_full']} runs), "
                    f"{stats.get('gc_tracked', 0)} tracked objects",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        await peer.close(drain_timeout=0)
        ex.stop()
    return rows


def _retained_store(path: Path, finished: int, live: int) -> None:
    """An SQLite store with `finished` finished echo tasks and `live` executing ones."""
    import sqlite3

    from synapse.p2p.engine import TaskKey, TaskRecord, Transition
    from synapse.p2p.states import Event, Role
    from synapse.store.sqlite import connect, encode_record
    from synapse.types import TaskResult, TaskSpec, TaskState

    connect(path).close()
    conn = sqlite3.connect(str(path), isolation_level=None)
    now = time.time()
    tasks, transitions = [], []
    for n in range(finished + live):
        key = TaskKey(R_ID, f"task-{n:07d}")
        final = n < finished
        state = TaskState.COMPLETED if final else TaskState.EXECUTING
        rec = TaskRecord(
            key=key,
            role=Role.EXECUTOR,
            partner=R_ID,
            task=TaskSpec(id=key.task_id, type="echo", payload={"text": f"hello {n}"}),
            context=None,
            request_id=f"msg-{n:07d}",
            created_at=now - 60,
            state=state,
            updated_at=now - 30,
            result=TaskResult(output_type="text", output=f"hello {n}") if final else None,
            handler_started=True,
        )
        tasks.append(
            (R_ID, key.task_id, "executor", state.value, rec.updated_at, encode_record(rec))
        )
        steps = [(TaskState.IDLE, TaskState.CONFIRMED, Event.SEND_TASK_CONFIRM)]
        steps.append((TaskState.CONFIRMED, TaskState.EXECUTING, Event.START_EXECUTION))
        if final:
            steps.append((TaskState.EXECUTING, TaskState.COMPLETED, Event.SEND_TASK_COMPLETE))
        for a, b, event in steps:
            t = Transition(key, Role.EXECUTOR, a, b, event, None, now - 30)
            transitions.append(
                (
                    R_ID,
                    key.task_id,
                    "executor",
                    t.from_state.value,
                    t.to_state.value,
                    t.event.value,
                    None,
                    t.at,
                )
            )
    conn.execute("BEGIN")
    conn.executemany(
        "INSERT INTO tasks (requester, task_id, role, state, updated_at, record) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        tasks,
    )
    conn.executemany(
        "INSERT INTO transitions (requester, task_id, role, from_state, to_state, event, "
        "message_id, at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        transitions,
    )
    conn.execute("COMMIT")
    conn.close()


async def _restart(finished: int, live: int) -> dict[str, float]:
    """Time to the first answered request after a start on a store of `finished` tasks."""
    import aiohttp

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "e.sqlite"
        _retained_store(path, finished, live)
        size = path.stat().st_size
        port = free_port()
        started = time.perf_counter()
        proc_started = started
        ex = Executor(str(path), port, "http://127.0.0.1:9/synapse/callback", 7 * 86400, 300)
        try:
            async with aiohttp.ClientSession() as session:
                # The port answers from the start: poll the stats until recovery is done.
                while True:
                    with contextlib.suppress(aiohttp.ClientError):
                        stats = await _stats(session, port, "ready")
                        if stats.get("in_memory", -1) >= live:
                            break
                    await asyncio.sleep(0.01)
            answered = time.perf_counter() - proc_started
        finally:
            ex.stop()
        return {
            "finished": finished,
            "live": live,
            "store_mb": size / 1e6,
            "ready_s": ex.ready_after,
            "recovery_s": float(ex.ready["recovery_s"]),
            "answered_s": answered,
        }


def _cpu_per_task(rows: list[dict[str, Any]]) -> tuple[float, float] | None:
    """Executor CPU µs per task in the first and in the last block (None if not measured)."""
    if "cpu_s" not in rows[0]:
        return None

    def block(i: int) -> float:
        tasks = rows[i]["tasks"] - rows[i - 1]["tasks"]
        return (rows[i]["cpu_s"] - rows[i - 1]["cpu_s"]) * 1e6 / tasks

    return block(1), block(len(rows) - 1)


def _per_task(rows: list[dict[str, Any]]) -> float:
    """RSS bytes per finished task after the first block."""
    first, last = rows[1], rows[-1]
    tasks = last["tasks"] - first["tasks"]
    return (last["rss_kib"] - first["rss_kib"]) * KIB / tasks if tasks else 0.0


STORES = ("memory", "sqlite", "sqlite-retain-5s")


def run(
    tasks: int = 100_000,
    block: int = 10_000,
    *,
    restart_tasks: int = 100_000,
    stores: Sequence[str] = STORES,
) -> Section:
    with quiet_structlog():  # maybe in a test process: its logging comes back afterwards
        return _run(tasks, block, restart_tasks, stores)


def _run(tasks: int, block: int, restart_tasks: int, stores: Sequence[str]) -> Section:
    runs: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        plans = [
            ("memory", "memory", 7 * 86400.0, 300.0),
            ("sqlite", str(Path(tmp) / "kept.sqlite"), 7 * 86400.0, 300.0),
            ("sqlite-retain-5s", str(Path(tmp) / "short.sqlite"), 5.0, 15.0),
        ]
        for name, store, retain, replay in plans:
            if name not in stores:
                continue
            runs[name] = asyncio.run(_run_tasks(store, tasks, block, retain=retain, replay=replay))
    restart = asyncio.run(_restart(restart_tasks, 100))
    return build_section({"runs": runs, "restart": restart}, tasks)


def build_section(raw: dict[str, Any], tasks: int) -> Section:
    """The tables and figures of a run (`raw`: what `run` measured, as saved by `--json`)."""
    runs: dict[str, list[dict[str, Any]]] = raw["runs"]
    restart: dict[str, Any] = raw["restart"]
    section = Section(
        "longrun",
        f"Running for months: {tasks:,} echo tasks per store",
        "python -m benchmarks.longrun" + ("" if tasks == 100_000 else f" --tasks {tasks}"),
    )
    table = Table(
        [
            "store",
            "tasks",
            "tasks/s",
            "RSS KiB",
            "store MB",
            "full GC max ms",
            "… CPU ms",
            "in memory",
            "GC-tracked objects",
        ],
        title="Executor after each block (RSS, store on disk, longest full GC so far)",
    )
    for name, rows in runs.items():
        for row in rows[1:]:
            table.add(
                name,
                f"{row['tasks']:,}",
                f"{(row['tasks'] - rows[rows.index(row) - 1]['tasks']) / row['seconds']:.0f}",
                row["rss_kib"],
                f"{row['store_bytes'] / 1e6:.1f}",
                f"{row['gc_full_max_ms']:.1f}",
                f"{row['gc_full_cpu_max_ms']:.1f}",
                row["in_memory"],
                f"{row['gc_tracked']:,}" if "gc_tracked" in row else "n/a",
            )
    section.tables.append(table)
    summary = Table(
        [
            "store",
            "RSS B/finished task",
            "store last/warm-up",
            "throughput last/first",
            "full GC max ms",
            "… CPU ms",
            "executor CPU µs/task first → last",
        ],
        title="Summary (after the first block as warm-up)",
    )
    for name, rows in runs.items():
        first_rate = rows[1]["tasks"] / rows[1]["seconds"]
        last_rate = (rows[-1]["tasks"] - rows[-2]["tasks"]) / rows[-1]["seconds"]
        warm = rows[1]["store_bytes"]
        growth = rows[-1]["store_bytes"] / warm if warm else 0.0
        gc_max = max(row["gc_full_max_ms"] for row in rows)
        gc_cpu = max(row["gc_full_cpu_max_ms"] for row in rows)
        per_task = _per_task(rows)
        cpu = _cpu_per_task(rows)
        summary.add(
            name,
            f"{per_task:.0f}",
            f"{growth:.2f}",
            f"{last_rate / first_rate:.2f}",
            f"{gc_max:.1f}",
            f"{gc_cpu:.1f}",
            f"{cpu[0]:.0f} → {cpu[1]:.0f}" if cpu else "-",
        )
        if cpu:
            key = name.replace("-", "_")
            section.figures[f"longrun.{key}.cpu_last_over_first"] = cpu[1] / cpu[0]
        key = name.replace("-", "_")
        section.figures[f"longrun.{key}.rss_bytes_per_task"] = max(per_task, 0.0) + 1e-9
        section.figures[f"longrun.{key}.store_growth"] = growth + 1e-9
        section.figures[f"longrun.{key}.throughput_last_over_first"] = last_rate / first_rate
        section.figures[f"longrun.{key}.gc_full_max_ms"] = gc_max + 1e-9
        section.figures[f"longrun.{key}.gc_full_cpu_max_ms"] = gc_cpu + 1e-9
    section.tables.append(summary)
    restart_table = Table(
        ["finished", "live", "store MB", "process start → ready s", "recovery s", "first answer s"],
        title="Restart on a store of retained tasks",
    )
    restart_table.add(
        f"{restart['finished']:,}",
        restart["live"],
        f"{restart['store_mb']:.1f}",
        f"{restart['ready_s']:.2f}",
        f"{restart['recovery_s']:.3f}",
        f"{restart['answered_s']:.2f}",
    )
    section.tables.append(restart_table)
    section.figures["longrun.restart.recovery_s"] = restart["recovery_s"] + 1e-9
    section.figures["longrun.restart.answered_s"] = restart["answered_s"] + 1e-9
    section.raw = raw  # type: ignore[attr-defined]
    return section


def plot(section: Section, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    runs = section.raw["runs"]  # type: ignore[attr-defined]
    fig, (left, right, cpu) = plt.subplots(1, 3, figsize=(15, 4))
    for name, rows in runs.items():
        rows = [row for row in rows if row["rss_kib"]]  # a run rebuilt from its log has no start
        xs = [row["tasks"] for row in rows]
        left.plot(xs, [row["rss_kib"] / 1024 for row in rows], marker="o", label=name)
        right.plot(xs, [row["store_bytes"] / 1e6 for row in rows], marker="o", label=name)
        if "cpu_s" in rows[0]:
            per_block = [
                (b["cpu_s"] - a["cpu_s"]) * 1e6 / (b["tasks"] - a["tasks"])
                for a, b in itertools.pairwise(rows)
            ]
            cpu.plot(xs[1:], per_block, marker="o", label=name)
    left.set(title="executor RSS", xlabel="finished echo tasks", ylabel="MiB")
    right.set(title="store on disk (file + WAL)", xlabel="finished echo tasks", ylabel="MB")
    cpu.set(title="executor CPU per task, each block", xlabel="finished echo tasks", ylabel="µs")
    cpu.set_ylim(bottom=0)
    for axis in (left, right, cpu):
        axis.grid(alpha=0.3)
        axis.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.longrun", description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--block", type=int, default=10_000)
    parser.add_argument("--restart-tasks", type=int, default=100_000)
    parser.add_argument("--stores", default=",".join(STORES), help="which runs, comma-separated")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--plot", type=Path)
    parser.add_argument("--markdown", type=Path, help="write the tables as Markdown")
    parser.add_argument("--from-json", type=Path, help="render a saved --json run")
    # The executor process:
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--store", default="memory", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--partner", default="", help=argparse.SUPPRESS)
    parser.add_argument("--retain", type=float, default=7 * 86400, help=argparse.SUPPRESS)
    parser.add_argument("--replay-window", type=float, default=300, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        asyncio.run(executor(args))
        return 0
    if args.quick:
        args.tasks, args.block, args.restart_tasks = 400, 100, 2000
    if args.from_json:
        raw = json.loads(args.from_json.read_text())
        section = build_section(raw, raw["runs"]["sqlite"][-1]["tasks"])
    else:
        stores = [name for name in args.stores.split(",") if name]
        section = run(args.tasks, args.block, restart_tasks=args.restart_tasks, stores=stores)
    print(section.text())
    if args.markdown:
        args.markdown.write_text("\n\n".join(t.markdown() for t in section.tables) + "\n")
    if args.json:
        args.json.write_text(json.dumps(section.raw, indent=1))  # type: ignore[attr-defined]
    if args.plot:
        plot(section, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
