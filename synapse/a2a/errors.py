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

from synapse.types import NackError
from synapse.types.errors import ErrorCode, SynapseException

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
    #: The earlier table's "Authorization Failed" (sent with HTTP 403): a valid credential lacking a
    #: scope or the right to a skill.
    AUTHORIZATION_FAILED = -32107

    @property
    def reason(self) -> str:
        """The `ErrorInfo.reason` the SDK writes for this code."""
        return _REASONS[self]

    @property
    def http_status(self) -> int:
        """The HTTP status of this error in the HTTP+JSON/REST binding."""
        return _STATUSES[self][0]

    @property
    def grpc_status(self) -> str:
        """The gRPC status code name of this error (gRPC binding, and REST `status`)."""
        return _STATUSES[self][1]


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
    A2ACode.AUTHORIZATION_FAILED: "PERMISSION_DENIED",
}


#: A2A v1.0's mapping of its errors to HTTP and gRPC statuses; the JSON-RPC-only codes
#: (parse error, invalid request …) as the SDK maps them; the earlier table's two codes as what they
#: mean (not ready: 503 UNAVAILABLE; authentication: 401 UNAUTHENTICATED).
_STATUSES: dict[A2ACode, tuple[int, str]] = {
    A2ACode.PARSE_ERROR: (400, "INVALID_ARGUMENT"),
    A2ACode.INVALID_REQUEST: (400, "INVALID_ARGUMENT"),
    A2ACode.METHOD_NOT_FOUND: (404, "NOT_FOUND"),
    A2ACode.INVALID_PARAMS: (400, "INVALID_ARGUMENT"),
    A2ACode.INTERNAL_ERROR: (500, "INTERNAL"),
    A2ACode.TASK_NOT_FOUND: (404, "NOT_FOUND"),
    A2ACode.TASK_NOT_CANCELABLE: (409, "FAILED_PRECONDITION"),
    A2ACode.PUSH_NOTIFICATION_NOT_SUPPORTED: (400, "UNIMPLEMENTED"),
    A2ACode.UNSUPPORTED_OPERATION: (400, "UNIMPLEMENTED"),
    A2ACode.CONTENT_TYPE_NOT_SUPPORTED: (415, "INVALID_ARGUMENT"),
    A2ACode.INVALID_AGENT_RESPONSE: (502, "INTERNAL"),
    A2ACode.EXTENDED_AGENT_CARD_NOT_CONFIGURED: (400, "FAILED_PRECONDITION"),
    A2ACode.EXTENSION_SUPPORT_REQUIRED: (400, "FAILED_PRECONDITION"),
    A2ACode.VERSION_NOT_SUPPORTED: (400, "UNIMPLEMENTED"),
    A2ACode.AGENT_NOT_READY: (503, "UNAVAILABLE"),
    A2ACode.AUTHENTICATION_FAILED: (401, "UNAUTHENTICATED"),
    A2ACode.AUTHORIZATION_FAILED: (403, "PERMISSION_DENIED"),
}

#: gRPC status name → the A2A code a client reports when the answer carries no ErrorInfo.
GRPC_FALLBACK: dict[str, A2ACode] = {
    "NOT_FOUND": A2ACode.TASK_NOT_FOUND,
    "INVALID_ARGUMENT": A2ACode.INVALID_PARAMS,
    "UNAUTHENTICATED": A2ACode.AUTHENTICATION_FAILED,
    "PERMISSION_DENIED": A2ACode.AUTHORIZATION_FAILED,
    "UNAVAILABLE": A2ACode.AGENT_NOT_READY,
    "UNIMPLEMENTED": A2ACode.UNSUPPORTED_OPERATION,
    "FAILED_PRECONDITION": A2ACode.UNSUPPORTED_OPERATION,
    "INTERNAL": A2ACode.INTERNAL_ERROR,
}
_BY_REASON: dict[str, A2ACode] = {}


class A2AError(SynapseException):
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

    @property
    def status(self) -> tuple[int, str]:
        """(HTTP status, gRPC status name) of this error outside JSON-RPC."""
        known = self.known
        return _STATUSES[known] if known is not None else (500, "UNKNOWN")

    def to_status_json(self) -> dict[str, Any]:
        """The REST error body: a `google.rpc.Status` as JSON, `code` the HTTP status
        (`{"error": {"code", "status", "message", "details": [ErrorInfo]}}`)."""
        http_status, grpc_status = self.status
        return {
            "error": {
                "code": http_status,
                "status": grpc_status,
                "message": self.message,
                "details": self.to_json()["data"],
            }
        }

    @classmethod
    def from_reason(
        cls, reason: str, message: str, metadata: dict[str, Any], fallback: A2ACode | int
    ) -> A2AError:
        """The error an `ErrorInfo.reason` names (REST and gRPC carry no A2A code)."""
        if not _BY_REASON:
            _BY_REASON.update({code.reason: code for code in A2ACode})
        code = _BY_REASON.get(reason, fallback)
        # As `from_json` does: the agent's own `metadata.reason` (why: `issuer_unavailable`,
        # `push_url_not_allowed` …) is kept; the ErrorInfo reason fills in when it has none.
        return cls(code, message, {"reason": reason, **metadata} if reason else metadata)

    @classmethod
    def from_status_json(cls, body: Any, http_status: int) -> A2AError:
        """The error of a REST error body (or of an HTTP status without one)."""
        error = body.get("error") if isinstance(body, dict) else None
        fallback: A2ACode = {
            401: A2ACode.AUTHENTICATION_FAILED,
            404: A2ACode.TASK_NOT_FOUND,
            503: A2ACode.AGENT_NOT_READY,
        }.get(http_status, A2ACode.INTERNAL_ERROR if http_status >= 500 else A2ACode.INVALID_PARAMS)
        if not isinstance(error, dict):
            return cls(fallback, f"HTTP {http_status}: {body!r}"[:300], http_status=http_status)
        message = error.get("message")
        text = message if isinstance(message, str) else f"HTTP {http_status}"
        for detail in error.get("details") or []:
            if isinstance(detail, dict) and detail.get("@type") == ERROR_INFO_TYPE:
                found = detail.get("metadata")
                metadata = dict(found) if isinstance(found, dict) else {}
                reason = detail.get("reason")
                made = cls.from_reason(str(reason or ""), text, metadata, fallback)
                made.http_status = http_status
                return made
        return cls(fallback, text, http_status=http_status)

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


def a2a_error_of(exc: NackError, task_id: str) -> A2AError:
    """A Synapse refusal of an in-process message, as an A2A error."""
    meta = {"synapseCode": exc.code.value, "taskId": task_id}
    if exc.code is ErrorCode.AGENT_NOT_READY:
        return A2AError(A2ACode.AGENT_NOT_READY, exc.message, meta)
    if exc.code is ErrorCode.TASK_NOT_FOUND:
        return A2AError(A2ACode.TASK_NOT_FOUND, exc.message, meta)
    if exc.code is ErrorCode.TASK_ALREADY_COMPLETED:
        return A2AError(A2ACode.UNSUPPORTED_OPERATION, f"Task {task_id} already finished", meta)
    if exc.code is ErrorCode.INVALID_PARAMS and (exc.details or {}).get("state"):
        return A2AError(A2ACode.UNSUPPORTED_OPERATION, exc.message, meta)
    if exc.code in (ErrorCode.INVALID_PARAMS, ErrorCode.MESSAGE_FORMAT_INVALID):
        return A2AError(A2ACode.INVALID_PARAMS, exc.message, meta)
    return A2AError(A2ACode.INTERNAL_ERROR, exc.message, meta)


__all__ = [
    "GRPC_FALLBACK",
    "A2ACode",
    "A2AError",
    "A2AVersionError",
    "a2a_error_of",
    "invalid_params",
    "task_not_found",
    "unsupported",
]
