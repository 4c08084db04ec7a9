"""`synapse mcp`: an MCP server whose tools delegate tasks to Synapse peers and A2A agents.

Tools (each with input and output schemas): `list_partners`, `delegate_task`, `get_task`,
`list_tasks`, `cancel_task`, `answer_task`; the resource `synapse://tasks/{task_id}` is a
task's history. A call that waits (`delegate_task`, `get_task`, `answer_task` with
`wait_seconds`) reports the task's progress as MCP progress notifications and returns at the
end, when the task asks something, or when the wait is over (the task goes on: `get_task`).

When the task asks (`task_need_info`, `task_need_human`, an A2A agent's INPUT_REQUIRED) and the
client declares elicitation, the question is asked through it as a form: on a 2026-07-28
connection as an `InputRequiredResult` (the client answers and calls again, with the task id
sealed in the request state), on an older one as an `elicitation/create` request in the middle
of the call. Otherwise the result carries the question, and `answer_task` answers it.

A refused or failed call is an MCP tool error with one clear line; the server keeps serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import Annotated, Any, Literal

import mcp_types as types
import msgspec
import uvicorn
from mcp.server.auth.provider import TokenVerifier
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import AnyHttpUrl, BaseModel, Field
from starlette.applications import Starlette

from synapse.a2a import A2AError
from synapse.mcp.auth import current_principal
from synapse.mcp.gateway import Gateway, GatewayError
from synapse.mcp.questions import (
    BadAnswer,
    PersonAnswer,
    Question,
    answer_from_arguments,
    answer_from_form,
)
from synapse.mcp.tasks_ext import AS_TASK, TASK_WAIT, TasksExtension
from synapse.mcp.tracking import Delegation, McpStatus
from synapse.runtime.protocol import TaskHandle
from synapse.types import DecisionAction, Priority, SynapseException

#: The key of the one input request a waiting task makes (`InputRequiredResult`).
ANSWER_KEY = "answer"
#: Who answered, in the task's audit trail, when the request has no authenticated principal.
MCP_ACTOR = "mcp-client"


class TaskView(BaseModel):
    """A delegated task as a tool reports it."""

    task_id: str
    partner: str
    task_type: str
    protocol: Literal["synapse", "a2a"]
    status: McpStatus = Field(description="MCP task status: working, input_required, …")
    state: str = Field(description="the protocol's own state (Synapse or A2A)")
    progress: float | None = Field(default=None, description="percent done, if reported")
    message: str | None = None
    question: dict[str, Any] | None = Field(
        default=None, description="what the task waits for: answer it with answer_task"
    )
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    hint: str | None = Field(default=None, description="what to do next")


class CapabilityView(BaseModel):
    name: str
    description: str = ""
    input_schema: dict[str, Any] | None = None


class PartnerInfo(BaseModel):
    name: str
    protocol: Literal["synapse", "a2a"]
    endpoint: str
    reachable: bool
    capabilities: list[CapabilityView] = []
    description: str | None = None
    error: str | None = None


class PartnerList(BaseModel):
    partners: list[PartnerInfo]


class TaskList(BaseModel):
    tasks: list[TaskView]


def task_view(task: Delegation) -> TaskView:
    view = TaskView.model_validate(task.view())
    if task.final:
        return view
    if task.question is not None:
        view.hint = f"answer it with answer_task(task_id={task.task_id!r}, …)"
    else:
        view.hint = f"still running: get_task(task_id={task.task_id!r}, wait_seconds=…)"
    return view


class SynapseMcp:
    """The MCP server in front of a `Gateway` (see the module's docstring)."""

    def __init__(
        self,
        gateway: Gateway,
        *,
        wait: float = 20.0,
        name: str = "synapse",
        token_verifier: TokenVerifier | None = None,
        public_url: str | None = None,
        issuer: str | None = None,
    ) -> None:
        """`token_verifier`: who may call over HTTP (`synapse.mcp.auth`); it needs the URL
        clients reach the server at (`public_url`) and the token issuer's (`issuer`, default
        the same), which the protected-resource metadata names."""
        self.gateway = gateway
        #: How long a call waits for the task by default before returning its id.
        self.wait = wait
        auth = None
        if token_verifier is not None:
            if public_url is None:
                raise ValueError("a token verifier needs the server's public URL")
            # The protected-resource metadata (RFC 9728) names an authorization server: an
            # OAuth issuer's. Static tokens have none, so there is no metadata to serve (it
            # would name this server, which issues nothing).
            auth = AuthSettings(
                issuer_url=AnyHttpUrl(issuer or public_url),
                resource_server_url=AnyHttpUrl(public_url) if issuer else None,
                validate_token_resource=False,  # the verifier checks the audience itself
            )
        self.server: MCPServer[Any] = MCPServer(
            name,
            token_verifier=token_verifier,
            auth=auth,
            extensions=[TasksExtension(self)],
            instructions=(
                "Delegate tasks to other agents (Synapse peers and A2A agents). Call "
                "list_partners to see who can do what, delegate_task to start a task; a "
                "task that asks a question waits for answer_task."
            ),
        )
        self._register()

    # --- serving --------------------------------------------------------------------------

    async def run_stdio(self) -> None:
        """Serve one client on stdin/stdout until it closes them."""
        await self.server.run_stdio_async()

    def http_app(self, host: str = "127.0.0.1") -> Starlette:
        """The streamable HTTP app (`/mcp`), for any ASGI server."""
        return self.server.streamable_http_app(host=host)

    async def run_http(
        self, sock: socket.socket, host: str = "127.0.0.1", *, stop: asyncio.Event | None = None
    ) -> None:
        """Serve streamable HTTP at /mcp on `sock` (bound and listening: the caller knows
        the port before anyone connects), until `stop` is set (without one: until SIGINT or
        SIGTERM, uvicorn's own handling)."""
        config = uvicorn.Config(self.http_app(host), log_level="warning")
        if stop is None:
            await uvicorn.Server(config).serve(sockets=[sock])
            return
        server = _QuietServer(config)
        serving = asyncio.ensure_future(server.serve(sockets=[sock]))
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
        server.should_exit = True  # finish the requests under way, then stop
        stopping.cancel()
        await serving

    # --- the tools ------------------------------------------------------------------------

    def _register(self) -> None:
        server = self.server
        server.add_tool(self.list_partners, title="List partners")
        server.add_tool(self.delegate_task, title="Delegate a task")
        server.add_tool(self.get_task, title="Get a task")
        server.add_tool(self.list_tasks, title="List tasks")
        server.add_tool(self.cancel_task, title="Cancel a task")
        server.add_tool(self.answer_task, title="PersonAnswer a task's question")
        server.resource(
            "synapse://tasks/{task_id}",
            name="task",
            description="A delegated task: its state and its history, as JSON",
            mime_type="application/json",
        )(self.task_history)

    async def list_partners(self) -> PartnerList:
        """The agents tasks can be delegated to: Synapse peers and A2A agents, what each can
        do (task types, with their input schemas) and whether it answers now."""
        found = await self.gateway.partners()
        return PartnerList(partners=[PartnerInfo.model_validate(p) for p in found])

    async def delegate_task(
        self,
        partner: Annotated[str, Field(description="the partner's name (list_partners)")],
        task_type: Annotated[str, Field(description="one of the partner's capabilities")],
        ctx: Context,
        payload: Annotated[
            dict[str, Any] | None, Field(description="the task's input (a JSON object)")
        ] = None,
        deadline: Annotated[
            datetime | None, Field(description="when the task must be done (ISO 8601)")
        ] = None,
        priority: Annotated[Literal["low", "normal", "high", "urgent"], Field()] = "normal",
        wait_seconds: Annotated[
            float | None,
            Field(
                ge=0,
                description="how long to wait for the outcome before returning the task id "
                "(default: the server's)",
            ),
        ] = None,
    ) -> TaskView | types.InputRequiredResult:
        """Start a task at a partner. A short task returns its result; a longer one returns
        its id while it runs (follow it with get_task). A question the task asks is put
        to the user when the client can (elicitation), else returned for answer_task."""
        answered = True
        if ctx.request_state is not None:  # the client answered our form: go on with its task
            task = self._task(ctx.request_state)
            answered = await self.answer_form(task, ctx.input_responses)
        else:
            try:
                task = await self.gateway.delegate(
                    partner,
                    task_type,
                    payload,
                    deadline=deadline,
                    priority=Priority(priority),
                    owner=current_principal(),
                )
            except GatewayError as exc:
                raise ToolError(str(exc)) from exc
        # A dismissed form is not asked again: the call returns the task (its id, its
        # question), which waits for answer_task or cancel_task.
        wait, ask = self._wait(wait_seconds), answered
        if AS_TASK.get():  # a task handle answers: wait a moment only, ask nothing
            wait, ask = min(wait, TASK_WAIT), False
        outcome = await self._follow(task, ctx, wait, ask=ask)
        if isinstance(outcome, TaskView):
            _raise_if_refused(task)
        return outcome

    async def get_task(
        self,
        task_id: str,
        ctx: Context,
        wait_seconds: Annotated[
            float, Field(ge=0, description="wait up to this long for the task to end")
        ] = 0.0,
    ) -> TaskView | types.InputRequiredResult:
        """A delegated task: its status, progress, question, result or error."""
        answered = True
        if ctx.request_state is not None:
            task = self._task(ctx.request_state)
            answered = await self.answer_form(task, ctx.input_responses)
        else:
            task = self._task(task_id)
        return await self._follow(task, ctx, wait_seconds, ask=answered and wait_seconds > 0)

    async def list_tasks(
        self,
        status: Annotated[
            McpStatus | None, Field(description="only tasks with this status")
        ] = None,
        limit: Annotated[int, Field(ge=1, le=1000)] = 100,
    ) -> TaskList:
        """The tasks delegated through this server, newest last."""
        tasks = [task_view(t) for t in self.gateway.tasks(owner=current_principal())]
        if status is not None:
            tasks = [t for t in tasks if t.status == status]
        return TaskList(tasks=tasks[-limit:])

    async def cancel_task(
        self,
        task_id: str,
        reason: Annotated[str | None, Field(description="why, told to the partner")] = None,
    ) -> TaskView:
        """Cancel a delegated task; returns it once the partner acknowledged (or ended it)."""
        task = self._task(task_id)
        if task.final:
            raise ToolError(f"task {task_id} has already ended ({task.state})")
        try:
            await task.cancel(reason)
        except (SynapseException, A2AError) as exc:
            raise ToolError(f"cannot cancel task {task_id}: {exc}") from exc
        since = task.version
        loop = asyncio.get_running_loop()
        until = loop.time() + min(self.wait, 10.0)
        while not task.final and await task.changed(since, until - loop.time()):
            since = task.version
        return task_view(task)

    async def answer_task(
        self,
        task_id: str,
        ctx: Context,
        fields: Annotated[
            dict[str, Any] | None,
            Field(description="the missing fields (need_info), or changed proposed values"),
        ] = None,
        decision: Annotated[
            Literal["approve", "reject"] | None,
            Field(description="a person's decision (need_human)"),
        ] = None,
        rejection_reason: str = "",
        notes: str = "",
        wait_seconds: Annotated[float | None, Field(ge=0)] = None,
    ) -> TaskView | types.InputRequiredResult:
        """Answer what a task asks: the missing fields of a need_info, or approve / reject
        a need_human (with changed values if you like). Then follow the task as
        delegate_task does."""
        task = self._task(task_id)
        question = task.question
        if question is None or task.final:
            raise ToolError(f"task {task_id} is not waiting for an answer (it is {task.state})")
        try:
            answer = answer_from_arguments(
                question,
                fields=fields,
                decision=decision,
                rejection_reason=rejection_reason,
                notes=notes,
            )
        except BadAnswer as exc:
            raise ToolError(f"task {task_id}: {exc}") from exc
        await self._send(task, answer)
        return await self._follow(task, ctx, self._wait(wait_seconds))

    async def task_history(self, task_id: str) -> str:
        """The task and its history (Synapse: every transition and who answered what)."""
        try:
            task = self.gateway.get(task_id, owner=current_principal())
        except GatewayError as exc:
            raise ResourceError(str(exc)) from exc
        return _json({**task.view(), "history": await history_of(task)})

    # --- following a task ---------------------------------------------------------------------

    def _task(self, task_id: str) -> Delegation:
        try:
            return self.gateway.get(task_id, owner=current_principal())
        except GatewayError as exc:
            raise ToolError(str(exc)) from exc

    def final_result(self, task: Delegation) -> types.CallToolResult:
        """What `delegate_task` answers for an ended task (the Tasks extension's result)."""
        view = task_view(task)
        refused = task.refused and task.error is not None
        text = json.dumps(view.model_dump(mode="json"), ensure_ascii=False, indent=2)
        if refused and task.error is not None:
            text = (
                f"{task.partner} did not take {task.task_type} task {task.task_id}: "
                f"{task.error.code}: {task.error.message}"
            )
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=text)],
            structured_content=None if refused else view.model_dump(mode="json"),
            is_error=refused,
        )

    def _wait(self, seconds: float | None) -> float:
        return self.wait if seconds is None else seconds

    async def _follow(
        self, task: Delegation, ctx: Context, wait: float, *, ask: bool = True
    ) -> TaskView | types.InputRequiredResult:
        """Wait for the task's end or question (at most `wait` s), telling its progress."""
        loop = asyncio.get_running_loop()
        until = loop.time() + wait
        since = -1
        while True:
            if task.version != since:
                since = task.version
                await _tell_progress(task, ctx)
            if task.final:
                return task_view(task)
            question = task.question
            if question is not None:
                if not ask or not _can_elicit(ctx):
                    return task_view(task)
                if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
                    return _input_required(task, question)
                result = await ctx.session.elicit_form(
                    message=question.message(),
                    requested_schema=question.form(),
                    related_request_id=ctx.request_id,
                )
                if not await self._take_elicitation(task, result):
                    return task_view(task)
                continue
            left = until - loop.time()
            if left <= 0:
                return task_view(task)
            await task.changed(since, left)

    async def answer_form(self, task: Delegation, responses: Mapping[str, Any] | None) -> bool:
        """The client's answer to our form (a retried call): send it on. False when the
        person dismissed the form (or declined a need_info): nothing was answered."""
        if task.question is None:
            return True  # answered meanwhile (answer_task, or a retry of the same answer)
        response = (responses or {}).get(ANSWER_KEY)
        if response is None:
            return False
        result = types.ElicitResult.model_validate(
            response if isinstance(response, Mapping) else response.model_dump(by_alias=True)
        )
        return await self._take_elicitation(task, result)

    async def _take_elicitation(self, task: Delegation, result: types.ElicitResult) -> bool:
        """Answer the task from the form's result; False when the user gave no answer."""
        question = task.question
        if question is None:
            return True
        if result.action == "cancel" or (result.action == "decline" and question.human is None):
            return False  # the task keeps waiting: answer_task, or cancel_task
        if result.action == "decline":  # declining a decision is a rejection
            answer = PersonAnswer(action=DecisionAction.REJECT, rejection_reason="declined")
        else:
            try:
                answer = answer_from_form(question, result.content or {})
            except BadAnswer as exc:
                raise ToolError(f"task {task.task_id}: {exc}") from exc
        await self._send(task, answer)
        return True

    async def _send(self, task: Delegation, answer: PersonAnswer) -> None:
        try:
            await task.answer(answer, by=current_principal() or MCP_ACTOR)
        except (SynapseException, A2AError, ValueError) as exc:
            raise ToolError(f"task {task.task_id}: the answer was refused: {exc}") from exc


class _QuietServer(uvicorn.Server):
    """uvicorn's server, leaving SIGINT and SIGTERM to the caller."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _can_elicit(ctx: Context) -> bool:
    capabilities = ctx.client_capabilities
    return capabilities is not None and capabilities.elicitation is not None


def _input_required(task: Delegation, question: Question) -> types.InputRequiredResult:
    form = types.ElicitRequestFormParams(
        message=question.message(), requested_schema=question.form()
    )
    return types.InputRequiredResult(
        input_requests={ANSWER_KEY: types.ElicitRequest(params=form)},
        # Sealed by the SDK (encrypted, bound to this request, expiring): not forgeable.
        request_state=task.task_id,
    )


async def _tell_progress(task: Delegation, ctx: Context) -> None:
    """One MCP progress notification (a no-op when the client asked for none)."""
    message = task.message or task.state
    await ctx.report_progress(task.progress or 0.0, 100.0, message)


def _raise_if_refused(task: Delegation) -> None:
    """A task that never ran (refused, rejected, undeliverable) is a tool error."""
    error = task.error
    if task.refused and error is not None:
        raise ToolError(
            f"{task.partner} did not take {task.task_type} task {task.task_id}: "
            f"{error.code}: {error.message}"
        )


async def history_of(task: Delegation) -> list[dict[str, Any]]:
    """A task's history: Synapse transitions and audit entries, or A2A messages."""
    handle = task.handle
    if isinstance(handle, TaskHandle):
        rec = handle.record
        steps = [
            {
                "at": t.at,
                "from": t.from_state.value,
                "to": t.to_state.value,
                "event": t.event.value,
            }
            for t in rec.history
        ]
        steps += [{"audit": msgspec.to_builtins(a)} for a in rec.audit]
        return steps
    try:
        a2a_task = await handle.client.get_task(handle.task_id)
    except A2AError as exc:
        return [{"error": str(exc)}]
    return [msgspec.to_builtins(m) for m in a2a_task.history]


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str, indent=2)


__all__ = ["PartnerList", "SynapseMcp", "TaskList", "TaskView", "task_view"]
