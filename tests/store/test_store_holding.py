"""One process serves a store: a second one (a second `synapse serve` started by mistake, a
service manager restarting a process that had not died) is refused before it reads a task,
told who holds the store; replicas of one agent share a PostgreSQL store, and nothing else
joins them. Tools that read or repair a store work beside the process serving it."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psycopg
import pytest
from diskfaults import set_immutable

from synapse.cli.main import main
from synapse.demo.handler import DemoHandler
from synapse.store import MemoryStore, SqliteStore, StoreInUse, StoreUnavailable
from synapse.store.holding import SERVING_LOCK, take_database_hold
from synapse.store.kit import record_in
from synapse.store.postgres import PostgresStore
from synapse.transport.peer import Peer
from synapse.types import TaskState

SECRET = "holding-test-secret-0123456789abcdef"


async def test_a_second_sqlite_store_on_the_file_is_refused_until_the_first_lets_go(
    tmp_path: Path,
) -> None:
    path = tmp_path / "agent.db"
    first, second = SqliteStore(path), SqliteStore(path)
    first.hold()
    first.hold()  # idempotent
    with pytest.raises(StoreInUse) as refused:
        second.hold()
    assert f"process {os.getpid()} on " in str(refused.value)
    assert str(path) in str(refused.value)
    assert (tmp_path / "agent.db-lock").read_text().startswith(f"process {os.getpid()} ")
    await first.close()
    second.hold()
    await second.close()


async def test_a_lock_file_that_cannot_be_written_still_holds_the_store(tmp_path: Path) -> None:
    """The store's files made immutable (`chattr +i`, as a fault test does to serve a store
    read-only): the lock file is opened for reading, and still keeps a second holder out."""
    path = tmp_path / "agent.db"
    first = SqliteStore(path)
    first.hold()
    await first.close()
    lock = tmp_path / "agent.db-lock"
    set_immutable([lock], True)
    try:
        reader, second = SqliteStore(path), SqliteStore(path)
        reader.hold()
        with pytest.raises(StoreInUse):
            second.hold()
        await reader.close()
        second.hold()
        await second.close()
    finally:
        set_immutable([lock], False)


def test_a_killed_holder_lets_go_of_the_store(tmp_path: Path) -> None:
    """However the serving process ends (SIGKILL here), the system lets go of its lock: the
    next process serves the store, as a restart after a crash must."""
    path = tmp_path / "agent.db"
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from synapse.store import SqliteStore\n"
            "SqliteStore(sys.argv[1]).hold()\n"
            "print('held', flush=True)\n"
            "time.sleep(60)\n",
            str(path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "held\n"
        with pytest.raises(StoreInUse, match=f"process {child.pid} on "):
            SqliteStore(path).hold()
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
    SqliteStore(path).hold()


async def test_a_second_peer_on_the_file_does_not_start_and_the_first_serves_on(
    tmp_path: Path,
) -> None:
    path = tmp_path / "agent.db"
    async with Peer("agent-e", handler=DemoHandler(), store=SqliteStore(path)) as first:
        second = Peer("agent-e", handler=DemoHandler(), store=SqliteStore(path))
        with pytest.raises(StoreInUse):
            await second.start()
        await second.close()
        requester = Peer("agent-r")
        async with requester:
            requester.add_partner("agent-e", first.endpoint, (SECRET,))
            first.add_partner("agent-r", requester.endpoint, (SECRET,))
            handle = await requester.submit("agent-e", "echo", {"text": "still here"})
            assert (await handle.result(timeout=10)).state is TaskState.COMPLETED
    # Closed: the next process serves it, and finds the task.
    async with Peer("agent-e", store=SqliteStore(path)) as again:
        stored = again.store.get_task(handle.key)
        assert stored is not None
        assert stored.state is TaskState.COMPLETED


def test_the_outbox_tool_reads_a_store_a_process_serves(tmp_path: Path) -> None:
    path = tmp_path / "agent.db"
    held = SqliteStore(path)
    held.hold()
    out, err = io.StringIO(), io.StringIO()
    assert main(["outbox", "--store", str(path)], out=out, err=err) == 0, err.getvalue()


def test_a_memory_store_holds_nothing() -> None:
    store = MemoryStore()
    store.hold()
    store.hold()


# --- PostgreSQL ------------------------------------------------------------------------------


class _Replica:
    """What makes a store a replica's for `hold` (`Ownership` sets the store's fence)."""

    replica_id = "r1"


def replica_store(url: str) -> PostgresStore:
    store = alone_store(url)
    store.fence = _Replica()  # type: ignore[assignment]
    return store


def alone_store(url: str) -> PostgresStore:
    """A store whose hold gives up at once (3 s by default: a process that has just died
    may keep the lock a moment)."""
    store = PostgresStore(url)
    store.patience = 0.0
    return store


async def test_postgresql_replicas_share_the_store_and_nothing_else_joins_them(
    pg_url: str,
) -> None:
    one, two = replica_store(pg_url), replica_store(pg_url)
    one.hold()
    two.hold()  # replicas of one agent
    alone = alone_store(pg_url)
    with pytest.raises(StoreInUse, match="only the replicas of one agent"):
        alone.hold()
    await one.close()
    with pytest.raises(StoreInUse):
        alone.hold()  # one replica still serves it
    await two.close()
    alone.hold()
    late_replica = replica_store(pg_url)
    with pytest.raises(StoreInUse, match="not a replica"):
        late_replica.hold()
    second = alone_store(pg_url)
    with pytest.raises(StoreInUse, match="served by another process"):
        second.hold()
    for store in (alone, late_replica, second):
        await store.close()


async def test_the_postgresql_hold_is_taken_again_when_its_connection_comes_back(
    pg_url: str,
) -> None:
    """The hold is the session's: a lost connection (a restart of the server, a cut) loses
    it, and the store takes it again as the connection comes back by itself."""
    store = PostgresStore(pg_url)
    store.hold()
    with psycopg.connect(pg_url, autocommit=True) as admin:
        (pid,) = admin.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objid = %s",
            (SERVING_LOCK & 0xFFFFFFFF,),
        ).fetchone() or (None,)
        assert pid is not None
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        # A lookup: the connection comes back, and the hold with it.
        assert store.read_rows("SELECT count(*) FROM tasks") == [(0,)]
        (holders,) = admin.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = %s AND granted",
            (SERVING_LOCK & 0xFFFFFFFF,),
        ).fetchone() or (0,)
        assert holders == 1
    with pytest.raises(StoreInUse):
        alone_store(pg_url).hold()
    await store.close()


async def test_the_postgresql_hold_is_taken_on_a_new_connection_if_the_first_was_lost(
    pg_url: str,
) -> None:
    store = alone_store(pg_url)
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    store.hold()  # its lookups' connection, opened with the store, was lost meanwhile
    with pytest.raises(StoreInUse):
        alone_store(pg_url).hold()
    await store.close()


async def test_a_store_whose_hold_another_process_took_writes_nothing_until_it_is_back(
    pg_url: str,
) -> None:
    """A restart of the server ends every session of the holder, its hold with them; a
    process starting then takes the hold. The first must not serve the store beside it: its
    commits fail as if the database were away, writing nothing, until the other lets go."""
    first, second = PostgresStore(pg_url), None
    try:
        first.hold()
        first.put_task(record_in(0, None, {"text": "before"}), [])
        await first.commit()  # its pool has connections now
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            second = alone_store(pg_url)  # a process starting now
            second.hold()  # the first's session is gone, and its hold with it
            first.put_task(record_in(1, None, {"text": "beside"}), [])
            # The first meets its lost connections, then the other's hold; as the runtime
            # does, it tries again (`_commit_patiently`).
            assert "served by another process" in await failures_until(first, "another")

            def stored() -> list[str]:
                rows = admin.execute("SELECT task_id FROM tasks ORDER BY task_id").fetchall()
                return [task_id for (task_id,) in rows]

            assert stored() == ["c-0"]  # nothing written beside the other process
            with pytest.raises(StoreUnavailable, match="served by another process"):
                await first.probe_write()  # /readyz: not ready
            await second.close()  # it lets go: the first writes again, what it kept included
            await failures_until(first, None)
            await first.probe_write()
            assert stored() == ["c-0", "c-1"]
        with pytest.raises(StoreInUse):
            alone_store(pg_url).hold()  # the first holds the store again
    finally:
        if second is not None:
            await second.close()
        await first.close()


async def test_a_store_whose_holding_session_alone_ended_writes_nothing_beside_another(
    pg_url: str,
) -> None:
    """The session holding the store (its lookups' connection) ended alone, its pool's
    connections alive (an administrator's `pg_terminate_backend`, a proxy closing one idle
    connection), and another process took the store meanwhile: the first's next write must
    not commit through its pool as if nothing happened. It fails as if the database were
    away, and the next ones find the other process's hold."""
    first, second = PostgresStore(pg_url), None
    try:
        first.hold()
        first.put_task(record_in(0, None, {"text": "before"}), [])
        await first.commit()  # its pool has a connection now
        holder = first._reader.info.backend_pid
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (holder,))
            second = alone_store(pg_url)
            second.hold()  # the first's hold ended with its session
            first.put_task(record_in(1, None, {"text": "beside"}), [])
            with pytest.raises(StoreUnavailable, match="session holding the store"):
                await first.commit()
            assert "served by another process" in await failures_until(first, "another")
            rows = admin.execute("SELECT task_id FROM tasks ORDER BY task_id").fetchall()
            assert [task_id for (task_id,) in rows] == ["c-0"]
            await second.close()
            await failures_until(first, None)  # the first holds the store again, and writes
            rows = admin.execute("SELECT task_id FROM tasks ORDER BY task_id").fetchall()
            assert [task_id for (task_id,) in rows] == ["c-0", "c-1"]
    finally:
        if second is not None:
            await second.close()
        await first.close()


async def failures_until(store: PostgresStore, words: str | None) -> str:
    """Commit until the commit fails saying `words` (None: until it succeeds), at most five
    times; the last failure's message."""
    last = ""
    for _ in range(5):
        try:
            await store.commit()
        except StoreUnavailable as exc:
            last = str(exc)
            if words is not None and words in last:
                return last
            continue
        if words is None:
            return last
        raise AssertionError(f"committed while another process held the store ({last!r})")
    raise AssertionError(f"still failing: {last!r}")


def test_synapse_mcp_on_a_store_another_process_serves_exits_2(tmp_path: Path) -> None:
    """Two MCP clients that each start `synapse mcp` on one store: the second says who
    holds it and exits, before it reads a line of MCP."""
    path = tmp_path / "assistant.db"
    held = SqliteStore(path)
    held.hold()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "synapse.cli.main",
            "mcp",
            "--as",
            "assistant",
            "--store",
            str(path),
            "--peer",
            "partner=http://127.0.0.1:9/synapse/callback",
            "--secret",
            SECRET,
            "--listen",
            "127.0.0.1:0",
        ],
        input="",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert f"served by another process (process {os.getpid()} on " in done.stderr
    assert "Traceback" not in done.stderr


async def test_the_postgresql_hold_waits_a_moment_for_a_process_that_just_died(
    pg_url: str,
) -> None:
    """A process that dies lets go of the lock only once the server notices its connection
    closed; the next process's `hold` waits for that (up to `patience`), instead of being
    refused by the dead one."""
    dying = psycopg.connect(pg_url, autocommit=True)
    take_database_hold(dying, shared=False)
    timer = threading.Timer(0.5, dying.close)  # the dead process's connection, closed
    timer.start()
    try:
        store = PostgresStore(pg_url)
        store.hold()  # waits for the lock, then has it
        with pytest.raises(StoreInUse):
            alone_store(pg_url).hold()
        await store.close()
        last = alone_store(pg_url)
        last.hold()  # given back at close, at once
        await last.close()
    finally:
        timer.join()
