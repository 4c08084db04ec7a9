"""What only the PostgreSQL store does: versioned migrations, sharing one database between
processes, `synapse migrate`, and refusing what it cannot vouch for. Against a real server."""

from __future__ import annotations

import asyncio
import io
import threading

import psycopg
import pytest
from pgserver import restart_server, start_server, stop_server
from storekit import T0, Duo, dedup_entry, outbox_item

from synapse.cli.main import main
from synapse.store import open_store
from synapse.store.base import StoreUnavailable
from synapse.store.memory import MemoryStore
from synapse.store.migrations import latest_version, migrations
from synapse.store.pglink import client_link_checks, server_link_checks
from synapse.store.postgres import PostgresStore, apply_migrations, schema_version
from synapse.store.shared import SharedStore


def versions(url: str) -> list[tuple[int, str]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT version, name FROM schema_migrations ORDER BY version")
        return [(int(v), str(n)) for v, n in rows.fetchall()]


async def test_opening_applies_every_migration_once(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    await store.close()
    expected = [(m.version, m.name) for m in migrations()]
    assert versions(pg_url) == expected
    assert expected[0] == (1, "initial") and len(expected) == latest_version()
    again = PostgresStore(pg_url)  # a second start finds the schema current: nothing applied
    await again.close()
    assert versions(pg_url) == expected


async def test_open_store_takes_a_postgresql_url(pg_url: str) -> None:
    store = open_store(pg_url)
    assert isinstance(store, PostgresStore) and store.durable
    assert isinstance(store, SharedStore)  # replicas may share it
    await store.close()


def test_replicas_starting_together_apply_migrations_once(pg_url: str) -> None:
    errors: list[BaseException] = []
    applied: list[int] = []
    barrier = threading.Barrier(4)

    def start() -> None:
        try:
            with psycopg.connect(pg_url, autocommit=True) as conn:
                barrier.wait()
                applied.append(len(apply_migrations(conn)))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sorted(applied) == [0, 0, 0, latest_version()]  # one did the work, three waited
    assert len(versions(pg_url)) == latest_version()


def test_a_newer_schema_is_refused(pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        apply_migrations(conn)
        conn.execute(
            "INSERT INTO schema_migrations (version, name) VALUES (%s, 'future')",
            (latest_version() + 1,),
        )
    with pytest.raises(RuntimeError, match="newer than this version"):
        PostgresStore(pg_url)


def test_a_store_that_may_not_migrate_refuses_an_old_schema(pg_url: str) -> None:
    with pytest.raises(RuntimeError, match="synapse migrate"):
        PostgresStore(pg_url, apply_schema=False)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        assert schema_version(conn) == 0  # nothing was written


def test_synapse_migrate_applies_then_reports_up_to_date(pg_url: str) -> None:
    out, err = io.StringIO(), io.StringIO()
    assert main(["migrate", "--store", pg_url], out=out, err=err) == 0, err.getvalue()
    lines = out.getvalue().splitlines()
    assert lines[0] == "applied 0001 initial"
    assert lines[-1] == f"schema version {latest_version()}"
    out = io.StringIO()
    assert main(["migrate", "--store", pg_url], out=out, err=err) == 0
    assert out.getvalue() == f"schema version {latest_version()} (already up to date)\n"
    out = io.StringIO()
    assert main(["migrate", "--status", "--store", pg_url], out=out, err=err) == 0
    assert out.getvalue().startswith(f"schema version {latest_version()}")


def test_synapse_migrate_refuses_what_it_cannot_migrate(postgres_server: object) -> None:
    err = io.StringIO()
    assert main(["migrate", "--store", "tasks.sqlite"], out=io.StringIO(), err=err) == 2
    assert "not a postgresql:// URL" in err.getvalue()
    err = io.StringIO()
    unreachable = "postgresql://nobody@127.0.0.1:1/none"
    assert main(["migrate", "--store", unreachable], out=io.StringIO(), err=err) == 2
    assert err.getvalue().startswith("synapse: migrate: ")


async def test_two_processes_sharing_a_database_never_reuse_a_seq(pg_url: str) -> None:
    first, second = PostgresStore(pg_url), PostgresStore(pg_url)
    seqs = [store.next_seq() for _ in range(3) for store in (first, second)]
    assert len(set(seqs)) == len(seqs)
    for n, seq in enumerate(seqs):
        (first if n % 2 else second).add_outbox(outbox_item(seq, f"m-{n}"))
    await asyncio.gather(first.commit(), second.commit())
    assert [i.seq for i in first.load().outbox] == sorted(seqs)
    await first.close()
    await second.close()


async def test_what_one_process_commits_the_other_reads_at_once(pg_url: str) -> None:
    writer, reader = PostgresStore(pg_url), PostgresStore(pg_url)
    duo = Duo(writer, MemoryStore())
    key = duo.submit()
    duo.complete(key)
    writer.put_dedup(dedup_entry("m-1", T0 + 600))
    assert reader.get_task(key) is None  # buffered, not committed: invisible
    await writer.commit()
    assert reader.get_task(key) == duo.record("r", key)
    assert reader.get_dedup(("agent-r", "m-1")) == dedup_entry("m-1", T0 + 600)
    await writer.close()
    await reader.close()


async def test_a_failed_commit_applies_nothing_of_its_batch(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    duo = Duo(store, MemoryStore())
    key = duo.submit()
    store.put_dedup(dedup_entry("m-ok", T0 + 600))
    # A row the database refuses (a NUL byte in a TEXT column) in the same batch.
    store.add_outbox(outbox_item(1, "bad\x00id"))
    with pytest.raises(psycopg.Error):
        await store.commit()
    assert store.get_task(key) is None
    assert store.get_dedup(("agent-r", "m-ok")) is None
    assert store.load().outbox == []
    store.add_outbox(outbox_item(2))  # the store stays usable
    await store.commit()
    assert [i.seq for i in store.load().outbox] == [2]
    await store.close()


async def test_purging_from_two_replicas_deletes_each_row_once(pg_url: str) -> None:
    first, second = PostgresStore(pg_url), PostgresStore(pg_url)
    duo = Duo(first, MemoryStore())
    for n in range(40):
        duo.complete(duo.submit(task_id=f"t-{n}"))
    await first.commit()
    cutoff = duo.tick(10)
    removed = [0, 0]

    async def purge(index: int, store: PostgresStore) -> None:
        while (n := await store.purge(finished_before=cutoff, now=cutoff, limit=5)) > 0:
            removed[index] += n

    await asyncio.gather(purge(0, first), purge(1, second))
    assert sum(removed) == 40
    assert first.count_tasks() == 0
    await first.close()
    await second.close()


async def test_after_a_failed_batch_a_commit_with_nothing_new_fails_too(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    store.add_outbox(outbox_item(1, "bad\x00id"))
    first = asyncio.ensure_future(store.commit())
    # Another caller whose writes went into that batch commits with nothing new buffered.
    with pytest.raises(psycopg.Error):
        await store.commit()
    with pytest.raises(psycopg.Error):
        await first
    store.add_outbox(outbox_item(2))
    await store.commit()  # a new batch that succeeds clears it
    await store.commit()
    await store.close()


@pytest.mark.parametrize("mode", ["fast", "immediate"])
async def test_every_connection_comes_back_after_the_server_restarts(mode: str) -> None:
    """`pg_ctl restart` under a running store: lookups of stored tasks and dedup entries (the
    autocommit connection), maintenance, and commits (the pool) all work again by themselves,
    with no restart of the store. (A durable server: `immediate` is a crash, and what a
    server without fsync acknowledged may be gone after one.)"""
    server = start_server(durable=True)
    try:
        url = server.create_database("restarted")
        store, other = PostgresStore(url), PostgresStore(url)
        duo = Duo(store, MemoryStore())
        key = duo.submit()
        duo.complete(key)
        store.put_dedup(dedup_entry("m-1", T0 + 600))
        await store.commit()
        # A lookup before the restart opened the connection the restart then breaks.
        assert other.get_task(key) == duo.record("r", key)

        restart_server(server, mode)

        assert other.get_task(key) == duo.record("r", key)
        assert other.get_dedup(("agent-r", "m-2")) is None
        assert other.read_rows("SELECT count(*) FROM tasks") == [(1,)]
        other.put_dedup(dedup_entry("m-3", T0 + 600))
        for _ in range(3):  # the pool's connections were broken too: a commit gets through
            try:
                await other.commit()
                break
            except StoreUnavailable:
                continue
        assert store.get_dedup(("agent-r", "m-3")) == dedup_entry("m-3", T0 + 600)
        await store.close()
        await other.close()
    finally:
        stop_server(server)


async def test_a_database_out_of_reach_is_store_unavailable_to_every_caller() -> None:
    """Lookups (a stored task, a dedup entry, a replica's lease) and single statements (an
    outbox claim) on a server that went away raise `StoreUnavailable`, which callers wait
    out (a message is answered 503, a handle's follower reads again later), not a driver
    error nobody expects: a follower stopped by one left its handles waiting for good."""
    server = start_server(durable=True)
    try:
        url = server.create_database("away")
        store = PostgresStore(url)
        duo = Duo(store, MemoryStore())
        key = duo.submit()
        await store.commit()
        assert await store.execute("SELECT 1") == [(1,)]  # the pool's connection is open
        assert store.get_task(key) is not None  # and the lookups'
    finally:
        stop_server(server)
    with pytest.raises(StoreUnavailable):
        store.get_task(key)
    with pytest.raises(StoreUnavailable):
        store.get_dedup(("agent-r", "m-1"))
    with pytest.raises(StoreUnavailable):
        store.read_rows("SELECT count(*) FROM tasks")
    with pytest.raises(StoreUnavailable):
        await store.execute("SELECT 1")
    with pytest.raises(StoreUnavailable):
        await store.fetch_dedup(("agent-r", "m-1"))
    await store.close()


@pytest.mark.parametrize("kind", ["lookups", "writes"])
async def test_every_connection_asks_both_ends_to_notice_a_dead_link(
    pg_url: str, kind: str
) -> None:
    """The server probes the store's sessions (it ends one whose client is gone in seconds,
    not after the operating system's two hours), and so does the client; a setting the URL
    gives itself is kept. (The cut itself: tests/cluster/test_cluster_partitions.py.)"""
    own = pg_url + "?keepalives_idle=7&options=-c%20tcp_keepalives_interval%3D4"
    store = PostgresStore(own)
    show = (
        "SELECT current_setting('tcp_keepalives_idle'), "
        "current_setting('tcp_keepalives_interval'), current_setting('tcp_keepalives_count'), "
        "current_setting('tcp_user_timeout')"
    )
    try:
        if kind == "lookups":
            rows = store.read_rows(show)
            client = store._reader.info.get_parameters()
        else:
            rows = await store.execute(show)
            pool = await store._open_pool()
            async with pool.connection() as conn:
                client = conn.info.get_parameters()
        assert rows == [("5", "4", "3", "15000")]  # seconds, seconds, probes, ms
        assert client["keepalives_idle"] == "7"
        assert (client["keepalives_interval"], client["keepalives_count"]) == ("2", "3")
        assert client["tcp_user_timeout"] == "15000"
    finally:
        await store.close()


def test_the_server_side_is_set_only_where_the_url_and_the_server_leave_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the URL's `options` (or PGOPTIONS) sets is the user's, and `tcp_user_timeout`
    is asked only of a server that has it (12 and later); the settings go as a statement
    after connecting, never as `options`, which poolers such as PgBouncer refuse."""
    monkeypatch.delenv("PGOPTIONS", raising=False)
    url = "postgresql://u@db:5432/x"
    assert server_link_checks(url, 150004) == (
        "SELECT set_config('tcp_keepalives_idle', '5', false), "
        "set_config('tcp_keepalives_interval', '2', false), "
        "set_config('tcp_keepalives_count', '3', false), "
        "set_config('tcp_user_timeout', '15000', false)"
    )
    assert "tcp_user_timeout" not in (server_link_checks(url, 110022) or "")
    own = url + "?options=--tcp-keepalives-idle%3D60%20-c%20tcp_keepalives_count%3D9"
    assert server_link_checks(own, 150004) == (
        "SELECT set_config('tcp_keepalives_interval', '2', false), "
        "set_config('tcp_user_timeout', '15000', false)"
    )
    monkeypatch.setenv(
        "PGOPTIONS",
        "-c tcp_keepalives_idle=1 -c tcp_keepalives_interval=1 "
        "-c tcp_keepalives_count=1 -c tcp_user_timeout=1",
    )
    assert server_link_checks(url, 150004) is None
    assert "options" not in client_link_checks(url)
    assert client_link_checks(url + "?keepalives=0") == {
        "keepalives_idle": "5",
        "keepalives_interval": "2",
        "keepalives_count": "3",
        "tcp_user_timeout": "15000",
    }
