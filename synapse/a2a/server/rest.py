"""The HTTP+JSON/REST binding of A2A v1.0: each operation at its route under the interface
URL (`<path>/message:send`, `<path>/tasks/{id}` …, optionally after a `/{tenant}` segment),
bodies and answers in proto JSON (`application/json`; `application/a2a+json` accepted),
query parameters named as the JSON members (`historyLength`, `pageSize` …), the streaming
operations as server-sent events whose `data` is one `StreamResponse`, and errors as a
`google.rpc.Status` body with the HTTP status of the error.

Its routes are in `synapse.a2a.routes`, which the client (`synapse.a2a.client.transports`) shares.
A2A 0.3's REST routes (`/v1/message:send` …, no `A2A-Version` header or 0.3) are served too,
translated (`synapse.a2a.v03rest`).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from aiohttp import web

from synapse.a2a import v03, v03rest, wire
from synapse.a2a.errors import A2ACode, A2AError
from synapse.a2a.routes import ROUTE_OF, ROUTES, Route, match
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
from synapse.types.errors import SynapseException

if TYPE_CHECKING:
    from synapse.a2a.server.host import BindingHost

log = get_logger("synapse.a2a")


class RestBinding:
    """`<path>/…`: the REST routes on the server's service."""

    def __init__(self, server: BindingHost) -> None:
        self.server = server
        self.prefix = ""

    def add_routes(self, app: web.Application, prefix: str) -> None:
        self.prefix = prefix.rstrip("/")
        app.router.add_route("*", self.prefix + "/{tail:.+}", self.handle)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        server = self.server
        try:
            # The raw path: path variables are percent-decoded once, after matching.
            path = request.rel_url.raw_path[len(self.prefix) :]
            if v03.is_v03(requested_version(request)):
                legacy = v03rest.match03(request.method, path)
                if legacy is not None:
                    return await self._handle_v03(request, *legacy)
            found = match(request.method, path)
            if found is None:
                raise A2AError(A2ACode.METHOD_NOT_FOUND, f"no A2A route {request.method} {path}")
            if isinstance(found, str):
                raise _NotAllowed(found)
            route, variables, tenant = found
            principal = await server.authenticate(request)
            check_version(request)
            params: dict[str, Any] = {}
            if route.body:
                params = await self._body(request)
            params.update(_query(request))
            params.update(variables)
            if tenant:
                params["tenant"] = tenant
            await server.authorize(request, route.method, params)
            strict = route.body
            LAST_EVENT_ID.set(last_event_id(request))
            result = await METHODS[route.method](server.service, principal, params, strict=strict)
            if isinstance(result, Subscription | DirectStream):
                return await self._stream(request, result)
            return web.Response(
                body=wire.encode({} if result is None else result),
                content_type="application/json",
            )
        except _NotAllowed as exc:
            error = A2AError(A2ACode.METHOD_NOT_FOUND, f"{request.method} is not allowed here")
            response = _error_response(error)
            response.set_status(405)
            response.headers["Allow"] = exc.allowed
            return response
        except A2AError as exc:
            if exc.code in (A2ACode.INTERNAL_ERROR, A2ACode.AGENT_NOT_READY):
                log.warning("a2a_error", code=exc.code, message=exc.message, binding="rest")
            else:
                log.info("a2a_refused", code=exc.code, message=exc.message, binding="rest")
            return _error_response(exc)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # never a bare 500 or a traceback
            log.exception("a2a_internal_error", error=repr(exc), binding="rest")
            return _error_response(A2AError(A2ACode.INTERNAL_ERROR, "internal error"))

    async def _handle_v03(
        self, request: web.Request, route: v03rest.Route03, variables: dict[str, str]
    ) -> web.StreamResponse:
        """An A2A 0.3 REST request: its 0.3 method, as the 1.0 operation, answered in 0.3."""
        server = self.server
        principal = await server.authenticate(request)
        body = await self._body(request) if route.body else {}
        method = route.method
        legacy = v03rest.params_of(method, variables, _query(request), body)
        operation = v03.operation_of(method, legacy)
        params = v03.params_to_v1(method, legacy)
        await server.authorize(request, operation, params)
        result = await METHODS[operation](server.service, principal, params)
        if isinstance(result, Subscription | DirectStream):
            return await self._stream(request, result, legacy=True)
        answer = v03rest.result_of(method, v03.result_to_v03(method, wire.to_builtins(result)))
        return web.Response(body=wire.encode(answer), content_type="application/json")

    async def _body(self, request: web.Request) -> dict[str, Any]:
        if media_type := undeclared_json(request):
            error = A2AError(
                A2ACode.INVALID_REQUEST,
                f"Content-Type {media_type!r} is not supported: send application/json",
            )
            raise _Unsupported(error)
        if not request.can_read_body:
            return {}
        body = await read_json(request, self.server.config.max_body_size)
        if not isinstance(body, dict):
            raise A2AError(A2ACode.INVALID_REQUEST, "the request body must be a JSON object")
        return body

    async def _stream(
        self,
        request: web.Request,
        subscription: Subscription | DirectStream,
        *,
        legacy: bool = False,
    ) -> web.StreamResponse:
        response = event_stream_response()
        try:
            await response.prepare(request)
            async for event in subscription.events(self.server.keepalive):
                if event is None:
                    await response.write(b": keepalive\n\n")
                else:
                    shown: Any = event
                    if legacy:
                        shown = v03rest.event_to_rest(v03.event_to_v03(wire.to_builtins(event)))
                    await response.write(
                        _event_id(subscription) + b"data: " + wire.encode(shown) + b"\n\n"
                    )
        except (ConnectionResetError, ConnectionError):
            log.info("a2a_stream_closed_by_client", task_id=subscription.task_id, binding="rest")
        finally:
            subscription.close()
        return response


class _NotAllowed(SynapseException):
    def __init__(self, allowed: str) -> None:
        super().__init__(allowed)
        self.allowed = allowed


class _Unsupported(A2AError):
    """A body of a media type other than JSON: HTTP 415."""

    def __init__(self, error: A2AError) -> None:
        super().__init__(error.code, error.message, error.metadata, http_status=415)


def _query(request: web.Request) -> dict[str, Any]:
    """The query parameters as members (a repeated one as a list); `A2A-Version` is a
    service parameter, not a member."""
    params: dict[str, Any] = {}
    for key in request.query:
        if key == wire.VERSION_HEADER:
            continue
        values = request.query.getall(key)
        params[key] = values[-1] if len(values) == 1 else values
    return params


def _error_response(error: A2AError) -> web.Response:
    http_status, _ = error.status
    if isinstance(error, _Unsupported):
        http_status = 415
    headers = {}
    challenge = getattr(error, "www_authenticate", "")
    if challenge or http_status == 401:
        headers["WWW-Authenticate"] = challenge or 'Bearer realm="a2a"'
    return web.Response(
        status=http_status,
        body=wire.encode(error.to_status_json()),
        content_type="application/json",
        headers=headers,
    )


__all__ = ["ROUTES", "ROUTE_OF", "RestBinding", "Route", "match"]
