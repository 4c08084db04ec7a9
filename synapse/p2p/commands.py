"""What the engine is told to do: the requester's commands (submit, provide information,
decide, cancel) and the running handler's (report status, ask, complete, fail)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeAlias

from synapse.p2p.engine_base import EngineBase, _at
from synapse.p2p.records import (
    Outgoing,
    Step,
    TaskKey,
    TaskRecord,
)
from synapse.p2p.states import (
    Event,
    Role,
    TransitionError,
)
from synapse.types import (
    DecidedBy,
    Decision,
    DecisionAction,
    HumanContext,
    HumanDecision,
    HumanDecisionPayload,
    HumanOption,
    LocalProtocolError,
    MissingField,
    Priority,
    Reason,
    TaskComplete,
    TaskCompletePayload,
    TaskContext,
    TaskError,
    TaskInfoProvided,
    TaskInfoProvidedPayload,
    TaskNeedHuman,
    TaskNeedHumanPayload,
    TaskNeedInfo,
    TaskNeedInfoPayload,
    TaskRequest,
    TaskRequestPayload,
    TaskResult,
    TaskSpec,
)


@dataclass(frozen=True, slots=True)
class Submit:
    """The requester asks `partner` to run a task (the key is the first transition's)."""

    partner: str
    task_type: str
    payload: Mapping[str, Any] | None = None
    task_id: str | None = None
    priority: Priority = Priority.NORMAL
    deadline: datetime | None = None
    context: TaskContext | None = None


@dataclass(frozen=True, slots=True)
class ProvideInfo:
    """The requester answers a `task_need_info`."""

    key: TaskKey
    fields: Mapping[str, Any]
    notes: str | None = None


@dataclass(frozen=True, slots=True)
class StartDeciding:
    """The requester's person takes up a `task_need_human`."""

    key: TaskKey


@dataclass(frozen=True, slots=True)
class Decide:
    """The requester's person decides a `task_need_human`."""

    key: TaskKey
    action: DecisionAction
    decided_by: DecidedBy
    decision_id: str
    approved_fields: Mapping[str, Any] | None = None
    rejection_reason: str = ""
    notes: str = ""


@dataclass(frozen=True, slots=True)
class Cancel:
    """The requester cancels its task."""

    key: TaskKey
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class ReportStatus:
    """The running handler reports progress."""

    key: TaskKey
    progress: float | None = None
    message: str = ""
    intermediate_result: Any = None


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """The running handler asks the requester for missing information."""

    key: TaskKey
    missing_fields: tuple[MissingField, ...]
    question: str = ""
    required_by: datetime | None = None


@dataclass(frozen=True, slots=True)
class RequestHuman:
    """The running handler asks the requester's person to decide."""

    key: TaskKey
    reason: Reason
    context: HumanContext | None = None
    options: tuple[HumanOption, ...] = ()
    escalation_level: int = 1
    deadline: datetime | None = None


@dataclass(frozen=True, slots=True)
class Complete:
    """The running handler's task succeeded."""

    key: TaskKey
    result: TaskResult
    summary: str = ""


@dataclass(frozen=True, slots=True)
class Fail:
    """The running handler's task failed (or the runtime fails it: shutdown, a crash)."""

    key: TaskKey
    error: TaskError


#: What the requester and the running handler tell the engine (`Engine.handle`).
Command: TypeAlias = (
    Submit
    | ProvideInfo
    | StartDeciding
    | Decide
    | Cancel
    | ReportStatus
    | RequestInfo
    | RequestHuman
    | Complete
    | Fail
)


class Commands(EngineBase):
    """The commands of the requester and of the running handler, each returning a `Step`."""

    def handle(self, command: Command, now: float) -> Step:
        """Carry out `command` at `now`: what to POST, which actions, which transitions. A
        command the task's state does not allow raises `LocalProtocolError` and changes
        nothing."""
        match command:
            case Submit():
                return self.request(command, now)[1]
            case ProvideInfo():
                return self.provide_info(command.key, command.fields, now=now, notes=command.notes)
            case StartDeciding():
                return self.start_deciding(command.key, now=now)
            case Decide():
                return self.decide(
                    command.key,
                    command.action,
                    now=now,
                    decided_by=command.decided_by,
                    decision_id=command.decision_id,
                    approved_fields=command.approved_fields,
                    rejection_reason=command.rejection_reason,
                    notes=command.notes,
                )
            case Cancel():
                return self.cancel(command.key, now=now, reason=command.reason)
            case ReportStatus():
                return self.report_status(
                    command.key,
                    now=now,
                    progress=command.progress,
                    message=command.message,
                    intermediate_result=command.intermediate_result,
                )
            case RequestInfo():
                return self.request_info(
                    command.key,
                    command.missing_fields,
                    now=now,
                    question=command.question,
                    required_by=command.required_by,
                )
            case RequestHuman():
                return self.request_human(
                    command.key,
                    command.reason,
                    now=now,
                    context=command.context,
                    options=command.options,
                    escalation_level=command.escalation_level,
                    deadline=command.deadline,
                )
            case Complete():
                return self.complete(command.key, command.result, now=now, summary=command.summary)
            case Fail():
                return self.fail(command.key, command.error, now=now)

    def submit(
        self,
        partner: str,
        task_type: str,
        payload: Mapping[str, Any] | None = None,
        *,
        now: float,
        task_id: str | None = None,
        priority: Priority = Priority.NORMAL,
        deadline: datetime | None = None,
        context: TaskContext | None = None,
    ) -> tuple[TaskKey, Step]:
        """Create a task as requester and queue its `task_request` to `partner`."""
        command = Submit(
            partner,
            task_type,
            payload,
            task_id=task_id,
            priority=priority,
            deadline=deadline,
            context=context,
        )
        return self.request(command, now)

    def request(self, command: Submit, now: float) -> tuple[TaskKey, Step]:
        """`submit`, given as a value: the new task's key, and the step that requests it."""
        partner, context = command.partner, command.context
        spec = TaskSpec(
            id=command.task_id or self.ids.task_id(),
            type=command.task_type,
            priority=command.priority,
            deadline=command.deadline,
            payload=dict(command.payload or {}),
        )
        key = TaskKey(self.agent_id, spec.id)
        if self.get(key) is not None:  # in flight, or finished and kept by the store
            raise LocalProtocolError(f"task id {spec.id!r} is already used")
        message: TaskRequest = self._message(
            TaskRequest, TaskRequestPayload(task=spec, context=context), partner, now
        )
        rec = TaskRecord(
            key=key,
            role=Role.REQUESTER,
            partner=partner,
            task=spec,
            context=context,
            request_id=message.id,
            created_at=now,
            updated_at=now,
        )
        self._track(rec, now)
        step = Step()
        self._move(rec, Event.SEND_TASK_REQUEST, now, message.id, step)
        self._arm_requester(rec, now)
        step.outgoing.append(Outgoing(partner, message, key))
        return key, step

    def _requester(self, key: TaskKey) -> TaskRecord:
        rec = self.get(key)
        if rec is None or rec.role is not Role.REQUESTER:
            raise LocalProtocolError(f"no task {key} of ours as requester")
        return rec

    def _local(
        self, rec: TaskRecord, event: Event, now: float, step: Step, mid: str | None
    ) -> None:
        try:
            self._move(rec, event, now, mid, step)
        except TransitionError as exc:
            raise LocalProtocolError(f"{event.value} in state {rec.state.value}") from exc

    def provide_info(
        self, key: TaskKey, fields: Mapping[str, Any], *, now: float, notes: str | None = None
    ) -> Step:
        rec = self._requester(key)
        payload = TaskInfoProvidedPayload(task_id=rec.task_id, fields=dict(fields), notes=notes)
        out = self._callback(rec, TaskInfoProvided, payload, now)
        step = Step()
        self._local(rec, Event.SEND_TASK_INFO_PROVIDED, now, step, out.message.id)
        step.outgoing.append(out)
        return step

    def start_deciding(self, key: TaskKey, *, now: float) -> Step:
        """A person at R started to decide on a `task_need_human` (R only)."""
        rec = self._requester(key)
        step = Step()
        self._local(rec, Event.HUMAN_DECIDING, now, step, None)
        return step

    def decide(
        self,
        key: TaskKey,
        action: DecisionAction,
        *,
        now: float,
        decided_by: DecidedBy,
        decision_id: str,
        approved_fields: Mapping[str, Any] | None = None,
        rejection_reason: str = "",
        notes: str = "",
    ) -> Step:
        rec = self._requester(key)
        if rec.need_human_id is None:
            raise LocalProtocolError(f"task {key} has no pending task_need_human")
        payload = HumanDecisionPayload(
            task_id=rec.task_id,
            decision_id=decision_id,
            reply_to=rec.need_human_id,
            decided_by=decided_by,
            decision=Decision(
                action=action,
                approved_fields=dict(approved_fields or {}),
                rejection_reason=rejection_reason,
            ),
            notes=notes,
            timestamp=_at(now),
        )
        out = self._callback(rec, HumanDecision, payload, now)
        event = (
            Event.SEND_HUMAN_APPROVE
            if action is DecisionAction.APPROVE
            else Event.SEND_HUMAN_REJECT
        )
        step = Step()
        self._local(rec, event, now, step, out.message.id)
        step.outgoing.append(out)
        return step

    def cancel(self, key: TaskKey, *, now: float, reason: str | None = None) -> Step:
        """Ask E to cancel. Sent once R has the reply to its request (specs/protocol.md,
        'Task states')."""
        rec = self._requester(key)
        step = Step()
        if rec.is_final or rec.cancel_requested:
            return step
        rec.cancel_requested, rec.cancel_reason = True, reason
        self._send_requested_cancel(rec, now, step)
        return step

    def _executor(self, key: TaskKey, step: Step) -> TaskRecord | None:
        rec = self.get(key)
        if rec is None or rec.role is not Role.EXECUTOR:
            raise LocalProtocolError(f"no task {key} of ours as executor")
        if rec.is_final:
            step.discarded = True  # a late call after cancel or timeout: dropped by design
            return None
        return rec

    def _handler_move(
        self,
        rec: TaskRecord,
        event: Event,
        now: float,
        step: Step,
        *,
        wait_until: datetime | None = None,
    ) -> None:
        try:
            self._move(rec, event, now, None, step, wait_until=wait_until)
        except TransitionError as exc:
            raise LocalProtocolError(
                f"handler asked for {event.value} in state {rec.state.value}"
            ) from exc

    def report_status(
        self,
        key: TaskKey,
        *,
        now: float,
        progress: float | None = None,
        message: str = "",
        intermediate_result: Any = None,
    ) -> Step:
        step = Step()
        rec = self._executor(key, step)
        if rec is None:
            return step
        self._handler_move(rec, Event.SEND_TASK_STATUS_UPDATE, now, step)
        self._status_callback(
            rec,
            now,
            step,
            progress=progress,
            message=message,
            intermediate_result=intermediate_result,
        )
        return step

    def request_info(
        self,
        key: TaskKey,
        missing_fields: Iterable[MissingField],
        *,
        now: float,
        question: str = "",
        required_by: datetime | None = None,
    ) -> Step:
        step = Step()
        rec = self._executor(key, step)
        if rec is None:
            return step
        need = TaskNeedInfoPayload(
            task_id=rec.task_id,
            missing_fields=list(missing_fields),
            question=question,
            required_by=required_by,
        )
        self._handler_move(rec, Event.SEND_TASK_NEED_INFO, now, step, wait_until=required_by)
        rec.need_info = need
        step.outgoing.append(self._callback(rec, TaskNeedInfo, need, now))
        return step

    def request_human(
        self,
        key: TaskKey,
        reason: Reason,
        *,
        now: float,
        context: HumanContext | None = None,
        options: Iterable[HumanOption] = (),
        escalation_level: int = 1,
        deadline: datetime | None = None,
    ) -> Step:
        step = Step()
        rec = self._executor(key, step)
        if rec is None:
            return step
        need = TaskNeedHumanPayload(
            task_id=rec.task_id,
            reason=reason,
            context=context,
            options=list(options),
            escalation_level=escalation_level,
            deadline=deadline,
        )
        self._handler_move(rec, Event.SEND_TASK_NEED_HUMAN, now, step, wait_until=deadline)
        out = self._callback(rec, TaskNeedHuman, need, now)
        rec.need_human, rec.need_human_id = need, out.message.id
        step.outgoing.append(out)
        return step

    def complete(self, key: TaskKey, result: TaskResult, *, now: float, summary: str = "") -> Step:
        step = Step()
        rec = self._executor(key, step)
        if rec is None:
            return step
        self._handler_move(rec, Event.SEND_TASK_COMPLETE, now, step)
        rec.result = result
        payload = TaskCompletePayload(task_id=rec.task_id, result=result, summary=summary)
        step.outgoing.append(self._callback(rec, TaskComplete, payload, now))
        return step

    def fail(self, key: TaskKey, error: TaskError, *, now: float) -> Step:
        step = Step()
        rec = self._executor(key, step)
        if rec is None:
            return step
        self._fail(rec, error, now, step)
        return step
