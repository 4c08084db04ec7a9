"""A2A JSON-RPC errors: the codes of A2A v1.0 (as the official SDK maps them), and the one
exception that carries them.

JSON-RPC 2.0 codes: -32700 parse error, -32600 invalid request, -32601 method not found,
-32602 invalid params, -32603 internal error. A2A v1.0 codes: -32001 … -32009. Two further
codes come from the earlier A2A error table Synapse follows (-32101 agent not ready,
-32106 authentication failed) for conditions A2A v1.0 gives no code of its own; see
`docs/a2a.md` in the repository for how every code of that table maps.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any

#: The `domain` of `google.rpc.ErrorInfo` details, as the SDK writes it.
ERROR_DOMAIN = "a2a-protocol.org"
ERROR_INFO_TYPE = "type.googleapis.com/google.rpc.ErrorInfo"


class A2ACode(IntEnum):
    PARSE_ERROR = -32700
    INVALID_REQUEST = -32600
    METHOD_NOT_FOUND = -32601
    INVALID_PARAMS = -32602
    INTERNAL_ERROR = -32603
    TASK_NOT_FOUND = -32001
    TASK_NOT_CANCELABLE = -32002
    PUSH_NOTIFICATION_NOT_SUPPORTED = -32003
    UNSUPPORTED_OPERATION = -32004
    CONTENT_TYPE_NOT_SUPPORTED = -32005
    INVALID_AGENT_RESPONSE = -32006
    EXTENDED_AGENT_CARD_NOT_CONFIGURED = -32007
    EXTENSION_SUPPORT_REQUIRED = -32008
    VERSION_NOT_SUPPORTED = -32009
    #: The earlier table's "Agent Not Ready": starting up or draining (A2A v1.0 has no code for it).
    AGENT_NOT_READY = -32101
    #: The earlier table's "Authentication Failed" (sent with HTTP 401).
    AUTHENTICATION_FAILED = -32106

    @property
    def reason(self) -> str:
        """The `ErrorInfo.reason` the SDK writes for this code."""
        return _REASONS[self]


_REASONS: dict[A2ACode, str] = {
    A2ACode.PARSE_ERROR: "PARSE_ERROR",
    A2ACode.INVALID_REQUEST: "INVALID_REQUEST",
    A2ACode.METHOD_NOT_FOUND: "METHOD_NOT_FOUND",
    A2ACode.INVALID_PARAMS: "INVALID_PARAMS",
    A2ACode.INTERNAL_ERROR: "INTERNAL_ERROR",
    A2ACode.TASK_NOT_FOUND: "TASK_NOT_FOUND",
    A2ACode.TASK_NOT_CANCELABLE: "TASK_NOT_CANCELABLE",
    A2ACode.PUSH_NOTIFICATION_NOT_SUPPORTED: "PUSH_NOTIFICATION_NOT_SUPPORTED",
    A2ACode.UNSUPPORTED_OPERATION: "UNSUPPORTED_OPERATION",
    A2ACode.CONTENT_TYPE_NOT_SUPPORTED: "CONTENT_TYPE_NOT_SUPPORTED",
    A2ACode.INVALID_AGENT_RESPONSE: "INVALID_AGENT_RESPONSE",
    A2ACode.EXTENDED_AGENT_CARD_NOT_CONFIGURED: "EXTENDED_AGENT_CARD_NOT_CONFIGURED",
    A2ACode.EXTENSION_SUPPORT_REQUIRED: "EXTENSION_SUPPORT_REQUIRED",
    A2ACode.VERSION_NOT_SUPPORTED: "VERSION_NOT_SUPPORTED",
    A2ACode.AGENT_NOT_READY: "AGENT_NOT_READY",
    A2ACode.AUTHENTICATION_FAILED: "UNAUTHENTICATED",
}


class A2AError(Exception):
    """An A2A JSON-RPC error: raised by the server binding, and by the client when an agent
    answered with one (`code` may then be a code this package does not know)."""

    def __init__(
        self,
        code: A2ACode | int,
        message: str,
        metadata: dict[str, Any] | None = None,
        *,
        http_status: int = 200,
    ) -> None:
        super().__init__(f"A2A error {int(code)}: {message}")
        self.code = int(code)
        self.message = message
        self.metadata = metadata or {}
        self.http_status = http_status

    @property
    def known(self) -> A2ACode | None:
        try:
            return A2ACode(self.code)
        except ValueError:
            return None

    def to_json(self) -> dict[str, Any]:
        """The JSON-RPC `error` object, with an `ErrorInfo` detail like the SDK's."""
        known = self.known
        reason = known.reason if known is not None else "UNKNOWN_ERROR"
        return {
            "code": self.code,
            "message": self.message,
            "data": [
                {
                    "@type": ERROR_INFO_TYPE,
                    "reason": reason,
                    "domain": ERROR_DOMAIN,
                    "metadata": {k: str(v) for k, v in self.metadata.items()},
                }
            ],
        }

    @classmethod
    def from_json(cls, error: Any) -> A2AError:
        """The error of a JSON-RPC error object (as received)."""
        if not isinstance(error, dict):
            return cls(A2ACode.INVALID_AGENT_RESPONSE, f"not a JSON-RPC error object: {error!r}")
        code = error.get("code")
        message = error.get("message")
        metadata: dict[str, Any] = {}
        data = error.get("data")
        if isinstance(data, list):
            for detail in data:
                if isinstance(detail, dict) and detail.get("@type") == ERROR_INFO_TYPE:
                    found = detail.get("metadata")
                    metadata = dict(found) if isinstance(found, dict) else {}
                    if isinstance(detail.get("reason"), str):
                        metadata.setdefault("reason", detail["reason"])
                    break
        if not isinstance(code, int) or isinstance(code, bool):
            return cls(A2ACode.INVALID_AGENT_RESPONSE, f"JSON-RPC error without a code: {error!r}")
        return cls(code, message if isinstance(message, str) else str(error), metadata)


class A2AVersionError(A2AError):
    """The other side does not speak A2A 1.x: refused, never silently downgraded."""

    def __init__(self, message: str, metadata: dict[str, Any] | None = None) -> None:
        super().__init__(A2ACode.VERSION_NOT_SUPPORTED, message, metadata)


def invalid_params(message: str, **metadata: Any) -> A2AError:
    return A2AError(A2ACode.INVALID_PARAMS, message, metadata)


def task_not_found(task_id: str) -> A2AError:
    return A2AError(A2ACode.TASK_NOT_FOUND, f"Task {task_id} not found", {"taskId": task_id})


def unsupported(message: str, **metadata: Any) -> A2AError:
    return A2AError(A2ACode.UNSUPPORTED_OPERATION, message, metadata)


__all__ = [
    "A2ACode",
    "A2AError",
    "A2AVersionError",
    "invalid_params",
    "task_not_found",
    "unsupported",
]
