"""`TaskHandler` (seed §5.2), and the context a running task uses to talk to its requester."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from synapse.p2p.engine import TaskKey, Validation, ValidationResult
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

if TYPE_CHECKING:
    from synapse.p2p.protocol import P2PProtocol


@runtime_checkable
class TaskHandler(Protocol):
    """What a peer runs for the tasks it accepts.

    `validate_task` decides the synchronous answer to a `task_request` (seed §5.2): return a
    `Validation` (or the seed's `(missing_fields, can_handle)` pair). `execute_task` runs the
    task as straight-line async code; what it returns becomes `task_complete.result` (a
    `TaskResult`, or any JSON value, wrapped with `output_type` "text" for a string and "json"
    otherwise); what it raises becomes `task_failed` (`execution_failed`).
    """

    async def execute_task(
        self, ctx: ExecutionContext, task_type: str, payload: dict[str, Any]
    ) -> Any: ...

    def validate_task(self, task_type: str, payload: dict[str, Any]) -> ValidationResult: ...

    def get_capabilities(self) -> Sequence[str | Capability]: ...


class ExecutionContext:
    """Handed to `execute_task`: report progress, ask for information or a person's decision.

    Each `await` that waits for the requester returns its answer; if the task is cancelled or
    times out meanwhile, the handler's coroutine is cancelled (`asyncio.CancelledError`).
    """

    def __init__(self, runtime: P2PProtocol, key: TaskKey, task: TaskSpec) -> None:
        self._runtime = runtime
        self.key = key
        self.task = task

    @property
    def task_id(self) -> str:
        return self.key.task_id

    @property
    def requester(self) -> str:
        return self.key.requester

    @property
    def context(self) -> TaskContext | None:
        rec = self._runtime.engine.get(self.key)
        return rec.context if rec else None

    @property
    def state(self) -> TaskState:
        rec = self._runtime.engine.get(self.key)
        return rec.state if rec else TaskState.IDLE

    @property
    def cancelled(self) -> bool:
        return self.state is TaskState.CANCELLED

    async def progress(
        self,
        progress: float | None = None,
        message: str = "",
        intermediate_result: Any = None,
    ) -> None:
        """Send a `task_status_update`."""
        self._runtime.apply(
            self._runtime.engine.report_status(
                self.key,
                now=self._runtime.clock(),
                progress=progress,
                message=message,
                intermediate_result=intermediate_result,
            )
        )

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
        waiter = self._runtime.expect_resume(self.key)
        self._runtime.apply(
            self._runtime.engine.request_info(
                self.key,
                fields,
                now=self._runtime.clock(),
                question=question,
                required_by=required_by,
            )
        )
        value: Mapping[str, Any] = await waiter
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
        waiter = self._runtime.expect_resume(self.key)
        self._runtime.apply(
            self._runtime.engine.request_human(
                self.key,
                reason,
                now=self._runtime.clock(),
                context=context,
                options=options,
                escalation_level=escalation_level,
                deadline=deadline,
            )
        )
        decision: HumanDecisionPayload = await waiter
        return decision


class TaskFailure(Exception):
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


__all__ = ["ExecutionContext", "TaskFailure", "TaskHandler", "Validation", "as_result"]
