"""Echo tasks/s through replicas on PostgreSQL (1, 2, 3 behind nginx) beside one SQLite process.

    python -m benchmarks.replicas [--tasks 400] [--concurrency 50] [--durable] [--rounds 1]

Starts a throw-away PostgreSQL server and nginx (the test kits' `tests/pgserver.py` and
`tests/lbserver.py`), then for each setup N `synapse serve` replicas of one agent and an
in-process requester that keeps `--concurrency` echo tasks in flight. Reports wall-clock
tasks/s, the CPU the replicas used per task and the database server's (from /proc: load on
the machine disturbs it less than the wall clock), and per task the explicit transactions
the server committed and the statements it ran, BEGIN and COMMIT aside
(`pg_stat_statements`). `--durable`
runs the server with PostgreSQL's own defaults (fsync and synchronous_commit on) instead of
the tests' fast settings; `--rounds N` alternates the setups N times. Everything runs on
127.0.0.1 and is stopped by PID.
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
from pgserver import PgServer, start_server, stop_server  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def server_cpu_seconds(postmaster: int) -> float:
    """CPU of the PostgreSQL server: its postmaster, its live backends and workers, and the
    children that ended (their time is added to the postmaster's cutime/cstime)."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(stat.parent.name)
        if pid == postmaster:
            total += sum(int(f) for f in fields[11:15]) / TICKS  # its own and reaped children's
        elif int(fields[1]) == postmaster:
            total += (int(fields[11]) + int(fields[12])) / TICKS
    return total


def server_counts(url: str) -> tuple[int, int]:
    """(explicit transactions committed, statements run) in the database so far, from
    `pg_stat_statements`, which counts as each statement ends (`pg_stat_database` lags: a
    backend flushes its counts at most once a second). Statements run in autocommit are a
    transaction each on top of the explicit ones."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(calls) FILTER (WHERE query = 'COMMIT'), 0), "
            "coalesce(sum(calls) FILTER (WHERE query NOT IN ('BEGIN', 'COMMIT')), 0) "
            "FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid "
            "WHERE d.datname = current_database()"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


async def run_setup(
    label: str,
    stores: list[str],
    tmp: Path,
    tasks: int,
    concurrency: int,
    nginx: bool,
    server: PgServer | None = None,
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
        server0 = server_cpu_seconds(server.pid) if server is not None else 0.0
        counts0 = server_counts(stores[0]) if server is not None else (0, 0)
        started = time.perf_counter()
        await asyncio.gather(*(one(n) for n in range(tasks)))
        elapsed = time.perf_counter() - started
        cpu = sum(cpu_seconds(pid) for pid in pids) - cpu0
        row: dict[str, float | str] = {
            "setup": label,
            "tasks_per_s": round(tasks / elapsed, 1),
            "replica_cpu_ms_per_task": round(1000 * cpu / tasks, 2),
            "server_cpu_ms_per_task": "",
            "commits_per_task": "",
            "statements_per_task": "",
        }
        if server is not None:
            server_cpu = server_cpu_seconds(server.pid) - server0
            xacts, calls = (b - a for a, b in zip(counts0, server_counts(stores[0]), strict=True))
            row["server_cpu_ms_per_task"] = round(1000 * server_cpu / tasks, 2)
            row["commits_per_task"] = round(xacts / tasks, 2)
            row["statements_per_task"] = round(calls / tasks, 1)
        return row
    finally:
        for replica in replicas:
            await replica.close()
        await requester.close()
        if balancer is not None:
            balancer.stop()


async def main(
    tasks: int,
    concurrency: int,
    *,
    durable: bool,
    rounds: int,
    codes: list[str],
    counts: list[int],
    sqlite: bool,
) -> None:
    import psycopg

    from synapse.cli.logs import configure_logging

    configure_logging(quiet=True, stream=sys.stderr)  # the requester's logs cost CPU too
    server = start_server(durable=durable, statements=True)
    tmp = Path(tempfile.mkdtemp(prefix="synapse-bench-replicas-"))
    inherited = os.environ.get("PYTHONPATH")
    home = os.getcwd()
    # This process's own imports stay where they were found, whatever directory it runs in.
    sys.path[:] = [str(Path(home, entry)) for entry in sys.path]
    results: list[dict[str, float | str]] = []
    try:
        for round_ in range(rounds):
            for n, code in enumerate(codes):
                # The replicas run this checkout's code (`synapse serve -m` in a subprocess,
                # whose working directory comes first on its path).
                os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [code, inherited]))
                os.chdir(code)
                name = Path(code).name or code
                if sqlite:
                    store = str(tmp / f"e-{round_}-{n}.sqlite")
                    row = await run_setup("sqlite-1", [store], tmp, tasks, concurrency, False)
                    results.append({"code": name, **row})
                for count in counts:
                    url = server.create_database(f"bench_{round_}_{n}_{count}")
                    with psycopg.connect(url, autocommit=True) as conn:
                        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                    label = f"postgres-{count}"
                    row = await run_setup(
                        label, [url] * count, tmp, tasks, concurrency, True, server
                    )
                    results.append({"code": name, **row})
        columns = [
            ("code", 12),
            ("setup", 12),
            ("tasks_per_s", 11),
            ("replica_cpu_ms_per_task", 23),
            ("server_cpu_ms_per_task", 22),
            ("commits_per_task", 16),
            ("statements_per_task", 19),
        ]
        print("  ".join(f"{name:>{width}}" for name, width in columns))
        for row in results:
            print("  ".join(f"{row.get(name, '')!s:>{width}}" for name, width in columns))
        print(
            f"({tasks} echo tasks per setup, {concurrency} in flight, {os.cpu_count()} CPUs, "
            f"PostgreSQL {'durable (fsync, synchronous_commit on)' if durable else 'fsync off'}, "
            f"load average {os.getloadavg()[0]:.2f})"
        )
    finally:
        os.chdir(home)
        if inherited is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = inherited
        stop_server(server)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--durable", action="store_true", help="fsync and synchronous_commit on")
    parser.add_argument("--rounds", type=int, default=1, help="alternate the setups N times")
    parser.add_argument(
        "--code",
        action="append",
        metavar="ROOT",
        help="a checkout whose code the replicas run (repeatable, for an A/B; default: this one)",
    )
    parser.add_argument("--replicas", default="1,2,3", help="replica counts (default 1,2,3)")
    parser.add_argument("--no-sqlite", action="store_true", help="skip the SQLite process")
    args = parser.parse_args()
    asyncio.run(
        main(
            args.tasks,
            args.concurrency,
            durable=args.durable,
            rounds=args.rounds,
            codes=args.code or [str(ROOT)],
            counts=[int(c) for c in args.replicas.split(",") if c],
            sqlite=not args.no_sqlite,
        )
    )
