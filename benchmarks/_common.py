"""What every benchmark shares: results, tables, the machine, quiet logging, child processes.

A benchmark's `run(...)` returns a `Section`: one or more tables of formatted cells, the
named figures the targets and the chart are judged on, and notes saying what was measured.
`python -m benchmarks` gathers the sections into `docs/benchmarks.md`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import platform
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from benchmarks.ports import free_port as free_port  # re-exported

ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"


# --- results ----------------------------------------------------------------------------------


@dataclass
class Table:
    """A table of already formatted cells; the first column is left-aligned, others right."""

    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    title: str = ""

    def add(self, *cells: object) -> None:
        self.rows.append([str(c) for c in cells])

    def text(self) -> str:
        widths = [len(c) for c in self.columns]
        for row in self.rows:
            widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]

        def line(cells: Sequence[str]) -> str:
            parts = [
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            ]
            return "  ".join(parts).rstrip()

        out = [self.title] if self.title else []
        out += [line(self.columns), "  ".join("-" * w for w in widths)]
        out += [line(r) for r in self.rows]
        return "\n".join(out)

    def markdown(self) -> str:
        def line(cells: Sequence[str]) -> str:
            return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

        align = ["---"] + ["---:"] * (len(self.columns) - 1)
        out = [f"**{self.title}**", ""] if self.title else []
        out += [line(self.columns), line(align)]
        out += [line(r) for r in self.rows]
        return "\n".join(out)


@dataclass
class Section:
    """What one benchmark measured."""

    name: str
    title: str
    command: str
    tables: list[Table] = field(default_factory=list)
    #: Named figures (floats): what the targets, the chart and the JSON are made of.
    figures: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def text(self) -> str:
        out = [f"== {self.title} ({self.command}) =="]
        for table in self.tables:
            out += ["", table.text()]
        for note in self.notes:
            out += ["", f"* {note}"]
        return "\n".join(out)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "command": self.command,
            "figures": self.figures,
            "notes": self.notes,
            "seconds": self.seconds,
            "tables": [
                {"title": t.title, "columns": t.columns, "rows": t.rows} for t in self.tables
            ],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Section:
        tables = [Table(t["columns"], t["rows"], t["title"]) for t in data["tables"]]
        return cls(
            data["name"],
            data["title"],
            data["command"],
            tables,
            {k: float(v) for k, v in data["figures"].items()},
            list(data["notes"]),
            float(data.get("seconds", 0.0)),
        )


def percentile(values: Sequence[float], q: float) -> float:
    """The `q`-th percentile (0–100) by linear interpolation; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def ratio(value: float) -> str:
    return f"{value:.2f}×"


def pct(value: float) -> str:
    return f"{value * 100:.1f} %"


def rate(value: float) -> str:
    return f"{value:,.0f}"


# --- the machine --------------------------------------------------------------------------------


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def nproc() -> int:
    try:
        out = subprocess.run(["nproc"], capture_output=True, text=True, check=True).stdout
        return int(out.strip())
    except (OSError, ValueError, subprocess.CalledProcessError):
        return len(os.sched_getaffinity(0))


LIBRARIES = (
    "synapse-agent-p2p",
    "aiohttp",
    "msgspec",
    "structlog",
    "pydantic",
    "pydantic-core",
    "a2a-sdk",
    "starlette",
    "uvicorn",
    "httptools",
    "uvloop",
)


def versions() -> dict[str, str]:
    found: dict[str, str] = {}
    for name in LIBRARIES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[name] = metadata.version(name)
    return found


def machine() -> dict[str, Any]:
    return {
        "nproc": nproc(),
        "cpu": cpu_model(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "platform": platform.platform(),
        "versions": versions(),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        # The machine is shared: how busy it was when the run began (1, 5, 15 min).
        "load": [round(x, 2) for x in os.getloadavg()],
    }


# --- logging ----------------------------------------------------------------------------------


def quiet_logging(level: int = logging.WARNING, *, stdlib: bool = True) -> None:
    """Synapse's loggers at `level` (warnings and errors still go to stderr), for a process of
    its own (a worker, a command line): the benchmarks measure the protocol, not log
    rendering. (The library is quiet by default already; this makes it explicit.)"""
    logging.getLogger("synapse").setLevel(level)
    if stdlib:
        logging.basicConfig(stream=sys.stderr, level=logging.WARNING)


@contextlib.contextmanager
def quiet_structlog() -> Iterator[None]:
    """`quiet_logging` for a while, in a process that is not ours (a test): the previous
    level comes back afterwards."""
    synapse_logger = logging.getLogger("synapse")
    previous = synapse_logger.level
    quiet_logging(stdlib=False)
    try:
        yield
    finally:
        synapse_logger.setLevel(previous)


# --- child processes ----------------------------------------------------------------------------


class Child:
    """A benchmark worker in its own process (`python -m benchmarks._worker ROLE ...`).

    It prints one JSON line when ready, then answers each JSON command written to its stdin
    with one JSON line. Its stderr goes to ours (warnings only).
    """

    def __init__(self, role: str, *args: str, env: dict[str, str] | None = None) -> None:
        self.role = role
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks._worker", role, *args],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.ready = self._read(timeout=60)

    def _read(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"worker {self.role} exited ({self.proc.poll()})")
            line = line.strip()
            if line.startswith("{"):
                data: dict[str, Any] = json.loads(line)
                if "error" in data:
                    raise RuntimeError(f"worker {self.role}: {data['error']}")
                return data
            if time.monotonic() > deadline:
                raise RuntimeError(f"worker {self.role}: no answer within {timeout} s")

    def call(self, cmd: str, timeout: float = 120, **params: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"cmd": cmd, **params}) + "\n")
        self.proc.stdin.flush()
        return self._read(timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError, RuntimeError, ValueError):
                self.call("quit", timeout=10)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


@contextlib.contextmanager
def children(*specs: tuple[str, ...]) -> Iterator[list[Child]]:
    """Start workers in order; stop them all (in reverse order) on the way out."""
    started: list[Child] = []
    try:
        for role, *args in specs:
            started.append(Child(role, *args))
        yield started
    finally:
        for child in reversed(started):
            child.close()


async def read_commands() -> AsyncIterator[dict[str, Any]]:
    """The JSON commands on stdin, one per line, until EOF (for workers)."""
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            return
        line = line.strip()
        if line:
            command: dict[str, Any] = json.loads(line)
            yield command


async def commands(*, cpu: bool = True) -> AsyncIterator[dict[str, Any]]:
    """A worker's commands: `quit` is answered and ends them; with `cpu`, `cpu` is answered
    here too (`cpu_now`); every other command is the worker's to answer."""
    async for command in read_commands():
        if command["cmd"] == "quit":
            answer({"ok": True})
            return
        if cpu and command["cmd"] == "cpu":
            answer(cpu_now())
            continue
        yield command


def cpu_now() -> dict[str, float]:
    """This process's CPU seconds and a monotonic clock, to diff around a run (`cpu`)."""
    return {"cpu": time.process_time(), "wall": time.monotonic()}


class Backoff(Exception):
    """Raised by an operation of `drive` to wait `delay` seconds (at most until the run ends)
    before the next: not an error, and not a completed operation."""

    def __init__(self, delay: float) -> None:
        super().__init__(f"back off {delay} s")
        self.delay = delay


async def drive(
    op: Callable[[], Awaitable[None]],
    *,
    concurrency: int,
    seconds: float,
    warmup: float,
    starting: Callable[[bool], None] | None = None,
) -> dict[str, Any]:
    """Run `op` from `concurrency` workers for `warmup` + `seconds`; count the measured window.

    An operation counts if it ends inside the window; its latency is kept if it also began
    inside it. CPU time is this process's, over the window. `starting(measured)` is told,
    before each operation, whether it begins inside the window.
    """
    start = time.perf_counter()
    begin, end = start + warmup, start + warmup + seconds
    latencies: list[float] = []
    completed = errors = total = 0
    last_error = ""
    cpu: list[float] = []

    async def worker() -> None:
        nonlocal completed, errors, last_error, total
        while True:
            t0 = time.perf_counter()
            if t0 >= end:
                return
            if starting is not None:
                starting(begin <= t0)
            try:
                await op()
            except Backoff as exc:
                await asyncio.sleep(max(0.0, min(exc.delay, end - time.perf_counter())))
                continue
            except Exception as exc:
                errors += 1
                last_error = repr(exc)[:300]
                await asyncio.sleep(0.01)  # an error does not spin the worker
                continue
            t1 = time.perf_counter()
            total += 1
            if begin <= t1 <= end:
                completed += 1
                if t0 >= begin:
                    latencies.append(t1 - t0)

    async def clock() -> None:
        await asyncio.sleep(max(0.0, begin - time.perf_counter()))
        cpu.append(time.process_time())
        await asyncio.sleep(max(0.0, end - time.perf_counter()))
        cpu.append(time.process_time())

    await asyncio.gather(clock(), *(worker() for _ in range(concurrency)))
    return {
        "completed": completed,
        "total": total,
        "errors": errors,
        "last_error": last_error,
        "seconds": seconds,
        "rate": completed / seconds,
        "p50": percentile(latencies, 50),
        "p99": percentile(latencies, 99),
        "cpu": cpu[1] - cpu[0],
    }


async def send_message(session: Any, url: str) -> None:
    """One A2A `SendMessage` JSON-RPC call (text "hello"); fails unless its task completed."""
    request = {
        "jsonrpc": "2.0",
        "id": uuid.uuid4().hex,
        "method": "SendMessage",
        "params": {
            "message": {
                "messageId": uuid.uuid4().hex,
                "role": "ROLE_USER",
                "parts": [{"text": "hello"}],
            }
        },
    }
    headers = {"Content-Type": "application/json", "A2A-Version": "1.0"}
    async with session.post(url, data=json.dumps(request), headers=headers) as resp:
        data = json.loads(await resp.read())
    state = data.get("result", {}).get("task", {}).get("status", {}).get("state")
    if state != "TASK_STATE_COMPLETED":
        raise RuntimeError(f"not completed: {str(data)[:300]}")


def answer(data: dict[str, Any]) -> None:
    """Write one JSON line to stdout (for workers)."""
    sys.stdout.write(json.dumps(data) + "\n")
    sys.stdout.flush()
