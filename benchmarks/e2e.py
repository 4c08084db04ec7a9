"""End to end: echo tasks/s and CPU per task of `synapse serve` beside the floor executor and
the bare aiohttp server, measured in one run, in alternating rounds.

    python -m benchmarks.e2e [--seconds 4] [--rounds 3] [--compare] [--quick]

One independent requester (`benchmarks.floor`: aiohttp, stdlib json, HMAC-SHA256) drives
every executor alike over 127.0.0.1, each in its own process:

- **floor**: `benchmarks.floor`'s executor, the least an executor of the same three
  exchanges can do on aiohttp (no I-JSON, no dedup, no state table, no store, no logs);
- **fastest floor**: `benchmarks.fastest`'s, the same on raw asyncio Protocols, httptools
  and msgspec (when httptools is installed): the anchor of the CPU and latency ratios;
- **serve (memory)** and **serve (SQLite)**: `synapse serve` as an operator starts it (its
  default logging, to a file), demo handler, header-mode signatures both ways;
- **bare aiohttp**: an aiohttp server answering a POST with a small JSON reply, driven by an
  aiohttp client: what one HTTP exchange costs on this stack.

An `echo` task is 3 exchanges: the requester POSTs `task_request` (E answers
`task_confirm`), E POSTs `task_status_update{executing}` (R answers `ack`), E POSTs
`task_complete` (R answers `task_ack`). CPU is each executor process's own (utime + stime
from /proc), per task it served; the requester's CPU is the same for every executor.

`--compare` adds A/B variants of `synapse serve` (memory store): logging off, without
uvloop, without the collector thresholds, so that each setting's worth is measured in the
same run as the rest.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

from benchmarks._common import (
    HOST,
    ROOT,
    Child,
    Section,
    Table,
    free_port,
    ms,
    pct,
    rate,
)

EXCHANGES_PER_TASK = 3
#: The concurrency whose per-exchange p99 is a goal (< 2 ms), measured in several rounds.
LATENCY_CONCURRENCY = 1
KINDS = ("request", "executing", "complete")
SECRET = "bench-secret-2026"
REQUESTER = "agent-r"
CLK_TCK = os.sysconf("SC_CLK_TCK")
#: serve runs on uvloop when it is installed: the floor is then measured on it too.
UVLOOP = importlib.util.find_spec("uvloop") is not None
#: The fastest floor (`benchmarks.fastest`: raw asyncio and httptools) when httptools is here.
FASTEST = "fastest floor"
HTTPTOOLS = importlib.util.find_spec("httptools") is not None


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process `pid` so far, from /proc/PID/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def sample_body() -> str:
    """A signed-sized envelope like the task_request of an echo task, for the bare server."""
    from synapse.types import (
        Sender,
        TaskRequest,
        TaskRequestPayload,
        TaskSpec,
        build_message_now,
        encode_message,
    )

    message = build_message_now(
        TaskRequest,
        TaskRequestPayload(
            task=TaskSpec(id="task-" + "0" * 32, type="echo", payload={"text": "hello"})
        ),
        sender=Sender(agent_id="agent-r", endpoint="http://127.0.0.1:1/synapse/callback"),
        to="agent-e",
    )
    return encode_message(message).decode()


class ServeProcess:
    """`synapse serve` in its own process, logging to a file as an operator would run it."""

    def __init__(
        self,
        agent_id: str,
        requester: str,
        *,
        store: str,
        flags: tuple[str, ...],
        log: Path,
        root: Path = ROOT,
    ) -> None:
        """`root`: the checkout whose code runs (another one, for an A/B of two commits)."""
        self.agent_id = agent_id
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}/synapse/callback"
        self.log = log
        wrapper = [f for f in flags if f in ("--no-uvloop", "--no-gc-tuning")]
        serve = [f for f in flags if f not in wrapper]
        argv = [sys.executable, "-m", "benchmarks._serve", *wrapper, "serve"]
        argv += ["--agent-id", agent_id, "--port", str(self.port), "--secret", SECRET]
        argv += ["--peer", f"{REQUESTER}={requester}", "--store", store, *serve]
        self._log_file = log.open("wb")
        env = {k: v for k, v in os.environ.items() if not k.startswith("SYNAPSE_")}
        self.proc = subprocess.Popen(
            argv,
            cwd=root,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self._log_file,
            env=env,
        )
        self._wait_listening(timeout=60)

    def _wait_listening(self, timeout: float) -> None:
        # A process we started: poll its port (`--log-level off` logs no `listening`).
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(OSError), socket.create_connection((HOST, self.port), 1):
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"synapse serve exited: {self.log.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError("synapse serve is not listening")
            time.sleep(0.05)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_lines(self) -> int:
        return self.log.read_bytes().count(b"\n")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log_file.close()


@dataclass
class Executor:
    """One executor under test: its name, its process, where the requester POSTs."""

    name: str
    agent_id: str
    url: str
    pid: int
    serve: ServeProcess | None = None
    runs: dict[int, list[dict[str, Any]]] = field(default_factory=dict)


def measure(
    requester: Child, executor: Executor, concurrency: int, seconds: float, warmup: float
) -> dict[str, Any]:
    lines_before = executor.serve.log_lines() if executor.serve else 0
    cpu_before, wall_before = process_cpu(executor.pid), time.monotonic()
    result = requester.call(
        "load",
        url=executor.url,
        agent_id=executor.agent_id,
        concurrency=concurrency,
        seconds=seconds,
        warmup=warmup,
        timeout=seconds + warmup + 120,
    )
    cpu_after, wall_after = process_cpu(executor.pid), time.monotonic()
    run = {
        **result,
        # CPU over the whole call (warm-up included), per task completed in the whole call.
        "executor_cpu_s": cpu_after - cpu_before,
        "executor_wall_s": wall_after - wall_before,
        "tasks_per_s": result["rate"],
        "log_lines": (executor.serve.log_lines() - lines_before) if executor.serve else 0,
    }
    run["executor_cpu_share"] = run["executor_cpu_s"] / max(1e-9, run["executor_wall_s"])
    run["requester_cpu_us"] = result["cpu"] / max(1, result["completed"]) * 1e6
    return run


def cpu_per_task(run: dict[str, Any]) -> float:
    """Executor CPU µs per task: its CPU over the whole `load` call (warm-up included), per
    task the requester completed in that call (every task it started ran to its end)."""
    return float(run["executor_cpu_s"] / max(1, run["total"]) * 1e6)


def measure_bare(
    server: Child, client: Child, body: str, concurrency: int, seconds: float, warmup: float
) -> dict[str, Any]:
    before = server.call("cpu")
    result = client.call(
        "load",
        url=server.ready["url"],
        body=body,
        concurrency=concurrency,
        seconds=seconds,
        warmup=warmup,
        timeout=seconds + warmup + 60,
    )
    after = server.call("cpu")
    if result["errors"]:
        raise RuntimeError(f"{result['errors']} requests failed: {result['last_error']}")
    served = max(1, after["served"] - before["served"])
    return {
        "requests_per_s": result["rate"],
        "p50": result["p50"],
        "p99": result["p99"],
        "server_cpu_us": (after["cpu"] - before["cpu"]) / served * 1e6,
    }


VARIANTS: dict[str, tuple[str, ...]] = {
    # A second serve exactly like the first: how far two identical executors drift apart.
    "serve, control (the same again)": (),
    "serve, logging off": ("--log-level", "off"),
    "serve, no uvloop": ("--no-uvloop",),
    "serve, default GC thresholds": ("--no-gc-tuning",),
}


@contextlib.contextmanager
def executors(
    requester_url: str, logs: Path, *, compare: bool, sqlite: bool, only: tuple[str, ...] = ()
) -> Iterator[list[Executor]]:
    started: list[Child | ServeProcess] = []
    found: list[Executor] = []
    try:
        loops = [("floor", ())] + ([("floor (uvloop)", ("--uvloop",))] if UVLOOP else [])
        for name, loop in loops:
            floor = Child(
                "floor-executor",
                "--agent-id",
                "agent-f",
                "--port",
                str(free_port()),
                "--secret",
                SECRET,
                *loop,
            )
            started.append(floor)
            found.append(Executor(name, "agent-f", floor.ready["url"], floor.proc.pid))
        if HTTPTOOLS:
            fastest = Child(
                "fastest-executor",
                "--agent-id",
                "agent-f",
                "--port",
                str(free_port()),
                "--secret",
                SECRET,
                *(("--uvloop",) if UVLOOP else ()),
            )
            started.append(fastest)
            found.append(Executor(FASTEST, "agent-f", fastest.ready["url"], fastest.proc.pid))
        specs: list[tuple[str, str, tuple[str, ...]]] = [("serve (memory)", "memory", ())]
        if sqlite:
            specs.append(("serve (SQLite)", str(logs / "serve.sqlite"), ()))
        if compare:
            specs += [
                (name, "memory", flags)
                for name, flags in VARIANTS.items()
                if not only or any(word in name for word in only)
            ]
        for i, (name, store, flags) in enumerate(specs):
            agent_id = f"agent-e{i}"
            serve = ServeProcess(
                agent_id, requester_url, store=store, flags=flags, log=logs / f"{agent_id}.log"
            )
            started.append(serve)
            found.append(Executor(name, agent_id, serve.url, serve.pid, serve))
        yield found
    finally:
        for child in reversed(started):
            child.close()


def run(
    *,
    seconds: float = 4.0,
    warmup: float = 1.0,
    rounds: int = 3,
    headline: int = 50,
    sweep: tuple[int, ...] = (1, 10, 200, 1000),
    compare: bool = False,
    only: tuple[str, ...] = (),
    sqlite: bool = True,
) -> Section:
    started = time.monotonic()
    body = sample_body()
    with (
        tempfile.TemporaryDirectory(prefix="synapse-e2e-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        requester = Child(
            "floor-requester",
            "--agent-id",
            REQUESTER,
            "--port",
            str(free_port()),
            "--secret",
            SECRET,
        )
        stack.callback(requester.close)
        bare_server = Child("bare-server", "--port", str(free_port()))
        stack.callback(bare_server.close)
        bare_client = Child("http-client")
        stack.callback(bare_client.close)
        found = stack.enter_context(
            executors(
                requester.ready["endpoint"], Path(tmp), compare=compare, sqlite=sqlite, only=only
            )
        )
        bare_runs: list[dict[str, Any]] = []
        # Alternate: a slow spell of the shared machine hits every executor alike.
        for _ in range(rounds):
            bare_runs.append(
                measure_bare(bare_server, bare_client, body, headline, seconds, warmup)
            )
            for executor in found:
                executor.runs.setdefault(headline, []).append(
                    measure(requester, executor, headline, seconds, warmup)
                )
        serve_memory = next(e for e in found if e.name == "serve (memory)")
        for c in sweep:
            # Concurrency 1 is where the latency goal is judged: as many alternating rounds
            # as the headline, so that one slow spell of the machine is not the figure.
            for _ in range(rounds if c == LATENCY_CONCURRENCY else 1):
                fastest = [e for e in found if e.name == FASTEST and c == LATENCY_CONCURRENCY]
                for executor in (floor_of(found, serve_memory), *fastest, serve_memory):
                    executor.runs.setdefault(c, []).append(
                        measure(requester, executor, c, seconds, warmup)
                    )
    return report(found, bare_runs, headline, seconds, warmup, rounds, time.monotonic() - started)


def floor_of(found: list[Executor], executor: Executor) -> Executor:
    """The floor on the same event loop as `executor` (serve uses uvloop when installed)."""
    on_uvloop = UVLOOP and executor.serve is not None and "no uvloop" not in executor.name
    if executor.serve is None:
        return executor
    return next(e for e in found if e.name == ("floor (uvloop)" if on_uvloop else "floor"))


def key_of(executor: Executor) -> str:
    return "_".join(
        executor.name.lower().replace("(", "").replace(")", "").replace(",", "").split()
    )


def summary(runs: list[dict[str, Any]], seconds: float, warmup: float) -> dict[str, Any]:
    """Best tasks/s of the rounds, median CPU per task over them, and each exchange's p99 as
    the median of the rounds' (`p99_rounds`: every round's worst exchange p99)."""
    best = max(runs, key=lambda r: r["tasks_per_s"])
    return {
        **best,
        "exchange_p99": {k: median(r["exchange_p99"][k] for r in runs) for k in KINDS},
        "p99_rounds": [max(r["exchange_p99"].values()) for r in runs],
        "cpu_us": median(cpu_per_task(r) for r in runs),
        "errors": sum(r["errors"] for r in runs),
        "rejected": sum(r["rejected"] for r in runs),
        "log_lines_per_task": median(r["log_lines"] / max(1, r["total"]) for r in runs),
    }


def report(
    found: list[Executor],
    bare_runs: list[dict[str, Any]],
    headline: int,
    seconds: float,
    warmup: float,
    rounds: int,
    elapsed: float,
) -> Section:
    section = Section(
        "e2e",
        "End to end: `synapse serve` beside the floor executor and the bare aiohttp server",
        "python -m benchmarks.e2e",
        seconds=elapsed,
    )
    bare = max(bare_runs, key=lambda r: r["requests_per_s"])
    bare_cpu = median(r["server_cpu_us"] for r in bare_runs)
    main = Table(
        [
            "executor",
            "tasks/s",
            "floor on the same loop",
            "of the floor",
            "executor CPU µs/task",
            "CPU vs floor",
            "CPU vs fastest floor",
            "requester CPU µs/task",
            "log lines/task",
            "task p99 ms",
            "errors",
        ],
        title=f"Concurrency {headline}: best tasks/s of {rounds} alternating rounds, "
        "median CPU per task",
    )
    fastest = next((e for e in found if e.name == FASTEST), None)
    fastest_cpu = summary(fastest.runs[headline], seconds, warmup)["cpu_us"] if fastest else None
    for executor in found:
        s = summary(executor.runs[headline], seconds, warmup)
        reference = floor_of(found, executor)
        floor = summary(reference.runs[headline], seconds, warmup)
        key = key_of(executor)
        of_floor = s["tasks_per_s"] / floor["tasks_per_s"]
        cpu_ratio = s["cpu_us"] / floor["cpu_us"]
        main.add(
            executor.name,
            rate(s["tasks_per_s"]),
            reference.name,
            pct(of_floor),
            f"{s['cpu_us']:.0f}",
            f"{cpu_ratio:.2f}×",
            f"{s['cpu_us'] / fastest_cpu:.2f}×" if fastest_cpu else "–",
            f"{s['requester_cpu_us']:.0f}",
            f"{s['log_lines_per_task']:.2f}" if executor.serve else "–",
            ms(s["p99"]),
            f"{s['errors']}",
        )
        section.figures |= {
            f"e2e.{key}.tasks_per_s": s["tasks_per_s"],
            f"e2e.{key}.of_floor": of_floor,
            f"e2e.{key}.cpu_us_per_task": s["cpu_us"],
            f"e2e.{key}.cpu_vs_floor": cpu_ratio,
            f"e2e.{key}.floor_tasks_per_s": floor["tasks_per_s"],
            f"e2e.{key}.floor_cpu_us_per_task": floor["cpu_us"],
        }
        if fastest_cpu:
            section.figures[f"e2e.{key}.cpu_vs_fastest"] = s["cpu_us"] / fastest_cpu
    main.add(
        "bare aiohttp (requests/s, 1 exchange)",
        rate(bare["requests_per_s"]),
        "asyncio",
        "–",
        f"{bare_cpu:.0f} per request",
        "–",
        "–",
        "–",
        "–",
        ms(bare["p99"]),
        "0",
    )
    section.figures |= {
        "e2e.bare.requests_per_s": bare["requests_per_s"],
        "e2e.bare.server_cpu_us_per_request": bare_cpu,
    }
    sweep = Table(
        [
            "concurrency",
            "floor tasks/s",
            "serve tasks/s",
            "of the floor",
            "floor CPU µs/task",
            "serve CPU µs/task",
            "CPU vs floor",
            "serve p99 ms per exchange (request / executing / complete)",
            "floor p99 ms per exchange",
            "serve rejected (at capacity)",
            "serve errors",
        ],
        title=f"Concurrency sweep, memory store (one round each; {rounds} at concurrency "
        f"{LATENCY_CONCURRENCY}, its p99s the median of the rounds')",
    )
    serve_memory = next(e for e in found if e.name == "serve (memory)")
    sweep_floor = floor_of(found, serve_memory)
    sweep.title += f"; the floor: {sweep_floor.name}"
    spread: dict[int, tuple[list[float], list[float]]] = {}
    for c in sorted(serve_memory.runs):
        f = summary(sweep_floor.runs[c], seconds, warmup)
        s = summary(serve_memory.runs[c], seconds, warmup)
        p99 = s["exchange_p99"]
        sweep.add(
            c,
            rate(f["tasks_per_s"]),
            rate(s["tasks_per_s"]),
            pct(s["tasks_per_s"] / f["tasks_per_s"]),
            f"{f['cpu_us']:.0f}",
            f"{s['cpu_us']:.0f}",
            f"{s['cpu_us'] / f['cpu_us']:.2f}×",
            " / ".join(ms(p99[k]) for k in KINDS),
            " / ".join(ms(f["exchange_p99"][k]) for k in KINDS),
            f"{s['rejected']}",
            f"{s['errors']}",
        )
        section.figures |= {
            f"e2e.c{c}.floor_tasks_per_s": f["tasks_per_s"],
            f"e2e.c{c}.serve_tasks_per_s": s["tasks_per_s"],
            f"e2e.c{c}.serve_exchange_p99_ms": max(p99.values()) * 1e3,
            f"e2e.c{c}.floor_exchange_p99_ms": max(f["exchange_p99"].values()) * 1e3,
            f"e2e.c{c}.serve_rejected": float(s["rejected"]),
        }
        if len(s["p99_rounds"]) > 1:
            spread[c] = (f["p99_rounds"], s["p99_rounds"])
    section.tables += [main, sweep]
    if fastest is not None and LATENCY_CONCURRENCY in fastest.runs:
        section.tables.append(latency_table(fastest, serve_memory, seconds, warmup, section))
    for c, (floor_rounds, serve_rounds) in spread.items():
        section.notes.append(
            f"Concurrency {c}, worst exchange p99 of each round (ms): serve "
            + ", ".join(ms(v) for v in serve_rounds)
            + "; floor "
            + ", ".join(ms(v) for v in floor_rounds)
            + ". The machine's own spells move both alike: the floor, which does the least "
            "an executor can, is the yardstick of how quiet a round was."
        )
    section.notes += [
        "One echo task = 3 HTTP exchanges: task_request → task_confirm, "
        "task_status_update{executing} → ack, task_complete → task_ack; header-mode "
        "HMAC-SHA256 on every request and reply.",
        f"Each run: {warmup:g} s warm-up, {seconds:g} s measured; executors and the bare "
        "server alternate within every round. CPU per task is the executor process's own "
        "(utime + stime from /proc), the requester's is shown apart.",
        "Floor: aiohttp + stdlib json + hmac, the same exchanges and nothing else. serve: "
        "`synapse serve` with its defaults, demo handler, its log on stderr into a file.",
        "Per-exchange latencies are seen from the requester: `request` is its POST; "
        "`executing` and `complete` are the gaps until the executor's next callback arrives.",
        "Rejected: task requests answered `task_reject` because the executor was at its "
        "`max_concurrent_tasks` (backpressure); that requester tries again after the "
        "reject's advisory `alternatives.retry_after` (serve's `capacity_retry_after`, 5 s; "
        "the rest of the run if shorter), as a conforming requester does, so about "
        "`max_concurrent_tasks` tasks are in flight at concurrency 1,000. (Retrying every "
        "10 ms instead, 900 requesters kept the requester's own CPU busy re-asking: 50 tasks/s "
        "at 1,000 against 473 at 200, measured under load.)",
    ]
    return section


def latency_table(
    fastest: Executor, serve: Executor, seconds: float, warmup: float, section: Section
) -> Table:
    """Serial latency (concurrency 1) of a whole task, serve against the fastest floor: the
    median over the alternating rounds of each round's p50 and p99."""
    c = LATENCY_CONCURRENCY
    table = Table(
        ["executor", "task p50 ms", "task p99 ms", "p50 vs fastest floor", "p99 vs fastest floor"],
        title=f"Serial latency, concurrency {c}: a whole echo task (3 exchanges) as the "
        f"requester sees it, median of {len(serve.runs[c])} alternating rounds",
    )
    base = {q: median(r[q] for r in fastest.runs[c]) for q in ("p50", "p99")}
    for executor in (fastest, serve):
        mine = {q: median(r[q] for r in executor.runs[c]) for q in ("p50", "p99")}
        table.add(
            executor.name,
            ms(mine["p50"]),
            ms(mine["p99"]),
            f"{mine['p50'] / base['p50']:.2f}×",
            f"{mine['p99'] / base['p99']:.2f}×",
        )
        if executor is serve:
            section.figures |= {
                f"e2e.c{c}.serve_p50_vs_fastest": mine["p50"] / base["p50"],
                f"e2e.c{c}.serve_p99_vs_fastest": mine["p99"] / base["p99"],
            }
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.e2e", description=__doc__)
    parser.add_argument("--seconds", type=float, default=4.0, help="measured time per run")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    parser.add_argument("--compare", action="store_true", help="also A/B variants of serve")
    parser.add_argument(
        "--only", default="", help="with --compare: the variants whose name has one of these words"
    )
    parser.add_argument("--no-sqlite", action="store_true", help="no serve (SQLite) run")
    parser.add_argument("--no-sweep", action="store_true", help="concurrency 50 only")
    parser.add_argument("--quick", action="store_true", help="short runs (a smoke test)")
    args = parser.parse_args(argv)
    if args.quick:
        section = run(seconds=0.3, warmup=0.2, rounds=1, sweep=(1,), compare=args.compare)
    else:
        section = run(
            seconds=args.seconds,
            rounds=args.rounds,
            compare=args.compare,
            only=tuple(w for w in args.only.split(",") if w),
            sqlite=not args.no_sqlite,
            sweep=() if args.no_sweep else (1, 10, 200, 1000),
        )
    print(section.text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
