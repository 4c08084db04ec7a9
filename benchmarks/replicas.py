"""Echo tasks/s through replicas on PostgreSQL (1, 2, 3 behind nginx) beside one SQLite process.

    python -m benchmarks.replicas [--tasks 400] [--concurrency 50]

Starts a throw-away PostgreSQL server and nginx (the test kits' `tests/pgserver.py` and
`tests/lbserver.py`), then for each setup N `synapse serve` replicas of one agent and an
in-process requester that keeps `--concurrency` echo tasks in flight. Reports wall-clock
tasks/s and the CPU the replicas used per task (from /proc), which load on the machine
disturbs less than the wall clock. Everything runs on 127.0.0.1 and is stopped by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The benchmark reuses the tests' kits that start the real server and load balancer.
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "cluster")]

from clusterkit import E, Replica, Requester, replica_config  # noqa: E402
from lbserver import Nginx  # noqa: E402
from pgserver import start_server, stop_server  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


async def run_setup(
    label: str, stores: list[str], tmp: Path, tasks: int, concurrency: int, nginx: bool
) -> dict[str, float | str]:
    config = replica_config(tmp / f"{label}.toml", 10.0)
    replicas = [
        Replica(f"{label}-{n}", store, "", "", config, tmp) for n, store in enumerate(stores)
    ]
    balancer = Nginx([r.hostport for r in replicas]) if nginx else None
    executor_url = f"{balancer.url}/synapse/callback" if balancer else replicas[0].url
    requester = Requester(executor_url)
    try:
        if balancer is not None:
            balancer.start()
        for replica in replicas:
            replica.endpoint = executor_url
            replica.requester_url = requester.url
        await requester.start()
        for replica in replicas:
            await replica.start()
        peer = requester.peer
        gate = asyncio.Semaphore(concurrency)

        async def one(n: int) -> None:
            async with gate:
                handle = await peer.submit(E, "echo", {"text": f"t{n}"})
                outcome = await handle.result(timeout=60)
                assert outcome.ok, outcome

        await asyncio.gather(*(one(n) for n in range(min(50, tasks))))  # warm-up
        pids = [r.proc.pid for r in replicas if r.proc is not None]
        cpu0 = sum(cpu_seconds(pid) for pid in pids)
        started = time.perf_counter()
        await asyncio.gather(*(one(n) for n in range(tasks)))
        elapsed = time.perf_counter() - started
        cpu = sum(cpu_seconds(pid) for pid in pids) - cpu0
        return {
            "setup": label,
            "tasks_per_s": round(tasks / elapsed, 1),
            "replica_cpu_ms_per_task": round(1000 * cpu / tasks, 2),
        }
    finally:
        for replica in replicas:
            await replica.close()
        await requester.close()
        if balancer is not None:
            balancer.stop()


async def main(tasks: int, concurrency: int) -> None:
    from synapse.cli.logs import configure_logging

    configure_logging(quiet=True, stream=sys.stderr)  # the requester's logs cost CPU too
    server = start_server()
    tmp = Path(tempfile.mkdtemp(prefix="synapse-bench-replicas-"))
    try:
        results = [
            await run_setup("sqlite-1", [str(tmp / "e.sqlite")], tmp, tasks, concurrency, False)
        ]
        for count in (1, 2, 3):
            url = server.create_database(f"bench{count}")
            label = f"postgres-{count}"
            results.append(await run_setup(label, [url] * count, tmp, tasks, concurrency, True))
        print(f"{'setup':<12} {'tasks/s':>8} {'replica CPU ms/task':>20}")
        for row in results:
            print(
                f"{row['setup']:<12} {row['tasks_per_s']:>8} {row['replica_cpu_ms_per_task']:>20}"
            )
        print(f"({tasks} echo tasks per setup, {concurrency} in flight, {os.cpu_count()} CPUs)")
    finally:
        stop_server(server)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=50)
    args = parser.parse_args()
    asyncio.run(main(args.tasks, args.concurrency))
