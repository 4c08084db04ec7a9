"""`TaskHandler` (specs/protocol.md, 'Peer interfaces and configuration'), and the context a running
task uses to talk to its requester."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from synapse.p2p.commands import ReportStatus, RequestHuman, RequestInfo
from synapse.p2p.engine import AuditEntry, TaskKey, TaskRecord, Validation, ValidationResult
from synapse.types import (
    Capability,
    HumanContext,
    HumanDecisionPayload,
    HumanOption,
    MissingField,
    Reason,
    TaskContext,
    TaskError,
    TaskResult,
    TaskSpec,
    TaskState,
)
from synapse.types.errors import SynapseException


@runtime_checkable
class TaskHandler(Protocol):
    """What a peer runs for the tasks it accepts.

    `validate_task` decides the synchronous answer to a `task_request` (specs/protocol.md,
    'Peer interfaces and configuration'): return a
    `Validation` (or the protocol's `(missing_fields, can_handle)` pair). `execute_task` runs the
    task as straight-line async code; what it returns becomes `task_complete.result` (a
    `TaskResult`, or any JSON value, wrapped with `output_type` "text" for a string and "json"
    otherwise); what it raises becomes `task_failed` (`execution_failed`).
    """

    async def execute_task(
        self, ctx: ExecutionContext, task_type: str, payload: dict[str, Any]
    ) -> Any: ...

    def validate_task(self, task_type: str, payload: dict[str, Any]) -> ValidationResult: ...

    def get_capabilities(self) -> Sequence[str | Capability]: ...


@runtime_checkable
class ResumableHandler(TaskHandler, Protocol):
    """A `TaskHandler` whose interrupted tasks may be started again after a restart.

    With a durable store, a restart interrupts running handlers. For each such task the runtime
    asks `is_resumable(task_type)`: true starts it again from the beginning, false fails it with
    a recoverable `execution_failed` ("interrupted by restart").
    """

    def is_resumable(self, task_type: str) -> bool: ...


class TaskRuntime(Protocol):
    """What an `ExecutionContext` asks of the runtime that runs its task (`P2PProtocol`).

    The context talks to these methods only, never to the engine behind them, so this module
    does not depend on the runtime's module (which imports it).
    """

    def task_record(self, key: TaskKey) -> TaskRecord | None: ...

    async def settled(self, key: TaskKey) -> None: ...

    def report_status(self, command: ReportStatus) -> None: ...

    async def request_info(self, command: RequestInfo) -> Mapping[str, Any]: ...

    async def request_human(self, command: RequestHuman) -> HumanDecisionPayload: ...

    async def note_task(
        self, key: TaskKey, action: str, detail: Mapping[str, Any], actor: str | None = None
    ) -> None: ...

    def note_task_soon(
        self, key: TaskKey, action: str, detail: Mapping[str, Any], actor: str | None = None
    ) -> bool: ...


class ExecutionContext:
    """Handed to `execute_task`: report progress, ask for information or a person's decision.

    Each `await` that waits for the requester returns its answer; if the task is cancelled or
    times out meanwhile, the handler's coroutine is cancelled (`asyncio.CancelledError`).
    """

    def __init__(
        self, runtime: TaskRuntime, key: TaskKey, task: TaskSpec, answered: Any = None
    ) -> None:
        self._runtime = runtime
        self.key = key
        self.task = task
        #: The answer to the question the task waited on through a restart, for a handler
        #: started again: it is given to the first `need_info` / `need_human` of its kind
        #: instead of asking again (see `synapse.p2p.engine.Engine.recover`).
        self._answered = answered

    @property
    def task_id(self) -> str:
        return self.key.task_id

    @property
    def runtime(self) -> TaskRuntime:
        """The runtime the task runs on: what a binding looks its own records up by
        (`synapse.a2a.related_tasks`, say)."""
        return self._runtime

    @property
    def requester(self) -> str:
        return self.key.requester

    @property
    def context(self) -> TaskContext | None:
        rec = self._runtime.task_record(self.key)
        return rec.context if rec else None

    @property
    def state(self) -> TaskState:
        rec = self._runtime.task_record(self.key)
        return rec.state if rec else TaskState.IDLE

    @property
    def cancelled(self) -> bool:
        return self.state is TaskState.CANCELLED

    async def note(self, action: str, **detail: Any) -> None:
        """Keep a note with the task (in its audit trail, actor: this agent), durable when
        this returns: what a resumed handler needs to find its work again after a restart
        (a sub-task it started elsewhere, say). Plain JSON values only."""
        await self._runtime.note_task(self.key, action, detail)

    def note_soon(self, action: str, **detail: Any) -> None:
        """`note`, written with the next commit instead of one of its own: for a note the
        change about to be made durable should carry (a sub-task about to be requested from
        this peer, whose request commits both), at no extra commit."""
        self._runtime.note_task_soon(self.key, action, detail)

    @property
    def notes(self) -> list[AuditEntry]:
        """The task's audit trail, this handler's notes among it (see `note`)."""
        rec = self._runtime.task_record(self.key)
        return list(rec.audit) if rec is not None else []

    async def progress(
        self,
        progress: float | None = None,
        message: str = "",
        intermediate_result: Any = None,
    ) -> None:
        """Send a `task_status_update`."""
        await self._runtime.settled(self.key)
        self._runtime.report_status(ReportStatus(self.key, progress, message, intermediate_result))

    async def need_info(
        self,
        missing_fields: Iterable[MissingField | str],
        *,
        question: str = "",
        required_by: datetime | None = None,
    ) -> dict[str, Any]:
        """Send `task_need_info` and wait for `task_info_provided`; returns its `fields`."""
        fields = [
            f if isinstance(f, MissingField) else MissingField(field=f) for f in missing_fields
        ]
        answered = self._answered
        if isinstance(answered, Mapping):  # asked before the restart, answered since
            self._answered = None
            return dict(answered)
        value = await self._runtime.request_info(
            RequestInfo(self.key, tuple(fields), question, required_by)
        )
        return dict(value)

    async def need_human(
        self,
        reason: Reason | str,
        *,
        message: str = "",
        context: HumanContext | None = None,
        options: Iterable[HumanOption] = (),
        escalation_level: int = 1,
        deadline: datetime | None = None,
    ) -> HumanDecisionPayload:
        """Send `task_need_human` and wait for an approving `human_decision`.

        A rejection fails the task (`permission_denied`) and cancels this coroutine.
        """
        if isinstance(reason, str):
            reason = Reason(code=reason, message=message)
        answered = self._answered
        if isinstance(answered, HumanDecisionPayload):  # asked before the restart
            self._answered = None
            return answered
        return await self._runtime.request_human(
            RequestHuman(self.key, reason, context, tuple(options), escalation_level, deadline)
        )


class TaskFailure(SynapseException):
    """Raised by `execute_task` to fail the task with exactly this `task_failed.error`
    (any other exception becomes a recoverable `execution_failed`). A router relaying a
    partner's failure uses it to pass the partner's code on unchanged."""

    def __init__(self, error: TaskError) -> None:
        super().__init__(error.message or error.code)
        self.error = error


def as_result(value: Any) -> TaskResult:
    """What `execute_task` returned, as `task_complete.result`."""
    if isinstance(value, TaskResult):
        return value
    if isinstance(value, str):
        return TaskResult(output_type="text", output=value)
    return TaskResult(output_type="json", output=value)


__all__ = [
    "ExecutionContext",
    "ResumableHandler",
    "TaskFailure",
    "TaskHandler",
    "TaskRuntime",
    "Validation",
    "as_result",
]
