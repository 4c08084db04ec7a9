"""Replicas in network namespaces under real partitions, pauses, kills and PostgreSQL
restarts, one replica's clock off (`partitions.py`): a short seeded run, its history
checked on both sides; and what a cut does to the store's database sessions.

Needs root (network namespaces); without it the test is skipped outside CI, and fails
under `CI=true`. Longer runs: `python tests/cluster/partitions.py --seeds 0-9`.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time

import pytest
from partitions import Network, can_make_namespaces, run_seed
from pgserver import PgServer, missing, start_server, stop_server

from synapse.store import StoreInUse
from synapse.store.postgres import PostgresStore

pytestmark = pytest.mark.slow

#: Bounded for CI: a few hundred tasks under about twenty seconds of faults per seed.
TASKS = int(os.environ.get("SYNAPSE_PARTITION_TASKS", "300"))
SECONDS = float(os.environ.get("SYNAPSE_PARTITION_SECONDS", "20"))


# Seeds 12 and 22 between them cut every link, pause, kill, and restart PostgreSQL both ways,
# and seed 22 cuts the replicas from each other alone (2.3 s, past the lease's TTL); seed 12
# runs e2's clock 0.95 s ahead (past the third of a TTL between renewals), seed 22 e1's
# 0.79 s behind.
@pytest.mark.parametrize("seed", [12, 22])
async def test_partitions_pauses_kills_and_database_restarts_lose_and_double_nothing(
    seed: int,
) -> None:
    outcome = await run_seed(seed, tasks=TASKS, seconds=SECONDS)
    print(
        f"partitions, seed {seed}: {outcome.run.tasks} tasks in {outcome.run.elapsed:.0f} s "
        f"under {len(outcome.faults)} faults ({'; '.join(map(str, outcome.faults))}), "
        f"{outcome.skew}, {outcome.forwards_failed} forwards failed: "
        f"{len(outcome.found)} anomalies; {dict(outcome.run.states())}"
    )
    assert outcome.found == []
    # The faults touched the run: not every task completed untouched by them.
    assert len(outcome.faults) >= 3


def _connects(network: Network, index: int, address: str, port: int) -> bool:
    """Whether a TCP connection from replica `index`'s namespace to `address` is made."""
    probe = f"import socket; socket.create_connection(({address!r}, {port}), timeout=1.5)"
    ran = subprocess.run(
        ["ip", "netns", "exec", network.namespace(index), sys.executable, "-c", probe],
        capture_output=True,
        timeout=30,
    )
    return ran.returncode == 0


def test_cutting_the_replicas_from_each_other_leaves_their_other_links() -> None:
    """The fault the schedule calls "cut the replicas from each other" does that and no more:
    a replica no longer reaches another (nothing answers: the connection times out), still
    reaches this namespace (nginx, the database, the requester), and reaches the other again
    once it is healed."""
    why_not = can_make_namespaces()
    if why_not is not None:
        missing(why_not)
    network = Network(2)
    listeners: list[subprocess.Popen[bytes]] = []
    try:
        network.make()
        other = network.replica_address(1, "balancer")
        here = network.host_address("balancer")
        serve = "import socket, time; s = socket.socket(); s.bind(({!r}, {})); s.listen(); "
        serve += "time.sleep(60)"
        inside = ["ip", "netns", "exec", network.namespace(1), sys.executable, "-c"]
        listeners.append(subprocess.Popen([*inside, serve.format(other, 9911)]))
        host_listener = socket.create_server((here, 0))
        host_port = host_listener.getsockname()[1]

        def reaches_other() -> bool:
            deadline = time.monotonic() + 10
            while not _connects(network, 0, other, 9911):  # the listener may still start
                if time.monotonic() > deadline:
                    return False
            return True

        assert reaches_other()
        network.isolate_replicas()
        assert not _connects(network, 0, other, 9911)
        assert _connects(network, 0, here, host_port)
        network.heal_all()
        assert reaches_other()  # the neighbour cache may refuse for a moment first
        host_listener.close()
    finally:
        for listener in listeners:
            listener.kill()
            listener.wait()
        network.close()


#: What the process in the namespace runs: the store, its exclusive hold on the database (a
#: session's advisory lock, on the lookups' connection), then nothing: the test cuts it off.
HOLDER = """
import sys, time
from synapse.store.postgres import PostgresStore
store = PostgresStore(sys.argv[1])
store.hold()
print("held", flush=True)
time.sleep(300)
"""


def test_a_session_behind_a_dead_link_is_ended_and_its_hold_let_go() -> None:
    """A process holding the database is cut from it for good (its link down: nothing is
    refused, packets go nowhere). The server notices within seconds that the session's
    client is gone and ends it, so the hold, and any lock the session had, is free for the
    process that replaces it. With the operating system's defaults the server keeps such a
    session about two hours, and its replacement is refused all that time."""
    why_not = can_make_namespaces()
    if why_not is not None:
        missing(why_not)
    network = Network(1)
    server: PgServer | None = None
    holder: subprocess.Popen[bytes] | None = None
    replacement: PostgresStore | None = None
    try:
        network.make()
        server = start_server(trusted=(network.subnet("database"),))
        inside = f"{server.user}@{network.host_address('database')}:{server.port}"
        url = f"postgresql://{inside}/postgres"
        in_namespace = ["ip", "netns", "exec", network.namespace(0), sys.executable]
        holder = subprocess.Popen([*in_namespace, "-c", HOLDER, url], stdout=subprocess.PIPE)
        assert holder.stdout is not None
        assert holder.stdout.readline() == b"held\n"
        replacement = PostgresStore(server.url())
        with pytest.raises(StoreInUse):
            replacement.hold()  # waits its patience (3 s), then is refused
        network.partition(0, "database")
        cut_at = time.monotonic()
        while True:
            try:
                replacement.hold()
                break
            except StoreInUse:
                assert time.monotonic() - cut_at < 60, "the dead link's session is still held"
        print(f"a session behind a dead link ended in {time.monotonic() - cut_at:.1f} s")
    finally:
        if replacement is not None:
            asyncio.run(replacement.close())
        if holder is not None:
            holder.kill()
            holder.wait()
        network.close()
        if server is not None:
            stop_server(server)
