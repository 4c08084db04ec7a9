"""The router in the simulation: a hub routing a client's tasks over a pool of two spokes.

`simulate_router(seed)` runs four peers on the virtual clock and the simulated network, each
on its own SQLite file: `client` asks `hub` for tasks; `hub` runs `synapse.router.Router`
(what `synapse serve --route` runs) over a pool of `gamma` and `delta`, whose scripted
handler does the work (progress, questions, a human decision, work that takes time; complete
or fail), and passes every question back to the client, whose person answers it. The faults:

- the hub killed (SIGKILL) and restarted on its file, while its sub-tasks run, while one
  waits on a question, while a request is in doubt;
- a spoke paused (SIGSTOP) past the request timeout, so that the hub's requests to it time
  out in doubt and the hub may not know whether it runs the task; a spoke killed and
  restarted;
- the client killed and restarted; the network losing, delaying and duplicating POSTs; the
  disk failing commits.

The invariants are every run's between the client and the hub (`synapse.simulation.
invariants`: records agree, each message applied once, callbacks in order, outcomes
announced kept, answers kept once), those of each sub-task between the hub and its spoke,
and the router's own:

- `one_partner_runs_it`: a routed task's work runs at one spoke at most (a request that
  timed out is never sent to the other spoke while the first may have it), and at most once
  there unless its handler is resumable (once per process then); a task the client sees
  completed ran at a spoke;
- `routed_tasks_survive_restarts`: a restart of the hub fails no routed task, running or
  waiting on a question (only a spoke's own interruption, relayed, may fail it);
- every task ends, the client's and each sub-task at both ends, whatever was killed when.
"""

from __future__ import annotations

import asyncio
import random
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from synapse.model.invariants import applied_once, history_in_the_table, records_agree
from synapse.p2p.config import P2PConfig
from synapse.p2p.engine import TaskKey, TaskRecord
from synapse.router import PoolConfig, Router
from synapse.router.pool import SynapsePartnerConfig
from synapse.simulation.invariants import (
    acknowledged_messages_are_kept,
    announced_outcomes_are_kept,
    callbacks_in_order,
    check,
)
from synapse.simulation.loop import Stalled
from synapse.simulation.network import Network, NetworkFaults
from synapse.simulation.peers import Effect, Incarnation, Node, TaskPlan
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
from synapse.simulation.stores import StoreFaults, StoreFaultSource

CLIENT, HUB = "client", "hub"
SPOKES = ("gamma", "delta")


@dataclass(frozen=True, slots=True)
class RouterScenario:
    """What one router seed does (drawn from the seed alone)."""

    seed: int
    tasks: tuple[TaskPlan, ...]
    network: NetworkFaults
    store_faults: StoreFaults
    restarts: tuple[Restart, ...]
    pauses: tuple[Pause, ...]
    heal_at: float

    @classmethod
    def draw(cls, seed: int) -> RouterScenario:
        def rng(name: str) -> random.Random:  # one stream per concern
            return random.Random(f"router:{seed}:{name}")

        work = rng("tasks")
        tasks = tuple(
            replace(
                draw_task(work, n), requester=CLIENT, executor=HUB, task_id=f"{CLIENT}-task-{n}"
            )
            for n in range(work.randint(2, 8))
        )
        faults = rng("faults")
        heal_at = faults.choice((300.0, 900.0, 1800.0))
        restarts = [
            Restart(faults.uniform(0, heal_at), HUB, faults.choice((1.0, 30.0, 300.0)))
            for _ in range(faults.choice((0, 1, 1, 2)))
        ]
        restarts += [
            Restart(faults.uniform(0, heal_at), faults.choice(SPOKES), faults.choice((5.0, 120.0)))
            for _ in range(faults.choice((0, 0, 1)))
        ]
        restarts += [
            Restart(faults.uniform(0, heal_at), CLIENT, faults.choice((5.0, 120.0)))
            for _ in range(faults.choice((0, 0, 1)))
        ]
        # Past the request timeout (30 s): the hub's requests time out in doubt.
        pauses = tuple(
            sorted(
                (
                    Pause(
                        faults.uniform(0, heal_at),
                        faults.choice(SPOKES),
                        faults.choice((5.0, 45.0, 120.0)),
                    )
                    for _ in range(faults.choice((0, 1, 2, 3)))
                ),
                key=lambda p: p.at,
            )
        )
        store = rng("store")
        return cls(
            seed=seed,
            tasks=tasks,
            network=NetworkFaults.draw(rng("network")),
            store_faults=StoreFaults(
                failure=store.choice((0.0, 0.0, 0.03)), slow=store.choice((0.0, 0.002, 0.5))
            ),
            restarts=tuple(sorted(restarts, key=lambda r: r.at)),
            pauses=pauses,
            heal_at=heal_at,
        )

    def describe(self) -> str:
        n = self.network
        return (
            f"router seed {self.seed}: {len(self.tasks)} tasks of {CLIENT} through {HUB} "
            f"to {' and '.join(SPOKES)}, loss {n.loss:g}, duplicates {n.duplicate:g}, "
            f"late {n.late:g} (≤{n.late_by:g} s), commit failures "
            f"{self.store_faults.failure:g} (≤{self.store_faults.slow:g} s), kills "
            + (", ".join(f"{r.node}@{r.at:.0f}" for r in self.restarts) or "none")
            + ", pauses "
            + (", ".join(f"{p.node}@{p.at:.0f}+{p.seconds:g}" for p in self.pauses) or "none")
            + f", faults until {self.heal_at:g} s"
        )


def simulate_router(seed: int, *, workdir: Path | None = None) -> RunOutcome:
    """Run router seed `seed` (see the module's docstring)."""
    scenario = RouterScenario.draw(seed)
    outcome = RunOutcome(scenario)
    harness = Harness(outcome, pauses=True)
    with harness.logging_errors(), tempfile.TemporaryDirectory(dir=workdir) as tmp:
        _run(scenario, harness, Path(tmp))
    return outcome


def _secret(a: str, b: str) -> str:
    return f"{min(a, b)}-{max(a, b)}-secret"


def _run(scenario: RouterScenario, harness: Harness, tmp: Path) -> None:
    outcome, loop, trace = harness.outcome, harness.loop, harness.trace
    seed = scenario.seed
    network = Network(random.Random(f"router:{seed}:wire"), scenario.network, trace)
    store_faults = StoreFaultSource(scenario.store_faults, random.Random(f"router:{seed}:disk"))
    config = P2PConfig()
    nodes: dict[str, Node] = {}
    for name in (CLIENT, HUB, *SPOKES):
        nodes[name] = Node(
            name=name,
            url=f"http://{name}.test/synapse/callback",
            network=network,
            config=config,
            store_faults=store_faults,
            rng=random.Random(f"router:{seed}:{name}"),
            trace=trace,
            path=tmp / f"{name}.db",
        )
        network.attach(nodes[name])
    client, hub = nodes[CLIENT], nodes[HUB]
    client.partners = [(HUB, hub.url, _secret(CLIENT, HUB))]
    client.plans = list(scenario.tasks)
    hub.partners = [(CLIENT, client.url, _secret(CLIENT, HUB))]
    for spoke in SPOKES:
        nodes[spoke].partners = [(HUB, hub.url, _secret(HUB, spoke))]
    pool = PoolConfig(
        partner=[
            SynapsePartnerConfig(spoke, nodes[spoke].url, [_secret(HUB, spoke)]) for spoke in SPOKES
        ],
        refresh_interval=30.0,
    )
    routers: dict[int, Router] = {}

    def wire(incarnation: Incarnation) -> None:
        routers[incarnation.number] = _SimulatedRouter(incarnation.peer, pool, clock=hub.clock)

    async def start_router(incarnation: Incarnation) -> None:
        await routers[incarnation.number].start()

    hub.wire, hub.after_start = wire, start_router

    async def main() -> None:
        for node in nodes.values():
            node.start()
        faults = [asyncio.create_task(restart_later(nodes[r.node], r)) for r in scenario.restarts]
        faults += [
            asyncio.create_task(pause_later(loop, nodes[p.node], p)) for p in scenario.pauses
        ]
        await asyncio.sleep(scenario.heal_at)
        network.faulty = False
        store_faults.active = False
        trace("faults stop")
        await asyncio.gather(*faults)
        deadline = loop.time() + SETTLE_LIMIT
        while loop.time() < deadline and _unsettled(nodes, scenario):  # noqa: ASYNC110
            await asyncio.sleep(30.0)
        left = _unsettled(nodes, scenario)
        if left:
            outcome.violations.append(
                f"every_task_ends: {SETTLE_LIMIT:g} s after the faults stopped, {left}"
            )

    try:
        loop.run_until_complete(main())
    except Stalled as stalled:
        outcome.violations.append(f"no_stall: {stalled}")
    outcome.virtual_seconds = loop.time()
    outcome.deliveries = len(network.deliveries)
    # The hub's "side effects" are its spokes': each one's, by the routed task it was for.
    hub.effects = [
        Effect(TaskKey(CLIENT, parent), 1000 * index + effect.incarnation, effect.resumable)
        for index, spoke in enumerate(SPOKES, 1)
        for effect in nodes[spoke].effects
        if (parent := _parent(nodes[spoke], effect.task)) is not None
    ]
    outcome.violations += check(scenario.tasks, {CLIENT: client, HUB: hub})
    outcome.violations += _sub_task_violations(nodes)
    outcome.violations += one_partner_runs_it(nodes)
    outcome.violations += routed_tasks_survive_restarts(nodes, scenario)
    harness.check_quiet(nodes.values(), _record)
    outcome.ends = {plan.task_id: final_state(client, plan.key) for plan in scenario.tasks}
    for node in nodes.values():
        node.kill()
    harness.finish()


class _SimulatedRouter(Router):
    """The router, without the HTTP session it keeps for A2A members (this pool has none;
    an unclosed session of a killed process would be reported as a leak)."""

    async def start(self) -> None:
        await super().start()
        session, self._session = self._session, None
        if session is not None:
            await session.close()


def _record(node: Node, key: TaskKey) -> TaskRecord | None:
    incarnation = node.incarnation
    if incarnation is None:
        return None
    return incarnation.record(key)


def _parent(spoke: Node, key: TaskKey) -> str | None:
    """The client's task a spoke's sub-task was routed for (its context's parent)."""
    rec = _record(spoke, key)
    if rec is None or rec.context is None:
        return None
    return rec.context.parent_task_id


def _sub_tasks(nodes: dict[str, Node]) -> list[tuple[Node, TaskKey]]:
    """Every sub-task a spoke knows of, with the spoke."""
    found = []
    for spoke in SPOKES:
        node = nodes[spoke]
        incarnation = node.incarnation
        if incarnation is None:
            continue
        for rec in incarnation.peer.protocol.store.list_tasks(limit=10_000):
            found.append((node, rec.key))
    return found


def _sub_task_violations(nodes: dict[str, Node]) -> list[str]:
    """The invariants of every run, for each sub-task between the hub and its spoke."""
    hub = nodes[HUB]
    found: list[str] = []

    def note(name: str, text: str | None) -> None:
        if text is not None:
            found.append(f"{name} (sub-task): {text}")

    for spoke, key in _sub_tasks(nodes):
        r, e = _record(hub, key), _record(spoke, key)
        note("records_agree", records_agree(r, e))
        for side, rec in (("hub", r), (spoke.name, e)):
            twice = applied_once(rec)
            note("applied_once", None if twice is None else f"{side} applied {twice} twice")
            note("history_in_the_table", history_in_the_table(rec))
        note("acknowledged_messages_are_kept", acknowledged_messages_are_kept(hub, key, r))
        note("acknowledged_messages_are_kept", acknowledged_messages_are_kept(spoke, key, e))
        note("callbacks_in_order", callbacks_in_order(r, spoke.name))
        note("announced_outcomes_are_kept", announced_outcomes_are_kept(hub, key, r))
        note("announced_outcomes_are_kept", announced_outcomes_are_kept(spoke, key, e))
    return found


def one_partner_runs_it(nodes: dict[str, Node]) -> list[str]:
    """A routed task's work ran at one spoke at most."""
    ran_at: dict[str, set[str]] = {}
    for spoke in SPOKES:
        for effect in nodes[spoke].effects:
            parent = _parent(nodes[spoke], effect.task)
            if parent is not None:
                ran_at.setdefault(parent, set()).add(spoke)
    return [
        f"one_partner_runs_it: {task_id} ran at {' and '.join(sorted(spokes))}"
        for task_id, spokes in sorted(ran_at.items())
        if len(spokes) > 1
    ]


#: How a restart fails a task whose handler cannot resume (`Engine.recover`).
INTERRUPTED = "interrupted by restart"


def routed_tasks_survive_restarts(nodes: dict[str, Node], scenario: RouterScenario) -> list[str]:
    """The router's handler is resumable: a restart of the hub never fails a routed task,
    running or waiting on a question (the question still waits, and the answer reaches the
    spoke that asked). A routed task may fail "interrupted by restart" only as its spoke's
    sub-task did, relayed."""
    relayed = set()
    for spoke, key in _sub_tasks(nodes):
        rec = _record(spoke, key)
        parent = _parent(spoke, key)
        if rec is not None and rec.error is not None and rec.error.message == INTERRUPTED:
            relayed.add(parent)
    found = []
    for plan in scenario.tasks:
        rec = _record(nodes[HUB], plan.key)
        if rec is None or rec.error is None or rec.error.message != INTERRUPTED:
            continue
        if plan.task_id not in relayed:
            asked = [t.from_state.value for t in rec.history if t.to_state.is_final]
            found.append(
                f"routed_tasks_survive_restarts: the hub's restart failed {plan.task_id} "
                f"(from {', '.join(asked)})"
            )
    return found


def _unsettled(nodes: dict[str, Node], scenario: RouterScenario) -> str:
    """What keeps the run from being over ("" once every task has ended at both ends and
    nothing is left to deliver)."""
    parts = []
    for node in nodes.values():
        incarnation = node.incarnation
        if incarnation is None or not incarnation.serving:
            return f"{node.name} is not serving"
        if incarnation.peer.protocol.pending_deliveries:
            parts.append(f"{node.name} has messages to deliver")
    client, hub = nodes[CLIENT], nodes[HUB]
    for plan in scenario.tasks:
        if plan.key not in client.submitted:
            parts.append(f"{plan.task_id} not submitted")
            continue
        r, e = _record(client, plan.key), _record(hub, plan.key)
        if r is None or not r.is_final or (e is not None and not e.is_final):
            parts.append(
                f"{plan.task_id}: R {final_state(client, plan.key)}, E {final_state(hub, plan.key)}"
            )
    for spoke, key in _sub_tasks(nodes):
        r, e = _record(hub, key), _record(spoke, key)
        if (r is not None and not r.is_final) or (e is not None and not e.is_final):
            r_end, e_end = final_state(hub, key), final_state(spoke, key)
            parts.append(f"sub-task {key.task_id} at {spoke.name}: R {r_end}, E {e_end}")
    return "; ".join(parts)


__all__ = [
    "RouterScenario",
    "one_partner_runs_it",
    "routed_tasks_survive_restarts",
    "simulate_router",
]
