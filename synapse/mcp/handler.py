"""`McpToolsHandler`: an MCP server's tools as a Synapse `TaskHandler`.

Each tool is a task type (`get_capabilities` from `tools/list`, with the tool's input
schema). `validate_task` checks a payload against that schema: required fields that are
missing become `task_need_info` (each with the schema's description of it); any other
mismatch refuses the task (`invalid_params`). `execute_task` calls the tool: its progress
notifications become `task_status_update`s, an elicitation it makes becomes `task_need_info`
(the form's fields, with their defaults and choices), and its result the task's result (the
structured content when there is one, else the text). A tool error fails the task.

So a Synapse or A2A partner can use any MCP server's tools, durably and signed:

    handler = McpToolsHandler("python my_tools_server.py")   # or "http://host/mcp"
    await handler.start()
    peer = Peer("tools", handler=handler, ...)
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

import jsonschema
import mcp_types as types
from mcp import Client, StdioServerParameters
from mcp.client.session import ClientRequestContext

from synapse.logs import get_logger
from synapse.p2p.engine import Validation
from synapse.runtime.handler import ExecutionContext, TaskFailure
from synapse.types import Capability, MissingField, Reason, TaskError, TaskResult
from synapse.types.errors import ErrorCode

log = get_logger("synapse.mcp")

#: The task a tool call runs for (elicitations of a 2026-07-28 server arrive in its context).
_RUNNING: contextvars.ContextVar[ExecutionContext | None] = contextvars.ContextVar(
    "synapse_mcp_running", default=None
)


def server_of(spec: str) -> str | StdioServerParameters:
    """`--handler-mcp COMMAND|URL`: an http(s) URL is streamable HTTP, else a command line."""
    if spec.startswith(("http://", "https://")):
        return spec
    words = shlex.split(spec)
    if not words:
        raise ValueError("an MCP server is a command line or an http(s) URL")
    return StdioServerParameters(command=words[0], args=words[1:])


class McpToolsHandler:
    """Offers the tools of the MCP server `server` as task types (see the module)."""

    def __init__(self, server: str | StdioServerParameters, *, connect_timeout: float = 30.0):
        self.server = server_of(server) if isinstance(server, str) else server
        self.connect_timeout = connect_timeout
        self.tools: dict[str, types.Tool] = {}
        self._client: Client | None = None
        self._runner: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        #: Tool calls in flight (an elicitation without a context goes to the only one).
        self._calls: set[ExecutionContext] = set()

    # --- the connection -------------------------------------------------------------------

    async def start(self) -> None:
        """Connect and list the tools (before the peer serves: validation needs them)."""
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._runner = asyncio.create_task(self._run(ready), name="mcp-tools-client")
        try:
            await asyncio.wait_for(asyncio.shield(ready), self.connect_timeout)
        except BaseException:
            await self.close()
            raise

    async def _run(self, ready: asyncio.Future[None]) -> None:
        # The client is entered and left in this one task: the SDK's cancel scopes ask it.
        try:
            async with Client(self.server, elicitation_callback=self._elicit) as client:
                listed = await client.list_tools()
                self.tools = {tool.name: tool for tool in listed.tools}
                self._client = client
                ready.set_result(None)
                log.debug("mcp_tools", tools=sorted(self.tools))
                await self._stop.wait()
        except Exception as exc:
            cause = _cause(exc)
            if not ready.done():
                ready.set_exception(ConnectionError(f"cannot reach the MCP server: {cause}"))
            else:
                log.error("mcp_tools_lost", error=cause)
        finally:
            self._client = None

    async def close(self) -> None:
        self._stop.set()
        if self._runner is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(self._runner, 10.0)

    async def __aenter__(self) -> McpToolsHandler:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # --- TaskHandler ------------------------------------------------------------------------

    def get_capabilities(self) -> Sequence[Capability]:
        return [
            Capability(
                name=tool.name,
                description=tool.description or tool.title or "",
                input_schema=dict(tool.input_schema),
            )
            for tool in self.tools.values()
        ]

    def validate_task(self, task_type: str, payload: dict[str, Any]) -> Validation:
        tool = self.tools.get(task_type)
        if tool is None:
            return Validation(
                ok=False,
                reason=Reason(
                    code=ErrorCode.CAPABILITY_LACKING.value, message=f"no tool {task_type!r}"
                ),
            )
        schema = dict(tool.input_schema)
        properties: Mapping[str, Any] = schema.get("properties") or {}
        required = [name for name in schema.get("required") or [] if name not in payload]
        if required:
            return Validation(
                missing_fields=[_missing(name, properties.get(name) or {}) for name in required],
                question=f"{task_type} needs {', '.join(required)}",
            )
        errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(payload), key=str)
        if errors:
            where = "/".join(str(p) for p in errors[0].absolute_path) or "payload"
            return Validation(
                ok=False,
                reason=Reason(
                    code=ErrorCode.INVALID_PARAMS.value, message=f"{where}: {errors[0].message}"
                ),
            )
        return Validation()

    async def execute_task(
        self, ctx: ExecutionContext, task_type: str, payload: dict[str, Any]
    ) -> TaskResult:
        client = self._client
        if client is None:
            raise TaskFailure(_error("the MCP server is not connected", recoverable=True))

        async def report(progress: float, total: float | None, message: str | None) -> None:
            percent = 100.0 * progress / total if total else None
            if percent is not None:
                percent = max(0.0, min(100.0, percent))
            await ctx.progress(percent, message or "")

        token = _RUNNING.set(ctx)
        self._calls.add(ctx)
        try:
            result = await client.call_tool(task_type, payload, progress_callback=report)
        finally:
            self._calls.discard(ctx)
            _RUNNING.reset(token)
        text = "".join(c.text for c in result.content if isinstance(c, types.TextContent))
        if result.is_error:
            raise TaskFailure(_error(text or f"the tool {task_type} failed"))
        if result.structured_content is not None:
            return TaskResult(output_type="json", output=result.structured_content)
        return TaskResult(output_type="text", output=text)

    # --- elicitation ------------------------------------------------------------------------

    async def _elicit(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult | types.ErrorData:
        """The tool asks for input: ask the requester (`task_need_info`)."""
        ctx = _RUNNING.get() or (next(iter(self._calls)) if len(self._calls) == 1 else None)
        if ctx is None or not isinstance(params, types.ElicitRequestFormParams):
            return types.ErrorData(
                code=types.INVALID_REQUEST, message="this elicitation cannot be put to a task"
            )
        schema = params.requested_schema
        properties: Mapping[str, Any] = schema.get("properties") or {}
        # The form as the tool wrote it: what it requires is asked for; an optional field
        # is passed on when the requester gives it anyway, and otherwise left to the tool.
        required = [name for name in schema.get("required") or [] if name in properties]
        missing = [_missing(name, properties[name]) for name in required]
        fields = await ctx.need_info(missing, question=params.message)
        content = {name: fields[name] for name in properties if name in fields}
        return types.ElicitResult(action="accept", content=content)


def _choices(spec: Mapping[str, Any]) -> list[tuple[Any, str]]:
    """The values a property may take, each with its title: `enum` (with `enumNames`, if
    any), or titled `oneOf`/`anyOf` of `const`s; of its `items` for a multi-select."""
    items = spec.get("items")
    if spec.get("type") == "array" and isinstance(items, Mapping):
        spec = items
    titled = spec.get("oneOf") or spec.get("anyOf")
    if isinstance(titled, list) and titled:
        return [
            (o["const"], str(o.get("title") or o["const"]))
            for o in titled
            if isinstance(o, Mapping) and "const" in o
        ]
    values = list(spec.get("enum") or [])
    names = list(spec.get("enumNames") or [])
    return [(v, str(names[i]) if i < len(names) else str(v)) for i, v in enumerate(values)]


def _missing(name: str, spec: Mapping[str, Any]) -> MissingField:
    """A schema property as a missing field: its description, default and choices (with
    their titles, in the reason, where they differ from the values)."""
    choices = _choices(spec)
    values = [value for value, _ in choices]
    default = spec.get("default")
    reason = str(spec.get("description") or spec.get("title") or f"{name} is required")
    titles = [f"{value} ({title})" for value, title in choices if title != str(value)]
    if titles:
        reason += "; choices: " + ", ".join(titles)
    if spec.get("type") == "array" and choices:
        reason += " (one or more)"
    suggested = default if default is not None else (values[0] if values else None)
    return MissingField(
        field=name,
        reason=reason,
        suggested_value=suggested,
        alternatives=[v for v in values if v != suggested],
    )


def _cause(exc: BaseException) -> str:
    """What went wrong, said plainly: the exceptions inside an exception group (the SDK's
    task group wraps the real cause), each as `Type: message`."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_cause(inner) for inner in exc.exceptions)
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _error(message: str, *, recoverable: bool = False) -> TaskError:
    return TaskError(
        code=ErrorCode.EXECUTION_FAILED.value, message=message, recoverable=recoverable
    )


__all__ = ["McpToolsHandler", "server_of"]
