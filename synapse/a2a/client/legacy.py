"""Talking to an A2A 0.3 agent: its card read as a 1.0 card whose interfaces say 0.3, and a
JSON-RPC or HTTP+JSON/REST transport that sends each 1.0 operation as the 0.3 method (over
REST, on its 0.3 route: `synapse.a2a.v03rest`) and reads the 0.3 answer back as the 1.0 one
(`synapse.a2a.v03`), so everything above the transport stays 1.0."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any
from urllib.parse import urlencode

from synapse.a2a import v03, v03rest, wire
from synapse.a2a.client.transports import (
    GrpcTransport,
    JsonRpcTransport,
    Request,
    RestTransport,
    rest_json,
    sse_events,
)
from synapse.a2a.errors import A2ACode, A2AError


def method_03(operation: str) -> str:
    """The 0.3 method of a 1.0 operation (`ListTasks` has none)."""
    method = v03.METHOD_TO_V03.get(operation)
    if method is None:
        raise A2AError(
            A2ACode.UNSUPPORTED_OPERATION,
            f"{operation} is not an operation of A2A 0.3, which this agent speaks",
        )
    return method


class JsonRpc03Transport(JsonRpcTransport):
    """JSON-RPC to an A2A 0.3 agent (`message/send`, `tasks/get` …)."""

    binding = wire.JSONRPC_BINDING
    version = "0.3"

    async def call(self, method: str, params: dict[str, Any]) -> Any:
        legacy = method_03(method)
        result = await super().call(legacy, v03.params_to_v03(method, params))
        return v03.result_to_v1(method, result)

    async def stream(self, method: str, params: dict[str, Any]) -> AsyncIterator[Any]:
        legacy = method_03(method)
        async for event in super().stream(legacy, v03.params_to_v03(method, params)):
            yield v03.event_to_v1(event) if isinstance(event, dict) else event


class Rest03Transport(RestTransport):
    """HTTP+JSON/REST to an A2A 0.3 agent: `POST /v1/message:send`, `GET /v1/tasks/{id}` …,
    with the 0.3 proto JSON bodies, as the official SDK's 0.3 REST client sends them."""

    binding = wire.REST_BINDING

    def _request_03(
        self, method: str, params: dict[str, Any], **headers: str
    ) -> tuple[str, dict[str, Any], Request]:
        legacy = method_03(method)
        rpc = v03.params_to_v03(method, params)
        verb, path, body, query = v03rest.request_of(legacy, rpc)
        url = self.url + path + ("?" + urlencode(query) if query else "")
        headers = {wire.VERSION_HEADER: "0.3", **headers}
        data = None
        if body is not None:
            headers["Content-Type"] = "application/json"
            data = wire.encode(body)
        return legacy, rpc, Request(verb, url, data, headers)

    async def call(self, method: str, params: dict[str, Any]) -> Any:
        legacy, rpc, request = self._request_03(method, params)
        raw, status = await self._fetch(method, params, request)
        value = rest_json(raw, status) if raw.strip() else {}
        if status >= 300:
            raise v03rest.error_of(value, status)
        return v03.result_to_v1(method, v03rest.result_to_rpc(legacy, value, rpc))

    async def stream(self, method: str, params: dict[str, Any]) -> AsyncIterator[Any]:
        resume = self._resume_headers(method, params)
        _, _, request = self._request_03(method, params, Accept="text/event-stream", **resume)
        async with self._open(method, params, request, stream=True) as response:
            if "text/event-stream" not in response.headers.get("Content-Type", ""):
                raw = await response.read()
                value = rest_json(raw, response.status) if raw.strip() else {}
                if response.status >= 300:
                    raise v03rest.error_of(value, response.status)
                yield v03.event_to_v1(v03rest.event_to_rpc(value))
                return
            async for name, data, event_id in sse_events(response):
                value = rest_json(data.encode(), response.status)
                if name == "error" or (isinstance(value, dict) and "error" in value):
                    raise v03rest.error_of(value, 500)
                event = v03.event_to_v1(v03rest.event_to_rpc(value))
                self._seen(event, event_id)
                yield event


def is_v03_interface(interface: wire.AgentInterface) -> bool:
    return v03.is_v03(interface.protocol_version) and bool(interface.protocol_version)


def kind_of(
    interface: wire.AgentInterface,
) -> type[JsonRpc03Transport] | type[Rest03Transport] | None:
    """The transport of a 0.3 `interface` (None: not 0.3)."""
    if not is_v03_interface(interface):
        return None
    return (
        Rest03Transport if interface.protocol_binding == wire.REST_BINDING else JsonRpc03Transport
    )


def grpc_kind(interface: wire.AgentInterface) -> type[GrpcTransport]:
    """The gRPC transport of `interface`: 1.0's, or 0.3's for a 0.3 one."""
    if not is_v03_interface(interface):
        return GrpcTransport
    from synapse.a2a.client.grpc03 import Grpc03Transport  # the grpc extra, only now

    return Grpc03Transport


#: The bindings a 0.3 agent is spoken to over, the first preferred (gRPC with the `grpc`
#: extra: `synapse.a2a.client.grpc03`).
LEGACY_BINDINGS = (wire.JSONRPC_BINDING, wire.REST_BINDING, wire.GRPC_BINDING)


def legacy_interface(interfaces: Sequence[wire.AgentInterface]) -> wire.AgentInterface | None:
    """The 0.3 interface to talk to among `interfaces`: JSON-RPC's, else HTTP+JSON's."""
    for binding in LEGACY_BINDINGS:
        for interface in interfaces:
            if interface.protocol_binding == binding and is_v03_interface(interface):
                return interface
    return None


__all__ = [
    "LEGACY_BINDINGS",
    "JsonRpc03Transport",
    "Rest03Transport",
    "grpc_kind",
    "is_v03_interface",
    "kind_of",
    "legacy_interface",
    "method_03",
]
