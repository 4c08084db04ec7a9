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


async def main(sizes: list[int], scans: int) -> None:
    from synapse.store.postgres import migrate

    server = start_server(statements=True)
    results: dict[int, list[tuple[str, float, float, float]]] = {}
    try:
        for size in sizes:
            url = server.create_database(f"scan_{size}")
            import psycopg

            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("CREATE EXTENSION pg_stat_statements")
            migrate(url)
            fill(url, size)
            results[size] = await scan(url, scans)
    finally:
        stop_server(server)
    print(f"{'finished tasks':>14}  {'buffers/scan':>12}  {'ms/scan':>8}  statement")
    for size, rows in results.items():
        for query, _calls, buffers, ms in rows:
            text = " ".join(query.split())
            kind = "orphans" if text.startswith("WITH orphans") else "unleased"
            print(f"{size:>14,}  {buffers:>12.1f}  {ms:>8.3f}  {kind}: {text[:60]}…")
        total_b = sum(b for _q, _c, b, _t in rows)
        total_t = sum(t for _q, _c, _b, t in rows)
        print(f"{size:>14,}  {total_b:>12.1f}  {total_t:>8.3f}  the whole scan")
    if len(results) == 2:
        (small, a), (large, b) = results.items()
        ratio_b = sum(x[2] for x in b) / max(1e-9, sum(x[2] for x in a))
        ratio_t = sum(x[3] for x in b) / max(1e-9, sum(x[3] for x in a))
        print(
            f"{large:,} vs {small:,} finished tasks: {ratio_b:.2f}× the buffers, "
            f"{ratio_t:.2f}× the time per scan ({scans} scans each)"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--scans", type=int, default=200)
    args = parser.parse_args()
    asyncio.run(main([int(s) for s in args.sizes.split(",")], args.scans))
