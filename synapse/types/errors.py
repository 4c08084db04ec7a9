"""Error codes of specs/protocol.md, 'Error codes', their HTTP statuses, and the one exception that
carries them."""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class ErrorCode(StrEnum):
    """Protocol error codes (specs/protocol.md, 'Error codes')."""

    MESSAGE_FORMAT_INVALID = "message_format_invalid"
    CAPABILITY_LACKING = "capability_lacking"
    AGENT_NOT_READY = "agent_not_ready"
    TASK_NOT_FOUND = "task_not_found"
    TASK_ALREADY_COMPLETED = "task_already_completed"
    EXECUTION_TIMEOUT = "execution_timeout"
    EXECUTION_FAILED = "execution_failed"
    PERMISSION_DENIED = "permission_denied"
    INVALID_PARAMS = "invalid_params"
    RATE_LIMITED = "rate_limited"

    @property
    def http_status(self) -> int:
        return HTTP_STATUS[self]


HTTP_STATUS: dict[ErrorCode, int] = {
    ErrorCode.MESSAGE_FORMAT_INVALID: 400,
    ErrorCode.CAPABILITY_LACKING: 403,
    ErrorCode.AGENT_NOT_READY: 503,
    ErrorCode.TASK_NOT_FOUND: 404,
    ErrorCode.TASK_ALREADY_COMPLETED: 409,
    ErrorCode.EXECUTION_TIMEOUT: 504,
    ErrorCode.EXECUTION_FAILED: 500,
    ErrorCode.PERMISSION_DENIED: 403,
    ErrorCode.INVALID_PARAMS: 400,
    ErrorCode.RATE_LIMITED: 429,
}

#: Codes a `nack` may carry (specs/protocol.md, 'Error codes': nacks never carry the task-level
#: codes).
NACK_CODES: frozenset[ErrorCode] = frozenset(
    {
        ErrorCode.MESSAGE_FORMAT_INVALID,
        ErrorCode.INVALID_PARAMS,
        ErrorCode.PERMISSION_DENIED,
        ErrorCode.TASK_NOT_FOUND,
        ErrorCode.TASK_ALREADY_COMPLETED,
        ErrorCode.RATE_LIMITED,
        ErrorCode.AGENT_NOT_READY,
    }
)


class SynapseError(Exception):
    """A protocol error: the other side sent something we refuse.

    It becomes a `p2p:nack` with `code`, `message` and `details`, answered with `http_status`.
    """

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        details: dict[str, Any] | None = None,
        *,
        http_status: int | None = None,
    ) -> None:
        super().__init__(f"{code.value}: {message}")
        self.code = code
        self.message = message
        self.details = details
        self.http_status = http_status if http_status is not None else code.http_status

    def __repr__(self) -> str:
        return f"SynapseError({self.code.value!r}, {self.message!r}, {self.details!r})"


class LocalProtocolError(Exception):
    """We were about to do something the protocol forbids: a bug on our side, never sent."""
