"""How `A2AClient` reaches an agent over each protocol binding of A2A v1.0: JSON-RPC,
HTTP+JSON/REST and gRPC. Each transport takes an operation's name and its request as proto
JSON and returns the answer as proto JSON (streams: one `StreamResponse` per event), so the
client is the same over all three. A failure to reach the agent is an `A2AError` saying why
(never an empty reason); a stream that breaks is a `StreamBroken`.

The gRPC transport imports grpcio and the SDK's generated modules only when it is made
(the `grpc` extra).
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any, NamedTuple, Protocol
from urllib.parse import urlencode, urlsplit

import aiohttp

from synapse.a2a import wire
from synapse.a2a.errors import A2ACode, A2AError
from synapse.a2a.routes import ROUTE_OF


class StreamBroken(A2AError):
    """A stream ended by a network failure (not by the agent)."""

    def __init__(self, message: str) -> None:
        super().__init__(A2ACode.INTERNAL_ERROR, message)


def unknown_method(method: str, binding: str) -> A2AError:
    """What calling a method A2A does not have gives, on every binding: the JSON-RPC server's
    answer (-32601), not a lookup error of ours."""
    return A2AError(
        A2ACode.METHOD_NOT_FOUND,
        f"{method!r} is not a method of A2A v{wire.PROTOCOL_VERSION} ({binding} binding)",
    )


def describe_failure(exc: BaseException, timeout: float | None) -> str:
    """Why a request failed, never empty (`str(TimeoutError())` is "")."""
    if isinstance(exc, TimeoutError | aiohttp.ServerTimeoutError):
        return f"no answer within {timeout:g} s (timed out)" if timeout else "timed out"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class Transport(Protocol):
    binding: str
    url: str
    activated_extensions: tuple[str, ...]

    async def call(self, method: str, params: dict[str, Any]) -> Any: ...

    def stream(self, method: str, params: dict[str, Any]) -> AsyncIterator[Any]: ...

    async def close(self) -> None: ...


#: The members of a stream event that name its task, and how many tasks' last event ids a
#: transport keeps.
_EVENT_KINDS = ("task", "statusUpdate", "artifactUpdate", "message")
_KEPT_EVENT_IDS = 1000


#: The header an answer names its activated extensions in.
EXTENSIONS = "A2A-Extensions"


def activated(values: Iterable[str]) -> tuple[str, ...]:
    """The extension URIs of an `A2A-Extensions` header (repeated or comma-separated)."""
    return tuple(dict.fromkeys(u.strip() for v in values for u in v.split(",") if u.strip()))


class Request(NamedTuple):
    verb: str
    url: str
    body: bytes | None
    headers: dict[str, str]


class _HttpTransport:
    """What the JSON-RPC and REST transports share: the session, the credentials of each
    call, and one request (or one stream) with its failure to reach the agent said."""

    binding: str

    def __init__(
        self, url: str, session: Callable[[], aiohttp.ClientSession], timeout: float
    ) -> None:
        self.url = url
        self._session = session
        self.timeout = timeout
        #: The id of the last server-sent event received about each task (the newest
        #: tasks'): a stream of it that resumes sends it as `Last-Event-ID`, and the agent
        #: sends the events missed since instead of the whole task.
        self.last_event_ids: dict[str, str] = {}

    def _resume_headers(self, method: str, params: dict[str, Any]) -> dict[str, str]:
        last = self.last_event_ids.get(str(params.get("id", "")))
        return {"Last-Event-ID": last} if method == "SubscribeToTask" and last else {}

    def _seen(self, value: Any, event_id: str) -> None:
        """Remember `event_id` as the last event received about the task `value` is about."""
        if not event_id or not isinstance(value, dict):
            return
        inner: dict[str, Any] = next(
            (value[k] for k in _EVENT_KINDS if isinstance(value.get(k), dict)), {}
        )
        task_id = inner.get("id") if "task" in value else inner.get("taskId")
        if isinstance(task_id, str) and task_id:
            ids = self.last_event_ids
            ids.pop(task_id, None)
            ids[task_id] = event_id
            if len(ids) > _KEPT_EVENT_IDS:
                del ids[next(iter(ids))]

    #: Adds the credentials a call needs (`A2AClient` sets it: synapse.a2a.client.auth).
    auth: Any = None
    #: The extensions the agent said it activated for the last call (its answer's header).
    activated_extensions: tuple[str, ...] = ()

    async def _extra(
        self, method: str, params: dict[str, Any]
    ) -> tuple[dict[str, str], dict[str, str] | None]:
        if self.auth is None:
            return {}, None
        found = await self.auth(method, params)
        return found.header_items(), (found.params or None)

    async def close(self) -> None:
        pass

    async def _fetch(
        self, method: str, params: dict[str, Any], request: Request
    ) -> tuple[bytes, int]:
        """One request of the call `method`: the answer's body and status."""
        async with self._open(method, params, request, stream=False) as response:
            return await response.read(), response.status

    @contextlib.asynccontextmanager
    async def _open(
        self, method: str, params: dict[str, Any], request: Request, *, stream: bool
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        # A call has `timeout` in all; a stream only to connect. A network failure is an
        # `A2AError` saying why, or for a stream (even once under way) a `StreamBroken`.
        if stream:
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.timeout)
        else:
            timeout = aiohttp.ClientTimeout(total=self.timeout)
        verb, url, body, headers = request
        extra, query = await self._extra(method, params)
        try:
            async with self._session().request(
                verb, url, data=body, headers={**headers, **extra}, params=query, timeout=timeout
            ) as response:
                self.activated_extensions = activated(response.headers.getall(EXTENSIONS, []))
                yield response
        except (aiohttp.ClientError, TimeoutError) as exc:
            if stream:
                raise StreamBroken(
                    f"{method}: stream from {url} broke: {describe_failure(exc, None)}"
                ) from exc
            raise A2AError(
                A2ACode.INTERNAL_ERROR,
                f"{method}: cannot reach {url}: {describe_failure(exc, self.timeout)}",
            ) from exc


# --- JSON-RPC -----------------------------------------------------------------------------------


class JsonRpcTransport(_HttpTransport):
    binding = wire.JSONRPC_BINDING

    #: Headers every request of this transport adds (a 0.3 agent's: its `A2A-Version`).
    version: str = ""

    def _headers(self, **more: str) -> dict[str, str]:
        headers = {"Content-Type": "application/json", **more}
        if self.version:
            headers[wire.VERSION_HEADER] = self.version
        return headers

    async def call(self, method: str, params: dict[str, Any]) -> Any:
        """One JSON-RPC call; the `result`, or `A2AError` for an `error`."""
        rpc_id = str(uuid.uuid4())
        body = wire.encode({"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": params})
        headers = self._headers()
        raw, status = await self._fetch(method, params, Request("POST", self.url, body, headers))
        return _judge(_json(raw, status), rpc_id, status)

    async def stream(self, method: str, params: dict[str, Any]) -> AsyncIterator[Any]:
        """A streaming call: each server-sent event's `result`."""
        rpc_id = str(uuid.uuid4())
        body = wire.encode({"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": params})
        headers = self._headers(Accept="text/event-stream")
        headers.update(self._resume_headers(method, params))
        request = Request("POST", self.url, body, headers)
        async with self._open(method, params, request, stream=True) as response:
            if "text/event-stream" not in response.headers.get("Content-Type", ""):
                yield _judge(_json(await response.read(), response.status), rpc_id, 200)
                return
            async for name, data, event_id in sse_events(response):
                body_ = _json(data.encode(), response.status)
                if name == "error":
                    error = body_.get("error") if isinstance(body_, dict) else body_
                    raise A2AError.from_json(error)
                result = _judge(body_, rpc_id, 200)
                self._seen(result, event_id)
                yield result


# --- HTTP+JSON/REST -------------------------------------------------------------------------------


class RestTransport(_HttpTransport):
    binding = wire.REST_BINDING

    def __init__(
        self, url: str, session: Callable[[], aiohttp.ClientSession], timeout: float
    ) -> None:
        super().__init__(url.rstrip("/"), session, timeout)

    def _request(self, method: str, params: dict[str, Any]) -> tuple[str, str, bytes | None]:
        route = ROUTE_OF.get(method)
        if route is None:
            raise unknown_method(method, self.binding)
        values = dict(params)
        tenant = values.pop("tenant", "")
        path = route.path(values)
        if tenant:
            path = "/" + _quote(str(tenant)) + path
        url = self.url + path
        if route.body:
            return route.verb, url, wire.encode(values)
        query = _query_string(values)
        return route.verb, url + ("?" + query if query else ""), None

    async def call(self, method: str, params: dict[str, Any]) -> Any:
        verb, url, body = self._request(method, params)
        headers = {"Content-Type": "application/json"} if body is not None else {}
        raw, status = await self._fetch(method, params, Request(verb, url, body, headers))
        value = rest_json(raw, status)
        if status >= 300:
            raise A2AError.from_status_json(value, status)
        return value

    async def stream(self, method: str, params: dict[str, Any]) -> AsyncIterator[Any]:
        verb, url, body = self._request(method, params)
        headers = {"Accept": "text/event-stream", **self._resume_headers(method, params)}
        if body is not None:
            headers["Content-Type"] = "application/json"
        request = Request(verb, url, body, headers)
        async with self._open(method, params, request, stream=True) as response:
            if "text/event-stream" not in response.headers.get("Content-Type", ""):
                value = rest_json(await response.read(), response.status)
                if response.status >= 300:
                    raise A2AError.from_status_json(value, response.status)
                yield value
                return
            async for name, data, event_id in sse_events(response):
                value = rest_json(data.encode(), response.status)
                if name == "error" or (isinstance(value, dict) and "error" in value):
                    raise A2AError.from_status_json(value, 500)
                self._seen(value, event_id)
                yield value


def _quote(value: str) -> str:
    from urllib.parse import quote

    return quote(value, safe="")


def _query_string(values: Mapping[str, Any]) -> str:
    """Query parameters named as the members (A2A v1.0): booleans `true`/`false`."""
    pairs: list[tuple[str, str]] = []
    for key, value in values.items():
        items = value if isinstance(value, list) else [value]
        for item in items:
            if isinstance(item, bool):
                pairs.append((key, "true" if item else "false"))
            elif item is not None:
                pairs.append((key, str(item)))
    return urlencode(pairs)


def rest_json(raw: bytes, status: int) -> Any:
    return _json(raw, status, "a JSON answer") if raw else {}


# --- gRPC ---------------------------------------------------------------------------------------


#: Headers that describe an HTTP message, not the call: never gRPC metadata.
_HTTP_ONLY_HEADERS = frozenset(
    {
        "accept",
        "accept-encoding",
        "connection",
        "content-length",
        "content-type",
        "host",
        "te",
        "transfer-encoding",
        "user-agent",
    }
)


class GrpcTransport:
    binding = wire.GRPC_BINDING
    #: The extensions the agent said it activated for the last call (initial metadata).
    activated_extensions: tuple[str, ...] = ()

    def __init__(
        self,
        url: str,
        headers: Mapping[str, str],
        timeout: float,
        extensions: tuple[str, ...] = (),
        *,
        secure: bool = False,
        tls: Any = None,
    ) -> None:
        import grpc

        from synapse.a2a import grpc_proto, grpc_tls  # the grpc extra, only now

        self._proto = grpc_proto
        self._grpc = grpc
        self.url = url
        self.timeout = timeout
        target = url
        parts = urlsplit(url)
        if parts.scheme in ("grpc", "grpcs", "http", "https") and parts.netloc:
            target = parts.netloc
        # TLS when the agent's card came over https (its gRPC port serves TLS as its HTTP
        # does) or the URL says so; the server verified, our certificate shown (`tls`).
        self.secure = secure or parts.scheme in ("grpcs", "https")
        self._tls = tls
        self._target = target
        self._revocation_checked = not (self.secure and tls is not None and tls.crl is not None)
        if self.secure:
            credentials = grpc_tls.channel_credentials(tls)
            self._channel = grpc.aio.secure_channel(target, credentials)
        else:
            self._channel = grpc.aio.insecure_channel(target)
        by_name = {k.lower(): v for k, v in headers.items()}
        version = by_name.pop(wire.VERSION_HEADER.lower(), wire.PROTOCOL_VERSION)
        by_name.pop("a2a-extensions", None)  # from `extensions`, below
        metadata = [(grpc_proto.VERSION_KEY, version)]
        # The client's headers are its service parameters on every binding (credentials
        # such as an API key in its header, a tenant's header): on gRPC, metadata entries.
        metadata += [(k, v) for k, v in by_name.items() if k not in _HTTP_ONLY_HEADERS]
        if extensions:
            metadata.append((grpc_proto.EXTENSIONS_KEY, ",".join(extensions)))
        self.metadata = tuple(metadata)

    #: Adds the credentials a call needs (`A2AClient` sets it: synapse.a2a.client.auth).
    auth: Any = None

    async def _metadata(self, method: str, params: dict[str, Any]) -> tuple[tuple[str, str], ...]:
        """The call's metadata: the service parameters, then the credentials the card asks
        for: headers as entries (keys lower-cased), a query API key as the entry of its
        name (gRPC has no query string), cookies in `cookie`."""
        if not self._revocation_checked:
            await self._check_revocation()
        if self.auth is None:
            return self.metadata
        found = await self.auth(method, params)
        extra = [(k.lower(), v) for k, v in found.header_items().items()]
        extra += [(k.lower(), v) for k, v in found.params.items()]
        names = {k for k, _ in extra}
        return tuple(e for e in self.metadata if e[0] not in names) + tuple(extra)

    async def _check_revocation(self) -> None:
        from synapse.a2a import grpc_tls

        parts = urlsplit("//" + self._target)
        host, port = parts.hostname or "", parts.port or 443
        try:
            await grpc_tls.check_server_revocation(host, port, self._tls, self.timeout)
        except (OSError, TimeoutError) as exc:
            raise A2AError(
                A2ACode.INTERNAL_ERROR,
                f"cannot reach {self.url}: the server certificate is refused or unreachable: "
                f"{describe_failure(exc, self.timeout)}",
            ) from exc
        self._revocation_checked = True

    async def close(self) -> None:
        await self._channel.close()

    def _stub(self, method: str, params: dict[str, Any], kind: str) -> tuple[Any, Any]:
        """The channel's `kind` ("unary_unary", "unary_stream") callable for `method`, and
        its request message made of `params`."""
        spec = self._proto.METHODS.get(method)
        if spec is None:
            raise unknown_method(method, wire.GRPC_BINDING)
        stub = getattr(self._channel, kind)(
            spec.path,
            request_serializer=spec.request.SerializeToString,
            response_deserializer=spec.response.FromString,
        )
        return stub, self._proto.from_json(params, spec.request)

    def _prepare(
        self, method: str, params: dict[str, Any], kind: str
    ) -> tuple[Any, Any, Callable[[Any], Any]]:
        """The stub, the request, and how an answer (or a stream's event) reads as JSON."""
        stub, request = self._stub(method, params, kind)
        return stub, request, self._proto.to_json

    async def call(self, method: str, params: dict[str, Any]) -> Any:
        stub, request, answer = self._prepare(method, params, "unary_unary")
        metadata = await self._metadata(method, params)
        try:
            call = stub(request, metadata=metadata, timeout=self.timeout)
            response = await call
            await self._activated(call)
        except self._grpc.aio.AioRpcError as exc:
            raise self._error(method, exc) from exc
        return answer(response)

    async def _activated(self, call: Any) -> None:
        """Read what the agent activated from the call's initial metadata."""
        found = await call.initial_metadata() or ()
        values = [str(v) for k, v in found if k == self._proto.EXTENSIONS_KEY]
        self.activated_extensions = activated(values)

    async def stream(self, method: str, params: dict[str, Any]) -> AsyncIterator[Any]:
        stub, request, answer = self._prepare(method, params, "unary_stream")
        call = stub(request, metadata=await self._metadata(method, params))
        try:
            await self._activated(call)
            async for event in call:
                yield answer(event)
        except self._grpc.aio.AioRpcError as exc:
            error = self._error(method, exc)
            if exc.code() in (
                self._grpc.StatusCode.UNAVAILABLE,
                self._grpc.StatusCode.CANCELLED,
            ) and error.metadata.get("grpcStatus"):
                raise StreamBroken(
                    f"{method}: stream from {self.url} broke: {error.message}"
                ) from exc
            raise error from exc
        finally:
            call.cancel()

    def _error(self, method: str, exc: Any) -> A2AError:
        code = exc.code()
        if code is self._grpc.StatusCode.DEADLINE_EXCEEDED:
            return A2AError(
                A2ACode.INTERNAL_ERROR,
                f"{method}: cannot reach {self.url}: no answer within {self.timeout:g} s "
                "(timed out)",
            )
        error: A2AError = self._proto.error_of(exc)
        if code is self._grpc.StatusCode.UNAVAILABLE and "grpcStatus" in error.metadata:
            # No A2A error from the agent: the connection failed (as an HTTP client says).
            return A2AError(
                A2ACode.INTERNAL_ERROR,
                f"{method}: cannot reach {self.url}: {error.message}",
                error.metadata,
            )
        return error


# --- shared -------------------------------------------------------------------------------------


def _json(raw: bytes, status: int, what: str = "a JSON-RPC response") -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        raise A2AError(
            A2ACode.INVALID_AGENT_RESPONSE,
            f"HTTP {status}: not {what}: {raw[:200]!r}",
            http_status=status,
        ) from None


def _judge(body: Any, rpc_id: str, status: int) -> Any:
    if not isinstance(body, dict):
        raise A2AError(A2ACode.INVALID_AGENT_RESPONSE, "a JSON-RPC response must be an object")
    if "error" in body and body["error"] is not None:
        error = A2AError.from_json(body["error"])
        error.http_status = status
        raise error
    if body.get("id") not in (rpc_id, None):
        raise A2AError(
            A2ACode.INVALID_AGENT_RESPONSE, f"response id {body.get('id')!r} is not ours"
        )
    if "result" not in body:
        raise A2AError(A2ACode.INVALID_AGENT_RESPONSE, "response has neither result nor error")
    return body["result"]


async def sse_events(response: aiohttp.ClientResponse) -> AsyncIterator[tuple[str, str, str]]:
    """(event name, data, last event id) of each server-sent event."""
    name, lines, event_id = "message", list[str](), ""
    while True:
        raw = await response.content.readline()
        if not raw:
            break
        line = raw.decode("utf-8").rstrip("\r\n")
        if not line:
            if lines:
                yield name, "\n".join(lines), event_id
            name, lines = "message", list[str]()
            continue
        if line.startswith(":"):
            continue
        key, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if key == "event":
            name = value
        elif key == "data":
            lines.append(value)
        elif key == "id" and "\0" not in value:
            event_id = value  # kept for the next events too, as the SSE spec says
    if lines:
        yield name, "\n".join(lines), event_id


__all__ = [
    "GrpcTransport",
    "JsonRpcTransport",
    "Request",
    "RestTransport",
    "StreamBroken",
    "Transport",
    "describe_failure",
    "rest_json",
    "sse_events",
    "unknown_method",
]
