"""Simulated peers: real `Peer`s, their lives and deaths, their handlers and their people.

A `Node` is one agent of the simulation: its name, its URL on the simulated network, its
store's file, and what outlives its process (the handler's side effects, the tasks its
person submitted). An `Incarnation` is one run of its process: a `synapse.Peer` built as a
user builds one (the real runtime, engine, transport server and client), on the virtual clock
and the simulated network. Killing an incarnation is SIGKILL: every task it runs is
cancelled where it stands, its store writes nothing more, and the next incarnation starts
from what the store's file holds.

Which incarnation a piece of work belongs to is told by a context variable (`CURRENT`), set
when an incarnation starts and inherited by every task it creates, so that a kill cancels
exactly its tasks (`install_task_factory`).
"""

from __future__ import annotations

import asyncio
import contextvars
import random
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from multidict import CIMultiDict

from synapse.humans.decisions import told
from synapse.p2p.config import P2PConfig
from synapse.p2p.dedup import StoredReply
from synapse.p2p.engine import TaskKey, TaskRecord, Transition, Validation
from synapse.p2p.states import Event
from synapse.runtime.handler import ExecutionContext, TaskFailure
from synapse.runtime.listener import RuntimeListener
from synapse.runtime.protocol import P2PProtocol
from synapse.runtime.runtime_base import TaskHandle
from synapse.simulation.loop import Parked
from synapse.simulation.network import CURRENT, Network
from synapse.simulation.people import (
    EVERYONE,
    answer_by_console,
    answer_by_link,
    decided,
    enable_people,
    enable_people_console,
)
from synapse.simulation.stores import (
    SimulatedMemoryStore,
    SimulatedSqliteStore,
    StoreFaultSource,
)
from synapse.store.base import StoreUnavailable
from synapse.transport.client import HttpClient
from synapse.transport.partners import Partner
from synapse.transport.peer import Peer
from synapse.transport.server import SynapseServer
from synapse.types import (
    DecidedBy,
    LocalProtocolError,
    MissingField,
    NotReady,
    RemoteProtocolError,
    TaskError,
    TaskState,
)
from synapse.types.codec import CountingIds, decode_typed

#: Where every node's wall clock starts (plus its offset).
EPOCH = datetime(2026, 1, 1, tzinfo=UTC).timestamp()
#: Seconds before a person tries again an answer or a cancel the store could not take.
PERSON_RETRY = 10.0
#: Seconds from a process's failed start (it exits) to its supervisor starting it again.
RESTART_AFTER_EXIT = 5.0
#: The task types of the scripted handler: one resumable after a restart, one not.
JOB, RESUMABLE_JOB = "job", "resumable-job"


def install_task_factory(loop: asyncio.AbstractEventLoop) -> None:
    """Every task created on `loop` joins the incarnation it was created in (if any)."""

    def factory(
        loop: asyncio.AbstractEventLoop,
        coro: Coroutine[Any, Any, Any],
        context: contextvars.Context | None = None,
    ) -> asyncio.Task[Any]:
        task = asyncio.Task(coro, loop=loop, context=context)
        owner = context.get(CURRENT) if context is not None else CURRENT.get()
        if isinstance(owner, Incarnation):
            owner.adopt(task)
        return task

    loop.set_task_factory(factory)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class Script:
    """What the executor's handler does with one task (carried in the task's payload)."""

    #: The synchronous answer: "accept", "reject", or "ask" (need_info before accepting).
    validate: str = "accept"
    #: Then, in order: "progress", "ask" (need_info), "human" (need_human), "work:<s>".
    steps: tuple[str, ...] = ()
    #: "complete" or "fail".
    end: str = "complete"

    def payload(self) -> dict[str, Any]:
        return {"validate": self.validate, "steps": list(self.steps), "end": self.end}


@dataclass(frozen=True, slots=True)
class Effect:
    """A side effect a handler ran (what "exactly once" is about)."""

    task: TaskKey
    incarnation: int
    resumable: bool


class ScriptedHandler:
    """A `TaskHandler` that follows each task's `Script`, and records its side effect in the
    node's ledger just before it returns (a crash may fall in between, as in life)."""

    def __init__(self, node: Node) -> None:
        self.node = node

    def get_capabilities(self) -> list[str]:
        return [JOB, RESUMABLE_JOB]

    def validate_task(self, task_type: str, payload: dict[str, Any]) -> Validation:
        verdict = payload.get("validate")
        if verdict == "reject":
            return Validation(ok=False)
        if verdict == "ask" and "detail" not in payload:
            return Validation(missing_fields=("detail",), question="which detail?")
        return Validation()

    def is_resumable(self, task_type: str) -> bool:
        return task_type == RESUMABLE_JOB

    async def execute_task(
        self, ctx: ExecutionContext, task_type: str, payload: dict[str, Any]
    ) -> Any:
        for step in payload.get("steps", ()):
            if step == "progress":
                await ctx.progress(50.0, "halfway")
            elif step == "ask":
                await ctx.need_info([MissingField(field="more")], question="more?")
            elif step == "human":
                await ctx.need_human("approval", message="may I?")
            elif step.startswith("work:"):
                await asyncio.sleep(float(step.split(":", 1)[1]))
        incarnation = CURRENT.get()
        assert isinstance(incarnation, Incarnation)
        key = TaskKey(ctx.requester, ctx.task_id)
        self.node.effects.append(Effect(key, incarnation.number, task_type == RESUMABLE_JOB))
        if payload.get("end") == "fail":
            raise TaskFailure(TaskError(code="execution_failed", message="the script says fail"))
        return {"done": ctx.task_id}


@dataclass(frozen=True, slots=True)
class TakenAnswer:
    """An answer a person was told was taken: the task, the question's message id, and
    the answer's event (info provided, approve, reject)."""

    task: TaskKey
    question: str
    event: Event


@dataclass(frozen=True, slots=True)
class TaskPlan:
    """One task of the workload: who asks whom, when, what the handler does, and what the
    requester's person does (answer a question after `answer_after` s, approve or not,
    cancel at `cancel_at` s after submitting, if ever)."""

    requester: str
    executor: str
    task_id: str
    task_type: str
    submit_at: float
    script: Script
    answer_after: float
    approve: bool
    cancel_at: float | None

    @property
    def key(self) -> TaskKey:
        return TaskKey(self.requester, self.task_id)


@dataclass
class Node:
    """One agent of the simulation (see the module's docstring)."""

    name: str
    url: str
    network: Network
    config: P2PConfig
    store_faults: StoreFaultSource
    rng: random.Random
    trace: Any
    #: The SQLite file (None: a memory store, never restarted).
    path: Path | None = None
    #: Seconds this node's wall clock is ahead of the simulation's (clock jumps change it).
    offset: float = 0.0
    partners: list[tuple[str, str, str]] = field(default_factory=list)
    incarnation: Incarnation | None = None
    incarnations: int = 0
    effects: list[Effect] = field(default_factory=list)
    #: Tasks whose `submit` returned, by key.
    submitted: dict[TaskKey, TaskPlan] = field(default_factory=dict)
    plans: list[TaskPlan] = field(default_factory=list)
    #: Messages each incarnation acknowledged with a 200 after applying them to a task:
    #: (task key, message id) (they must be in the store at the end).
    applied: set[tuple[TaskKey, str]] = field(default_factory=set)
    #: The outcome each task's listeners were told of (a final state), by any incarnation:
    #: announced, it must be what the store keeps, whatever restarts came after.
    announced: dict[TaskKey, TaskState] = field(default_factory=dict)
    #: The store of the last incarnation (the memory store lives as long as the node).
    store: Any = None
    #: The agent this node is a process of (None: its own name). Replicas of one agent are
    #: nodes of their own, sharing the agent's id, secrets and ledgers.
    agent: str | None = None
    #: Numbers the incarnations (shared by an agent's replicas: each number names one
    #: process of the agent). None: counted per node.
    counter: Iterator[int] | None = None
    #: Builds an incarnation's store (None: SQLite at `path`, else memory).
    store_factory: Callable[[Node, int], Any] | None = None
    #: Called with each incarnation's `Peer` before it starts (replicas wire it).
    wire: Callable[[Incarnation], None] | None = None
    #: Awaited once each incarnation's peer has started, before it serves (a router
    #: discovers its pool there).
    after_start: Callable[[Incarnation], Awaitable[None]] | None = None
    #: The ids each incarnation mints (None: per incarnation, named after the node).
    ids: Any = None
    #: The URL its peers call back (None: `url`; a replica's is its agent's balancer).
    endpoint: str | None = None
    #: The tasks its person answers and cancels (None: `plans`; a replica's person acts on
    #: every task of its agent that the replica holds).
    answers_for: list[TaskPlan] | None = None
    #: The other replicas of its agent: its person answers through two of them at once.
    siblings: list[Node] = field(default_factory=list)
    #: Every answer a person was told was taken (the call returned), by any incarnation.
    answers: list[TakenAnswer] = field(default_factory=list)
    #: People answer this agent's questions as reviewers of the humans service
    #: (`synapse.simulation.people`); False: no humans service, the person is the agent.
    people: bool = False
    #: In some seeds, the stream that sends people's answers through signed links
    #: (`synapse.simulation.people.links_in`); None: never.
    links: random.Random | None = None
    #: Errors that end a start (the database out of reach): the process exits, and its
    #: supervisor starts it again `RESTART_AFTER_EXIT` seconds later. Any other is a defect.
    exits_on: tuple[type[BaseException], ...] = ()
    #: The incarnation whose start failed and exited, until its supervisor starts another.
    exited: Incarnation | None = None

    @property
    def process(self) -> Incarnation | None:
        return self.incarnation

    def clock(self) -> float:
        return EPOCH + asyncio.get_running_loop().time() + self.offset

    def utcnow(self) -> datetime:
        return datetime.fromtimestamp(self.clock(), UTC)

    def start(self) -> Incarnation:
        """A new process: a fresh `Peer` on the store's file (or the node's memory store)."""
        self.incarnations += 1
        number = next(self.counter) if self.counter is not None else self.incarnations
        incarnation = Incarnation(self, number)
        self.incarnation = incarnation
        incarnation.boot()
        return incarnation

    def kill(self) -> None:
        """SIGKILL: the process ends where it stands (see `Incarnation.kill`)."""
        incarnation, self.incarnation = self.incarnation, None
        if incarnation is not None:
            incarnation.kill()

    def exit(self, incarnation: Incarnation, why: BaseException) -> None:
        """`incarnation` could not start and exits; its supervisor (systemd, Kubernetes)
        starts the process again a little later, unless someone else has meanwhile."""
        self.trace(f"{self.name}#{incarnation.number} exited: {why}")
        if self.incarnation is not incarnation:
            return  # killed meanwhile
        self.kill()
        self.exited = incarnation

        def again() -> None:
            if self.exited is incarnation and self.incarnation is None:
                self.exited = None
                self.start()

        # In no incarnation's context: the restart is the supervisor's, not the dead one's.
        asyncio.get_running_loop().call_later(
            RESTART_AFTER_EXIT, again, context=contextvars.Context()
        )


class _Watcher(RuntimeListener):
    """Wakes the node's person whenever one of its tasks moves, and keeps the node's ledger
    of the outcomes announced."""

    def __init__(self, wake: asyncio.Event, announced: dict[TaskKey, TaskState]) -> None:
        self.wake = wake
        self.announced = announced

    def on_transition(self, transition: Transition) -> None:
        if transition.to_state.is_final:
            self.announced[transition.key] = transition.to_state
        self.wake.set()


class Incarnation:
    """One run of a node's process (see the module's docstring)."""

    def __init__(self, node: Node, number: int) -> None:
        self.node = node
        self.number = number
        self.alive = True
        #: True once the peer answers POSTs (its store loaded).
        self.serving = False
        #: Stopped (SIGSTOP): its callbacks wait in `parked` (`VirtualTimeLoop.resume`).
        self.paused = False
        self.parked: list[Parked] = []
        self.tasks: set[asyncio.Task[Any]] = set()
        #: The handles `submit` returned here: each must settle while this process lives.
        self.handles: dict[TaskKey, TaskHandle] = {}
        self.context = contextvars.copy_context()
        self.context.run(CURRENT.set, self)
        self._wake = asyncio.Event()
        node_ = node
        if node_.store_factory is not None:
            store: Any = node_.store_factory(node_, number)
        elif node_.path is not None:
            store = SimulatedSqliteStore(node_.path, node_.store_faults)
        else:
            store = node_.store or SimulatedMemoryStore(node_.store_faults)
        node_.store = store
        self.store = store
        self.peer = Peer(
            node_.agent or node_.name,
            partners=[Partner(name, url, (secret,)) for name, url, secret in node_.partners],
            handler=ScriptedHandler(node_),
            endpoint=node_.endpoint or node_.url,
            config=node_.config,
            store=store,
            serve=False,
            ids=node_.ids or CountingIds(prefix=f"{node_.name}{number}-"),
        )
        self.peer.client = HttpClient(
            node_.config,
            clock=node_.utcnow,
            jitter=node_.rng.random,
            post=node_.network.post,
        )
        self.peer.protocol_hooks.append(self._wire_protocol)
        self.peer.server_hooks.append(self._wire_server)
        # With links, the people have addresses: a question is then queued to them, and a
        # link is theirs to open (without, a seed runs as it did before links).
        mailed = node_.links is not None
        self.humans = enable_people(self.peer, mailed=mailed) if node_.people else None
        # There, too, the answers not given through a link are given on the console.
        self.console = (
            enable_people_console(self.peer, self.humans)
            if self.humans is not None and mailed
            else None
        )
        if node_.wire is not None:
            node_.wire(self)

    def _wire_protocol(self, protocol: P2PProtocol) -> None:
        protocol.clock = self.node.clock
        protocol.listeners.append(_Watcher(self._wake, self.node.announced))

    def _wire_server(self, server: SynapseServer) -> None:
        server.utcnow = self.node.utcnow
        server.rate_clock = asyncio.get_running_loop().time

    def adopt(self, task: asyncio.Task[Any]) -> None:
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run `coro` as this incarnation's (a kill cancels it)."""
        return asyncio.get_running_loop().create_task(coro, context=self.context)

    def boot(self) -> None:
        self.spawn(self._run())

    async def _run(self) -> None:
        try:
            await self.peer.start()
        except self.node.exits_on as exc:
            self.node.exit(self, exc)
            return
        if self.humans is not None:
            await self.humans.start()
        if self.node.after_start is not None:
            await self.node.after_start(self)
        self.serving = True
        self.node.trace(f"{self.node.name}#{self.number} started")
        person = self.spawn(self._person())
        for plan in self.node.plans:
            if plan.key not in self.node.submitted:
                self.spawn(self._submit(plan))
        await person

    async def _submit(self, plan: TaskPlan) -> None:
        loop = asyncio.get_running_loop()
        wait = plan.submit_at - loop.time()
        if wait > 0:
            await asyncio.sleep(wait)
        if plan.key in self.node.submitted:
            return
        try:
            handle = await self.peer.submit(
                plan.executor,
                plan.task_type,
                {**plan.script.payload()},
                task_id=plan.task_id,
            )
        except (LocalProtocolError, RemoteProtocolError) as exc:
            self.node.trace(f"submit {plan.task_id} refused: {exc}")
            if self.record(plan.key) is not None:
                # The submit before the crash was durable, and never returned: the caller
                # retrying with its task id learns the task is there, as a real one would.
                self.node.submitted[plan.key] = plan
            return
        self.node.submitted[plan.key] = plan
        self.handles[plan.key] = handle
        self.node.trace(f"{self.node.name}#{self.number} submitted {plan.task_id}")

    async def _person(self) -> None:
        """The person at the requester: answers questions and decisions after a while,
        cancels when the plan says so (once per incarnation)."""
        loop = asyncio.get_running_loop()
        protocol = self.peer.protocol
        mine = self.node.answers_for if self.node.answers_for is not None else self.node.plans
        plans = {plan.key: plan for plan in mine}
        seen: dict[tuple[TaskKey, int], float] = {}
        cancelled: set[TaskKey] = set()
        while True:
            now = loop.time()
            due: list[float] = []
            for rec in protocol.view.records():
                key = rec.key
                plan = plans.get(key)
                if plan is None or rec.is_final or key not in self.node.submitted:
                    continue
                if plan.cancel_at is not None and key not in cancelled:
                    at = plan.submit_at + plan.cancel_at
                    if now >= at:
                        if await self._try_act(key, "cancel", plan):
                            cancelled.add(key)
                        else:
                            due.append(now + PERSON_RETRY)
                        continue
                    due.append(at)
                if rec.state in (TaskState.INFO_NEEDED, TaskState.NEED_HUMAN):
                    asked = seen.setdefault((key, len(rec.history)), now)
                    at = asked + plan.answer_after
                    if now < at:
                        due.append(at)
                    elif not await self._try_act(key, rec.state.value, plan):
                        due.append(now + PERSON_RETRY)
            self._wake.clear()
            timeout = max(0.0, min(due) - loop.time()) if due else None
            try:
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
            except TimeoutError:
                pass

    async def _try_act(self, key: TaskKey, what: str, plan: TaskPlan) -> bool:
        """`_act`, unless the store cannot be read now (the page shows an error): False,
        and the person tries again a little later."""
        try:
            await self._act(key, what, plan)
        except StoreUnavailable as exc:
            self.node.trace(f"{self.node.name}#{self.number} could not {what} {key.task_id}: {exc}")
            return False
        return True

    async def _act(self, key: TaskKey, what: str, plan: TaskPlan) -> None:
        if self.node.siblings and what != "cancel":
            await self._answer_at_two_fronts(key, what, plan)
            return
        handle = self.peer.protocol.handle(key)
        if handle is None:
            return
        try:
            if what == "cancel":
                await handle.cancel("the plan says cancel")
            elif what == TaskState.INFO_NEEDED.value:
                await handle.provide_info({"detail": "x", "more": "y"})
            elif plan.approve:
                await handle.approve()
            else:
                await handle.reject("no")
        except (LocalProtocolError, RemoteProtocolError, NotReady) as exc:
            self.node.trace(f"{self.node.name} could not {what} {key.task_id}: {exc}")
            return
        self.node.trace(f"{self.node.name}#{self.number} person: {what} {key.task_id}")

    def _holder(self, front: Incarnation, key: TaskKey) -> Incarnation | None:
        """Where a person's answer given at `front` lands: the replica holding the task (a
        replica that does not hold the task passes the answer on to the one that does; a
        paused one answers nothing)."""
        for inc in [front, *(n.incarnation for n in self.node.siblings)]:
            if inc is None or not inc.serving or inc.paused:
                continue
            if inc.peer.protocol.handle(key) is not None:
                return inc
        return None

    async def _answer_at_two_fronts(self, key: TaskKey, what: str, plan: TaskPlan) -> None:
        """The person answers the question through this replica and, at the same moment,
        through another one (two tabs, a link and the console): sometimes with the other
        decision. At most one answer may be taken; each one acknowledged must be kept."""
        rec = self.record(key)
        if rec is None or not rec.history:
            return
        question = rec.history[-1].message_id or ""
        others = [
            n.incarnation
            for n in self.node.siblings
            if n.incarnation is not None and n.incarnation.serving and not n.incarnation.paused
        ]
        other = self.node.rng.choice(others) if others else self
        flip = self.node.rng.random() < 0.5
        decisions = (plan.approve, plan.approve != flip)
        # Through the humans service, each front's answer is one reviewer's, routed or not.
        who = [self.node.rng.choice(EVERYONE) if self.node.people else "" for _ in decisions]

        async def answer(front: Incarnation, approve: bool, who: str) -> None:
            holder = self._holder(front, key)
            handle = holder.peer.protocol.handle(key) if holder is not None else None
            if holder is None or handle is None:
                return
            links = self.node.links
            by_link = links is not None and holder.humans is not None and links.random() < 0.75
            if by_link and await self._answer_by_link(holder, key, question, what, approve, who):
                return
            if holder.console is not None and who:  # the seeds with links: else the console
                await self._answer_by_console(holder, key, question, what, approve, who)
                return
            by = DecidedBy(user_id=who) if who else None
            try:
                if what == TaskState.INFO_NEEDED.value:
                    event = Event.SEND_TASK_INFO_PROVIDED
                    told = await handle.provide_info({"detail": "x", "more": "y"}, provided_by=who)
                elif approve:
                    event = Event.SEND_HUMAN_APPROVE
                    told = await handle.approve(decided_by=by)
                else:
                    event = Event.SEND_HUMAN_REJECT
                    told = await handle.reject("no", decided_by=by)
            except (LocalProtocolError, RemoteProtocolError, NotReady) as exc:
                self.node.trace(f"{front.node.name} could not {what} {key.task_id}: {exc}")
                return
            if not decided(told):  # one of a quorum, recorded: not the question's answer
                self.node.trace(f"{front.node.name}#{front.number} {who}: {told}")
                return
            self.node.answers.append(TakenAnswer(key, question, event))
            self.node.trace(f"{front.node.name}#{front.number} person: {event.value} {key.task_id}")

        await asyncio.gather(
            answer(self, decisions[0], who[0]), answer(other, decisions[1], who[1])
        )

    async def _answer_by_link(
        self, holder: Incarnation, key: TaskKey, question: str, what: str, approve: bool, who: str
    ) -> bool:
        """The person's answer to `question` (its message's id) through a link of `who`'s, at
        the replica holding the task; False if `who` has no link to answer with (never told
        of this question). A quarter of the links are those of another question of the task,
        answered long ago."""
        assert holder.humans is not None and self.node.links is not None
        stale = self.node.links.random() < 0.25
        handle = holder.peer.protocol.handle(key)
        asked = holder.humans.question_of(handle.record) if handle is not None else None
        if asked is None or (not stale and who not in told(asked)):
            return False
        decision, event = _decision(what, approve)
        got = await answer_by_link(holder.humans, key, asked.id, who, decision, stale=stale)
        where = f"{holder.node.name}#{holder.number} {who} by link{' (stale)' if stale else ''}"
        if got.status != 200 or not decided(got.text):
            self.node.trace(f"{where}: {got.status} {got.text}")
            return True
        self.node.answers.append(TakenAnswer(key, question, event))
        self.node.trace(f"{where}: {event.value} {key.task_id}")
        return True

    async def _answer_by_console(
        self, holder: Incarnation, key: TaskKey, question: str, what: str, approve: bool, who: str
    ) -> None:
        """The person's answer to `question` as `who`, on the console of the replica holding
        the task (the page's own checks: who may see the task, what it waits for, the body;
        then the same gate)."""
        assert holder.console is not None
        decision, event = _decision(what, approve)
        status, said = await answer_by_console(holder.console, key, who, decision)
        where = f"{holder.node.name}#{holder.number} {who} on the console"
        if status != 200 or not decided(said):
            self.node.trace(f"{where}: {status} {said}")
            return
        self.node.answers.append(TakenAnswer(key, question, event))
        self.node.trace(f"{where}: {event.value} {key.task_id}")

    async def answer(self, body: bytes, headers: CIMultiDict[str]) -> StoredReply:
        """A POST's reply, as the peer's transport server judges it."""
        return await self.peer.server.answer(body, headers, None)

    def answered(self, body: bytes, status: int) -> None:
        """The network saw this incarnation answer a POST: a 200 that applied the message to
        a task is an acknowledgement the store must keep."""
        if status != 200:
            return
        try:
            message = decode_typed(body)
        except RemoteProtocolError:
            return
        protocol = self.peer.protocol
        key = protocol.task_key_of(message)
        if key is None:
            return
        rec = protocol.view.get(key) or protocol.store.get_task(key)
        if rec is not None and any(t.message_id == message.id for t in rec.history):
            self.node.applied.add((key, message.id))

    def kill(self) -> None:
        self.alive = False
        self.serving = False
        if isinstance(self.store, SimulatedSqliteStore):
            self.store.fence()
        elif hasattr(self.store, "die"):
            self.store.die()  # a replica's shared store: its connections close
        for task in list(self.tasks):
            task.cancel()
        self.node.trace(f"{self.node.name}#{self.number} killed")

    def record(self, key: TaskKey) -> TaskRecord | None:
        protocol = self.peer.protocol
        return protocol.view.get(key) or protocol.store.get_task(key)


def _decision(what: str, approve: bool) -> tuple[str, Event]:
    """What a person's answer to a question in state `what` is on a page (provide, approve,
    reject), and the event it sends."""
    if what == TaskState.INFO_NEEDED.value:
        return "provide", Event.SEND_TASK_INFO_PROVIDED
    if approve:
        return "approve", Event.SEND_HUMAN_APPROVE
    return "reject", Event.SEND_HUMAN_REJECT


def first_final(rec: TaskRecord) -> int | None:
    """The index of the transition that made `rec` final (None if it never was)."""
    return next((i for i, t in enumerate(rec.history) if t.to_state.is_final), None)


__all__ = [
    "CURRENT",
    "EPOCH",
    "JOB",
    "RESUMABLE_JOB",
    "Effect",
    "Incarnation",
    "Node",
    "Script",
    "ScriptedHandler",
    "TakenAnswer",
    "TaskPlan",
    "first_final",
    "install_task_factory",
]
