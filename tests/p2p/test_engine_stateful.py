"""A paired R/E driven by random commands, deliveries, handler calls and clock jumps.

At each step the machine lists what could happen now — POST one of the messages the transport
may send (messages about one task one at a time and in order, `Outgoing.key`; everything else,
other tasks and heartbeats, interleaved freely), let a held-back synchronous reply arrive (so
that callbacks overtake it), an R command (submit, provide info, deliberate, decide, cancel at
any moment), a handler call (status, need info, need human, complete, fail, or a late call
after the task ended), a jump of the clock — and hypothesis picks. Noise rules re-send a
task_request under a new message id, hand a reply to `on_reply` twice, or replay an old
message under a fresh id (a broken or hostile partner). Through all of it:

- every state is one of the 14 (and E never has `pending` or `human_deciding`);
- a final state never changes, on either side; histories are unbroken chains;
- `StartExecution` is emitted at most once per task: nothing runs twice;
- a refused message changes nothing (state, history, bookkeeping, counters, timers);
- the in-flight and capacity counters match the tasks;
- once everything is delivered (and no replay was accepted), R and E agree.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable

import msgspec
from hypothesis import HealthCheck, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from pairing import E_ID, R_ID, Exchange, Pair, Snapshot, at

from synapse.p2p.config import P2PConfig
from synapse.p2p.engine import PartnerReachability, StartExecution, Step, TaskKey
from synapse.p2p.states import Event, Role
from synapse.types import (
    NACK_CODES,
    DecisionAction,
    SynapseError,
    TaskRequest,
    TaskState,
)

S = TaskState
TASK_TYPES = ["echo", "slow", "portrait", "text_generation", "translate"]
MAX_TASKS = 5
FULL = {"style": "古典"}
POOR = {"mood": "calm"}  # not the missing field: E asks again
Move = tuple[str, Callable[[], object]]


class PairedEngines(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.pair = Pair(
            e_config=P2PConfig(max_concurrent_tasks=3, task_timeout=300, heartbeat_interval=30)
        )
        self.keys: list[TaskKey] = []
        self.in_flight: list[Exchange] = []
        self.finals: dict[tuple[str, TaskKey], TaskState] = {}
        #: Tasks whose request finds E draining (refused with 503).
        self.refused: set[TaskKey] = set()
        #: A replay under a fresh id was accepted: the two sides may then legitimately
        #: disagree, so the agreement check is off for this run.
        self.tainted = False
        self.counter = 0

    @initialize()
    def start(self) -> None:
        self.submit("slow", deadline=None, refused=False)

    # --- what can happen now ------------------------------------------------------------------

    def eligible(self, side: str) -> list[int]:
        """Outbox positions the transport may POST now (per-task order, one at a time)."""
        busy = {ex.outgoing.key for ex in self.in_flight if ex.sender == side}
        seen: set[TaskKey] = set()
        found: list[int] = []
        for i, out in enumerate(self.pair.outbox[side]):
            if out.key is None:
                found.append(i)
            elif out.key not in seen:
                seen.add(out.key)
                if out.key not in busy:
                    found.append(i)
        return found

    def moves(self) -> list[Move]:
        """Everything that can happen now. Moves that take a task further are listed more than
        once, so that runs get deep into the flows as well as wide."""
        p = self.pair
        found: list[Move] = []
        for side in (R_ID, E_ID):
            for i in self.eligible(side):
                out = p.outbox[side][i]
                name = f"POST {out.message.message_type.short} {out.key or ''} from {side}"
                found.append((name, lambda s=side, i=i: self.post(s, i, hold=False)))
                found.append(
                    (f"{name}, reply held", lambda s=side, i=i: self.post(s, i, hold=True))
                )
        for ex in self.in_flight:
            name = f"reply to {ex.message.message_type.short} arrives"
            found.append((name, lambda ex=ex: self.answer(ex)))
        for key in self.keys:
            r = p.rec(R_ID, key)
            if r.state is S.INFO_NEEDED:
                found += 2 * [(f"R provides info {key}", lambda k=key: p.provide_info(k, FULL))]
                found.append(
                    (f"R provides too little {key}", lambda k=key: p.provide_info(k, POOR))
                )
            if r.state is S.NEED_HUMAN:
                found.append((f"R deliberates {key}", lambda k=key: p.start_deciding(k)))
            if r.state in (S.NEED_HUMAN, S.HUMAN_DECIDING):
                for a in DecisionAction:
                    found.append((f"R decides {a} {key}", lambda k=key, a=a: p.decide(k, a)))
            if not r.is_final and not r.cancel_requested:
                found.append((f"R cancels {key}", lambda k=key: p.cancel(k)))
        for key, e in p.e.tasks.items():
            if not e.handler_started:
                continue
            if e.is_final:
                found.append((f"late handler call {key}", lambda k=key: self.late_handler(k)))
                continue
            found.append((f"handler fails {key}", lambda k=key: p.fail(k)))  # may raise any time
            if e.state is S.EXECUTING:
                t = at(p.now + 40)
                found += [
                    (f"handler status {key}", lambda k=key: p.report_status(k, progress=50)),
                    (
                        f"handler needs info by {t} {key}",
                        lambda k=key, t=t: p.request_info(k, required_by=t),
                    ),
                    (f"handler needs info {key}", lambda k=key: p.request_info(k)),
                    (
                        f"handler needs a person by {t} {key}",
                        lambda k=key, t=t: p.request_human(k, deadline=t),
                    ),
                    (f"handler needs a person {key}", lambda k=key: p.request_human(k)),
                    (f"handler completes {key}", lambda k=key: p.complete(k)),
                    (f"handler completes {key}", lambda k=key: p.complete(k)),
                ]
        return found

    @rule(data=st.data(), count=st.integers(1, 4))
    def act(self, data: st.DataObject, count: int) -> None:
        """Do `count` of the things that can happen now, chosen at random."""
        for _ in range(count):
            moves = self.moves()
            if not moves:
                return
            name, move = moves[data.draw(st.integers(0, len(moves) - 1), label="move")]
            note(name)
            move()

    # --- the pieces ---------------------------------------------------------------------------

    def post(self, side: str, index: int, *, hold: bool) -> Exchange:
        receiver = self.pair.peer(side)
        before = Snapshot.of(receiver)
        self.pair.e.draining = self.pair.outbox[side][index].key in self.refused
        ex = self.pair.post(side, index)
        self.pair.e.draining = False
        if ex.error is not None:
            assert ex.error.code in NACK_CODES
            assert Snapshot.of(receiver) == before, "a refused message changed state"
        if hold:
            self.in_flight.append(ex)  # the reply is slow: later messages may overtake it
        else:
            self.pair.answer(ex)
        return ex

    def answer(self, ex: Exchange) -> None:
        self.in_flight.remove(ex)
        self.pair.answer(ex)

    def submit(self, task_type: str, deadline: float | None, refused: bool) -> None:
        self.counter += 1
        when = None if deadline is None else at(self.pair.now + deadline)
        payload = {"prompt": "p"} if task_type == "text_generation" else {"text": "t"}
        key = self.pair.submit(task_type, payload, task_id=f"task-{self.counter}", deadline=when)
        self.keys.append(key)
        if refused:
            self.refused.add(key)

    def late_handler(self, key: TaskKey) -> None:
        """The handler did not notice the cancel or the timeout: dropped, nothing sent."""
        before = Snapshot.of(self.pair.e)
        step = self.pair.complete(key, "late")
        assert step == Step(discarded=True)
        assert Snapshot.of(self.pair.e) == before

    def settle(self) -> None:
        """Deliver every reply and every queued message, in an order the transport allows."""
        for _ in range(1000):
            if self.in_flight:
                self.answer(self.in_flight[0])
                continue
            for side in (R_ID, E_ID):
                if self.pair.outbox[side]:
                    self.post(side, 0, hold=False)
            if not (self.pair.outbox[R_ID] or self.pair.outbox[E_ID]):
                return
        raise AssertionError("delivery does not settle")

    # --- rules besides `act` --------------------------------------------------------------------

    @precondition(lambda self: len(self.keys) < MAX_TASKS)
    @rule(
        task_type=st.sampled_from(TASK_TYPES),
        deadline=st.sampled_from([None, None, None, -10.0, 50.0]),
        refused=st.sampled_from([False, False, False, False, True]),
    )
    def submit_task(self, task_type: str, deadline: float | None, refused: bool) -> None:
        self.submit(task_type, deadline, refused)

    @rule(seconds=st.sampled_from([1.0, 10.0, 30.0, 100.0]))
    def advance(self, seconds: float) -> None:
        self.pair.advance(seconds)

    @rule()
    def deliver_everything(self) -> None:
        self.settle()
        self.check_agreement()

    @precondition(lambda self: self.pair.log)
    @rule(pick=st.integers(0, 200))
    def resend_request(self, pick: int) -> None:
        """R re-sends a task_request under a new message id: E repeats its first decision."""
        firsts = [
            ex for ex in self.pair.log if isinstance(ex.message, TaskRequest) and ex.error is None
        ]
        if not firsts:
            return
        first = firsts[pick % len(firsts)]
        self.counter += 1
        again = msgspec.structs.replace(first.message, id=f"msg-again-{self.counter}")
        before = Snapshot.of(self.pair.e, liveness=False)
        step = self.pair.e.receive(again, self.pair.now)
        assert step.reply is not None and type(step.reply) is type(first.reply)
        assert step.reply.payload == first.reply.payload
        assert step.reply.reply_to == again.id
        assert step.outgoing == [] and step.transitions == []
        # Hearing from R may make it reachable again; nothing else happens.
        assert all(isinstance(a, PartnerReachability) for a in step.actions)
        assert Snapshot.of(self.pair.e, liveness=False) == before
        self.pair.absorb(self.pair.e, step)

    @precondition(lambda self: any(ex.reply_step is not None for ex in self.pair.log))
    @rule(pick=st.integers(0, 200))
    def reply_arrives_twice(self, pick: int) -> None:
        """A reply handed to `on_reply` a second time changes nothing."""
        answered = [ex for ex in self.pair.log if ex.reply_step is not None]
        ex = answered[pick % len(answered)]
        sender = self.pair.engine(ex.sender)
        before = Snapshot.of(sender, liveness=False)
        step = sender.on_reply(ex.message, ex.reply, self.pair.now)
        assert step.transitions == [] and step.outgoing == []
        assert Snapshot.of(sender, liveness=False) == before

    @precondition(lambda self: self.pair.log)
    @rule(pick=st.integers(0, 200))
    def replay_under_a_new_id(self, pick: int) -> None:
        """A broken or hostile partner re-sends an old message under a fresh id."""
        ex = self.pair.log[pick % len(self.pair.log)]
        if isinstance(ex.message, TaskRequest):
            return  # that is `resend_request`
        self.counter += 1
        again = msgspec.structs.replace(ex.message, id=f"msg-replay-{self.counter}")
        receiver = self.pair.peer(ex.sender)
        before = Snapshot.of(receiver)
        try:
            step = receiver.receive(again, self.pair.now)
        except SynapseError as error:
            assert error.code in NACK_CODES
            assert Snapshot.of(receiver) == before
            return
        if step.transitions or step.outgoing:
            self.tainted = True
        self.pair.absorb(receiver, step)

    # --- invariants ------------------------------------------------------------------------------

    @invariant()
    def states_are_the_fourteen(self) -> None:
        for engine in (self.pair.r, self.pair.e):
            for rec in engine.tasks.values():
                assert isinstance(rec.state, TaskState)
                if rec.role is Role.EXECUTOR:
                    assert rec.state not in (S.PENDING, S.HUMAN_DECIDING, S.IDLE)
                else:
                    assert rec.state is not S.IDLE

    @invariant()
    def final_states_never_change(self) -> None:
        for side in (R_ID, E_ID):
            for key, rec in self.pair.engine(side).tasks.items():
                was = self.finals.get((side, key))
                if was is not None:
                    assert rec.state is was, f"{side} left final {was} for {rec.state}"
                elif rec.is_final:
                    self.finals[(side, key)] = rec.state

    @invariant()
    def histories_are_unbroken_chains(self) -> None:
        for engine in (self.pair.r, self.pair.e):
            for rec in engine.tasks.values():
                states = [S.IDLE] + [t.to_state for t in rec.history]
                assert [t.from_state for t in rec.history] == states[:-1]
                assert states[-1] is rec.state
                assert not any(t.from_state.is_final for t in rec.history)

    @invariant()
    def nothing_runs_twice(self) -> None:
        starts = Counter(a.key for a in self.pair.actions[E_ID] if isinstance(a, StartExecution))
        assert all(n == 1 for n in starts.values()), starts
        for key in starts:
            rec = self.pair.e.get(key)
            assert rec is not None and rec.handler_started

    @invariant()
    def counters_match_the_tasks(self) -> None:
        e_live = [r for r in self.pair.e.tasks.values() if not r.is_final]
        assert self.pair.e.active_executor_tasks() == len(e_live) <= 3
        for engine, partner in ((self.pair.r, E_ID), (self.pair.e, R_ID)):
            live = sum(not r.is_final for r in engine.tasks.values())
            assert engine.in_flight_with(partner) == live

    def check_agreement(self) -> None:
        """Everything delivered: both sides tell the same story about every task."""
        if self.tainted:
            return
        for key in self.keys:
            r, e = self.pair.r.get(key), self.pair.e.get(key)
            assert r is not None
            if r.history and r.history[-1].event is Event.GIVE_UP:
                # R gave up on its own (past the deadline); once E had answered, E got a
                # task_cancel and ended too.
                assert r.state is S.FAILED and r.error is not None
                if r.history[-1].from_state is not S.PENDING:
                    assert e is None or e.is_final, e.state
                continue
            if e is None:
                assert r.state is S.REJECTED and r.refusal is not None  # E was draining
                continue
            assert r.is_final == e.is_final, (r.state, e.state)
            if r.is_final:
                assert r.state is e.state
            elif e.state is S.EXECUTING:
                assert r.state is S.EXECUTING
            elif e.state is S.INFO_NEEDED:
                assert r.state is S.INFO_NEEDED
            elif e.state is S.NEED_HUMAN:
                assert r.state in (S.NEED_HUMAN, S.HUMAN_DECIDING)
            else:
                raise AssertionError(f"E rests in {e.state}")

    def teardown(self) -> None:
        self.settle()
        self.check_agreement()


#: Multiply the example budget, as the fuzz tests do (e.g. SYNAPSE_FUZZ_SCALE=10 for a long run).
SCALE = float(os.environ.get("SYNAPSE_FUZZ_SCALE", "1"))

PairedEngines.TestCase.settings = settings(
    max_examples=max(1, round(150 * SCALE)),
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestPairedEngines = PairedEngines.TestCase


def test_the_budget_follows_synapse_fuzz_scale() -> None:
    """SYNAPSE_FUZZ_SCALE=10 runs ten times the examples, as with the fuzz tests."""
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    code = (
        f"import sys; sys.path[:0] = [{str(here)!r}, {str(here.parent)!r}]\n"
        "import test_engine_stateful as t\n"
        "print(t.PairedEngines.TestCase.settings.max_examples)"
    )
    env = {**os.environ, "SYNAPSE_FUZZ_SCALE": "10"}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "1500"
