"""The system the model checker explores: two real engines, the runtime's delivery rules
around each, a network that loses, duplicates and reorders, timers, people and handlers.

A `World` is one state of one task between a requester R and an executor E. `World.moves()`
lists what can happen next (each a `Move`: a small frozen value naming the event);
`World.after(move)` is the state it leads to, a copy (an explored world never changes), with
the violations the move revealed; `synapse.model.fingerprint` tells when two worlds are the
same state.

The engines are `synapse.p2p.engine.Engine`s, the code a peer runs. What the runtime does
with an engine's `Step` (`synapse.runtime.protocol.P2PProtocol.apply`) is `Side.carry_out`,
rule for rule: the step's drops first, then its messages queued behind the task's others in
a `synapse.p2p.delivery.TaskQueue` (one on the wire at a time), its handler started, resumed
or cancelled. A POST is judged as `SynapseServer` judges it: the deduplication table first
(a retry gets the stored reply), then the engine, whose effect is committed, or rolled back
when the commit fails (the message is then refused with 503 and sent again).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from synapse.model.bounds import Bounds
from synapse.p2p.commands import (
    Cancel,
    Complete,
    Decide,
    Fail,
    ProvideInfo,
    ReportStatus,
    RequestHuman,
    RequestInfo,
    StartDeciding,
    Submit,
)
from synapse.p2p.config import P2PConfig
from synapse.p2p.delivery import TaskQueue
from synapse.p2p.engine import (
    CancelExecution,
    DropQueued,
    Engine,
    EngineTimer,
    ResumeExecution,
    StartExecution,
    Step,
    TaskEvent,
    TaskKey,
    Validation,
)
from synapse.p2p.states import TransitionError, next_state
from synapse.types import (
    DecidedBy,
    DecisionAction,
    ErrorCode,
    HumanOption,
    LocalProtocolError,
    Message,
    MessageType,
    MissingField,
    Nack,
    NackError,
    NackPayload,
    Reason,
    TaskError,
    TaskRequest,
    TaskResult,
    TaskState,
    build_reply,
)
from synapse.types.codec import CountingIds

R, E = "r", "e"
TASK_TYPE = "job"
T0 = 1_000_000.0

#: What each role POSTs about a task (specs/protocol.md, 'Message types').
SENDS: dict[str, frozenset[MessageType]] = {
    R: frozenset(
        {
            MessageType.TASK_REQUEST,
            MessageType.TASK_INFO_PROVIDED,
            MessageType.HUMAN_DECISION,
            MessageType.TASK_CANCEL,
        }
    ),
    E: frozenset(
        {
            MessageType.TASK_STATUS_UPDATE,
            MessageType.TASK_NEED_INFO,
            MessageType.TASK_NEED_HUMAN,
            MessageType.TASK_COMPLETE,
            MessageType.TASK_FAILED,
        }
    ),
}


# --- moves -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Move:
    """One event: `kind`, on `side`, about network item `item` (an index), with `choice`."""

    kind: str
    side: str = ""
    item: int = -1
    choice: str = ""

    def describe(self, world: World) -> str:
        """The event in words, for a trace."""
        if self.item >= 0:
            return f"{self.kind} {world.net[self.item].describe(world)}" + (
                f" ({self.choice})" if self.choice else ""
            )
        who = {R: "requester", E: "executor", "": ""}[self.side]
        return " ".join(p for p in (who, self.kind, self.choice) if p)


#: Moves that are faults (or long waits): liveness is judged without them.
FAULTS = frozenset(
    {
        "lose",
        "stall",
        "deliver, commit failing",
        "exhaust",
        "wait past dedup",
        "was never sent",
        "timer, messages late",
    }
)
#: Moves a person may or may not make: liveness is judged without them too.
OPTIONAL = frozenset({"cancel"})


# --- the network ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Post:
    """A POST on its way from `sender`: `message`, of the sender's attempt `attempt`."""

    sender: str
    message: Message
    attempt: int

    def describe(self, world: World) -> str:
        return f"{_side_name(self.sender)} POST {world.name(self.message)}"

    def key(self, world: World, names: dict[str, str]) -> tuple[Any, ...]:
        current = self.attempt == world.side(self.sender).attempt
        return ("post", self.sender, names[self.message.id], current)


@dataclass(frozen=True, slots=True)
class ReplyOnTheWay:
    """The reply to a POST of `sender`'s, on its way back."""

    sender: str
    sent: Message
    reply: Message
    status: int
    attempt: int

    def describe(self, world: World) -> str:
        sender = _side_name(self.sender)
        return f"reply {reply_kind(self.reply)} to {sender}'s {world.name(self.sent)}"

    def key(self, world: World, names: dict[str, str]) -> tuple[Any, ...]:
        current = self.attempt == world.side(self.sender).attempt
        return ("reply", self.sender, names[self.sent.id], reply_kind(self.reply), current)


Item = Post | ReplyOnTheWay


def _side_name(side: str) -> str:
    return {R: "requester", E: "executor"}[side]


def reply_kind(message: Message) -> str:
    """A reply's kind, as the answered-alike rule compares them: its type and nack code."""
    if isinstance(message, Nack):
        return f"nack {message.payload.code}"
    state = getattr(message.payload, "state", None)
    suffix = f" {state.value}" if isinstance(state, TaskState) else ""
    return message.message_type.value.removeprefix("p2p:") + suffix


# --- the runtime around one engine ---------------------------------------------------------------


class _Plan:
    """What the executor's `validate_task` answers next (set by the move being explored)."""

    verdict = "accept"


PLAN = _Plan()


def _validate(task_type: str, payload: dict[str, Any]) -> Validation:
    if PLAN.verdict == "reject":
        return Validation(ok=False)
    if PLAN.verdict == "need_info":
        return Validation(missing_fields=[MissingField(field="x")], question="x?")
    return Validation()


@dataclass(slots=True)
class Side:
    """One peer: its engine and what its runtime holds for the task."""

    name: str
    engine: Engine
    queue: TaskQueue[Message] = field(default_factory=TaskQueue)
    #: The current delivery attempt of the head: a reply to an older one is stale.
    attempt: int = 0
    #: Message id → (the reply it got, when): the deduplication table.
    dedup: dict[str, tuple[Message, int, float]] = field(default_factory=dict)
    #: "idle", "running", "waiting" or "stopped" (E's handler).
    handler: str = "idle"
    #: Handler moves left: progress updates, questions, decisions asked for.
    progress_left: int = 0
    info_left: int = 0
    human_left: int = 0
    #: R: final outcomes the handle was told of.
    outcomes: int = 0
    #: Retries ran out: the queue waits for the partner's next heartbeat.
    parked: bool = False
    #: (message id, attempt) of a POST let go of by a drop: it was on the wire, or about to
    #: be sent and never was.
    withdrawable: tuple[str, int] | None = None

    def copy(self) -> Side:
        twin = object.__new__(Side)
        for name in Side.__slots__:
            setattr(twin, name, getattr(self, name))
        twin.engine = self.engine.clone()
        twin.queue = self.queue.copy()
        twin.dedup = dict(self.dedup)
        return twin

    @property
    def key(self) -> TaskKey:
        return TaskKey(R, "t")

    def record(self) -> Any:
        return self.engine.get(self.key)

    def state(self) -> TaskState | None:
        rec = self.record()
        return rec.state if rec is not None else None

    def carry_out(self, step: Step, world: World) -> None:
        """What `P2PProtocol.apply` does with `step` (see the module docstring)."""
        world.check_step(self, step)
        for action in step.actions:
            if isinstance(action, DropQueued):
                head, sending = self.queue.head, self.queue.sending
                self.queue.drop()  # before the step's own messages are queued
                if head is not None and sending:
                    # On the wire, or still about to be sent: either may be true.
                    self.withdrawable = (head.id, self.attempt)
                self.attempt += 1  # a POST in progress is not retried
        for out in step.outgoing:
            if out.key is not None:
                world.learn(out.message)
                self.queue.push(out.message)
        for action in step.actions:
            if isinstance(action, TaskEvent):
                if action.state.is_final:
                    self.outcomes += 1
                    if self.outcomes > 1:
                        world.violation("outcome_reported_once", "a second final outcome")
            elif isinstance(action, StartExecution):
                self.handler = "running"
            elif isinstance(action, ResumeExecution):
                if self.handler == "waiting":
                    self.handler = "running"
            elif isinstance(action, CancelExecution) and self.handler in ("running", "waiting"):
                self.handler = "stopped"
        if step.reply is not None:
            world.learn(step.reply)
        world.flush(self)


# --- the world ---------------------------------------------------------------------------------


@dataclass(slots=True)
class World:
    """One state: both sides, the network, the clock and what faults are left."""

    r: Side
    e: Side
    bounds: Bounds
    net: tuple[Item, ...] = ()
    now: float = T0
    losses: int = 0
    stalls: int = 0
    failures: int = 0
    waits: int = 0
    cancels: int = 0
    exhaustions: int = 0
    lates: int = 0
    #: (receiver, message id) → the kind of the first final answer it got.
    answers: dict[tuple[str, str], str] = field(default_factory=dict)
    #: Message id → "sender type n": every message seen, named for traces (kept only when
    #: a trace is replayed: exploration does without).
    names: dict[str, str] = field(default_factory=dict)
    naming: bool = False
    #: What the move that made this world revealed (not part of the state).
    violations: list[tuple[str, str]] = field(default_factory=list)
    #: The sides this world copied from its parent's (see `_own`).
    owned: set[str] = field(default_factory=lambda: {R, E})
    #: The world this one was made from, while its move is applied.
    parent: World | None = None

    @classmethod
    def initial(cls, bounds: Bounds, *, naming: bool = False) -> World:
        config = P2PConfig(
            task_timeout=bounds.task_timeout,
            input_timeout=bounds.input_timeout,
            dedup_window=bounds.dedup_window,
            replay_window=bounds.dedup_window / 2,
        )
        r_engine = Engine(agent_id=R, endpoint="http://r/cb", config=config, ids=CountingIds("r"))
        e_engine = Engine(
            agent_id=E,
            endpoint="http://e/cb",
            config=config,
            ids=CountingIds("e"),
            validator=_validate,
            capabilities=lambda: [TASK_TYPE],
        )
        world = cls(
            r=Side(R, r_engine),
            e=Side(
                E,
                e_engine,
                progress_left=bounds.progress,
                info_left=bounds.questions,
                human_left=bounds.decisions,
            ),
            bounds=bounds,
            naming=naming,
        )
        _, step = r_engine.submit(Submit(E, TASK_TYPE, {}, task_id="t"), world.now)
        world.r.carry_out(step, world)
        return world

    # --- helpers --------------------------------------------------------------------------

    def side(self, name: str) -> Side:
        return self.r if name == R else self.e

    def other(self, name: str) -> Side:
        return self.e if name == R else self.r

    def learn(self, message: Message) -> None:
        if self.naming and message.id not in self.names:
            sender = "R" if message.from_.agent_id == R else "E"
            kind = message.message_type.value.removeprefix("p2p:")
            count = sum(1 for n in self.names.values() if n.startswith(f"{sender} {kind} "))
            self.names[message.id] = f"{sender} {kind} #{count + 1}"

    def name(self, message: Message) -> str:
        return self.names.get(message.id, message.id)

    def violation(self, invariant: str, text: str) -> None:
        self.violations.append((invariant, text))

    def copy(self) -> World:
        """A world that shares this one's sides until a move changes one (`_own`)."""
        return replace(
            self,
            answers=dict(self.answers),
            names=dict(self.names) if self.naming else self.names,
            violations=[],
            owned=set(),
        )

    def _own(self, *names: str) -> None:
        """Copy the sides a move is about to change (the others stay shared)."""
        for name in names:
            if name not in self.owned:
                self.owned.add(name)
                if name == R:
                    self.r = self.r.copy()
                else:
                    self.e = self.e.copy()

    def check_step(self, side: Side, step: Step) -> None:
        """Every transition of a step is one of the table's."""
        for t in step.transitions:
            try:
                ok = next_state(t.role, t.from_state, t.event) is t.to_state
            except TransitionError:
                ok = False
            if not ok:
                self.violation(
                    "transitions_in_the_table",
                    f"{side.name}: {t.from_state.value} --{t.event.value}--> {t.to_state.value}",
                )

    # --- what can happen ---------------------------------------------------------------------

    def moves(self) -> Iterator[Move]:
        bounds = self.bounds
        for side in (self.r, self.e):
            if side.queue.sending and self.stalls < bounds.stalls:
                yield Move("stall", side.name)
            if side.queue.sending and self.exhaustions < bounds.exhaustions:
                yield Move("exhaust", side.name)
            if side.parked:
                yield Move("partner answers again", side.name)
        for index, item in enumerate(self.net):
            if isinstance(item, Post) and self._dropped(item):
                yield Move("was never sent", item=index)
            if isinstance(item, Post):
                for verdict in self._verdicts(item):
                    yield Move("deliver", item=index, choice=verdict)
                if self.failures < bounds.failures:
                    yield Move("deliver, commit failing", item=index)
            else:
                yield Move("receive", item=index)
            if self.losses < bounds.losses:
                yield Move("lose", item=index)
        if self._next_timer() is not None:
            # Time passes: at once when nothing is on its way; while messages are, they are
            # late past a timeout (a fault, bounded).
            if not self.net:
                yield Move("timer")
            elif self.lates < bounds.lates:
                yield Move("timer, messages late")
        if self.waits < bounds.waits:
            yield Move("wait past dedup")
        yield from self._people()
        yield from self._handler()

    def _verdicts(self, post: Post) -> list[str]:
        """The executor's possible answers when a POST makes it validate the task."""
        message = post.message
        if post.sender != R:
            return [""]
        rec = self.e.record()
        if isinstance(message, TaskRequest) and rec is None:
            return ["accept", "reject", "need_info"]
        if (
            message.message_type is MessageType.TASK_INFO_PROVIDED
            and rec is not None
            and rec.state is TaskState.INFO_NEEDED
            and not rec.handler_started
            and message.id not in self.e.dedup
        ):
            # validate_task runs again on the fields provided: enough, or ask again.
            return ["accept", "reject"] + (["need_info"] if self.e.info_left > 0 else [])
        return [""]

    def _people(self) -> Iterator[Move]:
        rec = self.r.record()
        if rec is None or rec.is_final:
            return
        if self.cancels < self.bounds.cancels and not rec.cancel_requested:
            yield Move("cancel", R)
        if rec.state is TaskState.INFO_NEEDED:
            yield Move("provide info", R)
        if rec.state is TaskState.NEED_HUMAN:
            yield Move("start deciding", R)
        if rec.state in (TaskState.NEED_HUMAN, TaskState.HUMAN_DECIDING):
            yield Move("approve", R)
            yield Move("reject", R)

    def _handler(self) -> Iterator[Move]:
        e = self.e
        rec = e.record()
        if e.handler != "running" or rec is None or rec.is_final:
            return
        if e.progress_left > 0:
            yield Move("report progress", E)
        if e.info_left > 0:
            yield Move("ask for information", E)
        if e.human_left > 0:
            yield Move("ask a person", E)
        yield Move("complete", E)
        yield Move("fail", E)

    def _next_timer(self) -> float | None:
        found = [
            when
            for side in (self.r, self.e)
            for (kind, _), when in side.engine.timer_deadlines().items()
            if kind is not EngineTimer.HEARTBEAT
        ]
        return min(found) if found else None

    # --- what happens ------------------------------------------------------------------------

    def after(self, move: Move) -> World:
        world = self.copy()
        world.parent = self
        try:
            world._apply(move)
        except LocalProtocolError as exc:  # our bug: an engine refused its own step
            world.violation("no_local_protocol_error", f"{type(exc).__name__}: {exc}")
        world.parent = None
        return world

    def _apply(self, move: Move) -> None:
        kind = move.kind
        if move.side:
            self._own(move.side)
        elif move.item >= 0:
            item = self.net[move.item]
            if isinstance(item, ReplyOnTheWay) or kind == "lose":
                self._own(item.sender)
            if isinstance(item, Post) and kind != "lose":
                self._own(E if item.sender == R else R)
        else:
            self._own(R, E)
        if kind == "stall":
            self.stalls += 1
            side = self.side(move.side)
            side.queue.retry()
            side.attempt += 1  # the POST may still arrive: its retry will be a duplicate
            self.flush(side)
        elif kind == "exhaust":
            self.exhaustions += 1
            side = self.side(move.side)
            head = side.queue.head
            assert head is not None
            side.queue.retry()
            side.attempt += 1
            side.parked = True  # until the partner's next heartbeat is answered
            side.carry_out(side.engine.on_undeliverable(head, self.now, "model"), self)
        elif kind == "partner answers again":
            side = self.side(move.side)
            side.parked = False
            self.flush(side)
        elif kind == "was never sent":
            # The POST of a message its sender let go of before its worker sent it.
            item = self.net[move.item]
            self.net = self.net[: move.item] + self.net[move.item + 1 :]
            self._own(item.sender)
            self.side(item.sender).withdrawable = None
        elif kind in ("deliver", "deliver, commit failing"):
            post = self.net[move.item]
            assert isinstance(post, Post)
            self.net = self.net[: move.item] + self.net[move.item + 1 :]
            if kind != "deliver":
                self.failures += 1
            self._deliver(post, commit=kind == "deliver", verdict=move.choice)
        elif kind == "receive":
            reply = self.net[move.item]
            assert isinstance(reply, ReplyOnTheWay)
            self.net = self.net[: move.item] + self.net[move.item + 1 :]
            self._receive(reply)
        elif kind == "lose":
            item = self.net[move.item]
            self.net = self.net[: move.item] + self.net[move.item + 1 :]
            self.losses += 1
            sender = self.side(item.sender)
            if item.attempt == sender.attempt and sender.queue.sending:
                sender.queue.retry()  # the client times out and sends it again
                sender.attempt += 1
                self.flush(sender)
        elif kind in ("timer", "timer, messages late"):
            if kind != "timer":
                self.lates += 1
            when = self._next_timer()
            assert when is not None
            self._advance(when)
        elif kind == "wait past dedup":
            self.waits += 1
            self._advance(self.now + self.bounds.dedup_window + 1)
        else:
            self._person_or_handler(move)

    def flush(self, side: Side) -> None:
        """The delivery worker sends the head of the queue as soon as it may. (That it may
        also be late is the network's delay; that a message let go of before it was sent
        never arrives is the move "was never sent".)"""
        if side.queue and not side.queue.sending and not side.parked:
            self._send(side)

    def _dropped(self, post: Post) -> bool:
        """The POST of a message its sender let go of while it was being sent."""
        return self.side(post.sender).withdrawable == (post.message.id, post.attempt)

    def _send(self, side: Side) -> None:
        message = side.queue.start_sending()
        rec = side.record()
        if message.message_type not in SENDS[side.name]:
            self.violation(
                "messages_sent_legally",
                f"{side.name} POSTs {message.message_type.value}, not one of its role's",
            )
        if (
            side.name == E
            and rec is not None
            and rec.state is TaskState.CANCELLED
            and rec.history
            and rec.history[-1].event.value == "recv task_cancel"
        ):
            self.violation(
                "nothing_after_a_cancel",
                f"the executor POSTs {self.name(message)} after acknowledging the cancel",
            )
        self.net = (*self.net, Post(side.name, message, side.attempt))

    def _deliver(self, post: Post, *, commit: bool, verdict: str) -> None:
        """The receiver judges a POST, as `SynapseServer._answer` and
        `P2PProtocol.handle_message` do."""
        receiver = self.other(post.sender)
        message = post.message
        stored = receiver.dedup.get(message.id)
        if stored is not None:
            self._answer(post, receiver, stored[0], stored[1])
            return
        engine = receiver.engine
        # The receiver as it was before this move (the parent world's, untouched).
        parent = self.parent
        before_engine = parent.side(receiver.name).engine if parent is not None else None
        PLAN.verdict = verdict or "accept"
        checkpoint = engine.checkpoint(message)
        try:
            step = engine.receive(message, self.now)
        except NackError as refused:
            if before_engine is not None and engine.snapshot() != before_engine.snapshot():
                self.violation(
                    "a_refusal_changes_nothing",
                    f"{receiver.name} refused {self.name(message)} ({refused.code.value}) "
                    "and changed",
                )
            nack = self._nack(receiver, message, refused.code, refused.message)
            receiver.dedup[message.id] = (nack, refused.http_status, self.now)
            self._answer(post, receiver, nack, refused.http_status)
            return
        if not commit:
            after = engine.counted(checkpoint)
            engine.rollback(checkpoint, after)
            if before_engine is not None:
                before, now = before_engine.snapshot(), engine.snapshot()
                if now != before:
                    self.violation(
                        "a_failed_commit_changes_nothing",
                        f"{receiver.name}'s commit of {self.name(message)} failed, and the "
                        "rolled-back engine differs from one that never saw it: "
                        + _difference(before, now),
                    )
            nack = self._nack(receiver, message, ErrorCode.AGENT_NOT_READY, "store down")
            self._answer(post, receiver, nack, 503)
            return
        receiver.carry_out(step, self)
        assert step.reply is not None
        receiver.dedup[message.id] = (step.reply, 200, self.now)
        self._answer(post, receiver, step.reply, 200)

    def _nack(self, receiver: Side, message: Message, code: ErrorCode, text: str) -> Nack:
        nack: Nack = build_reply(
            Nack,
            NackPayload(code=code.value, message=text),
            request=message,
            sender=receiver.engine.sender,
            timestamp=datetime.fromtimestamp(self.now, UTC),
            message_id=receiver.engine.ids.message_id(),
        )
        self.learn(nack)
        return nack

    def _answer(self, post: Post, receiver: Side, reply: Message, status: int) -> None:
        """The reply goes back; a final answer must be the same for every copy of a message."""
        if status < 500 and status != 429:
            said = self.answers.setdefault((receiver.name, post.message.id), reply_kind(reply))
            now_said = reply_kind(reply)
            if said != now_said:
                self.violation(
                    "a_retry_is_answered_alike",
                    f"{self.name(post.message)} was answered {said!r} first, then {now_said!r}",
                )
        sender = self.side(post.sender)
        if post.attempt == sender.attempt and sender.queue.head is post.message:
            self.net = (
                *self.net,
                ReplyOnTheWay(post.sender, post.message, reply, status, post.attempt),
            )
        # Else the sender gave up on this attempt (or let the message go): the reply would be
        # read and ignored, so it is not kept (one state, not one per moment it may arrive).

    def _receive(self, reply: ReplyOnTheWay) -> None:
        """The sender reads the reply, as `P2PProtocol._deliver` does."""
        side = self.side(reply.sender)
        if reply.attempt != side.attempt or side.queue.head is not reply.sent:
            return  # an attempt already given up on, or a message dropped meanwhile
        if reply.status >= 500 or reply.status == 429:
            side.queue.retry()  # the client's retry: sent again, same id
            side.attempt += 1
            self.flush(side)
            return
        side.queue.answered(reply.sent)
        side.attempt += 1
        side.carry_out(side.engine.on_reply(reply.sent, reply.reply, self.now), self)
        self.flush(side)

    def _advance(self, when: float) -> None:
        self.now = max(self.now, when)
        for side in (self.r, self.e):
            side.carry_out(side.engine.on_timer(self.now), self)
            horizon = self.now - self.bounds.dedup_window
            side.dedup = {k: v for k, v in side.dedup.items() if v[2] > horizon}

    def _person_or_handler(self, move: Move) -> None:
        kind, now = move.kind, self.now
        if move.side == R:
            r = self.r
            key = r.key
            if kind == "cancel":
                self.cancels += 1
                step = r.engine.handle(Cancel(key, reason="changed my mind"), now)
            elif kind == "provide info":
                step = r.engine.handle(ProvideInfo(key, {"x": 1}), now)
            elif kind == "start deciding":
                step = r.engine.handle(StartDeciding(key), now)
            else:
                action = DecisionAction.APPROVE if kind == "approve" else DecisionAction.REJECT
                step = r.engine.handle(
                    Decide(
                        key,
                        action,
                        decided_by=DecidedBy(user_id="alice"),
                        decision_id=f"dec-{kind}",
                        approved_fields={"ok": True} if kind == "approve" else None,
                        rejection_reason="" if kind == "approve" else "no",
                    ),
                    now,
                )
            r.carry_out(step, self)
            return
        e = self.e
        key = e.key
        if kind == "report progress":
            e.progress_left -= 1
            step = e.engine.handle(ReportStatus(key, progress=50.0), now)
        elif kind == "ask for information":
            e.info_left -= 1
            e.handler = "waiting"
            step = e.engine.handle(RequestInfo(key, [MissingField(field="y")]), now)
        elif kind == "ask a person":
            e.human_left -= 1
            e.handler = "waiting"
            step = e.engine.handle(
                RequestHuman(
                    key,
                    Reason(code="review", message="review?"),
                    options=[HumanOption(field="ok", value=True)],
                ),
                now,
            )
        elif kind == "complete":
            e.handler = "stopped"
            step = e.engine.handle(
                Complete(key, TaskResult(output_type="text", output="done")), now
            )
        else:
            e.handler = "stopped"
            error = TaskError(code="execution_failed", message="failed", recoverable=True)
            step = e.engine.handle(Fail(key, error), now)
        if step.discarded:
            e.handler = "stopped"  # a late call about a final task: the handler is gone
        e.carry_out(step, self)


def _difference(before: Any, after: Any) -> str:
    """Where two engine snapshots differ, for a violation's text."""
    parts = []
    for name in before.__struct_fields__:
        if getattr(before, name) != getattr(after, name):
            parts.append(f"{name}: {getattr(before, name)!r} → {getattr(after, name)!r}")
    return "; ".join(parts)[:600]


Invariant = Callable[[World], str | None]

__all__ = [
    "FAULTS",
    "OPTIONAL",
    "E",
    "Move",
    "Post",
    "R",
    "ReplyOnTheWay",
    "Side",
    "World",
    "reply_kind",
]
