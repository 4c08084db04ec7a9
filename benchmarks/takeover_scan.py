"""The takeover scan's cost against the number of finished tasks stored: 10,000 vs 100,000.

    python -m benchmarks.takeover_scan [--sizes 10000,100000] [--scans 200]

Every replica looks for orphaned tasks (a lease run out, or none at all) a third of the lease
TTL apart (`Ownership.take_over_expired`). For each size, a fresh database on a throw-away
PostgreSQL server holds that many finished tasks (their leases given back, as replicas do),
200 live tasks leased by a live replica and 50 outbox rows still to deliver; the scan runs
`--scans` times (finding nothing to take over: the usual case), and `pg_stat_statements`
says what each of its statements cost per call: the buffers it touched (deterministic: the
rows and index pages it read) and its execution time. A scan whose cost is flat in the
number of finished tasks touches the same number of buffers at both sizes.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests")]  # the tests' kit that starts the real server

from pgserver import start_server, stop_server  # noqa: E402

from benchmarks._common import Section, Table  # noqa: E402

LIVE = 200
UNDELIVERED = 50


def fill(url: str, finished: int) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        record = b"{}"
        conn.execute(
            "INSERT INTO tasks SELECT 'agent-r', 'done-' || g, 'executor', 'completed', "
            "extract(epoch from now()), %s FROM generate_series(1, %s) g",
            (record, finished),
        )
        conn.execute(
            "INSERT INTO tasks SELECT 'agent-r', 'live-' || g, 'executor', 'executing', "
            "extract(epoch from now()), %s FROM generate_series(1, %s) g",
            (record, LIVE),
        )
        conn.execute(
            "INSERT INTO leases SELECT 'agent-r', 'live-' || g, 'other-replica', 1, %s "
            "FROM generate_series(1, %s) g",
            (time.time() + 3600, LIVE),
        )
        conn.execute(
            "INSERT INTO outbox (seq, message_id, partner, requester, task_id, body, "
            "created_at) SELECT g, 'm-' || g, 'agent-r', 'agent-r', 'live-' || g, '', 0 "
            "FROM generate_series(1, %s) g",
            (UNDELIVERED,),
        )
        conn.execute("VACUUM ANALYZE")


async def scan(url: str, scans: int) -> list[tuple[str, float, float, float]]:
    """(statement, calls, buffers per call, ms per call) of the scan's statements."""
    import psycopg

    from synapse.store.leases import Ownership
    from synapse.store.postgres import PostgresStore

    store = PostgresStore(url)
    owner = Ownership(store, agent_id="agent-e", url="http://127.0.0.1:1/", ttl=10)
    owner.take_over_at_start()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_statements_reset()")
    for _ in range(scans):
        taken = await owner.take_over_expired()
        assert not taken.tasks, "the scan took a task over: nothing is orphaned here"
    await store.close()
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT query, calls, (shared_blks_hit + shared_blks_read)::float / calls, "
            "mean_exec_time FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid "
            "WHERE d.datname = current_database() AND calls >= %s ORDER BY query",
            (scans,),
        ).fetchall()
    return [(str(q), float(c), float(b), float(t)) for q, c, b, t in rows]


async def measure(sizes: list[int], scans: int) -> dict[int, list[tuple[str, float, float, float]]]:
    import psycopg

    from synapse.store.postgres import migrate

    server = start_server(statements=True)
    results: dict[int, list[tuple[str, float, float, float]]] = {}
    try:
        for size in sizes:
            url = server.create_database(f"scan_{len(results)}_{size}")
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("CREATE EXTENSION pg_stat_statements")
            migrate(url)
            fill(url, size)
            results[size] = await scan(url, scans)
    finally:
        stop_server(server)
    return results


def run(sizes: tuple[int, ...] = (10_000, 100_000), scans: int = 200) -> Section:
    started = time.monotonic()
    results = asyncio.run(measure(list(sizes), scans))
    section = Section(
        "takeover_scan",
        "Takeover scan against the number of finished tasks stored",
        "python -m benchmarks.takeover_scan",
    )
    table = Table(
        ["finished tasks", "buffers/scan", "ms/scan", "orphans buffers", "unleased buffers"],
        title=f"One scan (mean of {scans}), {LIVE} live tasks and {UNDELIVERED} undelivered rows",
    )
    for size, rows in results.items():
        kinds = {("orphans" if q.lstrip().startswith("WITH orphans") else "unleased"): b
                 for q, _c, b, _t in rows}  # fmt: skip
        buffers = sum(b for _q, _c, b, _t in rows)
        ms = sum(t for _q, _c, _b, t in rows)
        table.add(f"{size:,}", f"{buffers:.1f}", f"{ms:.3f}", f"{kinds.get('orphans', 0):.1f}",
                  f"{kinds.get('unleased', 0):.1f}")  # fmt: skip
        section.figures[f"takeover_scan.{size}.buffers"] = buffers
        section.figures[f"takeover_scan.{size}.ms"] = ms
    section.tables.append(table)
    if len(results) == 2:
        small, large = sorted(results)
        f = section.figures
        f["takeover_scan.buffers_ratio"] = (
            f[f"takeover_scan.{large}.buffers"] / f[f"takeover_scan.{small}.buffers"]
        )
        f["takeover_scan.time_ratio"] = (
            f[f"takeover_scan.{large}.ms"] / f[f"takeover_scan.{small}.ms"]
        )
        f["takeover_scan.size_ratio"] = large / small
    section.notes.append(
        "Buffers: shared buffers the scan's statements touched per call "
        "(pg_stat_statements), deterministic; ms: their mean execution time, noisy."
    )
    section.seconds = time.monotonic() - started
    return section


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--scans", type=int, default=200)
    args = parser.parse_args()
    print(run(tuple(int(s) for s in args.sizes.split(",")), args.scans).text())
