"""The JSON-RPC 2.0 binding of A2A v1.0: `POST <path>` with one request per body; the
streaming methods answer `text/event-stream`, each event a JSON-RPC response. A2A 0.3
methods are served too, translated to the 1.0 operations and back (`synapse.a2a.v03`).

It only frames: parses the envelope, converts `params` to the typed request, calls the
`A2AService` operation, and writes the result or the `A2AError` as JSON-RPC.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from aiohttp import web

from synapse.a2a import v03, wire
from synapse.a2a.errors import A2ACode, A2AError, invalid_params
from synapse.a2a.server.direct import DirectStream
from synapse.a2a.server.httpbase import (
    check_version,
    event_stream_response,
    last_event_id,
    read_json,
    requested_version,
    undeclared_json,
)
from synapse.a2a.server.operations import METHODS
from synapse.a2a.server.view import LAST_EVENT_ID, Subscription
from synapse.a2a.server.view import event_id as _event_id
from synapse.logs import get_logger
from synapse.store.base import StoreUnavailable

if TYPE_CHECKING:
    from synapse.a2a.server.host import BindingHost

log = get_logger("synapse.a2a")


class JsonRpcBinding:
    """`POST <path>`: JSON-RPC 2.0 on the server's service."""

    def __init__(self, server: BindingHost) -> None:
        self.server = server

    async def handle(self, request: web.Request) -> web.StreamResponse:
        server = self.server
        rpc_id: str | int | None = None
        streamed = False
        try:
            # The body is read before authenticating so that a refusal answers the request's
            # id; a body that does not parse is refused only once the caller is known.
            unreadable: A2AError | None = None
            body: Any = None
            try:
                body = await read_json(request, server.config.max_body_size)
            except A2AError as exc:
                unreadable = exc
            if media_type := undeclared_json(request):
                unreadable = A2AError(
                    A2ACode.CONTENT_TYPE_NOT_SUPPORTED,
                    f"Content-Type {media_type!r} is not supported: send application/json",
                )
            rpc_id = _rpc_id(body)
            principal = await server.authenticate(request)
            if unreadable is not None:
                raise unreadable
            method, params = _parse_rpc(body)
            # An A2A 0.3 method (no A2A-Version header, or 0.3): the 1.0 operation it names,
            # its params and its answer translated (synapse.a2a.v03).
            legacy = method in v03.METHOD_TO_V1 and v03.is_v03(requested_version(request))
            streamed = legacy and method in v03.STREAMING_03
            operation = v03.operation_of(method, params) if legacy else method
            handler = METHODS.get(operation)
            if handler is None:
                raise A2AError(A2ACode.METHOD_NOT_FOUND, f"Method {method!r} not found")
            if legacy:
                params = v03.params_to_v1(method, params)
            await server.authorize(request, operation, params)
            if not legacy:
                check_version(request)
            LAST_EVENT_ID.set(last_event_id(request))
            result = await handler(server.service, principal, params)
            if isinstance(result, Subscription | DirectStream):
                return await self._stream(request, rpc_id, result, legacy=legacy)
            if legacy:
                result = v03.result_to_v03(method, wire.to_builtins(result))
            elif result is None:
                result = {}  # 1.0's answers are messages: google.protobuf.Empty is {}
            return _result(rpc_id, result)
        except A2AError as exc:
            if exc.code in (A2ACode.INTERNAL_ERROR, A2ACode.AGENT_NOT_READY):
                log.warning("a2a_error", code=exc.code, message=exc.message)
            else:
                log.info("a2a_refused", code=exc.code, message=exc.message)
            if streamed and exc.http_status != 401:
                return await _error_event(request, rpc_id, exc)  # 0.3 streams say it inline
            return _error_response(rpc_id, exc)
        except asyncio.CancelledError:
            raise
        except StoreUnavailable:  # nothing was kept (see P2PProtocol.handle_message)
            error = A2AError(A2ACode.AGENT_NOT_READY, "cannot store the change; retry later")
            return _error_response(rpc_id, error)
        except RecursionError:  # the parser's depth limit should make this unreachable
            error = A2AError(A2ACode.INVALID_REQUEST, "Invalid request: nested too deeply")
            return _error_response(rpc_id, error)
        except Exception as exc:  # never a bare 500 or a traceback
            log.exception("a2a_internal_error", error=repr(exc))
            return _error_response(rpc_id, A2AError(A2ACode.INTERNAL_ERROR, "internal error"))

    async def _stream(
        self,
        request: web.Request,
        rpc_id: Any,
        subscription: Subscription | DirectStream,
        *,
        legacy: bool = False,
    ) -> web.StreamResponse:
        """Server-sent events, each a JSON-RPC response carrying one `StreamResponse` (for
        an A2A 0.3 client: the 0.3 event it stands for)."""
        response = event_stream_response()
        try:
            await response.prepare(request)
            async for event in subscription.events(self.server.keepalive):
                if event is None:
                    await response.write(b": keepalive\n\n")
                else:
                    shown: Any = v03.event_to_v03(wire.to_builtins(event)) if legacy else event
                    await response.write(
                        _event_id(subscription)
                        + b"data: "
                        + _jsonrpc(rpc_id, result=shown)
                        + b"\n\n"
                    )
        except (ConnectionResetError, ConnectionError):
            log.info("a2a_stream_closed_by_client", task_id=subscription.task_id)
        finally:
            subscription.close()
        return response


# --- JSON-RPC plumbing ----------------------------------------------------------------------------


def _rpc_id(body: Any) -> str | int | None:
    """The request's id if it is a valid one (errors answer it), else None."""
    raw = body.get("id") if isinstance(body, dict) else None
    if isinstance(raw, str) or (isinstance(raw, int) and not isinstance(raw, bool)):
        return raw
    return None


def _parse_rpc(body: Any) -> tuple[str, dict[str, Any]]:
    """(method, params) of a JSON-RPC 2.0 request, or the -32600 / -32602 error."""
    if isinstance(body, list):
        raise A2AError(A2ACode.INVALID_REQUEST, "Batch requests are not supported")
    if not isinstance(body, dict):
        raise A2AError(A2ACode.INVALID_REQUEST, "Invalid Request: not a JSON-RPC object")
    if body.get("id") is not None and _rpc_id(body) is None:
        raise A2AError(
            A2ACode.INVALID_REQUEST, "Invalid request: id must be a string, integer, or null"
        )
    if body.get("jsonrpc") != "2.0":
        raise A2AError(A2ACode.INVALID_REQUEST, "Invalid request: 'jsonrpc' must be exactly '2.0'")
    method = body.get("method")
    if not isinstance(method, str) or not method:
        raise A2AError(A2ACode.INVALID_REQUEST, "Method is required")
    params = body.get("params")
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise invalid_params("params must be an object", path="params")
    return method, params


def _jsonrpc(rpc_id: Any, *, result: Any = None, error: A2AError | None = None) -> bytes:
    body: dict[str, Any] = {"jsonrpc": "2.0", "id": rpc_id}
    if error is not None:
        body["error"] = error.to_json()
    else:
        body["result"] = result
    return wire.encode(body)


def _result(rpc_id: Any, result: Any) -> web.Response:
    return web.Response(body=_jsonrpc(rpc_id, result=result), content_type="application/json")


async def _error_event(request: web.Request, rpc_id: Any, error: A2AError) -> web.StreamResponse:
    """A refused A2A 0.3 streaming call: one server-sent event carrying the JSON-RPC error,
    which 0.3 clients read from the stream they asked for."""
    response = event_stream_response()
    await response.prepare(request)
    await response.write(b"data: " + _jsonrpc(rpc_id, error=error) + b"\n\n")
    return response


def _error_response(rpc_id: Any, error: A2AError) -> web.Response:
    headers = {}
    challenge = getattr(error, "www_authenticate", "")
    if challenge or error.http_status == 401:
        headers["WWW-Authenticate"] = challenge or 'Bearer realm="a2a"'
    return web.Response(
        status=error.http_status,
        body=_jsonrpc(rpc_id, error=error),
        content_type="application/json",
        headers=headers,
    )


__all__ = ["JsonRpcBinding"]
