"""Talking to an A2A 0.3 agent: its card read as a 1.0 card whose interfaces say 0.3, and a
JSON-RPC transport that sends each 1.0 operation as the 0.3 method and reads the 0.3 answer
back as the 1.0 one (`synapse.a2a.v03`), so everything above the transport stays 1.0."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from synapse.a2a import v03, wire
from synapse.a2a.client.transports import JsonRpcTransport
from synapse.a2a.errors import A2ACode, A2AError


class JsonRpc03Transport(JsonRpcTransport):
    """JSON-RPC to an A2A 0.3 agent (`message/send`, `tasks/get` …)."""

    binding = wire.JSONRPC_BINDING
    version = "0.3"

    def _method(self, operation: str) -> str:
        method = v03.METHOD_TO_V03.get(operation)
        if method is None:
            raise A2AError(
                A2ACode.UNSUPPORTED_OPERATION,
                f"{operation} is not an operation of A2A 0.3, which this agent speaks",
            )
        return method

    async def call(self, method: str, params: dict[str, Any]) -> Any:
        legacy = self._method(method)
        result = await super().call(legacy, v03.params_to_v03(method, params))
        return v03.result_to_v1(method, result)

    async def stream(self, method: str, params: dict[str, Any]) -> AsyncIterator[Any]:
        legacy = self._method(method)
        async for event in super().stream(legacy, v03.params_to_v03(method, params)):
            yield v03.event_to_v1(event) if isinstance(event, dict) else event


def is_v03_interface(interface: wire.AgentInterface) -> bool:
    return v03.is_v03(interface.protocol_version) and bool(interface.protocol_version)


__all__ = ["JsonRpc03Transport", "is_v03_interface"]
