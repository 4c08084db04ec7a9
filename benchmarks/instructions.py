"""Instructions per echo task, counted by callgrind: a figure the load of a shared machine does
not move, for the ladder of executors and for the A/B of two commits.

    python -m benchmarks.instructions [--tasks 300] [--serve-args "--log-level off"] [ROOT ...]

Without ROOT, one run counts the ladder: the fastest floor (`benchmarks.fastest`), the aiohttp
floor (`benchmarks.floor`), and `synapse serve` with the memory store (as an operator starts
it: its default logging to a file, metrics), with `--log-level warning`, and with the SQLite
store, each as a ratio to the fastest floor. With ROOTs (checkouts whose code runs: an older
commit's worktree and this one), it counts serve of each, for an A/B.

Each executor runs under `valgrind --tool=callgrind --instr-atstart=no`; the floor requester
(`benchmarks.floor`, in this process) runs 30 echo tasks to warm it up, then callgrind counts
while it runs `--tasks` more at concurrency 1, checking every one (signatures both ways, the
order of callbacks, the output). The table gives the instructions per task and where they go
by shared object (the interpreter, OpenSSL's libcrypto, msgspec, uvloop, ...). Callgrind
counts user-space instructions only, of every thread: the kernel's work (system calls,
loopback TCP) and cache misses are not in it, so it is the figure of the Python work a change
removes, not of wall time. Needs `valgrind` (Debian: `apt-get install valgrind`) and, for the
fastest floor, `httptools`; an executor runs about 50 times slower under it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks._common import HOST, ROOT, Section, Table, free_port

SECRET = "bench-secret-2026-0123456789abcdef"
FASTEST = "fastest floor"
SERVE_MEMORY = "serve, memory store"
SERVE_SQLITE = "serve, SQLite store (writer thread included)"
#: serve runs on uvloop when it is installed: the floors are then counted on it too.
UVLOOP = importlib.util.find_spec("uvloop") is not None
WARMUP_TASKS = 30
#: Where an instruction ran, by what callgrind_annotate prints of its function (the shared
#: object, or the interpreter's own source path where it leaves the object out); the rest is
#: summed as "other".
LIBRARIES = {
    "libpython": "interpreter",
    "/Python-3.": "interpreter",
    "libcrypto": "libcrypto (HMAC, SHA-256)",
    "_core.cpython": "msgspec",
    "libc.so": "libc",
    "loop.cpython": "uvloop",
}


@dataclass(frozen=True)
class Subject:
    """An executor to count: a module run with `python -m` from `root`, and how it stops."""

    name: str
    #: `python -m` and its arguments, with `{port}`, `{endpoint}` and `{work}` filled in.
    argv: tuple[str, ...]
    root: Path = ROOT
    #: A benchmark worker (`benchmarks._worker`) ends when its stdin closes; serve on SIGTERM.
    worker: bool = False


def serve_subject(
    name: str, store: str, serve_args: tuple[str, ...] = (), root: Path = ROOT
) -> Subject:
    """`synapse serve` as an operator starts it (its default logging to a file, metrics)."""
    argv: tuple[str, ...] = (
        "benchmarks._serve",
        "serve",
        "--agent-id",
        "agent-e",
        "--port",
        "{port}",
    )
    argv += ("--secret", SECRET, "--peer", "agent-r={endpoint}", "--store", store, *serve_args)
    return Subject(name, argv, root)


def ladder(serve_args: tuple[str, ...] = ()) -> list[Subject]:
    """The fastest floor, the aiohttp floor and serve (memory, quieter logging, SQLite): the
    figures of one run, each a ratio to the first."""
    loop = ("--uvloop",) if UVLOOP else ()  # serve runs on uvloop when it is installed

    def floor(role: str) -> tuple[str, ...]:
        return ("benchmarks._worker", role, "--agent-id", "agent-e", "--port", "{port}",
                "--secret", SECRET, *loop)  # fmt: skip

    return [
        Subject(FASTEST, floor("fastest-executor"), worker=True),
        Subject("aiohttp floor", floor("floor-executor"), worker=True),
        serve_subject(SERVE_MEMORY, "memory", serve_args),
        serve_subject(f"{SERVE_MEMORY}, --log-level warning", "memory", ("--log-level", "warning")),
        serve_subject(SERVE_SQLITE, "{work}/serve.{port}.sqlite", serve_args),
    ]


async def count(subject: Subject, tasks: int, work: Path) -> dict[str, Any]:
    """Instructions of one executor over `tasks` echo tasks at concurrency 1, by library."""
    from benchmarks.floor import Requester

    requester = Requester(
        argparse.Namespace(secret=SECRET, agent_id="agent-r", port=free_port(), connections=4)
    )
    runner = await requester.start()
    port = free_port()
    out = work / f"callgrind.{port}.out"
    fill = {"port": str(port), "endpoint": requester.endpoint, "work": str(work)}
    argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
    argv += [sys.executable, "-m", *(arg.format(**fill) for arg in subject.argv)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYNAPSE_")}
    env["PYTHONPATH"] = str(subject.root)
    with (work / f"executor.{port}.log").open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=subject.root,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=log,
            env=env,
        )
    try:
        await _listening(proc, port, timeout=180)
        url = f"http://{HOST}:{port}/synapse/callback"
        await warm_up(requester, url, WARMUP_TASKS)
        _toggle(proc.pid, "on")
        for _ in range(tasks):
            await requester.one(url, "agent-e")  # checks each task: signatures, order, output
        _toggle(proc.pid, "off")
    finally:
        if proc.returncode is None:
            if subject.worker:
                assert proc.stdin is not None
                proc.stdin.write(b'{"cmd": "quit"}\n')
                proc.stdin.close()
            else:
                proc.send_signal(signal.SIGTERM)
        await proc.wait()  # callgrind writes its file as the executor exits
        await requester.session.close()
        await runner.cleanup()
    by_library = _by_library(out)
    total = sum(by_library.values())
    return {
        "name": subject.name,
        "tasks": tasks,
        "per_task": total / tasks,
        "libraries": by_library,
    }


async def _listening(proc: asyncio.subprocess.Process, port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError), socket.create_connection((HOST, port), 1):
            return
        if proc.returncode is not None or time.monotonic() > deadline:
            raise RuntimeError("serve under callgrind did not start listening")
        await asyncio.sleep(0.2)


async def warm_up(requester: Any, url: str, tasks: int, timeout: float = 180) -> None:
    """`tasks` echo tasks, the first tried again while it is refused 503: serve listens
    before it has held and loaded its store, and answers `agent_not_ready` until then (under
    callgrind, for seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            await requester.one(url, "agent-e")
            break
        except RuntimeError as exc:
            if "HTTP 503" not in str(exc) or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
    for _ in range(tasks - 1):
        await requester.one(url, "agent-e")


def _toggle(pid: int, state: str) -> None:
    subprocess.run(
        ["callgrind_control", "--instr=" + state, str(pid)], check=True, capture_output=True
    )


def _by_library(out: Path) -> Counter[str]:
    """Self instructions per named library (callgrind_annotate's per-function lines)."""
    text = subprocess.run(
        ["callgrind_annotate", "--inclusive=no", "--auto=no", "--threshold=100", str(out)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    libraries: Counter[str] = Counter()
    for line in text.splitlines():
        match = re.match(r"\s*([\d,]+) \(\s*[\d.]+%\)\s+(.*)$", line)
        if match is None or "PROGRAM TOTALS" in line:
            continue
        where = match.group(2)
        name = next((label for key, label in LIBRARIES.items() if key in where), "other")
        libraries[name] += int(match.group(1).replace(",", ""))
    return libraries


def counts(subjects: list[Subject], tasks: int) -> list[dict[str, Any]]:
    """Count each of `subjects`, one after the other, with the same requester."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise RuntimeError("needs valgrind (Debian: apt-get install valgrind)")
    with tempfile.TemporaryDirectory(prefix="synapse-callgrind-") as tmp:
        return [asyncio.run(count(subject, tasks, Path(tmp))) for subject in subjects]


def table_of(results: list[dict[str, Any]]) -> Table:
    """Each executor's instructions per task, its ratio to the first, and where they go."""
    names = [*dict.fromkeys(LIBRARIES.values()), "other"]
    first = results[0]["per_task"]
    table = Table(
        ["executor", "instructions per task", f"× {results[0]['name']}", *names],
        title=f"Instructions per echo task under callgrind: {results[0]['tasks']} tasks at "
        f"concurrency 1 after {WARMUP_TASKS} warm-up, every task checked by the same requester",
    )
    for result in results:
        libraries = result["libraries"]
        table.add(
            result["name"],
            f"{result['per_task']:,.0f}",
            f"{result['per_task'] / first:.2f}",
            *(f"{libraries[name] / result['tasks'] / 1e3:,.0f}k" for name in names),
        )
    return table


def figures_of(results: list[dict[str, Any]]) -> dict[str, float]:
    first = results[0]["per_task"]
    found: dict[str, float] = {}
    for result in results:
        key = f"instructions.{_key(result['name'])}"
        found[f"{key}.per_task"] = result["per_task"]
        found[f"{key}.x_first"] = result["per_task"] / first
    return found


def run(subjects: list[Subject], tasks: int) -> Table:
    return table_of(counts(subjects, tasks))


def _key(name: str) -> str:
    """A figure's name for an executor's: "serve, memory store" → "serve_memory_store"."""
    return "_".join(re.sub(r"[^a-z0-9 ]", "", name.lower()).split())


def section(tasks: int = 300) -> Section:
    """The ladder (`ladder`) as a section of `python -m benchmarks`."""
    started = time.monotonic()
    results = counts(ladder(), tasks)
    return Section(
        "instructions",
        "Instructions per echo task: serve beside the fastest floor",
        f"python -m benchmarks.instructions --tasks {tasks}",
        tables=[table_of(results)],
        figures=figures_of(results),
        notes=[
            "Callgrind counts user-space instructions (the executor's threads included: the "
            "SQLite writer's too), not the kernel's work nor cache misses: the load of the "
            "machine cannot move it.",
        ],
        seconds=time.monotonic() - started,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.instructions", description=__doc__)
    parser.add_argument(
        "roots", nargs="*", type=Path, default=[], help="checkouts whose serve to count (A/B)"
    )
    parser.add_argument("--tasks", type=int, default=300, help="echo tasks counted")
    parser.add_argument(
        "--serve-args", default="", help='more arguments of serve, e.g. "--log-level off"'
    )
    args = parser.parse_args(argv)
    serve_args = tuple(args.serve_args.split())
    if args.roots:
        subjects = [
            serve_subject(str(root), "memory", serve_args, root.resolve()) for root in args.roots
        ]
    else:
        subjects = ladder(serve_args)
    print(run(subjects, args.tasks).text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
