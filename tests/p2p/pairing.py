"""Two sans-IO engines wired back to back on a fake clock, no sockets.

Like wsproto's tests pair a client and a server, a `Pair` hands each `Step`'s outgoing messages
to the other engine's `receive` and the synchronous reply (or the `nack` a refusal becomes) back
to the sender's `on_reply`. Messages wait in a per-side outbox until a test delivers them, so a
test can look at every message, reply and state in between, hold a reply back (the race of a
callback with the synchronous reply), or drop messages (a silent partner).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

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
from synapse.p2p.engine import (
    Action,
    DropQueued,
    Engine,
    Outgoing,
    StartExecution,
    Step,
    TaskKey,
    TaskRecord,
    Validation,
)
from synapse.types import (
    CountingIds,
    DecidedBy,
    DecisionAction,
    ErrorCode,
    HumanOption,
    Message,
    MessageType,
    MissingField,
    Nack,
    NackError,
    NackPayload,
    Reason,
    TaskError,
    TaskResult,
    TaskState,
    build_reply_now,
)

#: 2026-01-01T00:00:00Z: the fake clock starts here (engine time is epoch seconds).
T0 = 1_767_225_600.0
R_ID = "agent-r"
E_ID = "agent-e"
DEMO_TYPES = ("echo", "slow", "text_generation", "portrait", "fail")


def at(now: float) -> datetime:
    """The fake-clock time `now` as the datetime deadlines are written in."""
    return datetime.fromtimestamp(now, UTC)


def style_missing() -> MissingField:
    return MissingField(
        field="style",
        reason="未指定生成风格",
        suggested_value="古典",
        alternatives=["现代", "浪漫"],
    )


def demo_validator(task_type: str, payload: dict[str, Any]) -> Validation:
    """The demo handler's ValidateTask: `text_generation` needs a `style` (specs/protocol.md,
    'The demo handler')."""
    if task_type == "text_generation" and "style" not in payload:
        return Validation(missing_fields=[style_missing()], question="请选择生成风格")
    return Validation()


def nack_for(receiver: Engine, message: Message, error: NackError) -> Nack:
    """The `nack` the transport answers a refused message with."""
    payload = NackPayload(code=error.code.value, message=error.message, details=error.details)
    nack: Nack = build_reply_now(Nack, payload, request=message, sender=receiver.sender)
    return nack


@dataclass
class Exchange:
    """One POST: the message, the receiver's reply and step, and (once applied) the sender's."""

    sender: str
    outgoing: Outgoing
    reply: Message
    step: Step
    error: NackError | None = None
    reply_step: Step | None = None

    @property
    def message(self) -> Message:
        return self.outgoing.message


@dataclass
class Snapshot:
    """What a refused message must leave alone on one engine: every task's state, history and
    bookkeeping, the engine's counters and its next timer, and what it knows of its partners
    (reachable or not, when last heard, whether messages for them wait): a refused message
    is no sign of life."""

    tasks: dict[TaskKey, tuple[Any, ...]] = field(default_factory=dict)
    counters: tuple[Any, ...] = ()
    partners: tuple[Any, ...] = ()

    @classmethod
    def of(cls, engine: Engine, *, liveness: bool = True) -> Snapshot:
        """`liveness=False` leaves out the partners: for an accepted message that must change
        nothing else (an accepted message is a sign of life)."""
        tasks = {
            key: (
                r.state,
                tuple(r.history),
                r.need_human_id,
                dict(r.provided),
                r.handler_started,
                r.cancel_requested,
                r.cancel_sent,
                r.executed_time,
                r.executing_since,
                r.result,
                r.error,
            )
            for key, r in engine.tasks.items()
        }
        partners = {r.partner for r in engine.tasks.values()}
        counters = (
            engine.active_executor_tasks(),
            tuple(sorted((p, engine.in_flight_with(p)) for p in partners)),
            engine.next_deadline(),
        )
        if not liveness:
            return cls(tasks, counters)
        partners = tuple(
            sorted(
                (p, engine.is_reachable(p), lv.last_heard, p in engine._backlog)
                for p, lv in engine._partners.items()
            )
        )
        return cls(tasks, counters, (partners, frozenset(engine._backlog)))


class Pair:
    """A requester engine `r` (agent `R_ID`) and an executor engine `e` (agent `E_ID`)."""

    def __init__(
        self,
        *,
        capabilities: Sequence[str] = DEMO_TYPES,
        validator: Callable[[str, dict[str, Any]], Validation] = demo_validator,
        r_config: P2PConfig | None = None,
        e_config: P2PConfig | None = None,
        now: float = T0,
        deterministic_ids: bool = False,
    ) -> None:
        self.now = now
        caps = list(capabilities)
        self.r = Engine(
            agent_id=R_ID,
            endpoint="http://r.test/synapse/callback",
            config=r_config,
            capabilities=lambda: caps,
            ids=CountingIds("r") if deterministic_ids else None,
        )
        self.e = Engine(
            agent_id=E_ID,
            endpoint="http://e.test/synapse/callback",
            config=e_config,
            validator=validator,
            capabilities=lambda: caps,
            ids=CountingIds("e") if deterministic_ids else None,
        )
        self.outbox: dict[str, list[Outgoing]] = {R_ID: [], E_ID: []}
        self.actions: dict[str, list[Action]] = {R_ID: [], E_ID: []}
        self.log: list[Exchange] = []

    # --- plumbing ----------------------------------------------------------------------------

    def engine(self, side: str) -> Engine:
        return self.r if side == R_ID else self.e

    def peer(self, side: str) -> Engine:
        return self.e if side == R_ID else self.r

    def absorb(self, engine: Engine, step: Step) -> Step:
        """Queue `step`'s outgoing messages at `engine`'s side and record its actions."""
        side = engine.agent_id
        for action in step.actions:
            if isinstance(action, DropQueued):
                self.outbox[side] = [o for o in self.outbox[side] if o.key != action.key]
        self.outbox[side].extend(step.outgoing)
        self.actions[side].extend(step.actions)
        return step

    def queued(self, side: str) -> list[MessageType]:
        return [o.message.message_type for o in self.outbox[side]]

    def post(self, side: str, index: int = 0) -> Exchange:
        """POST `side`'s queued message at `index` to the other engine; hold the reply back."""
        outgoing = self.outbox[side].pop(index)
        receiver = self.peer(side)
        try:
            step = receiver.receive(outgoing.message, self.now)
        except NackError as exc:
            exchange = Exchange(side, outgoing, nack_for(receiver, outgoing.message, exc), Step())
            exchange.error = exc
        else:
            assert step.reply is not None, "every POST gets a synchronous reply"
            assert step.reply.reply_to == outgoing.message.id
            exchange = Exchange(side, outgoing, step.reply, self.absorb(receiver, step))
        self.log.append(exchange)
        return exchange

    def answer(self, exchange: Exchange) -> Step:
        """Hand `exchange`'s reply to its sender's `on_reply`."""
        sender = self.engine(exchange.sender)
        exchange.reply_step = self.absorb(
            sender, sender.on_reply(exchange.message, exchange.reply, self.now)
        )
        return exchange.reply_step

    def deliver(self, side: str, index: int = 0) -> Exchange:
        """POST `side`'s next queued message and apply the reply."""
        exchange = self.post(side, index)
        self.answer(exchange)
        return exchange

    def deliver_all(self, limit: int = 1000) -> list[Exchange]:
        """Deliver everything queued on both sides (and what that causes) until quiet."""
        done: list[Exchange] = []
        while self.outbox[R_ID] or self.outbox[E_ID]:
            for side in (R_ID, E_ID):
                if self.outbox[side]:
                    done.append(self.deliver(side))
            assert len(done) < limit, "delivery does not settle"
        return done

    def drop(self, side: str) -> list[Outgoing]:
        """Lose everything queued at `side` (a partner that does not answer)."""
        lost, self.outbox[side] = self.outbox[side], []
        return lost

    def advance(self, seconds: float) -> tuple[Step, Step]:
        """Move the fake clock and fire both engines' due timers."""
        self.now += seconds
        return (
            self.absorb(self.r, self.r.on_timer(self.now)),
            self.absorb(self.e, self.e.on_timer(self.now)),
        )

    # --- looking ------------------------------------------------------------------------------

    def rec(self, side: str, key: TaskKey) -> TaskRecord:
        record = self.engine(side).get(key)
        assert record is not None
        return record

    def states(self, key: TaskKey) -> tuple[TaskState | None, TaskState | None]:
        r, e = self.r.get(key), self.e.get(key)
        return (r.state if r else None, e.state if e else None)

    def starts(self, key: TaskKey) -> int:
        return sum(isinstance(a, StartExecution) and a.key == key for a in self.actions[E_ID])

    # --- requester commands -------------------------------------------------------------------

    def submit(
        self, task_type: str = "echo", payload: Mapping[str, Any] | None = None, **kw: Any
    ) -> TaskKey:
        key, step = self.r.submit(Submit(E_ID, task_type, payload, **kw), self.now)
        self.absorb(self.r, step)
        return key

    def provide_info(self, key: TaskKey, fields: Mapping[str, Any]) -> Step:
        return self.absorb(self.r, self.r.handle(ProvideInfo(key, fields), self.now))

    def start_deciding(self, key: TaskKey) -> Step:
        return self.absorb(self.r, self.r.handle(StartDeciding(key), self.now))

    def decide(self, key: TaskKey, action: DecisionAction, **kw: Any) -> Step:
        kw.setdefault("decided_by", DecidedBy(user_id="user-123", user_name="张三"))
        kw.setdefault("decision_id", f"dec-{len(self.log)}")
        return self.absorb(self.r, self.r.handle(Decide(key, action, **kw), self.now))

    def cancel(self, key: TaskKey, reason: str | None = None) -> Step:
        return self.absorb(self.r, self.r.handle(Cancel(key, reason=reason), self.now))

    # --- executor (handler) commands ----------------------------------------------------------

    def report_status(self, key: TaskKey, **kw: Any) -> Step:
        return self.absorb(self.e, self.e.handle(ReportStatus(key, **kw), self.now))

    def request_info(self, key: TaskKey, **kw: Any) -> Step:
        kw.setdefault("missing_fields", [style_missing()])
        return self.absorb(self.e, self.e.handle(RequestInfo(key, **kw), self.now))

    def request_human(self, key: TaskKey, **kw: Any) -> Step:
        kw.setdefault("reason", Reason(code="ethical_decision", message="涉及伦理决策需要人工审核"))
        kw.setdefault("options", [HumanOption(field="authorized", value=True, confidence=70)])
        return self.absorb(self.e, self.e.handle(RequestHuman(key, **kw), self.now))

    def complete(self, key: TaskKey, output: Any = "done") -> Step:
        result = TaskResult(output_type="text", output=output)
        return self.absorb(self.e, self.e.handle(Complete(key, result), self.now))

    def fail(
        self, key: TaskKey, code: str = ErrorCode.EXECUTION_FAILED.value, recoverable: bool = True
    ) -> Step:
        error = TaskError(code=code, message="the handler raised", recoverable=recoverable)
        return self.absorb(self.e, self.e.handle(Fail(key, error), self.now))
