"""Where serve's interpreter time goes, by Python function: bytecodes executed per echo task.

    python -m benchmarks.bytecodes [--tasks 200] [--top 40] [--serve-args "--store x.sqlite"]

Callgrind (`benchmarks.instructions`) counts instructions by shared object, and four fifths of
serve's are the interpreter's: it cannot say which Python function they ran for. This counts,
for one `synapse serve` process (memory store, its default logging), the bytecodes each Python
function executed and how often it was entered (a coroutine each time it resumes), per echo
task: 30 tasks warm it up, then a trace function (`sys.settrace` with opcode events, which
slows the process a hundredfold) counts `--tasks` more, driven at concurrency 1 by the floor's
requester (`benchmarks.floor`), which checks every task. The figure is deterministic for the
same code and inputs.

Bytecodes are a proxy, not a measure: a bytecode that calls into C (a regular expression, a
hash) may cost a thousand instructions, a `LOAD_FAST` a few. Use it to find the Python calls a
change could remove, then count the change with `benchmarks.instructions`.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

from benchmarks._common import HOST, ROOT, free_port

#: The signal that turns counting on and off in the serve process (serve itself answers
#: SIGUSR1 with a dump of its state).
TOGGLE = signal.SIGRTMIN + 3
SECRET = "bench-secret-2026-0123456789abcdef"
WARMUP_TASKS = 30


def _count_in_this_process(out: Path) -> None:
    """Install the toggle in the serve process being started (run as its `__main__`)."""
    counts: collections.Counter[CodeType] = collections.Counter()
    calls: collections.Counter[CodeType] = collections.Counter()

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "opcode":
            counts[frame.f_code] += 1
        return local

    def entered(frame: FrameType, event: str, arg: Any) -> Any:
        if event != "call":
            return None
        frame.f_trace_opcodes = True
        calls[frame.f_code] += 1
        return local

    def toggle(signum: int, frame: Any) -> None:
        if sys.gettrace() is None:
            counts.clear()
            calls.clear()
            sys.settrace(entered)
            threading.settrace(entered)
            return
        sys.settrace(None)
        threading.settrace(None)
        rows = [[n, calls[code], _where(code)] for code, n in counts.items()]
        out.write_text(json.dumps(rows))

    signal.signal(TOGGLE, toggle)


def _where(code: CodeType) -> str:
    name = f"{code.co_filename}:{code.co_firstlineno}:{code.co_qualname}"
    if code.co_filename == "<string>":  # a dataclass's generated method: name its fields
        name += "(" + ", ".join(code.co_varnames[1 : code.co_argcount]) + ")"
    return name.replace(str(ROOT) + "/", "").replace(os.path.dirname(os.__file__) + "/", "")


async def _drive(tasks: int, out: Path, serve_args: list[str]) -> None:
    from benchmarks.floor import Requester
    from benchmarks.instructions import _listening, warm_up

    requester = Requester(
        argparse.Namespace(secret=SECRET, agent_id="agent-r", port=free_port(), connections=4)
    )
    runner = await requester.start()
    port = free_port()
    argv = [sys.executable, "-m", "benchmarks.bytecodes", "--serve", str(out), "serve"]
    argv += ["--agent-id", "agent-e", "--port", str(port), "--secret", SECRET]
    argv += ["--peer", f"agent-r={requester.endpoint}", "--store", "memory", *serve_args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYNAPSE_")}
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        await _listening(proc, port, timeout=60)
        url = f"http://{HOST}:{port}/synapse/callback"
        await warm_up(requester, url, WARMUP_TASKS)
        proc.send_signal(TOGGLE)
        for _ in range(tasks):
            await requester.one(url, "agent-e")  # checks each task
        proc.send_signal(TOGGLE)
        for _ in range(200):  # the process writes its counts when counting stops
            if await asyncio.to_thread(out.exists):
                break
            await asyncio.sleep(0.05)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        await proc.wait()
        await requester.session.close()
        await runner.cleanup()


def count(tasks: int = 200, serve_args: list[str] | None = None) -> list[tuple[float, float, str]]:
    """(bytecodes, entries, function) per echo task, the costliest first."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bytecodes.json"
        asyncio.run(_drive(tasks, out, serve_args or []))
        rows = json.loads(out.read_text())
    found = [(n / tasks, entries / tasks, where) for n, entries, where in rows]
    return sorted(found, reverse=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve"]:  # the serve process itself, counting between two toggles
        _count_in_this_process(Path(argv[1]))
        from synapse.cli.main import main as synapse_main

        return synapse_main(argv[2:])
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bytecodes", description=__doc__)
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--top", type=int, default=40, help="functions listed")
    parser.add_argument("--serve-args", default="", help="more arguments of synapse serve")
    args = parser.parse_args(argv)
    rows = count(args.tasks, shlex.split(args.serve_args))
    total = sum(n for n, _, _ in rows)
    by_file: dict[str, float] = collections.defaultdict(float)
    for n, _, where in rows:
        by_file[where.split(":", 1)[0]] += n
    print(f"{total:,.0f} bytecodes per echo task ({args.tasks} tasks after {WARMUP_TASKS})\n")
    print("by file:")
    for name, n in sorted(by_file.items(), key=lambda kv: -kv[1])[: args.top // 2]:
        print(f"{n:9,.0f}  {n / total:6.1%}  {name}")
    print("\nby function (bytecodes, entries per task):")
    for n, entries, where in rows[: args.top]:
        print(f"{n:9,.1f}  {entries:6.1f}  {where}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
