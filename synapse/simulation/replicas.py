"""Replicas in the simulation: one agent run by N processes on one PostgreSQL database.

`simulate_replicas(seed, server_url)` runs the agent `beta` as two or three replicas
(`synapse.transport.replicas`, `synapse.store.leases`: the code `synapse serve --replicas`
runs) behind a balancer that sends each POST to a live replica of its choosing, and the agent
`alpha` as one process. Tasks go both ways. The replicas share a fresh database on a real
PostgreSQL server (`synapse.simulation.shared`), so leases, fences, outbox claims and
takeovers are the database's own statements; everything else is the simulation's: a virtual
clock, a lossy network, seeded faults. The faults of a replica run:

- a replica killed (SIGKILL: its connections close, its memory is lost) and started again
  later as a new replica (a new replica id: its old leases run out); `alpha` killed and
  restarted on its SQLite file (callbacks to it pile up meanwhile);
- a replica paused past the lease's TTL (SIGSTOP: nothing of it runs, its connections and
  open transactions stay, its timers fire late), then resumed;
- each replica's wall clock ahead or behind by up to 0.6 of a TTL for the whole run (the
  lease's expiry is written with one clock and judged with another), and the agents' clocks
  apart;
- the database failing or crawling (a statement's round trip, a transaction that cannot
  begin), the network losing, delaying and duplicating POSTs;
- a replica cut from the database for a while, itself running on (every statement of its,
  lease renewals, outbox claims and lookups included, fails as on a lost connection);
- a replica drained from the balancer (a rolling deploy's first step): alive, holding its
  leases and sending its callbacks, but sent no POST, for a while or to the end of the run;
- people at the replicated requester who answer a question through two replicas at once
  (a front that is not the task's holder finds no handle there, and goes to the holder), as
  reviewers of the humans service, routed to the question or not (`synapse.simulation.people`).

The invariants are those of every run (`synapse.simulation.invariants`), read from the shared
database for the replicated agent, and with the agent's ledgers (messages acknowledged,
outcomes announced, side effects, answers acknowledged) kept across all its processes:

- no acknowledged message is lost, whichever replica acknowledged it (one replica writes a
  task at a time, or the fence keeps the other's writes out);
- no callback after a final one, each message applied once, callbacks in the order made;
- every task ends, its owner dead or paused notwithstanding (someone takes it over);
- a person's answer acknowledged is kept, and a question gets at most one answer.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import psycopg

from synapse.p2p.config import P2PConfig
from synapse.p2p.dedup import StoredReply
from synapse.p2p.engine import TaskKey
from synapse.simulation.invariants import check
from synapse.simulation.loop import Stalled
from synapse.simulation.network import Network, NetworkFaults
from synapse.simulation.peers import (
    Incarnation,
    Node,
    TakenAnswer,
    TaskPlan,
)
from synapse.simulation.people import decided_only_by_routed, links_in
from synapse.simulation.run import (
    SETTLE_LIMIT,
    Harness,
    Pause,
    Restart,
    RunOutcome,
    draw_task,
    final_state,
    pause_later,
    restart_later,
)
from synapse.simulation.shared import Databases, SimulatedPostgresStore, rows
from synapse.simulation.stores import StoreFaults, StoreFaultSource
from synapse.store.base import StoreUnavailable
from synapse.store.leases import DEFAULT_LEASE_TTL, Ownership
from synapse.transport.inbound import Inbound
from synapse.transport.replicas import (
    _OWNER_UNREACHABLE,
    _PASSED_HEADERS,
    FORWARDED_HEADER,
    Replicas,
)
from synapse.transport.server import SynapseServer
from synapse.types.codec import CountingIds

AGENT, SINGLE = "beta", "alpha"
TTL = DEFAULT_LEASE_TTL


@dataclass(frozen=True, slots=True)
class Drain:
    """The balancer sends replica `node` nothing from `at`, for `seconds` (None: to the
    end of the run); other replicas may still pass it what is its to handle."""

    at: float
    node: str
    seconds: float | None


@dataclass(frozen=True, slots=True)
class DatabaseCut:
    """Replica `node` cut from the database at `at`, for `seconds` (the network between
    them down; the replica runs on, and reaches its partners)."""

    at: float
    node: str
    seconds: float


@dataclass(frozen=True, slots=True)
class ReplicaScenario:
    """Everything one seed's replica run does (see the module's docstring)."""

    seed: int
    replicas: tuple[str, ...]
    tasks: tuple[TaskPlan, ...]
    network: NetworkFaults
    store_faults: StoreFaults
    restarts: tuple[Restart, ...]
    pauses: tuple[Pause, ...]
    #: Each replica's clock against the simulation's (seconds), by replica.
    offsets: tuple[tuple[str, float], ...]
    heal_at: float
    cuts: tuple[DatabaseCut, ...] = ()
    drains: tuple[Drain, ...] = ()

    @classmethod
    def draw(cls, seed: int) -> ReplicaScenario:
        def rng(part: str) -> random.Random:
            return random.Random(f"replicas:{seed}:{part}")

        plan = rng("plan")
        replicas = tuple(f"{AGENT}-{n}" for n in range(1, plan.choice((2, 3, 3)) + 1))
        heal_at = plan.choice((300.0, 900.0, 1800.0))
        tasks = tuple(_task_between(plan, n) for n in range(plan.randint(3, 12)))
        # alpha is killed too: while it is down, callbacks to it pile up, and a replica
        # killed then leaves a successor several to send.
        restarts = _spread(
            plan,
            Restart,
            heal_at,
            (*replicas, SINGLE),
            (0.5, 5.0, 3 * TTL, 60.0, 400.0),
            (0, 1, 2, 4, 6),
        )
        pauses = _spread(
            plan, Pause, heal_at, replicas, (TTL / 2, 1.5 * TTL, 3 * TTL, 30 * TTL), (0, 1, 2, 4)
        )
        # Outages: alpha down for a while (its callbacks pile up at the replicas), and
        # halfway through a replica killed or paused past the TTL, so that a successor takes
        # over tasks with several callbacks still to send.
        outage = rng("outages")
        extra_restarts: list[Restart] = []
        extra_pauses: list[Pause] = []
        handovers: list[tuple[float, str]] = []  # (when alpha is back, the replica gone)
        for _ in range(outage.choice((0, 0, 1, 2, 3))):
            down = outage.choice((60.0, 200.0, 400.0))
            # Some end as the faults stop: what is left to deliver then must go out with no
            # traffic to carry it (liveness shows at the end of a run).
            at = outage.choice((outage.uniform(0, heal_at), max(0.0, heal_at - down)))
            extra_restarts.append(Restart(at, SINGLE, down))
            replica = outage.choice(replicas)
            if outage.random() < 0.5:
                extra_restarts.append(Restart(at + down / 2, replica, outage.choice((5.0, 60.0))))
            else:
                extra_pauses.append(
                    Pause(at + down / 2, replica, outage.choice((3 * TTL, 30 * TTL)))
                )
            handovers.append((at + down, replica))
        restarts = tuple(sorted((*restarts, *extra_restarts), key=lambda r: r.at))
        pauses = tuple(sorted((*pauses, *extra_pauses), key=lambda p: p.at))
        skew = rng("clocks")
        offsets = tuple((name, skew.uniform(-0.6, 0.6) * TTL) for name in replicas)
        store_faults = rng("store")
        # Drawn apart from the other faults: a seed's other faults stay what they were.
        cuts = _spread(
            rng("cuts"),
            DatabaseCut,
            heal_at,
            replicas,
            (TTL / 2, 1.5 * TTL, 3 * TTL, 30 * TTL),
            (0, 0, 1, 2),
        )
        # Drawn apart too. Some start as the faults stop and last to the end: a replica
        # left idle with what it did before (a callback's removal still buffered, say).
        # And after an outage that handed tasks over, now and then the successor drained
        # as alpha comes back (the callbacks piled up for it are its to send, unprompted).
        drain = rng("drains")
        drained = [
            Drain(
                drain.choice((drain.uniform(0, heal_at), heal_at)),
                drain.choice(replicas),
                drain.choice((60.0, 600.0, None)),
            )
            for _ in range(drain.choice((0, 0, 1)))
        ]
        for back, gone in handovers:
            if drain.random() < 0.5:
                successor = drain.choice([r for r in replicas if r != gone])
                drained.append(Drain(back, successor, drain.choice((600.0, None))))
        drains = tuple(sorted(drained, key=lambda d: d.at))
        return cls(
            seed=seed,
            replicas=replicas,
            tasks=tasks,
            network=NetworkFaults.draw(rng("network")),
            store_faults=StoreFaults(
                failure=store_faults.choice((0.0, 0.0, 0.03, 0.15)),
                slow=store_faults.choice((0.002, 0.05, 0.5, 5.0)),
            ),
            restarts=restarts,
            pauses=pauses,
            offsets=offsets,
            heal_at=heal_at,
            cuts=cuts,
            drains=drains,
        )

    def describe(self) -> str:
        n = self.network
        return (
            f"replicas seed {self.seed}: {len(self.replicas)} replicas of {AGENT}, "
            f"{len(self.tasks)} tasks, loss {n.loss:g}, duplicates {n.duplicate:g}, "
            f"late {n.late:g} (≤{n.late_by:g} s), commit failures {self.store_faults.failure:g} "
            f"(≤{self.store_faults.slow:g} s), {len(self.restarts)} kills, "
            f"{len(self.pauses)} pauses, {len(self.cuts)} database cuts, "
            f"{len(self.drains)} drains, clocks "
            + ", ".join(f"{name} {offset:+.1f} s" for name, offset in self.offsets)
            + f", faults until {self.heal_at:g} s"
        )


_Timed = TypeVar("_Timed", Restart, Pause, DatabaseCut)


def _spread(
    rng: random.Random,
    make: Callable[[float, str, float], _Timed],
    heal_at: float,
    nodes: Sequence[str],
    lengths: Sequence[float],
    counts: Sequence[int],
) -> tuple[_Timed, ...]:
    """A number of faults drawn from `counts`, each at a time before `heal_at`, on one of
    `nodes`, lasting one of `lengths` (drawn in that order), sorted by time."""
    faults = [
        make(rng.uniform(0, heal_at), rng.choice(nodes), rng.choice(lengths))
        for _ in range(rng.choice(counts))
    ]
    return tuple(sorted(faults, key=lambda fault: fault.at))


def _task_between(rng: random.Random, n: int) -> TaskPlan:
    """A task either way between `alpha` and the replicated `beta`."""
    plan = draw_task(rng, n)
    requester = rng.choice((SINGLE, AGENT, SINGLE))
    executor = AGENT if requester == SINGLE else SINGLE
    return replace(plan, requester=requester, executor=executor, task_id=f"{requester}-task-{n}")


class SimulatedReplicas(Replicas):
    """`Replicas` whose forwarding goes over the simulated network, and whose renewals are
    jittered by the seed."""

    def __init__(self, *args: Any, network: Network, rng: random.Random, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.network = network
        self.jitter = rng.random

    async def _forward(self, url: str, inbound: Inbound, headers: Mapping[str, str]) -> StoredReply:
        out = {h: headers[h] for h in ("Content-Type", "X-Synapse-Signature") if h in headers}
        out[FORWARDED_HEADER] = self.ownership.replica_id
        try:
            status, body, retry_after, signature = await self.network.post(
                url, inbound.body, out, self.request_timeout
            )
        except (ConnectionError, TimeoutError):
            return _OWNER_UNREACHABLE  # type: ignore[return-value]
        got = {"Content-Type": "application/json", "Retry-After": retry_after}
        got["X-Synapse-Signature"] = signature
        passed = {h: v for h, v in got.items() if h in _PASSED_HEADERS and v is not None}
        self.forwarded += 1
        return StoredReply.of(status, body, passed)


class _Balancer:
    """The agent's endpoint: each POST goes to a live replica the seed picks."""

    def __init__(self, name: str, url: str, replicas: list[Node], rng: random.Random) -> None:
        self._name = name
        self._url = url
        self.replicas = replicas
        self.rng = rng
        #: The replicas drained now: sent nothing while another serves.
        self.drained: set[str] = set()

    @property
    def name(self) -> str:
        return self._name

    @property
    def url(self) -> str:
        return self._url

    @property
    def process(self) -> Incarnation | None:
        serving = [
            n.incarnation
            for n in self.replicas
            if n.incarnation is not None and n.incarnation.serving
        ]
        if self.drained:
            # A balancer with nowhere else to send still sends to a drained replica.
            undrained = [i for i in serving if i.node.name not in self.drained]
            serving = undrained or serving
        return self.rng.choice(serving) if serving else None


@dataclass
class _Agent:
    """What invariants read of the replicated agent: its ledgers (shared by its replicas)
    and its records as the shared database holds them."""

    name: str
    reader: SimulatedPostgresStore
    applied: set[tuple[TaskKey, str]]
    announced: dict[TaskKey, Any]
    effects: list[Any]
    submitted: dict[TaskKey, TaskPlan]
    answers: list[TakenAnswer]
    path: None = None
    incarnation: None = None

    @property
    def store(self) -> SimulatedPostgresStore:
        return self.reader


def simulate_replicas(
    seed: int, databases: Databases, *, scenario: ReplicaScenario | None = None
) -> RunOutcome:
    """Run replica seed `seed` on a fresh database of `databases` (see the module's
    docstring); `scenario`: the seed's, changed (a fault taken out, to replay a run as an
    earlier draw made it)."""
    if scenario is None:
        scenario = ReplicaScenario.draw(seed)
    assert scenario.seed == seed
    outcome = RunOutcome(scenario)
    harness = Harness(outcome, pauses=True)
    url = databases.fresh(seed)
    try:
        with harness.logging_errors(), tempfile.TemporaryDirectory() as tmp:
            _run(scenario, harness, url, Path(tmp))
    finally:
        databases.drop(url)
    return outcome


def _run(scenario: ReplicaScenario, harness: Harness, url: str, tmp: Path) -> None:
    outcome, loop, trace = harness.outcome, harness.loop, harness.trace
    seed = scenario.seed
    network = Network(random.Random(f"replicas:{seed}:wire"), scenario.network, trace)
    store_faults = StoreFaultSource(scenario.store_faults, random.Random(f"replicas:{seed}:db"))
    config = P2PConfig()
    secret = f"{SINGLE}-{AGENT}"
    single = Node(
        name=SINGLE,
        url=f"http://{SINGLE}.test/synapse/callback",
        network=network,
        config=config,
        store_faults=StoreFaultSource(StoreFaults(), random.Random(0)),
        rng=random.Random(f"replicas:{seed}:{SINGLE}"),
        trace=trace,
        path=tmp / f"{SINGLE}.db",  # SQLite: alpha is killed and restarted too
    )
    single.partners = [(AGENT, f"http://{AGENT}.test/synapse/callback", secret)]
    single.plans = [p for p in scenario.tasks if p.requester == SINGLE]
    network.attach(single)
    offsets = dict(scenario.offsets)
    numbers = itertools.count(1)
    ids = CountingIds(prefix=f"{AGENT}1-")  # one count for the agent: ids in minting order
    applied: set[tuple[TaskKey, str]] = set()
    announced: dict[TaskKey, Any] = {}
    effects: list[Any] = []
    submitted: dict[TaskKey, TaskPlan] = {}
    answers: list[TakenAnswer] = []
    beta_plans = [p for p in scenario.tasks if p.requester == AGENT]
    replicas: list[Node] = []
    links = links_in(seed)

    cut_off: set[str] = set()  # the replicas cut from the database now

    def store_for(node: Node, number: int) -> SimulatedPostgresStore:
        return SimulatedPostgresStore(
            url,
            store_faults,
            name=f"{node.name}#{number}",
            trace=node.trace,
            reachable=lambda: node.name not in cut_off,
        )

    async def cut_later(cut: DatabaseCut) -> None:
        await asyncio.sleep(max(0.0, cut.at - loop.time()))
        cut_off.add(cut.node)
        trace(f"{cut.node} cut from the database for {cut.seconds:g} s")
        await asyncio.sleep(cut.seconds)
        cut_off.discard(cut.node)
        trace(f"{cut.node} reaches the database again")

    for index, name in enumerate(scenario.replicas):
        node = Node(
            name=name,
            url=f"http://{name}.test/synapse/callback",
            network=network,
            config=config,
            store_faults=store_faults,
            rng=random.Random(f"replicas:{seed}:{name}"),
            trace=trace,
            offset=offsets[name],
            agent=AGENT,
            counter=numbers,
            store_factory=store_for,
            ids=ids,
            applied=applied,
            announced=announced,
            effects=effects,
            submitted=submitted,
            endpoint=f"http://{AGENT}.test/synapse/callback",
            answers_for=beta_plans,
            people=True,
            links=links,
            answers=answers,
            # A replica started while cut from the database exits (`synapse serve` does).
            exits_on=(psycopg.OperationalError, StoreUnavailable),
        )
        node.wire = _wiring(node, network, url, outcome.violations)
        node.partners = [(SINGLE, single.url, secret)]
        # Each task of the agent's is submitted at one replica (its person's front).
        node.plans = [p for i, p in enumerate(beta_plans) if i % len(scenario.replicas) == index]
        replicas.append(node)
        network.attach(node)
    balancer = _Balancer(
        AGENT,
        f"http://{AGENT}.test/synapse/callback",
        replicas,
        random.Random(f"replicas:{seed}:balancer"),
    )
    network.attach(balancer)

    async def drain_later(drain: Drain) -> None:
        await asyncio.sleep(max(0.0, drain.at - loop.time()))
        balancer.drained.add(drain.node)
        trace(f"{drain.node} drained from the balancer")
        if drain.seconds is None:
            return
        await asyncio.sleep(drain.seconds)
        balancer.drained.discard(drain.node)
        trace(f"{drain.node} back in the balancer")

    agent = _Agent(
        AGENT,
        # What the checks read: the shared database, through a store of no replica's.
        SimulatedPostgresStore(
            url,
            StoreFaultSource(StoreFaults(), random.Random(0)),
            name="checker",
            trace=trace,
        ),
        applied,
        announced,
        effects,
        submitted,
        answers,
    )
    for node in replicas:
        node.siblings = [other for other in replicas if other is not node]
    by_name = {n.name: n for n in replicas}

    async def main() -> None:
        single.start()
        for node in replicas:
            node.start()
        everyone = {SINGLE: single, **by_name}
        faults = [
            asyncio.create_task(restart_later(everyone[r.node], r)) for r in scenario.restarts
        ]
        faults += [
            asyncio.create_task(pause_later(loop, by_name[p.node], p)) for p in scenario.pauses
        ]
        faults += [asyncio.create_task(cut_later(c)) for c in scenario.cuts]
        faults += [asyncio.create_task(drain_later(d)) for d in scenario.drains]
        await asyncio.sleep(scenario.heal_at)
        network.faulty = False
        store_faults.active = False
        trace("faults stop")
        await asyncio.gather(*faults)
        deadline = loop.time() + SETTLE_LIMIT
        while loop.time() < deadline and not _settled(single, replicas, scenario, agent):  # noqa: ASYNC110
            await asyncio.sleep(30.0)
        # A replica that let a task go reads its outcome for the handle every TTL / 5.
        await asyncio.sleep(TTL)
        if not _settled(single, replicas, scenario, agent):
            outcome.violations.append(
                f"every_task_ends: {SETTLE_LIMIT:g} s after the faults stopped, "
                + _unsettled(single, replicas, scenario, agent)
            )

    try:
        loop.run_until_complete(main())
    except Stalled as stalled:
        outcome.violations.append(f"no_stall: {stalled}")
    outcome.virtual_seconds = loop.time()
    outcome.deliveries = len(network.deliveries)
    nodes: dict[str, Any] = {SINGLE: single, AGENT: agent}
    outcome.violations += check(scenario.tasks, nodes)
    for plan in scenario.tasks:
        if plan.requester == AGENT:
            wrong = decided_only_by_routed(agent.reader.get_task(plan.key))
            if wrong is not None:
                outcome.violations.append(f"decided_only_by_routed: {wrong}")
    harness.check_quiet(
        [single, *replicas],
        lambda node, key: _record(single, agent, SINGLE if node is single else AGENT, key),
    )
    outcome.ends = {
        plan.task_id: final_state(single if plan.requester == SINGLE else agent, plan.key)
        for plan in scenario.tasks
    }
    for node in [single, *replicas]:
        node.kill()
    agent.reader.die()
    harness.finish()


def _wiring(node: Node, network: Network, url: str, violations: list[str]) -> Any:
    """What `enable_replicas` does for `synapse serve`, with the node's clock, a replica
    id per incarnation, and forwarding over the simulated network; each lease the replica
    finds lost is checked against the database (`leases_lost_only_when_taken`)."""

    def wire(incarnation: Incarnation) -> None:
        peer = incarnation.peer
        made: list[Ownership] = []

        def on_protocol(protocol: Any) -> None:
            made.append(
                Ownership(
                    incarnation.store,
                    agent_id=AGENT,
                    url=node.url,
                    ttl=TTL,
                    replica_id=f"{node.name}#{incarnation.number}",
                    clock=node.clock,
                )
            )

        def on_server(server: SynapseServer) -> None:
            replicas = SimulatedReplicas(
                server.protocol,
                server,
                made[-1],
                request_timeout=peer.config.request_timeout,
                network=network,
                rng=node.rng,
            )
            replicas.start()
            peer.task_owners = replicas
            own, release = made[-1], made[-1].on_lost
            assert release is not None

            def on_lost(key: TaskKey) -> None:
                taken = lost_though_held(url, own.replica_id, key)
                if taken is not None:
                    violations.append(f"leases_lost_only_when_taken: {taken}")
                release(key)

            own.on_lost = on_lost

        peer.protocol_hooks.append(on_protocol)
        peer.server_hooks.append(on_server)

    return wire


def lost_though_held(url: str, replica_id: str, key: TaskKey) -> str | None:
    """Why a lease `replica_id` found lost is in fact still its own, or None: the database
    names it the holder, or holds neither the lease nor the task (a first write of the task
    not committed yet). A lease lost for real has another holder, or was given back by
    another replica once the task ended there (the task is stored then)."""
    found = rows(
        url,
        "SELECT holder, (SELECT count(*) FROM tasks WHERE requester = %s AND task_id = %s) "
        "FROM (VALUES (1)) v LEFT JOIN leases l ON l.requester = %s AND l.task_id = %s",
        (key.requester, key.task_id, key.requester, key.task_id),
    )
    holder, tasks = found[0]
    if holder == replica_id:
        return f"{replica_id} let {key.task_id} go while the database names it the holder"
    if holder is None and not tasks:
        return f"{replica_id} let {key.task_id} go before its first write was stored"
    return None


def _settled(single: Node, replicas: list[Node], scenario: ReplicaScenario, agent: _Agent) -> bool:
    if single.incarnation is None or not single.incarnation.serving:
        return False
    if single.incarnation.peer.protocol.pending_deliveries:
        return False
    for node in replicas:
        inc = node.incarnation
        if inc is None or not inc.serving or inc.paused:
            return False
        if inc.peer.protocol.pending_deliveries:
            return False
    for plan in scenario.tasks:
        submitted = single.submitted if plan.requester == SINGLE else agent.submitted
        if plan.key not in submitted:
            return False
        r = _record(single, agent, plan.requester, plan.key)
        e = _record(single, agent, plan.executor, plan.key)
        if r is None or not r.is_final or (e is not None and not e.is_final):
            return False
    return True


def _record(single: Node, agent: _Agent, name: str, key: TaskKey) -> Any:
    if name == SINGLE:
        assert single.incarnation is not None
        return single.incarnation.record(key)
    return agent.reader.get_task(key)


def _unsettled(single: Node, replicas: list[Node], scenario: ReplicaScenario, agent: _Agent) -> str:
    parts = []
    for plan in scenario.tasks:
        r = _record(single, agent, plan.requester, plan.key) if single.incarnation else None
        e = _record(single, agent, plan.executor, plan.key) if single.incarnation else None
        r_state = r.state.value if r else "none"
        e_state = e.state.value if e else "none"
        parts.append(f"{plan.task_id}: R {r_state}, E {e_state}")
    for node in [single, *replicas]:
        inc = node.incarnation
        if inc is None or not inc.serving:
            parts.append(f"{node.name} is not serving")
        elif inc.peer.protocol.pending_deliveries:
            parts.append(f"{node.name} has {inc.peer.protocol.pending_deliveries} to deliver")
    return "; ".join(parts)


__all__ = ["ReplicaScenario", "SimulatedReplicas", "simulate_replicas"]
