"""A real PostgreSQL server for the tests, started once per session on 127.0.0.1.

`postgres_server` runs Debian's `initdb` and `pg_ctl` (as the `postgres` user when the tests
run as root: the server refuses to run as root) into a temporary directory, on a free port,
and stops it by its PID at the end. `pg_url` gives each test a database of its own. Without
the server binaries the tests that need one are skipped, naming the package to install;
under `CI=true` they fail instead, so CI never passes by skipping them.
"""

from __future__ import annotations

import itertools
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from benchmarks.ports import free_port as free_port  # re-exported

INITDB_OPTIONS = ("-E", "UTF8", "--locale=C", "--no-sync")
INSTALL_HINT = "PostgreSQL server binaries not found: apt-get install postgresql"


def find_binary(name: str) -> str | None:
    """`name` from Debian's versioned directory (newest first), else from PATH."""
    candidates = sorted(
        Path("/usr/lib/postgresql").glob(f"*/bin/{name}"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
        reverse=True,
    )
    for path in candidates:
        if os.access(path, os.X_OK):
            return str(path)
    return shutil.which(name)


def missing(reason: str) -> None:
    """Skip outside CI; fail under CI=true (a CI run must not pass by skipping)."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(reason)
    pytest.skip(reason)


@dataclass
class PgServer:
    root: Path
    port: int
    pid: int
    user: str

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"'.encode())
        return self.url(name)


def _as_postgres(argv: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


def start_server(
    *, durable: bool = False, statements: bool = False, trusted: tuple[str, ...] = ()
) -> PgServer:
    """A throw-away server on 127.0.0.1. `durable`: PostgreSQL's own defaults (fsync and
    synchronous_commit on), for benchmarks; `statements`: pg_stat_statements loaded;
    `trusted`: networks (`10.0.0.0/8`) it also listens to and trusts, for the partition
    tests' namespaces."""
    initdb, pg_ctl = find_binary("initdb"), find_binary("pg_ctl")
    if initdb is None or pg_ctl is None:
        missing(INSTALL_HINT)
    assert initdb is not None and pg_ctl is not None
    root = Path(tempfile.mkdtemp(prefix="synapse-pg-"))
    user = "postgres" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
    if os.geteuid() == 0:
        entry = pwd.getpwnam("postgres")
        os.chown(root, entry.pw_uid, entry.pw_gid)
    data = root / "data"
    subprocess.run(
        _as_postgres([initdb, "-D", str(data), "-A", "trust", "-U", user, *INITDB_OPTIONS]),
        check=True,
        capture_output=True,
    )
    if trusted:
        with (data / "pg_hba.conf").open("a") as hba:
            hba.writelines(f"host all all {network} trust\n" for network in trusted)
    port = free_port()
    # Durability of the server itself is not under test (no test stops PostgreSQL uncleanly):
    # fsync off keeps the tests fast on a loaded machine.
    listen = "*" if trusted else "127.0.0.1"
    options = f"-c listen_addresses={listen} -p {port} -k {root} -c max_connections=300"
    if not durable:
        options += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
    if statements:
        options += " -c shared_preload_libraries=pg_stat_statements"
    start = [pg_ctl, "start", "-D", str(data), "-w", "-t", "60", "-l", str(root / "log")]
    subprocess.run(
        _as_postgres([*start, "-o", options]),
        check=True,
        capture_output=True,
    )
    pid = int((data / "postmaster.pid").read_text().split("\n", 1)[0])
    return PgServer(root, port, pid, user)


def restart_server(server: PgServer, mode: str = "fast") -> None:
    """`pg_ctl restart -m MODE` (fast: sessions ended cleanly; immediate: as after a crash),
    waiting until it accepts connections again; `server.pid` is the new postmaster's."""
    pg_ctl = find_binary("pg_ctl")
    assert pg_ctl is not None
    data = server.root / "data"
    restart = [pg_ctl, "restart", "-D", str(data), "-m", mode, "-w", "-t", "60"]
    subprocess.run(
        _as_postgres([*restart, "-l", str(server.root / "log")]),
        check=True,
        capture_output=True,
    )
    server.pid = int((data / "postmaster.pid").read_text().split("\n", 1)[0])


def stop_server(server: PgServer) -> None:
    """Fast shutdown by the postmaster's PID; SIGKILL if it lingers."""
    try:
        os.kill(server.pid, signal.SIGINT)
    except ProcessLookupError:
        pass
    else:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                os.kill(server.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)  # polling the PID's exit: no event to wait on across processes
        else:
            os.kill(server.pid, signal.SIGKILL)
    shutil.rmtree(server.root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PgServer]:
    try:
        import psycopg  # noqa: F401
    except ImportError:
        missing("psycopg is not installed: pip install -e '.[dev]'")
    server = start_server()
    try:
        yield server
    finally:
        stop_server(server)


_database_numbers = itertools.count(1)


@pytest.fixture
def pg_url(postgres_server: PgServer) -> str:
    """A new, empty database for one test."""
    return postgres_server.create_database(f"t{os.getpid()}_{next(_database_numbers)}")
