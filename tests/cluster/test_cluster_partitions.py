"""Replicas in network namespaces under real partitions, pauses, kills and PostgreSQL
restarts, one replica's clock off (`partitions.py`): a short seeded run, its history
checked on both sides.

Needs root (network namespaces); without it the test is skipped outside CI, and fails
under `CI=true`. Longer runs: `python tests/cluster/partitions.py --seeds 0-9`.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest
from partitions import Network, can_make_namespaces, run_seed
from pgserver import missing

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
