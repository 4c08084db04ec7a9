"""One seeded simulation: its scenario, its run, and what is checked at its end.

`Scenario.draw(seed)` turns a number into everything a run does: two peers (memory or
SQLite stores), the tasks each asks of the other (the executor's script and the requester's
person for each), the faults (network, store, restarts, clock jumps) and when they stop.
`simulate(seed)` runs it on a `VirtualTimeLoop` until every task has ended on both sides
after the faults stopped, then checks the invariants (`synapse.simulation.invariants`); the
same seed always makes the same run (`RunOutcome.digest` says so).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import random
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from synapse.p2p.config import P2PConfig
from synapse.p2p.engine import TaskKey
from synapse.simulation.invariants import (
    check,
    handles_settled,
    held_while_quiet,
    stored_record,
)
from synapse.simulation.loop import Stalled, VirtualTimeLoop
from synapse.simulation.network import CURRENT, Network, NetworkFaults
from synapse.simulation.peers import (
    JOB,
    RESUMABLE_JOB,
    Node,
    Script,
    TaskPlan,
    install_task_factory,
)
from synapse.simulation.stores import StoreFaults, StoreFaultSource

NAMES = ("alpha", "beta")
#: After the faults stop, how long the tasks have to end (input and task timeouts included).
SETTLE_LIMIT = 4 * 3600.0


@dataclass(frozen=True, slots=True)
class Restart:
    at: float
    node: str
    down_for: float


@dataclass(frozen=True, slots=True)
class Pause:
    """SIGSTOP of `node`'s process at `at`, SIGCONT `seconds` later."""

    at: float
    node: str
    seconds: float


@dataclass(frozen=True, slots=True)
class ClockJump:
    at: float
    node: str
    offset: float


@dataclass(frozen=True, slots=True)
class Scenario:
    """Everything one seed's run does (see the module's docstring)."""

    seed: int
    store: str
    tasks: tuple[TaskPlan, ...]
    network: NetworkFaults
    store_faults: StoreFaults
    restarts: tuple[Restart, ...]
    clock_jumps: tuple[ClockJump, ...]
    #: When the faults stop.
    heal_at: float

    @classmethod
    def draw(cls, seed: int) -> Scenario:
        def rng(part: str) -> random.Random:
            return random.Random(f"{seed}:{part}")

        plan = rng("plan")
        store = "sqlite" if plan.random() < 0.6 else "memory"
        heal_at = plan.choice((600.0, 1800.0, 3600.0))
        tasks = tuple(draw_task(plan, n) for n in range(plan.randint(2, 8)))
        restarts: tuple[Restart, ...] = ()
        if store == "sqlite":
            restarts = tuple(
                sorted(
                    (
                        Restart(
                            plan.uniform(0, heal_at),
                            plan.choice(NAMES),
                            plan.choice((0.5, 5.0, 60.0, 400.0, 1200.0)),
                        )
                        for _ in range(plan.choice((0, 1, 2, 4, 8)))
                    ),
                    key=lambda r: r.at,
                )
            )
        window = P2PConfig().replay_window
        jumps = tuple(
            sorted(
                (
                    ClockJump(
                        plan.uniform(0, heal_at),
                        plan.choice(NAMES),
                        # Two clocks stay within the replay window of each other.
                        plan.uniform(-window / 3, window / 3),
                    )
                    for _ in range(plan.choice((0, 0, 1, 3)))
                ),
                key=lambda j: j.at,
            )
        )
        return cls(
            seed=seed,
            store=store,
            tasks=tasks,
            network=NetworkFaults.draw(rng("network")),
            store_faults=StoreFaults.draw(rng("store")),
            restarts=restarts,
            clock_jumps=jumps,
            heal_at=heal_at,
        )

    def describe(self) -> str:
        n = self.network
        return (
            f"seed {self.seed}: {len(self.tasks)} tasks, {self.store} stores, "
            f"loss {n.loss:g}, duplicates {n.duplicate:g}, late {n.late:g} (≤{n.late_by:g} s), "
            f"commit failures {self.store_faults.failure:g} (≤{self.store_faults.slow:g} s), "
            f"{len(self.restarts)} restarts, {len(self.clock_jumps)} clock jumps, "
            f"faults until {self.heal_at:g} s"
        )


def draw_task(rng: random.Random, n: int) -> TaskPlan:
    requester = rng.choice(NAMES)
    executor = NAMES[1 - NAMES.index(requester)]
    validate = rng.choices(("accept", "reject", "ask"), (7, 1, 2))[0]
    steps = tuple(
        rng.choice(("progress", "progress", "ask", "human", "work:5", "work:400"))
        for _ in range(rng.choice((0, 1, 2, 3)))
    )
    return TaskPlan(
        requester=requester,
        executor=executor,
        task_id=f"{requester}-task-{n}",
        task_type=rng.choice((JOB, JOB, RESUMABLE_JOB)),
        submit_at=rng.uniform(0, 120),
        script=Script(validate, steps, rng.choices(("complete", "fail"), (4, 1))[0]),
        answer_after=rng.choice((0.1, 1.0, 30.0, 200.0, 4000.0)),
        approve=rng.random() < 0.8,
        cancel_at=rng.choice((None, None, None, 10.0, 100.0, 1000.0)),
    )


class Drawn(Protocol):
    """A seed's scenario, as a run's outcome tells of it."""

    @property
    def seed(self) -> int: ...

    def describe(self) -> str: ...


@dataclass
class RunOutcome:
    """What one seed's run did and found."""

    scenario: Drawn
    #: Broken invariants, each a line.
    violations: list[str] = field(default_factory=list)
    #: Every fault, delivery, kill and start, in order.
    trace: list[str] = field(default_factory=list)
    #: Virtual seconds the run lasted.
    virtual_seconds: float = 0.0
    deliveries: int = 0
    #: Final states of the requesters' tasks, by task id.
    ends: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def digest(self) -> str:
        """A hash of the trace: equal for two runs of one seed."""
        return hashlib.sha256("\n".join(self.trace).encode()).hexdigest()[:16]

    def replay_command(self) -> str:
        return f"python -m synapse.simulation --seed {self.scenario.seed} --trace"


#: Error events a fault explains: a failing store, a partner unreachable for an hour.
EXPECTED_ERRORS = frozenset({"store_unavailable", "dead_letter"})


class Errors(logging.Handler):
    """Collects the error lines the runtime logs (each a bug, unless a fault explains it)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.events: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg: Any = record.msg
        event = msg.get("event") if isinstance(msg, dict) else str(msg)
        self.events.append(str(event))


class Harness:
    """What every run sets up around its peers: a virtual-time loop whose tasks join the
    incarnation that made them, its unhandled exceptions and the runtime's error lines
    collected (and kept off the console), and a trace whose lines carry the virtual time."""

    def __init__(self, outcome: RunOutcome, *, pauses: bool = False) -> None:
        self.outcome = outcome
        self.loop = VirtualTimeLoop()
        install_task_factory(self.loop)
        if pauses:
            self.loop.enable_pauses(CURRENT)
        self.unhandled: list[str] = []
        self.loop.set_exception_handler(self._on_exception)
        self.errors = Errors()

    def _on_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        self.unhandled.append(f"{context.get('message')}: {context.get('exception')!r}")

    def trace(self, line: str) -> None:
        self.outcome.trace.append(f"{self.loop.time():10.3f} {line}")

    @contextlib.contextmanager
    def logging_errors(self) -> Iterator[None]:
        synapse_log = logging.getLogger("synapse")
        synapse_log.addHandler(self.errors)
        saved = synapse_log.propagate
        synapse_log.propagate = False
        try:
            yield
        finally:
            synapse_log.removeHandler(self.errors)
            synapse_log.propagate = saved

    def check_quiet(self, nodes: Iterable[Node], stored: Callable[[Node, TaskKey], Any]) -> None:
        """`held_only_while_committing` and `handles_settle` over the processes serving at
        the end (`stored`: a task's record as the node's agent stores it)."""
        for node in nodes:
            inc = node.incarnation
            if inc is not None and inc.serving:
                held = held_while_quiet(node.name, inc.peer.protocol)
                if held is not None:
                    self.outcome.violations.append(f"held_only_while_committing: {held}")
                name = f"{node.name}#{inc.number}"
                unsettled = handles_settled(name, inc.handles, partial(stored, node))
                self.outcome.violations += [f"handles_settle: {line}" for line in unsettled]

    def finish(self) -> None:
        """The loop's unhandled exceptions and the errors logged are violations; the loop
        is closed."""
        self.outcome.violations += [f"unhandled_exception: {line}" for line in self.unhandled]
        self.outcome.violations += [
            f"no_error_logged: {event}"
            for event in self.errors.events
            if event not in EXPECTED_ERRORS
        ]
        close_loop(self.loop)


def simulate(seed: int, *, workdir: Path | None = None) -> RunOutcome:
    """Run seed `seed` (see the module's docstring)."""
    scenario = Scenario.draw(seed)
    outcome = RunOutcome(scenario)
    harness = Harness(outcome)
    with harness.logging_errors(), tempfile.TemporaryDirectory(dir=workdir) as tmp:
        _run(scenario, harness, Path(tmp))
    return outcome


def _run(scenario: Scenario, harness: Harness, tmp: Path) -> None:
    outcome, loop, trace = harness.outcome, harness.loop, harness.trace

    network = Network(random.Random(f"{scenario.seed}:wire"), scenario.network, trace)
    store_faults = StoreFaultSource(scenario.store_faults, random.Random(f"{scenario.seed}:disk"))
    config = P2PConfig()
    nodes: dict[str, Node] = {}
    for name in NAMES:
        nodes[name] = Node(
            name=name,
            url=f"http://{name}.test/synapse/callback",
            network=network,
            config=config,
            store_faults=store_faults,
            rng=random.Random(f"{scenario.seed}:{name}"),
            trace=trace,
            path=tmp / f"{name}.db" if scenario.store == "sqlite" else None,
        )
        network.attach(nodes[name])
    for node in nodes.values():
        # Each shares with a partner the secret the partner signs with (one per direction).
        node.partners = [
            (other.name, other.url, f"{min(node.name, other.name)}-{max(node.name, other.name)}")
            for other in nodes.values()
            if other is not node
        ]
        node.plans = [plan for plan in scenario.tasks if plan.requester == node.name]

    async def main() -> None:
        for node in nodes.values():
            node.start()
        faults = [asyncio.create_task(restart_later(nodes[r.node], r)) for r in scenario.restarts]
        faults += [asyncio.create_task(_jump(nodes[j.node], j)) for j in scenario.clock_jumps]
        await asyncio.sleep(scenario.heal_at)
        network.faulty = False
        store_faults.active = False
        trace("faults stop")
        await asyncio.gather(*faults)
        deadline = loop.time() + SETTLE_LIMIT
        # Looked at every 30 virtual seconds (an observer outside the peers: nothing of
        # theirs would wake it, and looking costs no real time).
        while loop.time() < deadline and not _settled(nodes, scenario):  # noqa: ASYNC110
            await asyncio.sleep(30.0)
        if not _settled(nodes, scenario):
            outcome.violations.append(
                f"every_task_ends: {SETTLE_LIMIT:g} s after the faults stopped, "
                + _unsettled(nodes, scenario)
            )

    try:
        loop.run_until_complete(main())
    except Stalled as stalled:
        outcome.violations.append(f"no_stall: {stalled}")
    outcome.virtual_seconds = loop.time()
    outcome.deliveries = len(network.deliveries)
    outcome.violations += check(scenario.tasks, nodes)
    harness.check_quiet(nodes.values(), stored_record)
    outcome.ends = {
        plan.task_id: final_state(nodes[plan.requester], plan.key) for plan in scenario.tasks
    }
    for node in nodes.values():
        node.kill()
    if scenario.store == "sqlite":
        outcome.violations += check(scenario.tasks, nodes, from_files=True)
    harness.finish()


def final_state(node: Any, key: TaskKey) -> str:
    """The state `node` keeps of task `key` ("absent" if none)."""
    rec = stored_record(node, key)
    return rec.state.value if rec is not None else "absent"


async def restart_later(node: Node, restart: Restart) -> None:
    """Kill `node` at `restart.at`, and start it again `restart.down_for` later."""
    await asyncio.sleep(max(0.0, restart.at - asyncio.get_running_loop().time()))
    if node.incarnation is None:
        return
    node.kill()
    await asyncio.sleep(restart.down_for)
    node.start()


async def pause_later(loop: VirtualTimeLoop, node: Node, pause: Pause) -> None:
    """Stop `node`'s process at `pause.at` (nothing of it runs: its callbacks wait, parked),
    and let it go on `pause.seconds` later."""
    await asyncio.sleep(max(0.0, pause.at - loop.time()))
    incarnation = node.incarnation
    if incarnation is None or incarnation.paused:
        return
    incarnation.paused = True
    node.trace(f"{node.name}#{incarnation.number} paused for {pause.seconds:g} s")
    await asyncio.sleep(pause.seconds)
    if incarnation.alive:
        node.trace(f"{node.name}#{incarnation.number} resumed")
    loop.resume(incarnation)


async def _jump(node: Node, jump: ClockJump) -> None:
    await asyncio.sleep(max(0.0, jump.at - asyncio.get_running_loop().time()))
    node.trace(f"{node.name}'s clock jumps {jump.offset - node.offset:+.1f} s")
    node.offset = jump.offset


def _settled(nodes: dict[str, Node], scenario: Scenario) -> bool:
    for node in nodes.values():
        incarnation = node.incarnation
        if incarnation is None or not incarnation.serving:
            return False
        if incarnation.peer.protocol.pending_deliveries:
            return False
    for plan in scenario.tasks:
        requester, executor = nodes[plan.requester], nodes[plan.executor]
        if plan.key not in requester.submitted:
            if any(p is plan for p in requester.plans):
                return False  # not submitted yet
            continue
        assert requester.incarnation is not None and executor.incarnation is not None
        r = requester.incarnation.record(plan.key)
        e = executor.incarnation.record(plan.key)
        if r is None or not r.is_final or (e is not None and not e.is_final):
            return False
    return True


def _unsettled(nodes: dict[str, Node], scenario: Scenario) -> str:
    parts = []
    for plan in scenario.tasks:
        r_node, e_node = nodes[plan.requester], nodes[plan.executor]
        r = r_node.incarnation.record(plan.key) if r_node.incarnation else None
        e = e_node.incarnation.record(plan.key) if e_node.incarnation else None
        r_state = r.state.value if r else "none"
        e_state = e.state.value if e else "none"
        parts.append(f"{plan.task_id}: R {r_state}, E {e_state}")
    for node in nodes.values():
        if node.incarnation is None or not node.incarnation.serving:
            parts.append(f"{node.name} is not serving")
            continue
        pending = node.incarnation.peer.protocol.pending_deliveries
        if pending:
            parts.append(f"{node.name} has {pending} messages to deliver")
        waiting = [p.task_id for p in node.plans if p.key not in node.submitted]
        if waiting:
            parts.append(f"{node.name} has not submitted {', '.join(waiting)}")
    return "; ".join(parts)


def close_loop(loop: VirtualTimeLoop) -> None:
    pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.close()


__all__ = [
    "EXPECTED_ERRORS",
    "ClockJump",
    "Errors",
    "Harness",
    "Pause",
    "Restart",
    "RunOutcome",
    "Scenario",
    "close_loop",
    "draw_task",
    "final_state",
    "pause_later",
    "restart_later",
    "simulate",
]
