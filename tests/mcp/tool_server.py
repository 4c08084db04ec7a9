"""A small MCP server written with the official SDK, for `McpToolsHandler`'s tests: run over
stdio (`python tool_server.py`) or streamable HTTP (`python tool_server.py --http PORT`)."""

from __future__ import annotations

import sys
from typing import Annotated

from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ElicitRequest, ElicitRequestFormParams, ElicitResult, InputRequiredResult
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, Field

server = MCPServer("tools")


class Sum(BaseModel):
    total: int


@server.tool()
def add(
    a: Annotated[int, Field(description="the first addend")],
    b: Annotated[int, Field(description="the second addend")],
) -> Sum:
    """Add two integers."""
    return Sum(total=a + b)


@server.tool()
async def count(n: Annotated[int, Field(ge=1, le=50)], ctx: Context) -> str:
    """Count to n, reporting progress at each step."""
    for i in range(1, n + 1):
        await ctx.report_progress(i, n, f"counted {i}")
    return f"counted to {n}"


STYLE_FORM = {
    "type": "object",
    "properties": {
        "style": {
            "type": "string",
            "description": "the poem's style",
            "enum": ["haiku", "sonnet"],
            "default": "haiku",
        }
    },
    "required": ["style"],
}


@server.tool()
async def poem(topic: str, ctx: Context) -> str | InputRequiredResult:
    """Write a poem; asks which style (elicitation: in the result on a 2026-07-28
    connection, as a request in the middle of the call on an older one)."""
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        answer = (ctx.input_responses or {}).get("style")
        if answer is None:
            form = ElicitRequestFormParams(message="Which style?", requested_schema=STYLE_FORM)
            return InputRequiredResult(
                input_requests={"style": ElicitRequest(params=form)}, request_state="poem"
            )
        result = ElicitResult.model_validate(
            answer if isinstance(answer, dict) else answer.model_dump(by_alias=True)
        )
    else:
        result = await ctx.session.elicit_form(
            message="Which style?", requested_schema=STYLE_FORM, related_request_id=ctx.request_id
        )
    if result.action != "accept" or not result.content:
        raise ToolError("no style given")
    return f"a {result.content['style']} about {topic}"


ORDER_FORM = {
    "type": "object",
    "properties": {
        "size": {
            "type": "string",
            "description": "the cup's size",
            "oneOf": [
                {"const": "s", "title": "Small"},
                {"const": "l", "title": "Large"},
            ],
        },
        "extras": {
            "type": "array",
            "description": "what to add",
            "items": {"anyOf": [{"const": "milk", "title": "Oat milk"}]},
        },
        "note": {"type": "string", "description": "anything else"},
    },
    "required": ["size"],
}


@server.tool()
async def order(drink: str, ctx: Context) -> str | InputRequiredResult:
    """Order a drink; asks for its size (required) and, optionally, extras and a note."""
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        answer = (ctx.input_responses or {}).get("order")
        if answer is None:
            form = ElicitRequestFormParams(message="Which size?", requested_schema=ORDER_FORM)
            return InputRequiredResult(
                input_requests={"order": ElicitRequest(params=form)}, request_state="order"
            )
        result = ElicitResult.model_validate(
            answer if isinstance(answer, dict) else answer.model_dump(by_alias=True)
        )
    else:
        result = await ctx.session.elicit_form(
            message="Which size?", requested_schema=ORDER_FORM, related_request_id=ctx.request_id
        )
    content = result.content or {}
    return f"{drink} {content.get('size')} {sorted(content)}"


@server.tool()
def explode(reason: str) -> str:
    """Always fails."""
    raise ToolError(f"exploded: {reason}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        import anyio

        anyio.run(lambda: server.run_streamable_http_async(port=int(sys.argv[2])))
    else:
        server.run()
