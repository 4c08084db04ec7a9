"""Real faults on real processes: replicas in network namespaces, partitioned for real.

Each replica of agent-e (`synapse serve` on PostgreSQL) runs in a network namespace of its
own, joined to this one by three veth pairs, each on a bridge of its own:

- `balancer`: nginx (here) reaches the replica on it, and so do the other replicas (a
  message for a task another replica holds is forwarded to it);
- `database`: the replica reaches PostgreSQL (here) on it;
- `partner`: the replica reaches the requester (here) on it, for its callbacks.

A fault cuts one of them (the bridge's port set down: packets are dropped, nothing is
refused, as in a real partition), cuts the replicas from each other alone (their ports on
the balancer's bridge isolated: each still reaches nginx, the database and the requester,
but a message forwarded to the replica that holds its task goes nowhere), pauses a replica
past the lease's TTL (SIGSTOP, SIGCONT), kills and restarts one, or restarts PostgreSQL
(`-m fast` or `-m immediate`) while stored tasks are looked up (answers, cancels). The
schedule is drawn from a seed: which faults, on which replica, for how long. One replica's
clock is also off for the whole run (through libfaketime, seeded apart from the schedule):
ahead or behind by a fraction of the lease's TTL, it judges the others' leases by its own
time, and writes its own by it. Meanwhile the requester runs the mixed workload of
`workload.py`; once the faults stop and everything is healed, its history checker reads
both sides.

Short runs are in CI (`test_cluster_partitions.py`); long ones by hand, as root:

    python tests/cluster/partitions.py --seeds 0-9 --tasks 1000 --seconds 60

which prints, for each seed, the faults injected and the anomalies found, and at the end
the anomalies per 1,000 tasks. Creating namespaces needs root (CAP_NET_ADMIN) and
iproute2's `ip`; every namespace, bridge and process made here is removed by the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parent.parent)]

from clusterkit import Cluster, Replica, Requester, replica_config  # noqa: E402
from lbserver import Nginx  # noqa: E402
from pgserver import PgServer, missing, restart_server, start_server, stop_server  # noqa: E402
from workload import Run, anomalies, executor_settled, run_mixed  # noqa: E402

#: The three links of a replica, by the bridge's letter.
LINKS = {"balancer": "a", "database": "b", "partner": "c"}
#: The first two octets of each link's network (the third is the run's own).
NETWORKS = {"balancer": "10.213", "database": "10.214", "partner": "10.215"}
INSTALL_HINT = (
    "network namespaces need root (CAP_NET_ADMIN) and iproute2's ip: run as root, "
    "apt-get install iproute2"
)
#: Where Debian's libfaketime keeps the library a replica's clock is set off with.
FAKETIME_LIBRARY = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")


#: Numbers the networks made in one process, whose names must differ: the kernel removes a
#: deleted namespace's veth pairs in the background, so a second network named like the
#: first could meet the first one's ports still there ("File exists").
_networks_made = itertools.count()


class IpFailed(subprocess.CalledProcessError):
    """`ip` refused; its own words are in the message, which CalledProcessError leaves out."""

    def __str__(self) -> str:
        said = (self.stderr or b"").decode(errors="replace").strip()
        return f"{super().__str__()} ip said: {said or '(nothing)'}"


def ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, timeout=30, check=False)
    if done.returncode != 0:
        raise IpFailed(done.returncode, done.args, done.stdout, done.stderr)


def _network_tag() -> str:
    return f"{os.getpid() % 10000}{next(_networks_made) % 100:02d}"


def can_make_namespaces() -> str | None:
    """None if namespaces can be made here, else why not."""
    if shutil.which("ip") is None or os.geteuid() != 0:
        return INSTALL_HINT
    name = f"synprobe{os.getpid()}"
    try:
        ip("netns", "add", name)
    except (subprocess.CalledProcessError, OSError) as exc:
        return f"{INSTALL_HINT} ({exc})"
    ip("netns", "del", name)
    return None


@dataclass
class Network:
    """The namespaces and bridges of one run; `close()` removes them all."""

    replicas: int
    tag: str = field(default_factory=_network_tag)
    made_bridges: list[str] = field(default_factory=list)
    made_namespaces: list[str] = field(default_factory=list)
    cut: set[tuple[int, str]] = field(default_factory=set)

    @property
    def octet(self) -> int:
        return int(self.tag) % 250 + 1

    def host_address(self, link: str) -> str:
        """This namespace's address on `link`'s bridge."""
        return f"{NETWORKS[link]}.{self.octet}.1"

    def replica_address(self, index: int, link: str) -> str:
        return f"{NETWORKS[link]}.{self.octet}.{10 + index}"

    def subnet(self, link: str) -> str:
        """`link`'s network, as a server trusts it (pg_hba.conf)."""
        return f"{NETWORKS[link]}.{self.octet}.0/24"

    def namespace(self, index: int) -> str:
        return f"syn{self.tag}-{index}"

    def port_of(self, index: int, link: str) -> str:
        """The bridge port (host side of the veth pair) of replica `index` on `link`."""
        return f"sy{self.tag}{LINKS[link]}{index}"

    def make(self) -> None:
        for link, letter in LINKS.items():
            bridge = f"syb{self.tag}{letter}"
            ip("link", "add", bridge, "type", "bridge")
            self.made_bridges.append(bridge)
            ip("addr", "add", f"{self.host_address(link)}/24", "dev", bridge)
            ip("link", "set", "dev", bridge, "up")
        for index in range(self.replicas):
            ns = self.namespace(index)
            ip("netns", "add", ns)
            self.made_namespaces.append(ns)
            ip("-n", ns, "link", "set", "dev", "lo", "up")
            for link, letter in LINKS.items():
                port = self.port_of(index, link)
                inside = f"veth-{link}"
                ip("link", "add", port, "type", "veth", "peer", "name", inside, "netns", ns)
                ip("link", "set", "dev", port, "master", f"syb{self.tag}{letter}")
                ip("link", "set", "dev", port, "up")
                address = f"{self.replica_address(index, link)}/24"
                ip("-n", ns, "addr", "add", address, "dev", inside)
                ip("-n", ns, "link", "set", "dev", inside, "up")

    def partition(self, index: int, link: str) -> None:
        ip("link", "set", "dev", self.port_of(index, link), "down")
        self.cut.add((index, link))

    def heal(self, index: int, link: str) -> None:
        ip("link", "set", "dev", self.port_of(index, link), "up")
        self.cut.discard((index, link))

    def isolate_replicas(self) -> None:
        """Cut the replicas from each other, and from nothing else: their ports on the
        balancer's bridge isolated, which forwards no frame between two isolated ports
        (nginx, on the bridge itself, still reaches every one)."""
        for index in range(self.replicas):
            self._isolated(index, "on")
        self.cut.add((-1, "replicas"))

    def rejoin_replicas(self) -> None:
        for index in range(self.replicas):
            self._isolated(index, "off")
        self.cut.discard((-1, "replicas"))

    def _isolated(self, index: int, state: str) -> None:
        port = self.port_of(index, "balancer")
        ip("link", "set", "dev", port, "type", "bridge_slave", "isolated", state)

    def heal_all(self) -> None:
        for index, link in list(self.cut):
            if link == "replicas":
                self.rejoin_replicas()
            else:
                self.heal(index, link)

    def close(self) -> None:
        for index in range(len(self.made_namespaces)):
            for link in LINKS:
                # Deleting one end removes the pair at once; a deleted namespace's pairs
                # would go only when the kernel gets round to it.
                with contextlib.suppress(subprocess.CalledProcessError):
                    ip("link", "del", self.port_of(index, link))
        for ns in self.made_namespaces:
            with contextlib.suppress(subprocess.CalledProcessError):
                ip("netns", "del", ns)
        for bridge in self.made_bridges:
            with contextlib.suppress(subprocess.CalledProcessError):
                ip("link", "del", bridge)
        self.made_namespaces.clear()
        self.made_bridges.clear()


# --- the faults ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    kind: str  # partition, isolate, pause, kill, db-restart
    replica: int = 0
    link: str = ""
    seconds: float = 0.0
    mode: str = ""

    def __str__(self) -> str:
        if self.kind == "partition":
            return f"cut e{self.replica + 1}'s {self.link} link {self.seconds:.1f} s"
        if self.kind == "isolate":
            return f"cut the replicas from each other {self.seconds:.1f} s"
        if self.kind == "pause":
            return f"pause e{self.replica + 1} {self.seconds:.1f} s"
        if self.kind == "kill":
            return f"kill e{self.replica + 1}, restart after {self.seconds:.1f} s"
        return f"restart PostgreSQL -m {self.mode}"


def schedule(seed: int, seconds: float, replicas: int, lease_ttl: float) -> list[Fault]:
    """The faults of a run, one after the other for about `seconds`; each seed favours some
    kinds and leaves others out (swarm testing), so that kinds also meet in numbers."""
    rng = random.Random(seed)
    kinds = ["partition", "partition", "pause", "kill", "db-restart"]
    chosen = [k for k in kinds if rng.random() < 0.7] or [rng.choice(kinds)]
    faults: list[Fault] = []
    total = 0.0
    while total < seconds:
        kind = rng.choice(chosen)
        replica = rng.randrange(replicas)
        if kind == "partition":
            # Shorter than the lease, and longer: a takeover happens behind the cut replica.
            length = rng.uniform(0.3, 3.0) * lease_ttl
            faults.append(Fault(kind, replica, rng.choice(list(LINKS)), length))
        elif kind == "pause":
            length = rng.uniform(1.2, 3.0) * lease_ttl
            faults.append(Fault(kind, replica, seconds=length))
        elif kind == "kill":
            length = rng.uniform(0.0, 2.0) * lease_ttl
            faults.append(Fault(kind, replica, seconds=length))
        else:
            length = 2.0
            faults.append(Fault(kind, mode=rng.choice(["fast", "immediate"])))
        total += length + 1.0
    # The replicas cut from each other alone: drawn from a stream of its own, so that the
    # other faults of a seed stay as they were before this kind existed.
    # From 1 to 6 TTLs (2 to 12 s in CI): past nginx's read timeout (3 s) and the
    # replicas' request timeout (8 s), a forwarded message's wait ends before the cut does.
    apart = random.Random(seed ^ 0x150)
    if apart.random() < 0.7:
        length = apart.uniform(1.0, 6.0) * lease_ttl
        faults.insert(apart.randrange(len(faults) + 1), Fault("isolate", seconds=length))
    return faults


@dataclass(frozen=True)
class Skew:
    """One replica's clock, off by `seconds` (ahead if positive) for the whole run."""

    replica: int
    seconds: float

    def __str__(self) -> str:
        return f"e{self.replica + 1}'s clock {self.seconds:+.2f} s"

    def env(self) -> dict[str, str]:
        """What sets the replica's wall clock off (its monotonic clock, which timers and
        time-outs use, stays true)."""
        return {
            "LD_PRELOAD": str(FAKETIME_LIBRARY),
            "FAKETIME": f"{self.seconds:+.3f}",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        }


def faketime_installed() -> bool:
    return FAKETIME_LIBRARY.exists()


def clock_skew(seed: int, replicas: int, lease_ttl: float) -> Skew:
    """The seed's clock offset (its own stream: the schedule of a seed stays as it was):
    between a fifth and three fifths of the TTL, either way. Ahead by more than the third
    of a TTL between renewals, a replica finds leases run out that their holders are
    renewing, and takes tasks over from live replicas (fencing keeps their writes apart)."""
    rng = random.Random(seed ^ 0xC11E)
    return Skew(rng.randrange(replicas), rng.choice((-1, 1)) * rng.uniform(0.2, 0.6) * lease_ttl)


async def inject(
    faults: list[Fault], network: Network, cluster: Cluster, server: PgServer, seed: int
) -> None:
    """Apply `faults` in order, each healed before the next (a second apart)."""
    rng = random.Random(seed ^ 0x5EED)
    for fault in faults:
        replica = cluster.replicas[fault.replica]
        if fault.kind == "partition":
            network.partition(fault.replica, fault.link)
            await asyncio.sleep(fault.seconds)  # the fault's own length
            network.heal(fault.replica, fault.link)
        elif fault.kind == "isolate":
            network.isolate_replicas()
            await asyncio.sleep(fault.seconds)
            network.rejoin_replicas()
        elif fault.kind == "pause":
            replica.signal(signal.SIGSTOP)
            await asyncio.sleep(fault.seconds)
            replica.signal(signal.SIGCONT)
        elif fault.kind == "kill":
            await replica.kill()
            await asyncio.sleep(fault.seconds)
            await replica.start()
        else:
            await asyncio.to_thread(restart_server, server, fault.mode)
        await asyncio.sleep(rng.uniform(0.5, 1.5))  # traffic between faults


# --- one run ------------------------------------------------------------------------------


@dataclass
class Outcome:
    seed: int
    faults: list[Fault]
    skew: Skew
    run: Run
    found: list[str]
    #: Messages and pages a replica could not pass on to the replica holding their task (its
    #: `forward_failed` log lines): what cutting the replicas apart did to the run.
    forwards_failed: int = 0


def forwards_failed(workdir: Path) -> int:
    """The `forward_failed` lines in the replicas' logs under `workdir`."""
    return sum(
        log.read_text(errors="replace").count('"forward_failed"') for log in workdir.glob("e*.log")
    )


@contextlib.asynccontextmanager
async def partitioned_cluster(
    workdir: Path,
    *,
    replicas: int = 3,
    lease_ttl: float = 2.0,
    durable: bool = True,
    skew: Skew | None = None,
) -> AsyncIterator[tuple[Network, Cluster, PgServer, Path]]:
    """PostgreSQL, nginx and the requester here; `replicas` replicas in namespaces of their
    own, one of them with its clock off by `skew`. Everything is stopped and removed at the
    end."""
    why_not = can_make_namespaces()
    if why_not is not None:
        missing(why_not)
    if skew is not None and not faketime_installed():
        missing("a replica's clock is set off with libfaketime: apt-get install libfaketime")
    network = Network(replicas)
    server: PgServer | None = None
    nginx: Nginx | None = None
    requester: Requester | None = None
    made: list[Replica] = []
    try:
        network.make()
        # PostgreSQL's own durability (fsync, synchronous_commit): an immediate restart is a
        # crash, and with synchronous_commit off it loses commits it acknowledged (seed 22
        # finds tasks a requester saw completed gone from the executor's store).
        server = start_server(durable=durable, trusted=(network.subnet("database"),))
        store = server.create_database("partitions")
        config = replica_config(workdir / "replica.toml", lease_ttl, "heartbeat_interval = 1\n")
        executions = workdir / "executions"
        for index in range(replicas):
            database = network.host_address("database")
            made.append(
                Replica(
                    f"e{index + 1}",
                    store.replace("127.0.0.1", database),
                    "",
                    "",
                    config,
                    workdir,
                    handler="counting:CountingDemo",
                    host=network.replica_address(index, "balancer"),
                    netns=network.namespace(index),
                    env={
                        "SYNAPSE_TEST_EXECUTIONS": str(executions),
                        **(skew.env() if skew is not None and skew.replica == index else {}),
                    },
                )
            )
        nginx = Nginx([r.hostport for r in made], read_timeout=3.0)
        requester = Requester(
            f"{nginx.url}/synapse/callback",
            host=network.host_address("partner"),
            advertised=network.host_address("partner"),
        )
        nginx.start()
        for replica in made:
            replica.endpoint = f"{nginx.url}/synapse/callback"
            replica.requester_url = requester.url
        await requester.start()
        for replica in made:
            await replica.start()
        yield network, Cluster(made, nginx, requester, store), server, executions
    finally:
        for replica in made:
            await replica.close()
        if requester is not None:
            await requester.close()
        if nginx is not None:
            nginx.stop()
        if server is not None:
            stop_server(server)
        network.close()


async def run_seed(
    seed: int,
    *,
    tasks: int,
    seconds: float,
    replicas: int = 3,
    lease_ttl: float = 2.0,
    durable: bool = True,
) -> Outcome:
    """One seeded run: the workload under the seed's faults, then the history checked."""
    skew = clock_skew(seed, replicas, lease_ttl)
    with tempfile.TemporaryDirectory(prefix="synapse-partitions-") as tmp:
        async with partitioned_cluster(
            Path(tmp), replicas=replicas, lease_ttl=lease_ttl, durable=durable, skew=skew
        ) as (
            network,
            cluster,
            server,
            executions,
        ):
            faults = schedule(seed, seconds, replicas, lease_ttl)

            async def chaos() -> None:
                try:
                    await inject(faults, network, cluster, server, seed)
                finally:
                    network.heal_all()
                    for replica in cluster.replicas:
                        if replica.proc is not None and replica.proc.returncode is None:
                            replica.signal(signal.SIGCONT)

            # Tasks keep coming while the faults last (they start once a quarter are done).
            run = await run_mixed(
                cluster, tasks, chaos, timeout=seconds + 240, spread=seconds * 1.3
            )
            await executor_settled(cluster, timeout=60)
            found = anomalies(cluster, run, executions)
            return Outcome(seed, faults, skew, run, found, forwards_failed(Path(tmp)))


# --- by hand ------------------------------------------------------------------------------


def seeds_of(text: str) -> Iterator[int]:
    first, _, last = text.partition("-")
    yield from range(int(first), int(last or first) + 1)


async def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0-4", help="FIRST-LAST (default 0-4)")
    parser.add_argument("--tasks", type=int, default=1000, help="tasks per seed")
    parser.add_argument("--seconds", type=float, default=60.0, help="of faults per seed")
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument(
        "--not-durable",
        action="store_true",
        help="PostgreSQL with fsync and synchronous_commit off: shows what the checker finds "
        "when acknowledged commits are lost (an immediate restart is a crash)",
    )
    args = parser.parse_args(argv)
    total_tasks = total_found = total_forwards_failed = 0
    kinds: dict[str, int] = {}
    started = time.monotonic()
    for seed in seeds_of(args.seeds):
        outcome = await run_seed(
            seed,
            tasks=args.tasks,
            seconds=args.seconds,
            replicas=args.replicas,
            durable=not args.not_durable,
        )
        total_tasks += outcome.run.tasks
        total_found += len(outcome.found)
        total_forwards_failed += outcome.forwards_failed
        for fault in outcome.faults:
            name = fault.kind + (f" ({fault.link})" if fault.link else "")
            name += f" ({fault.mode})" if fault.mode else ""
            kinds[name] = kinds.get(name, 0) + 1
        print(
            f"seed {seed}: {outcome.run.tasks} tasks in {outcome.run.elapsed:.0f} s, "
            f"{len(outcome.faults)} faults ({'; '.join(map(str, outcome.faults))}), "
            f"{outcome.skew}, {outcome.forwards_failed} forwards failed, "
            f"{len(outcome.found)} anomalies {outcome.found[:5]}",
            flush=True,
        )
    print(
        f"{total_tasks} tasks, faults {kinds}, {total_forwards_failed} forwards failed, "
        f"{total_found} anomalies "
        f"({1000 * total_found / max(1, total_tasks):.2f} per 1,000 tasks), "
        f"{time.monotonic() - started:.0f} s"
    )
    return 1 if total_found else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
