"""A requester of the MCP Tasks extension (`io.modelcontextprotocol/tasks`), as an extension
of the official MCP client: it claims `resultType: "task"` answers of `tools/call` and follows
the task with `tasks/get` (at the server's poll interval), answering its input requests with
`tasks/update`, or cancelling it with `tasks/cancel`."""

from __future__ import annotations

from typing import Any, Literal

import anyio
import mcp_types as types
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim

TASKS = "io.modelcontextprotocol/tasks"


class TaskHandleResult(types.Result):
    result_type: Literal["task"]
    task_id: str
    status: str
    status_message: str | None = None
    created_at: str
    last_updated_at: str
    ttl_ms: int | None = None
    poll_interval_ms: int | None = None


class TaskIdParams(types.RequestParams):
    task_id: str


class UpdateParams(types.RequestParams):
    task_id: str
    input_responses: dict[str, Any]


class GetTask(types.Request[TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskIdParams


class UpdateTask(types.Request[UpdateParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    params: UpdateParams


class CancelTask(types.Request[TaskIdParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskIdParams


class DetailedTask(types.Result):
    result_type: str = "complete"
    task_id: str
    status: str
    status_message: str | None = None
    created_at: str
    last_updated_at: str
    poll_interval_ms: int | None = None
    input_requests: dict[str, Any] | None = None
    result: dict[str, Any] | None = None


class Acknowledged(types.Result):
    result_type: str = "complete"


class TasksRequester(ClientExtension):
    """Follows task handles to their end; `answers` fill the forms of `input_required`,
    `cancel_after` polls of `working` send `tasks/cancel`."""

    identifier = TASKS

    def __init__(self, answers: dict[str, Any] | None = None, cancel_after: int | None = None):
        self.answers = answers or {}
        self.cancel_after = cancel_after
        self.handles: list[TaskHandleResult] = []
        self.seen: list[DetailedTask] = []
        self.forms: list[dict[str, Any]] = []

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=TaskHandleResult, resolve=self._follow)]

    async def _follow(self, handle: TaskHandleResult, ctx: ClaimContext) -> types.CallToolResult:
        self.handles.append(handle)
        session, task_id = ctx.session, handle.task_id
        working = 0
        for _ in range(400):
            detail = await session.send_request(
                GetTask(params=TaskIdParams(task_id=task_id)), DetailedTask
            )
            self.seen.append(detail)
            if detail.status == "completed":
                assert detail.result is not None
                return types.CallToolResult.model_validate(detail.result)
            if detail.status in ("cancelled", "failed"):
                text = types.TextContent(type="text", text=f"task {detail.status}")
                return types.CallToolResult(content=[text], is_error=True)
            if detail.status == "input_required":
                assert detail.input_requests is not None
                form = detail.input_requests["answer"]["params"]["requestedSchema"]
                self.forms.append(form)
                content = {k: v for k, v in self.answers.items() if k in form["properties"]}
                response = {"action": "accept", "content": content}
                await session.send_request(
                    UpdateTask(
                        params=UpdateParams(task_id=task_id, input_responses={"answer": response})
                    ),
                    Acknowledged,
                )
            else:
                working += 1
                if self.cancel_after is not None and working == self.cancel_after:
                    await session.send_request(
                        CancelTask(params=TaskIdParams(task_id=task_id)), Acknowledged
                    )
            # The server's suggested interval: the extension's polling, not a test's wait.
            await anyio.sleep((detail.poll_interval_ms or 500) / 1000)
        raise AssertionError(f"task {task_id} did not end")
