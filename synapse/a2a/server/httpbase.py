"""What the HTTP bindings of A2A (JSON-RPC, HTTP+JSON/REST) share: reading a bounded JSON
body, the `A2A-Version` check, the server-sent-events response."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from synapse.a2a import wire
from synapse.a2a.errors import A2ACode, A2AError
from synapse.types import RemoteProtocolError
from synapse.types.ijson import parse_i_json

#: The media types a request body of JSON may declare (none declared is taken as JSON too).
JSON_TYPES = frozenset({"application/json", "application/a2a+json"})


def undeclared_json(request: web.Request) -> str:
    """The media type a request declares for its body when it is not JSON, else ""."""
    declared = request.content_type if request.headers.get("Content-Type") else ""
    return "" if not declared or declared in JSON_TYPES else declared


async def read_json(request: web.Request, limit: int) -> Any:
    if request.content_length is not None and request.content_length > limit:
        raise A2AError(A2ACode.INVALID_REQUEST, "Payload too large")
    raw = bytearray()
    async for chunk in request.content.iter_chunked(65536):
        raw += chunk
        if len(raw) > limit:
            raise A2AError(A2ACode.INVALID_REQUEST, "Payload too large")
    # The same I-JSON parser as Synapse envelopes: duplicate names, lone surrogates,
    # non-finite numbers and out-of-range integers are parse errors, deep nesting an
    # invalid request, before anything else sees the body.
    try:
        return parse_i_json(bytes(raw))
    except RemoteProtocolError as exc:
        if (exc.details or {}).get("reason") == "nested too deeply":
            raise A2AError(A2ACode.INVALID_REQUEST, f"Invalid request: {exc.message}") from None
        raise A2AError(A2ACode.PARSE_ERROR, f"Parse error: {exc.message}") from None


def requested_version(request: web.Request) -> str:
    """The A2A version a request asks for: the `A2A-Version` header, else the query
    parameter of that name (A2A v1.0, "Service parameters"), else "" (none given)."""
    given = request.headers.get(wire.VERSION_HEADER, "").strip()
    if not given:
        given = request.query.get(wire.VERSION_HEADER, "").strip()
    return given


def check_version(request: web.Request) -> None:
    wire.check_version(requested_version(request))


def event_stream_response() -> web.StreamResponse:
    return web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream; charset=utf-8",
            "Cache-Control": "no-store",
            "X-Accel-Buffering": "no",
        }
    )


def last_event_id(request: web.Request) -> int | None:
    """The `Last-Event-ID` a client that resumes a stream sends (an event number), if any."""
    value = request.headers.get("Last-Event-ID", "").strip()
    return int(value) if value.isdigit() and len(value) < 19 else None


__all__ = [
    "check_version",
    "event_stream_response",
    "last_event_id",
    "read_json",
    "requested_version",
]
