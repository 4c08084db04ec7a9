"""What the engine is told to do: the requester's commands (submit, provide information,
decide, cancel) and the running handler's (report status, ask, complete, fail)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
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
    missing_fields: Sequence[MissingField]
    question: str = ""
    required_by: datetime | None = None


@dataclass(frozen=True, slots=True)
class RequestHuman:
    """The running handler asks the requester's person to decide."""

    key: TaskKey
    reason: Reason
    context: HumanContext | None = None
    options: Sequence[HumanOption] = ()
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


def _fields(command: object) -> dict[str, Any]:
    """A command's fields but its key: the payload fields it carries, by the same names (a
    test holds every command to its payload, so a field is declared on each once)."""
    names = _FIELD_NAMES.get(type(command))
    if names is None:
        names = _FIELD_NAMES[type(command)] = tuple(
            f.name
            for f in dataclasses.fields(command)  # type: ignore[arg-type]
            if f.name != "key"
        )
    return {name: getattr(command, name) for name in names}


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


class Commands(EngineBase):
    """The commands of the requester and of the running handler, each returning a `Step`."""

    def handle(self, command: Command, now: float) -> Step:
        """Carry out `command` at `now`: what to POST, which actions, which transitions. A
        command the task's state does not allow raises `LocalProtocolError` and changes
        nothing."""
        match command:
            case Submit():
                return self.submit(command, now)[1]
            case ProvideInfo():
                return self._provide_info(command, now)
            case StartDeciding():
                return self._start_deciding(command, now)
            case Decide():
                return self._decide(command, now)
            case Cancel():
                return self._cancel(command, now)
            case ReportStatus():
                return self._report_status(command, now)
            case RequestInfo():
                return self._request_info(command, now)
            case RequestHuman():
                return self._request_human(command, now)
            case Complete():
                return self._complete(command, now)
            case Fail():
                return self._fail_command(command, now)

    def submit(self, command: Submit, now: float) -> tuple[TaskKey, Step]:
        """Create a task as requester and queue its `task_request` to the partner: the new
        task's key, and the step that requests it (`handle` gives only the step)."""
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

    def _provide_info(self, command: ProvideInfo, now: float) -> Step:
        rec = self._requester(command.key)
        payload = TaskInfoProvidedPayload(
            task_id=rec.task_id, fields=dict(command.fields), notes=command.notes
        )
        out = self._callback(rec, TaskInfoProvided, payload, now)
        step = Step()
        self._local(rec, Event.SEND_TASK_INFO_PROVIDED, now, step, out.message.id)
        step.outgoing.append(out)
        return step

    def _start_deciding(self, command: StartDeciding, now: float) -> Step:
        """A person at R started to decide on a `task_need_human` (R only)."""
        rec = self._requester(command.key)
        step = Step()
        self._local(rec, Event.HUMAN_DECIDING, now, step, None)
        return step

    def _decide(self, command: Decide, now: float) -> Step:
        rec = self._requester(command.key)
        if rec.need_human_id is None:
            raise LocalProtocolError(f"task {command.key} has no pending task_need_human")
        payload = HumanDecisionPayload(
            task_id=rec.task_id,
            decision_id=command.decision_id,
            reply_to=rec.need_human_id,
            decided_by=command.decided_by,
            decision=Decision(
                action=command.action,
                approved_fields=dict(command.approved_fields or {}),
                rejection_reason=command.rejection_reason,
            ),
            notes=command.notes,
            timestamp=_at(now),
        )
        out = self._callback(rec, HumanDecision, payload, now)
        event = (
            Event.SEND_HUMAN_APPROVE
            if command.action is DecisionAction.APPROVE
            else Event.SEND_HUMAN_REJECT
        )
        step = Step()
        self._local(rec, event, now, step, out.message.id)
        step.outgoing.append(out)
        return step

    def _cancel(self, command: Cancel, now: float) -> Step:
        """Ask E to cancel. Sent once R has the reply to its request (specs/protocol.md,
        'Task states')."""
        rec = self._requester(command.key)
        step = Step()
        if rec.is_final or rec.cancel_requested:
            return step
        rec.cancel_requested, rec.cancel_reason = True, command.reason
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

    def _report_status(self, command: ReportStatus, now: float) -> Step:
        step = Step()
        rec = self._executor(command.key, step)
        if rec is None:
            return step
        self._handler_move(rec, Event.SEND_TASK_STATUS_UPDATE, now, step)
        self._status_callback(rec, now, step, **_fields(command))
        return step

    def _request_info(self, command: RequestInfo, now: float) -> Step:
        step = Step()
        rec = self._executor(command.key, step)
        if rec is None:
            return step
        fields = _fields(command)
        fields["missing_fields"] = list(command.missing_fields)
        need = TaskNeedInfoPayload(task_id=rec.task_id, **fields)
        self._handler_move(
            rec, Event.SEND_TASK_NEED_INFO, now, step, wait_until=command.required_by
        )
        rec.need_info = need
        step.outgoing.append(self._callback(rec, TaskNeedInfo, need, now))
        return step

    def _request_human(self, command: RequestHuman, now: float) -> Step:
        step = Step()
        rec = self._executor(command.key, step)
        if rec is None:
            return step
        fields = _fields(command)
        fields["options"] = list(command.options)
        need = TaskNeedHumanPayload(task_id=rec.task_id, **fields)
        self._handler_move(rec, Event.SEND_TASK_NEED_HUMAN, now, step, wait_until=command.deadline)
        out = self._callback(rec, TaskNeedHuman, need, now)
        rec.need_human, rec.need_human_id = need, out.message.id
        step.outgoing.append(out)
        return step

    def _complete(self, command: Complete, now: float) -> Step:
        step = Step()
        rec = self._executor(command.key, step)
        if rec is None:
            return step
        self._handler_move(rec, Event.SEND_TASK_COMPLETE, now, step)
        rec.result = command.result
        payload = TaskCompletePayload(task_id=rec.task_id, **_fields(command))
        step.outgoing.append(self._callback(rec, TaskComplete, payload, now))
        return step

    def _fail_command(self, command: Fail, now: float) -> Step:
        step = Step()
        rec = self._executor(command.key, step)
        if rec is None:
            return step
        self._fail(rec, command.error, now, step)
        return step
