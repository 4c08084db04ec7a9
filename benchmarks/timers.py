"""Timer scaling: the CPU that 10,000 idle in-flight tasks cost, with their timers armed.

    python -m benchmarks.timers [--seconds 30] [--quick]

R and E are two `Peer` processes on 127.0.0.1 (default `P2PConfig`: heartbeats every 30 s,
TaskTimeout 300 s). R submits 10,000 `echo` tasks, each with its own deadline an hour ahead, to
an E whose handler awaits forever: every task is executing at E with its TaskTimeout and
deadline timers armed (20,000 heap entries), and in flight at R. Then nothing happens for the
window but heartbeats, and `time.process_time()` of each process, read at both ends of the
window, says what idling costs, as a percentage of one core.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from benchmarks._common import Section, Table, children, free_port

SECRET = "bench-secret-2026"


def _url(port: int) -> str:
    return f"http://127.0.0.1:{port}/synapse/callback"


def run(*, tasks: int = 10_000, seconds: float = 30.0) -> Section:
    started = time.monotonic()
    e_port, r_port = free_port(), free_port()
    common = ("--secret", SECRET, "--max-concurrent-tasks", str(tasks + 100))
    e_spec = ("synapse-peer", "--agent-id", "agent-e", "--port", str(e_port), "--idle")
    e_spec += ("--peer", f"agent-r={_url(r_port)}", *common)
    r_spec = ("synapse-peer", "--agent-id", "agent-r", "--port", str(r_port))
    r_spec += ("--peer", f"agent-e={_url(e_port)}", *common)
    with children(e_spec, r_spec) as (e, r):
        held = r.call("hold", partner="agent-e", count=tasks, deadline_in=3600, timeout=300)
        states: dict[str, int] = held["states"]
        if states.get("executing", 0) != tasks:
            raise RuntimeError(f"not all tasks are executing: {states}")
        time.sleep(1.0)  # let the last callbacks and acknowledgements settle
        e0, r0 = e.call("cpu"), r.call("cpu")
        time.sleep(seconds)
        e1, r1 = e.call("cpu"), r.call("cpu")
    e_share = (e1["cpu"] - e0["cpu"]) / (e1["wall"] - e0["wall"])
    r_share = (r1["cpu"] - r0["cpu"]) / (r1["wall"] - r0["wall"])
    table = Table(
        ["idle in-flight tasks", "window s", "executor CPU (% of one core)", "requester CPU"],
        title="CPU while idle (process_time over the window)",
    )
    table.add(f"{tasks:,}", f"{seconds:g}", f"{e_share * 100:.3f} %", f"{r_share * 100:.3f} %")
    section = Section(
        "timers",
        f"Timer scaling: {tasks:,} idle in-flight tasks",
        "python -m benchmarks.timers",
        tables=[table],
        figures={
            "timers.tasks": float(tasks),
            "timers.window_s": seconds,
            "timers.executor_cpu_share": e_share,
            "timers.requester_cpu_share": r_share,
        },
        notes=[
            "Executor: every task executing, TaskTimeout (300 s) and its own deadline (1 h) "
            "armed in the one timer heap; requester: every task in flight waiting for its "
            "result. Heartbeats every 30 s each way (one timer per partner, not per task).",
            "The runtime sleeps until the earliest deadline; nothing polls per task.",
        ],
        seconds=time.monotonic() - started,
    )
    return section


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.timers", description=__doc__)
    parser.add_argument("--seconds", type=float, default=30.0, help="the idle window")
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--quick", action="store_true", help="1,000 tasks, a 2 s window")
    args: Any = parser.parse_args(argv)
    section = (
        run(tasks=1_000, seconds=2.0) if args.quick else run(tasks=args.tasks, seconds=args.seconds)
    )
    print(section.text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
