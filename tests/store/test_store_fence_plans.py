"""The fence's plan does not depend on how many leases a replica holds: each task of a batch
is looked up by the leases' primary key, with statistics fresh or stale, whether the replica
holds a hundred leases or twenty thousand; and the takeover scan never reads the finished
tasks, however many are stored (read from the plans PostgreSQL chose, through
`auto_explain`)."""

from __future__ import annotations

import psycopg
import pytest

from synapse.store.postgres import PostgresStore

HOLDER = "replica-a"


def plans_of(conn: psycopg.Connection[object], query: str, params: tuple[object, ...]) -> list[str]:
    """The plans of every statement `query` ran, as PostgreSQL chose them."""
    plans: list[str] = []
    conn.add_notice_handler(lambda notice: plans.append(notice.message_primary or ""))
    conn.execute("LOAD 'auto_explain'")
    conn.execute("SET auto_explain.log_min_duration = 0")
    conn.execute("SET auto_explain.log_nested_statements = on")
    conn.execute("SET client_min_messages = log")
    conn.execute(query.encode(), params)
    conn.execute("SET client_min_messages = notice")
    conn.execute("SET auto_explain.log_min_duration = -1")
    return plans


def fence_plans(conn: psycopg.Connection[object]) -> list[str]:
    # Two tasks of ours and a new one, as a batch carries them.
    plans = plans_of(
        conn,
        "SELECT synapse_fence_all(%s, %s, %s, %s, %s)",
        (["agent-r"] * 3, ["t-1", "t-2", "t-new"], [1, 1, 0], HOLDER, 1e12),
    )
    return [plan for plan in plans if "FROM leases l" in plan]


def hold(conn: psycopg.Connection[object], first: int, last: int) -> None:
    """Leases (and stored tasks) t-first .. t-last, all held by HOLDER."""
    conn.execute(
        "INSERT INTO leases SELECT 'agent-r', 't-' || g, %s, 1, 1e12 "
        "FROM generate_series(%s::int, %s::int) g",
        (HOLDER, first, last),
    )
    conn.execute(
        "INSERT INTO tasks SELECT 'agent-r', 't-' || g, 'executor', 'executing', 0, "
        "convert_to('{}', 'UTF8') FROM generate_series(%s::int, %s::int) g",
        (first, last),
    )


@pytest.mark.parametrize(
    ("held", "statistics"),
    [(100, "fresh"), (20_000, "fresh"), (20_000, "stale")],
    ids=["100-leases", "20000-leases", "20000-leases-stale-statistics"],
)
def test_the_fence_looks_each_task_up_by_key(pg_url: str, held: int, statistics: str) -> None:
    PostgresStore(pg_url)  # the schema
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE leases SET (autovacuum_enabled = off)")
        conn.execute("ALTER TABLE tasks SET (autovacuum_enabled = off)")
        if statistics == "stale":  # analysed small, grown since
            hold(conn, 1, 100)
            conn.execute("ANALYZE leases, tasks")
            hold(conn, 101, held)
        else:
            hold(conn, 1, held)
            conn.execute("ANALYZE leases, tasks")
        plans = fence_plans(conn)
        assert plans, "auto_explain logged no plan of the fence"
        for plan in plans:
            assert "Index Scan using leases_pkey on leases" in plan, plan
            for scan in ("Seq Scan on leases", "Hash Join", "Merge Join", "leases_holder"):
                assert scan not in plan, plan
        # The fence took the new task's lease and kept the others: nothing was refused.
        found = conn.execute("SELECT count(*) FROM leases WHERE holder = %s", (HOLDER,)).fetchone()
        assert found == (held + 1,)


@pytest.mark.parametrize("finished", [100, 10_000])
def test_the_takeover_scan_never_reads_the_finished_tasks(pg_url: str, finished: int) -> None:
    PostgresStore(pg_url)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO tasks SELECT 'agent-r', 'done-' || g, 'executor', 'completed', 0, "
            "convert_to('{}', 'UTF8') FROM generate_series(1, %s) g",
            (finished,),
        )
        hold(conn, 1, 50)  # tasks in flight, leased
        conn.execute(  # and undelivered callbacks of some of them
            "INSERT INTO outbox (seq, message_id, partner, requester, task_id, body, "
            "created_at) SELECT g, 'm-' || g, 'agent-r', 'agent-r', 't-' || g, '', 0 "
            "FROM generate_series(1, 20) g"
        )
        conn.execute("ANALYZE")
        plans = plans_of(
            conn,
            "SELECT leased_requester, leased_task_id, leased_epoch "
            "FROM synapse_lease_unleased(%s, %s, %s)",
            (HOLDER, 1e12, 100),
        )
        inner = [plan for plan in plans if "INSERT INTO leases" in plan]
        assert inner, plans
        for plan in inner:
            assert "Seq Scan on tasks" not in plan, plan
            assert "tasks_live" in plan, plan  # the live tasks, through their index
