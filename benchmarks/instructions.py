"""Instructions per echo task of `synapse serve`, counted by callgrind: a figure the load of a
shared machine does not move, for the A/B of two commits.

    python -m benchmarks.instructions [--tasks 100] [--serve-args "--log-level off"] [ROOT ...]

Each ROOT is a checkout whose code runs (default: this one; give two, an older commit's
worktree and this one, for an A/B). serve runs as an operator starts it (memory store, its
default logging to a file, metrics) under `valgrind --tool=callgrind --instr-atstart=no`; the
floor requester (`benchmarks.floor`, in this process) runs 30 echo tasks to warm it up, then
callgrind counts while it runs `--tasks` more at concurrency 1. The table gives the
instructions per task and where they go by shared object (the interpreter, OpenSSL's
libcrypto, msgspec, uvloop, ...). Callgrind counts user-space instructions only: the kernel's
work (system calls, loopback TCP) and cache misses are not in it, so it is the figure of
the Python work a change removes, not of wall time. Needs `valgrind` (Debian: `apt-get
install valgrind`); serve runs about 50 times slower under it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
from pathlib import Path
from typing import Any

from benchmarks._common import HOST, ROOT, Table, free_port

SECRET = "bench-secret-2026"
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


async def count(
    root: Path, tasks: int, work: Path, serve_args: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Instructions of one serve (code of `root`) over `tasks` echo tasks, by library."""
    from benchmarks.floor import Requester

    requester = Requester(
        argparse.Namespace(secret=SECRET, agent_id="agent-r", port=free_port(), connections=4)
    )
    runner = await requester.start()
    port = free_port()
    out = work / f"callgrind.{port}.out"
    argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
    argv += [sys.executable, "-m", "benchmarks._serve", "serve", "--agent-id", "agent-e"]
    argv += ["--port", str(port), "--secret", SECRET, "--peer", f"agent-r={requester.endpoint}"]
    argv += ["--store", "memory", *serve_args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYNAPSE_")}
    with (work / f"serve.{port}.log").open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=root,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            env=env,
        )
    try:
        await _listening(proc, port, timeout=180)
        url = f"http://{HOST}:{port}/synapse/callback"
        for _ in range(WARMUP_TASKS):
            await requester.one(url, "agent-e")
        _toggle(proc.pid, "on")
        for _ in range(tasks):
            await requester.one(url, "agent-e")
        _toggle(proc.pid, "off")
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        await proc.wait()  # callgrind writes its file as serve exits
        await requester.session.close()
        await runner.cleanup()
    by_library = _by_library(out)
    total = sum(by_library.values())
    return {"root": str(root), "tasks": tasks, "per_task": total / tasks, "libraries": by_library}


async def _listening(proc: asyncio.subprocess.Process, port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError), socket.create_connection((HOST, port), 1):
            return
        if proc.returncode is not None or time.monotonic() > deadline:
            raise RuntimeError("serve under callgrind did not start listening")
        await asyncio.sleep(0.2)


def _toggle(pid: int, state: str) -> None:
    subprocess.run(
        ["callgrind_control", "--instr=" + state, str(pid)], check=True, capture_output=True
    )


def _by_library(out: Path) -> Counter[str]:
    """Self instructions per named library (callgrind_annotate's per-function lines)."""
    text = subprocess.run(
        ["callgrind_annotate", "--inclusive=no", "--threshold=100", str(out)],
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


def run(roots: list[Path], tasks: int, serve_args: tuple[str, ...] = ()) -> Table:
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise RuntimeError("needs valgrind (Debian: apt-get install valgrind)")
    with tempfile.TemporaryDirectory(prefix="synapse-callgrind-") as tmp:
        results = [asyncio.run(count(root, tasks, Path(tmp), serve_args)) for root in roots]
    names = [*dict.fromkeys(LIBRARIES.values()), "other"]
    table = Table(
        ["checkout", "instructions per task", *names],
        title=f"synapse serve {' '.join(serve_args)}".rstrip()
        + f" under callgrind: {tasks} echo tasks at concurrency 1, memory store",
    )
    for result in results:
        libraries = result["libraries"]
        table.add(
            result["root"],
            f"{result['per_task'] / 1e3:,.0f}k",
            *(f"{libraries[name] / result['tasks'] / 1e3:,.0f}k" for name in names),
        )
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.instructions", description=__doc__)
    parser.add_argument("roots", nargs="*", type=Path, default=[ROOT], help="checkouts to count")
    parser.add_argument("--tasks", type=int, default=100, help="echo tasks counted")
    parser.add_argument(
        "--serve-args", default="", help='more arguments of serve, e.g. "--log-level off"'
    )
    args = parser.parse_args(argv)
    table = run([root.resolve() for root in args.roots], args.tasks, tuple(args.serve_args.split()))
    print(table.text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
