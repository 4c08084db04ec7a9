"""The sans-IO protocol engine: decoded messages and the clock in, messages and actions out.

`Engine` holds every task of one peer, in either role, and applies the transition table of
`synapse.p2p.states`. It never touches a socket, a timer or a disk: each call returns a `Step`
saying what to answer, what to POST, what the handler runner should do and which transitions
happened. The asyncio runtime (`synapse.runtime.protocol`) and the transport drive it; tests drive
it with a fake clock.

Time is wall-clock seconds since the epoch (`now: float`), the clock message timestamps and
deadlines are written in.

The engine is one class in four modules: its state and shared moves (`engine_base`), what it
receives (`receiving`), what it is told to do (`commands`), and here its clock, restart and
the checkpoint that undoes a message whose effects could not be stored. The values it hands
out are in `records`; all are importable from here.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from synapse.p2p.commands import Commands
from synapse.p2p.engine_base import (
    UNDELIVERABLE,
    EngineSnapshot,
    EngineTimer,
    PartnerWatch,
    _copy_record,
    _epoch,
    _PartnerLiveness,
    _TimerKey,
)
from synapse.p2p.receiving import Receiving
from synapse.p2p.records import (
    Action,
    AuditEntry,
    CancelExecution,
    CapabilityProvider,
    DropQueued,
    Outgoing,
    PartnerReachability,
    Refusal,
    ResumeExecution,
    StartExecution,
    Step,
    TaskEvent,
    TaskEventKind,
    TaskKey,
    TaskNote,
    TaskRecord,
    Transition,
    Validation,
    ValidationResult,
    Validator,
    as_capability,
)
from synapse.p2p.states import (
    QUESTION_STATES,
    RUNNING_STATES,
    Event,
    Role,
    StateTimer,
    state_timers,
)
from synapse.types import (
    ErrorCode,
    Message,
    TaskError,
    TaskState,
)


class Engine(Receiving, Commands):
    """All tasks of one peer (`agent_id`, reachable at `endpoint`), as requester and executor."""

    def restore(self, records: Iterable[TaskRecord], now: float) -> None:
        """Take back the tasks a store kept, and re-arm their timers (at start-up)."""
        for rec in records:
            self.tasks[rec.key] = rec
            if rec.is_final:
                continue
            self._track(rec, now)
            executor = rec.role is Role.EXECUTOR
            if executor and rec.task.deadline is not None:
                self._timers.set((EngineTimer.DEADLINE, rec.key), _epoch(rec.task.deadline))
            if rec.state is TaskState.EXECUTING:
                rec.executing_since = now  # time spent down is not executing time
            # The same timers a live move into this state starts (STATE_TIMERS).
            for timer in state_timers(rec.role, rec.state):
                self._start_state_timer(rec, timer, now, self._wait_until(rec))
            if not executor:
                self._arm_requester(rec, now)

    def recover(self, key: TaskKey, *, resumable: bool, now: float) -> Step:
        """Decide the fate of an executor task whose handler a restart interrupted.

        A resumable handler is started again from the beginning (with the fields provided
        so far) if the task was running; if the task waited on its handler's question, it
        goes on waiting with that question, and the answer starts the handler again (it is
        given the answer when it asks the question again: `StartExecution.answered`).
        Otherwise the task fails with a recoverable `execution_failed` ("interrupted by
        restart"). A task whose handler never started (waiting on a synchronous
        `task_need_info`) just goes on waiting.
        """
        step = Step()
        rec = self.tasks.get(key)
        if rec is None or rec.is_final or rec.role is not Role.EXECUTOR:
            return step
        if not rec.handler_started:
            return step
        if resumable and rec.state in RUNNING_STATES:
            if rec.state is not TaskState.EXECUTING:
                self._move(rec, Event.START_EXECUTION, now, None, step)
                self._status_callback(rec, now, step, message="executing")
            step.actions.append(StartExecution(rec.key, rec.task.type, self._payload(rec)))
            return step
        if resumable and rec.state in QUESTION_STATES:
            self.restart_on_answer.add(rec.key)
            return step
        error = TaskError(
            code=ErrorCode.EXECUTION_FAILED.value,
            message="interrupted by restart",
            recoverable=True,
        )
        self._fail(rec, error, now, step)
        return step

    def on_timer(self, now: float) -> Step:
        """Fire every timer due at `now`: task timeouts, deadlines, heartbeats."""
        step = Step()
        for kind, target in list(self._timers.pop_due(now)):
            if kind is EngineTimer.HEARTBEAT:
                assert isinstance(target, str)
                self._heartbeat_due(target, now, step)
                continue
            assert isinstance(target, TaskKey)
            rec = self.tasks.get(target)
            if rec is None or rec.is_final:
                continue
            if rec.role is Role.REQUESTER:
                if kind is StateTimer.SILENCE:
                    silent = (
                        f"no word from {rec.partner} about the task for "
                        f"{self.silence_limit():g} s (task_timeout plus heartbeat loss)"
                    )
                    self._give_up(rec, ErrorCode.EXECUTION_TIMEOUT, silent, now, step)
                elif kind is EngineTimer.REQUESTER_DEADLINE:
                    late = f"the task's deadline passed with no outcome from {rec.partner}"
                    self._give_up(rec, ErrorCode.EXECUTION_TIMEOUT, late, now, step)
                continue
            if kind is StateTimer.ANSWER_WAIT:
                text = self._unanswered(rec)
            elif kind is StateTimer.TASK_TIMEOUT:
                text = f"TaskTimeout of {self.config.task_timeout:g} s passed"
            else:
                text = "the task's deadline passed"
            error = TaskError(
                code=ErrorCode.EXECUTION_TIMEOUT.value, message=text, recoverable=True
            )
            self._fail(rec, error, now, step)
        return step

    def _unanswered(self, rec: TaskRecord) -> str:
        """Which limit of an unanswered question passed, said plainly."""
        limit = self._wait_until(rec)
        if limit is None:
            return (
                f"no answer to the question within input_timeout ({self.config.input_timeout:g} s)"
            )
        if rec.state is TaskState.INFO_NEEDED:
            return f"no task_info_provided by its required_by ({limit.isoformat()})"
        return f"no human_decision by its deadline ({limit.isoformat()})"

    def timer_due(self, key: TaskKey, now: float) -> bool:
        """True if a timer of task `key` is due at `now` (the next `on_timer` fires it)."""
        return any(when <= now for when in self._timers.owned(key).values())

    def keep_heartbeat(self, partner: str, now: float) -> None:
        """Heartbeat `partner` even with no task in flight: messages to it are waiting.

        Delivery resumes after its next successful heartbeat (specs/protocol.md, 'Transport').
        """
        self._backlog.add(partner)
        if (EngineTimer.HEARTBEAT, partner) not in self._timers:
            self._timers.set((EngineTimer.HEARTBEAT, partner), now + self.config.heartbeat_interval)

    def _heartbeat_due(self, partner: str, now: float, step: Step) -> None:
        if not self.in_flight_with(partner) and partner not in self._backlog:
            return  # nothing in flight: stop heartbeating until the next task
        liveness = self._partners.setdefault(partner, _PartnerLiveness(last_heard=now))
        send = True
        if self.partner_watch is not None:
            shared, send = self.partner_watch.beat(partner, liveness.last_heard, now)
            if shared > liveness.last_heard:
                self.heard(partner, shared, step)  # another replica heard from it
        silent_for = now - liveness.last_heard
        limit = self.config.missed_heartbeat_limit * self.config.heartbeat_interval
        if liveness.reachable and silent_for >= limit:
            liveness.reachable = False
            step.actions.append(PartnerReachability(partner, reachable=False))
            self._partner_events(partner, TaskNote.PARTNER_UNREACHABLE, step)
        if send:
            step.outgoing.append(Outgoing(partner, self.heartbeat(partner, now)))
        self._timers.set((EngineTimer.HEARTBEAT, partner), now + self.config.heartbeat_interval)

    def checkpoint(self, message: Message) -> Checkpoint:
        """Prepare to apply `message` so that `rollback` can leave the engine as if it had
        never seen it (the runtime then refuses it as `agent_not_ready`).

        Nothing is copied back field by field. The one task a message touches is copied on
        write: `receive` works on a copy, and the original stays as it was; the timers of
        that task and the state of the partners involved (liveness, backlog, heartbeat) are
        kept whole, as values; the counts of tasks in flight follow from the records.
        """
        key = self.incoming_key(message)
        rec = self.tasks.get(key) if key is not None else None
        if rec is not None:
            assert key is not None
            self.tasks[key] = _copy_record(rec)
        partners = {message.from_.agent_id}
        if rec is not None:
            partners.add(rec.partner)
        return Checkpoint(
            key=key,
            record=rec,
            timers=self._timers.owned(key) if key is not None else {},
            partners={p: self._partner_state(p) for p in partners},
        )

    def counted(self, checkpoint: Checkpoint) -> Applied:
        """What `receive` left for the checkpoint's task, just after it: `rollback` takes it
        back only if nothing moved the task since."""
        key = checkpoint.key
        rec = self.tasks.get(key) if key is not None else None
        return Applied(rec, len(rec.history) if rec is not None else 0)

    def rollback(self, checkpoint: Checkpoint, after: Applied | None = None) -> bool:
        """Leave the engine as `checkpoint` found it: the task's record and timers, and the
        partners' state, each put back whole. Returns whether the task was put back as it
        was (False: no task, or one left as something else made it since).

        With `after` (`counted` just after `receive`), a task that another step moved since
        (its handler completed it while the commit was awaited, or a takeover put the
        store's copy in its place) is left as that step left it, so that what it recorded
        and queued stays true; the other tasks are never touched."""
        key = checkpoint.key
        put_back = False
        if key is not None:
            current = self.tasks.get(key)
            moved = (
                after is not None
                and current is not None
                and (current is not after.record or len(current.history) != after.history)
            )
            if not moved:
                if current is not None and not current.is_final:
                    self._account(current, -1)
                original = checkpoint.record
                if original is None:
                    self.tasks.pop(key, None)
                else:
                    self.tasks[key] = original
                    if not original.is_final:
                        self._account(original, +1)
                self._timers.replace_owned(key, checkpoint.timers)
                put_back = True
        for partner, state in checkpoint.partners.items():
            self._put_partner_state(partner, state)
        return put_back

    def _partner_state(self, partner: str) -> _PartnerState:
        liveness = self._partners.get(partner)
        return _PartnerState(
            liveness=None
            if liveness is None
            else _PartnerLiveness(liveness.last_heard, liveness.reachable),
            backlog=partner in self._backlog,
            timers=self._timers.owned(partner),
        )

    def _put_partner_state(self, partner: str, state: _PartnerState) -> None:
        if state.liveness is None:
            self._partners.pop(partner, None)
        else:
            self._partners[partner] = state.liveness
        if state.backlog:
            self._backlog.add(partner)
        else:
            self._backlog.discard(partner)
        self._timers.replace_owned(partner, state.timers)


class _PartnerState(msgspec.Struct, frozen=True):
    """What the engine holds about one partner, as a value."""

    liveness: _PartnerLiveness | None
    backlog: bool
    timers: dict[_TimerKey, float]


class Checkpoint(msgspec.Struct, frozen=True):
    """What one incoming message may change, as values (see `Engine.checkpoint`): the task's
    record as it was (untouched: `receive` works on a copy) and its timers, and the state of
    the partners involved."""

    key: TaskKey | None
    record: TaskRecord | None
    timers: dict[_TimerKey, float]
    partners: dict[str, _PartnerState]


class Applied(msgspec.Struct, frozen=True):
    """The record `receive` left for a checkpoint's task, and its length of history."""

    record: TaskRecord | None
    history: int


__all__ = [
    "UNDELIVERABLE",
    "Action",
    "Applied",
    "AuditEntry",
    "CancelExecution",
    "CapabilityProvider",
    "Checkpoint",
    "DropQueued",
    "Engine",
    "EngineSnapshot",
    "EngineTimer",
    "Outgoing",
    "PartnerReachability",
    "PartnerWatch",
    "Refusal",
    "ResumeExecution",
    "StartExecution",
    "Step",
    "TaskEvent",
    "TaskEventKind",
    "TaskKey",
    "TaskNote",
    "TaskRecord",
    "Transition",
    "Validation",
    "ValidationResult",
    "Validator",
    "as_capability",
]
