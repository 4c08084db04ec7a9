"""Replicas on PostgreSQL beside the PostgreSQL floor and one SQLite process: echo tasks/s, the
CPU of the replicas and of the database server per task, and what each task costs the database.

    python -m benchmarks.replicas [--seconds 5] [--rounds 3] [--durable] [--replicas 1,2]
                                  [--round-trips] [--code ROOT ...]

Starts a throw-away PostgreSQL server and nginx (the test kits' `tests/pgserver.py` and
`tests/lbserver.py`), and one independent requester (`benchmarks.floor`'s: aiohttp, stdlib
json, HMAC) that keeps `--concurrency` echo tasks in flight against each setup in turn:

- `sqlite-1`: one `synapse serve` process on SQLite;
- `pg-floor`: the PostgreSQL floor (`benchmarks.pg_floor`), behind nginx;
- `postgres-N`: N `synapse serve` replicas of one agent sharing one database, behind nginx.

Per setup: wall-clock tasks/s; the CPU of the executor processes and of the database server
per task (from /proc: load on the machine disturbs it less than the wall clock); and per task,
from `pg_stat_statements`, the transactions the server committed (explicit ones, and
statements run in autocommit: each is a transaction too) and the statements it ran, BEGIN and
COMMIT aside. `--round-trips` adds, per PostgreSQL setup, a round of its own through a relay
that counts round trips on the wire (`benchmarks.pgwire`). `--durable` runs the server with
PostgreSQL's own defaults (fsync and synchronous_commit on) instead of the tests' fast
settings; the setups alternate in every round. Everything runs on 127.0.0.1 and is stopped
by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from statistics import median

from benchmarks._common import Child, Section, Table, free_port, quiet_logging
from benchmarks.pgwire import RoundTripRelay

ROOT = Path(__file__).resolve().parent.parent
# The benchmark reuses the tests' kits that start the real server and load balancer.
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "cluster")]

from clusterkit import SECRET, E, R, Replica, replica_config  # noqa: E402
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


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine spent busy so far (every core: /proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / TICKS


def statement_counts(url: str) -> dict[str, int]:
    """Calls of each statement run in this database since the last reset, from
    `pg_stat_statements` (which counts as each statement ends)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT query, sum(calls) FROM pg_stat_statements s "
            "JOIN pg_database d ON d.oid = s.dbid "
            "WHERE d.datname = current_database() GROUP BY query"
        ).fetchall()
    return {str(query): int(calls) for query, calls in rows}


def committed_transactions(url: str) -> int:
    """Transactions committed in this database since the last reset, explicit and autocommit
    alike (`pg_stat_database`, which a backend updates when it ends, or at most once a
    second: read once the executors' connections are closed)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the executors' backends end after their exit
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchone()
            if row == (0,):
                break
            time.sleep(0.05)
        row = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    assert row is not None
    return int(row[0])


def dead_rows(url: str) -> str:
    """Dead rows left in the tables the replicas churn (autovacuum removes them)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT relname, n_dead_tup FROM pg_stat_user_tables "
            "WHERE relname IN ('leases', 'outbox', 'tasks', 'dedup') ORDER BY relname"
        ).fetchall()
    return ", ".join(f"{name} {dead}" for name, dead in rows)


def reset_counts(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_statements_reset()")
        conn.execute("SELECT pg_stat_reset()")


@dataclass(frozen=True)
class Setup:
    """`sqlite` (one process), `floor` (the PostgreSQL floor) or `replicas` (`count` of them)."""

    kind: str
    count: int = 1

    @property
    def label(self) -> str:
        return {"sqlite": "sqlite-1", "floor": "pg-floor"}.get(self.kind, f"postgres-{self.count}")


@dataclass
class Run:
    """One setup measured once: what the requester saw and what it cost."""

    setup: Setup
    code: str
    tasks_per_s: float
    tasks: int
    executor_cpu_s: float
    server_cpu_s: float = 0.0
    commits: int = 0
    transactions: int = 0
    statements: int = 0
    round_trips: int | None = None
    by_statement: dict[str, int] | None = None
    errors: int = 0
    #: Cores of the machine kept busy during the load (every process: the requester, nginx,
    #: the executors, PostgreSQL), out of `os.cpu_count()`.
    busy_cores: float = 0.0


class Bench:
    def __init__(
        self, server: PgServer, requester: Child, tmp: Path, seconds: float, warmup: float,
        concurrency: int,
    ) -> None:  # fmt: skip
        self.server = server
        self.requester = requester
        self.tmp = tmp
        self.seconds = seconds
        self.warmup = warmup
        self.concurrency = concurrency
        self.databases = 0
        #: With `--keep-database`: each setup's database, reused by its later rounds.
        self.kept: dict[tuple[Setup, str], str] | None = None

    def database(self, *, schema: bool) -> str:
        import psycopg

        from synapse.store.postgres import migrate

        self.databases += 1
        url = self.server.create_database(f"bench_{self.databases}")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        if schema:  # the floor writes into Synapse's schema; replicas make their own
            migrate(url)
        return url

    @contextlib.asynccontextmanager
    async def executors(
        self, setup: Setup, store: str, name: str
    ) -> AsyncIterator[tuple[str, list[int]]]:
        """Start the setup's executor processes; yield the URL to POST to and their PIDs."""
        endpoint = self.requester.ready["endpoint"]
        balancer: Nginx | None = None
        replicas: list[Replica] = []
        floor: Child | None = None
        try:
            if setup.kind == "floor":
                port = free_port()
                balancer = Nginx([f"127.0.0.1:{port}"])
                balancer.start()
                floor = await asyncio.to_thread(
                    Child, "pg-floor-executor", "--agent-id", E, "--port", str(port),
                    "--secret", SECRET, "--store", store,
                )  # fmt: skip
                yield f"{balancer.url}/synapse/callback", [floor.proc.pid]
                return
            config = replica_config(self.tmp / f"{name}.toml", 10.0)
            replicas = [
                Replica(f"{name}-{n}", store, "", endpoint, config, self.tmp)
                for n in range(setup.count)
            ]
            if setup.kind == "replicas":
                balancer = Nginx([r.hostport for r in replicas])
                balancer.start()
            url = f"{balancer.url}/synapse/callback" if balancer else replicas[0].url
            for replica in replicas:
                replica.endpoint = url
                await replica.start()
            yield url, [r.proc.pid for r in replicas if r.proc is not None]
        finally:
            for replica in replicas:
                await replica.close()
            if floor is not None:
                await asyncio.to_thread(floor.close)
            if balancer is not None:
                balancer.stop()

    async def measure(self, setup: Setup, code: str, *, round_trips: bool = False) -> Run:
        name = f"{setup.label}-{self.databases}"
        postgres = setup.kind != "sqlite"
        if not postgres:
            url = str(self.tmp / f"{name}.sqlite")
        elif self.kept is not None and (setup, code) in self.kept:
            url = self.kept[(setup, code)]
        else:
            url = self.database(schema=setup.kind == "floor")
            if self.kept is not None:
                self.kept[(setup, code)] = url
        relay: RoundTripRelay | None = None
        store = url
        if round_trips:
            relay = RoundTripRelay(url)
            await relay.start()
            store = relay.url(url)
        try:
            async with self.executors(setup, store, name) as (executor_url, pids):
                if postgres:
                    reset_counts(url)
                turns0 = relay.turns if relay is not None else 0
                cpu0 = sum(cpu_seconds(pid) for pid in pids)
                server0 = server_cpu_seconds(self.server.pid)
                busy0, wall0 = machine_busy_seconds(), time.monotonic()
                result = await asyncio.to_thread(
                    self.requester.call,
                    "load",
                    url=executor_url,
                    agent_id=E,
                    concurrency=self.concurrency,
                    seconds=self.seconds,
                    warmup=self.warmup,
                    timeout=self.seconds + self.warmup + 120,
                )
                cpu = sum(cpu_seconds(pid) for pid in pids) - cpu0
                server_cpu = server_cpu_seconds(self.server.pid) - server0
                busy = (machine_busy_seconds() - busy0) / (time.monotonic() - wall0)
                turns = relay.turns - turns0 if relay is not None else None
            run = Run(
                setup, code, result["rate"], int(result["total"]), cpu, server_cpu,
                round_trips=turns, errors=int(result["errors"]), busy_cores=busy,
            )  # fmt: skip
            if postgres:
                counts = statement_counts(url)
                run.commits = counts.get("COMMIT", 0)
                run.statements = sum(
                    n for q, n in counts.items() if q not in ("BEGIN", "COMMIT", "ROLLBACK")
                )
                run.transactions = committed_transactions(url)
                run.by_statement = counts
            return run
        finally:
            if relay is not None:
                await relay.close()


def per_task(value: float, run: Run, scale: float = 1.0) -> float:
    return scale * value / max(1, run.tasks)


def summary(runs: list[Run]) -> list[dict[str, str]]:
    """Medians per (code, setup) over the rounds, and each setup's ratios to the floor."""
    groups: dict[tuple[str, str], list[Run]] = {}
    for run in runs:
        if run.round_trips is None:
            groups.setdefault((run.code, run.setup.label), []).append(run)
    trips: dict[tuple[str, str], list[float]] = {}
    for run in runs:
        if run.round_trips is not None:
            trips.setdefault((run.code, run.setup.label), []).append(per_task(run.round_trips, run))
    rows: list[dict[str, str]] = []
    for (code, label), group in groups.items():
        rate = median(r.tasks_per_s for r in group)
        cpu = median(per_task(r.executor_cpu_s, r, 1000) for r in group)
        server = median(per_task(r.server_cpu_s, r, 1000) for r in group)
        floor = [r for r in runs if r.setup.kind == "floor" and r.round_trips is None]
        measured = [r for r in floor if r.tasks]  # a round that finished nothing measures nothing
        group_done = any(r.tasks for r in group)
        rates = [r.tasks_per_s for r in group]
        row = {
            "code": code,
            "setup": label,
            "tasks/s": f"{rate:,.0f}",
            "range": f"{min(rates):,.0f}–{max(rates):,.0f}",
            "executor ms/task": f"{cpu:.2f}",
            "server ms/task": f"{server:.2f}" if label != "sqlite-1" else "",
            "busy cores": f"{median(r.busy_cores for r in group):.2f}",
            "transactions/task": "",
            "explicit/task": "",
            "statements/task": "",
            "round trips/task": "",
            "× floor tasks/s": "",
            "× floor CPU": "",
        }
        if label != "sqlite-1":
            row["transactions/task"] = f"{median(per_task(r.transactions, r) for r in group):.2f}"
            row["explicit/task"] = f"{median(per_task(r.commits, r) for r in group):.2f}"
            row["statements/task"] = f"{median(per_task(r.statements, r) for r in group):.1f}"
        if (code, label) in trips:
            row["round trips/task"] = f"{median(trips[(code, label)]):.2f}"
        if floor and label != "sqlite-1":
            floor_rate = median(r.tasks_per_s for r in measured) if measured else 0.0
            floor_cpu = (
                median(per_task(r.executor_cpu_s + r.server_cpu_s, r, 1000) for r in measured)
                if measured
                else 0.0
            )
            ours = median(per_task(r.executor_cpu_s + r.server_cpu_s, r, 1000) for r in group)
            # A loaded machine can leave a round with no task finished: no ratio, not a crash.
            row["× floor tasks/s"] = f"{rate / floor_rate:.2f}" if floor_rate else "n/a"
            row["× floor CPU"] = f"{ours / floor_cpu:.2f}" if floor_cpu and group_done else "n/a"
        rows.append(row)
    return rows


def print_table(rows: list[dict[str, str]]) -> None:
    if not rows:
        return
    columns = list(rows[0])
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in columns}
    print("  ".join(c.rjust(widths[c]) for c in columns))
    for row in rows:
        print("  ".join(row[c].rjust(widths[c]) for c in columns))


def print_statements(runs: list[Run], top: int = 14) -> None:
    """Per PostgreSQL setup of the last round: the statements run most per task."""
    last: dict[tuple[str, str], Run] = {}
    for run in runs:
        if run.by_statement is not None and run.round_trips is None:
            last[(run.code, run.setup.label)] = run
    for (code, label), run in last.items():
        assert run.by_statement is not None
        print(f"\n{code} {label}: statements per task")
        ranked = sorted(run.by_statement.items(), key=lambda item: -item[1])[:top]
        for query, calls in ranked:
            text = " ".join(query.split())
            print(f"  {calls / max(1, run.tasks):6.2f}  {text[:110]}")


async def measure_all(args: argparse.Namespace) -> list[Run]:
    """Every setup, `args.rounds` times, alternating (and the round-trip rounds)."""
    server = start_server(durable=args.durable, statements=True)
    tmp = Path(tempfile.mkdtemp(prefix="synapse-bench-replicas-"))
    inherited = os.environ.get("PYTHONPATH")
    home = os.getcwd()
    saved_path = list(sys.path)
    # This process's own imports stay where they were found, whatever directory it runs in.
    sys.path[:] = [str(Path(home, entry)) for entry in sys.path]
    setups = [Setup("floor")] + [Setup("replicas", int(c)) for c in args.replicas.split(",") if c]
    if not args.no_sqlite:
        setups.insert(0, Setup("sqlite"))
    codes = args.code or [str(ROOT)]
    requester = await asyncio.to_thread(
        Child, "floor-requester", "--agent-id", R, "--port", str(free_port()), "--secret", SECRET
    )
    bench = Bench(server, requester, tmp, args.seconds, args.warmup, args.concurrency)
    if args.keep_database:
        bench.kept = {}
    runs: list[Run] = []
    try:
        for round_ in range(args.rounds):
            for code in codes:
                # The replicas run this checkout's code (`synapse serve -m` in a subprocess,
                # whose working directory comes first on its path).
                os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [code, inherited]))
                os.chdir(code)
                name = Path(code).name or code
                for setup in setups:
                    if setup.kind == "floor" and code != codes[0]:
                        continue  # the floor does not depend on the code under test
                    run = await bench.measure(setup, "floor" if setup.kind == "floor" else name)
                    runs.append(run)
                    dead = ""
                    if bench.kept is not None and (setup, run.code) in bench.kept:
                        dead = f"; dead rows: {dead_rows(bench.kept[(setup, run.code)])}"
                    print(
                        f"round {round_ + 1} {name} {setup.label}: {run.tasks_per_s:,.0f} tasks/s,"
                        f" {per_task(run.executor_cpu_s, run, 1000):.2f} ms/task"
                        f" ({run.errors} errors){dead}",
                        file=sys.stderr,
                    )
                    if args.round_trips and round_ == 0 and setup.kind != "sqlite":
                        runs.append(await bench.measure(setup, run.code, round_trips=True))
        return runs
    finally:
        os.chdir(home)
        sys.path[:] = saved_path
        if inherited is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = inherited
        await asyncio.to_thread(requester.close)
        stop_server(server)
        shutil.rmtree(tmp, ignore_errors=True)


def figures(runs: list[Run]) -> dict[str, float]:
    """The named figures the targets are judged on (medians over the rounds)."""
    out: dict[str, float] = {}
    measured = [r for r in runs if r.round_trips is None]

    def pick(label: str) -> list[Run]:
        return [r for r in measured if r.setup.label == label]

    for label, key in (("pg-floor", "floor"), ("sqlite-1", "sqlite"), ("postgres-1", "one"),
                       ("postgres-2", "two")):  # fmt: skip
        group = pick(label)
        if not group:
            continue
        out[f"replicas.{key}.tasks_per_s"] = median(r.tasks_per_s for r in group)
        out[f"replicas.{key}.cpu_ms"] = median(per_task(r.executor_cpu_s, r, 1000) for r in group)
        out[f"replicas.{key}.server_cpu_ms"] = median(
            per_task(r.server_cpu_s, r, 1000) for r in group
        )
        out[f"replicas.{key}.total_cpu_ms"] = median(
            per_task(r.executor_cpu_s + r.server_cpu_s, r, 1000) for r in group
        )
        if label != "sqlite-1":
            out[f"replicas.{key}.explicit_per_task"] = median(per_task(r.commits, r) for r in group)
            trips = [per_task(r.round_trips, r) for r in runs if r.round_trips is not None
                     and r.setup.label == label]  # fmt: skip
            if trips:
                out[f"replicas.{key}.round_trips_per_task"] = median(trips)
    return out


def projection(f: dict[str, float], counts: tuple[int, ...] = (1, 2, 4, 8, 16)) -> Table | None:
    """N replicas, each on a core of its own, beside one database server given the cores it
    needs: derived from what one and two replicas cost here, not measured.

    A replica's rate is the lesser of what one replica reached here (its commits in flight
    bound it: a group commit waits for the disk) and what a core of its own allows at the CPU
    per task two replicas needed (each replica's groups are smaller when they share the
    database, so each task costs more); the server's cores are what N such replicas need at
    the server CPU per task measured with two."""
    needed = ("replicas.one.tasks_per_s", "replicas.two.cpu_ms", "replicas.two.server_cpu_ms")
    if any(not f.get(key) for key in needed):
        return None  # missing, or a round that finished no task
    per_replica = min(f["replicas.one.tasks_per_s"], 1000 / f["replicas.two.cpu_ms"])
    table = Table(
        [
            "replicas (a core each)",
            "projected tasks/s",
            "database server cores needed",
            "× one SQLite process",
        ],
        title="Projection: N replicas on N cores beside one database server (derived)",
    )
    for n in counts:
        rate = n * per_replica
        cores = rate * f["replicas.two.server_cpu_ms"] / 1000
        sqlite = f.get("replicas.sqlite.tasks_per_s")
        table.add(n, f"{rate:,.0f}", f"{cores:.1f}", f"{rate / sqlite:.1f}×" if sqlite else "")
    return table


def run(
    *,
    seconds: float = 5.0,
    warmup: float = 1.0,
    rounds: int = 3,
    durable: bool = True,
    round_trips: bool = True,
) -> Section:
    """The section of `docs/benchmarks.md`: this checkout's replicas, durable PostgreSQL."""
    started = time.monotonic()
    args = parse_args(
        ["--seconds", str(seconds), "--warmup", str(warmup), "--rounds", str(rounds)]
        + (["--durable"] if durable else [])
        + (["--round-trips"] if round_trips else [])
    )
    runs = asyncio.run(measure_all(args))
    section = Section(
        "replicas",
        "Replicas on PostgreSQL beside the PostgreSQL floor and one SQLite process",
        "python -m benchmarks.replicas --durable --round-trips",
    )
    rows = [{k: v for k, v in row.items() if k != "code"} for row in summary(runs)]
    table = Table(list(rows[0]), title="Echo tasks, concurrency 50 (medians over the rounds)")
    for row in rows:
        table.add(*row.values())
    section.tables.append(table)
    section.figures = figures(runs)
    projected = projection(section.figures)
    if projected is not None:
        section.tables.append(projected)
    section.notes += [
        f"{rounds} alternating rounds of {seconds:g} s (+ {warmup:g} s warm-up) per setup; "
        "one independent requester (aiohttp, stdlib json and HMAC) drives every setup; "
        f"PostgreSQL {'durable (fsync, synchronous_commit on)' if durable else 'fsync off'}, "
        "on the same machine as everything else.",
        "executor ms/task: CPU of the executor processes (the replicas, the floor, or the "
        "SQLite process) per task; server ms/task: the PostgreSQL server's; busy cores: the "
        "whole machine's (requester, nginx, executors, server) during the load, of "
        f"{os.cpu_count()}.",
        "transactions/task: every commit (explicit ones, and statements run in autocommit); "
        "explicit/task: BEGIN … COMMIT transactions (the group commits); round trips/task: "
        "counted on the wire by a relay, in rounds of their own.",
    ]
    section.seconds = time.monotonic() - started
    return section


async def main(args: argparse.Namespace) -> None:
    quiet_logging()
    load = os.getloadavg()[0]
    runs = await measure_all(args)
    print_table(summary(runs))
    print(
        f"(median of {args.rounds} rounds of {args.seconds:g} s + {args.warmup:g} s warm-up; "
        f"{args.concurrency} echo tasks in flight; {os.cpu_count()} CPUs; PostgreSQL "
        f"{'durable (fsync, synchronous_commit on)' if args.durable else 'fsync off'}; "
        f"load average {load:.2f} at the start, {os.getloadavg()[0]:.2f} at the end)"
    )
    projected = projection(figures(runs))
    if projected is not None and len(args.code or [ROOT]) == 1:
        print()
        print(projected.text())
    if args.statements:
        print_statements(runs)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="measured window per setup")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--durable", action="store_true", help="fsync and synchronous_commit on")
    parser.add_argument("--rounds", type=int, default=3, help="alternate the setups N times")
    parser.add_argument(
        "--code",
        action="append",
        metavar="ROOT",
        help="a checkout whose code the replicas run (repeatable, for an A/B; default: this one)",
    )
    parser.add_argument("--replicas", default="1,2", help="replica counts (default 1,2)")
    parser.add_argument("--no-sqlite", action="store_true", help="skip the SQLite process")
    parser.add_argument(
        "--round-trips", action="store_true", help="count round trips (rounds of their own)"
    )
    parser.add_argument(
        "--keep-database",
        action="store_true",
        help="each setup keeps its database across rounds (rows and dead tuples accumulate)",
    )
    parser.add_argument(
        "--statements", action="store_true", help="list the statements run most per task"
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
