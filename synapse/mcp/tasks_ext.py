"""The MCP Tasks extension (`io.modelcontextprotocol/tasks`, 2026-07-28) for `delegate_task`.

A client that declares the extension on its request gets a task handle (`resultType: "task"`)
instead of waiting: `delegate_task` starts the Synapse or A2A task, waits a moment (a short
task still answers with its result at once), and returns the handle with the task's own id.
The client then polls `tasks/get`:

- `working`: the task runs (`statusMessage`: its last status update);
- `input_required`: it asks something; `inputRequests` holds the form (one elicitation,
  key `answer`), which the client answers with `tasks/update`;
- `completed`: the tool call is done; `result` is the `CallToolResult` `delegate_task`
  would have returned (`isError` when the partner refused the task);
- `cancelled`: cancelled, here (`tasks/cancel`) or by the partner's side.

`failed` is the extension's status for a JSON-RPC error of the call, which a started task
never has: a task that fails at its partner is a completed call whose result says so.
"""

from __future__ import annotations

import contextvars
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

import mcp_types as types
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from synapse.mcp.auth import current_principal
from synapse.mcp.gateway import Gateway, GatewayError
from synapse.mcp.questions import Question
from synapse.mcp.tracking import Delegation


class TaskHost(Protocol):
    """What the extension asks of the MCP server it serves (`synapse.mcp.server.SynapseMcp`)."""

    gateway: Gateway

    def final_result(self, task: Delegation) -> types.CallToolResult: ...

    async def answer_form(self, task: Delegation, responses: Mapping[str, Any] | None) -> bool: ...


TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
#: How long `delegate_task` waits before it answers with a task handle.
TASK_WAIT = 1.0
#: The polling interval suggested to clients, in milliseconds.
POLL_INTERVAL_MS = 500

#: Set while `delegate_task` runs for a client that takes task handles.
AS_TASK: contextvars.ContextVar[bool] = contextvars.ContextVar("synapse_mcp_as_task", default=False)


class TaskIdParams(types.RequestParams):
    task_id: str


class UpdateTaskParams(types.RequestParams):
    task_id: str
    input_responses: dict[str, Any]


class TaskFields(types.Result):
    """The `Task` of the extension (its fields, camelCase on the wire)."""

    task_id: str
    status: Literal["working", "input_required", "completed", "failed", "cancelled"]
    status_message: str | None = None
    created_at: str
    last_updated_at: str
    ttl_ms: int | None = None
    poll_interval_ms: int | None = POLL_INTERVAL_MS


class CreateTaskResult(TaskFields):
    result_type: Literal["task"] = "task"


class DetailedTask(TaskFields):
    """`tasks/get`'s answer: the task with its input requests or its result inlined."""

    result_type: Literal["complete"] = "complete"
    input_requests: dict[str, Any] | None = None
    result: dict[str, Any] | None = None


class Acknowledged(types.Result):
    result_type: Literal["complete"] = "complete"


class TasksExtension(Extension):
    """Serves `tasks/get`, `tasks/update` and `tasks/cancel`, and turns a `delegate_task`
    of a client that declared the extension into a task handle."""

    identifier = TASKS_EXTENSION

    def __init__(self, mcp: TaskHost) -> None:
        self.mcp = mcp

    def methods(self) -> list[MethodBinding]:
        modern = frozenset(MODERN_PROTOCOL_VERSIONS)
        return [
            MethodBinding("tasks/get", TaskIdParams, self._get, protocol_versions=modern),
            MethodBinding("tasks/update", UpdateTaskParams, self._update, protocol_versions=modern),
            MethodBinding("tasks/cancel", TaskIdParams, self._cancel, protocol_versions=modern),
        ]

    async def intercept_tool_call(
        self,
        params: types.CallToolRequestParams,
        ctx: ServerRequestContext[Any, Any],
        call_next: CallNext,
    ) -> HandlerResult:
        if params.name != "delegate_task" or not _declares_tasks(ctx):
            return await call_next(ctx)
        token = AS_TASK.set(True)
        try:
            result = await call_next(ctx)
        finally:
            AS_TASK.reset(token)
        if not isinstance(result, types.CallToolResult) or result.is_error:
            return result
        view = result.structured_content or {}
        if view.get("status") not in ("working", "input_required"):
            return result  # done within the first moment: the result itself
        task = self._task(str(view["task_id"]), ctx)
        return CreateTaskResult(**_task_fields(task))

    # --- the methods ------------------------------------------------------------------------

    def _task(self, task_id: str, ctx: ServerRequestContext[Any, Any]) -> Delegation:
        try:
            return self.mcp.gateway.get(task_id, owner=current_principal())
        except GatewayError as exc:
            raise _invalid(str(exc)) from exc

    async def _get(self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> DetailedTask:
        task = self._task(params.task_id, ctx)
        detail = DetailedTask(**_task_fields(task))
        if detail.status == "input_required" and task.question is not None:
            detail.input_requests = {"answer": _form(task.question)}
        elif detail.status == "completed":
            detail.result = self.mcp.final_result(task).model_dump(
                by_alias=True, mode="json", exclude_none=True
            )
        return detail

    async def _update(
        self, ctx: ServerRequestContext[Any, Any], params: UpdateTaskParams
    ) -> Acknowledged:
        task = self._task(params.task_id, ctx)
        await self.mcp.answer_form(task, params.input_responses)
        return Acknowledged()

    async def _cancel(
        self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams
    ) -> Acknowledged:
        task = self._task(params.task_id, ctx)
        if not task.final:
            await task.cancel("cancelled by the MCP client (tasks/cancel)")
        return Acknowledged()


def _declares_tasks(ctx: ServerRequestContext[Any, Any]) -> bool:
    capabilities = ctx.session.client_capabilities
    extensions = capabilities.extensions if capabilities is not None else None
    return bool(extensions is not None and TASKS_EXTENSION in extensions)


def _task_fields(task: Delegation) -> dict[str, Any]:
    status = task.status
    if task.final:
        status = "cancelled" if status == "cancelled" else "completed"
    message = task.message or None
    if status == "input_required" and task.question is not None:
        message = task.question.message()
    return {
        "task_id": task.task_id,
        "status": status,
        "status_message": message,
        "created_at": _iso(task.created_at),
        "last_updated_at": _iso(task.updated_at),
        "ttl_ms": None,
    }


def _form(question: Question) -> dict[str, Any]:
    form = types.ElicitRequestFormParams(
        message=question.message(), requested_schema=question.form()
    )
    request = types.ElicitRequest(params=form)
    dumped: dict[str, Any] = request.model_dump(by_alias=True, mode="json", exclude_none=True)
    return dumped


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat().replace("+00:00", "Z")


def _invalid(message: str) -> Exception:
    return MCPError(code=types.INVALID_PARAMS, message=message)


__all__ = ["AS_TASK", "TASKS_EXTENSION", "TASK_WAIT", "TasksExtension"]
