"""Error codes of specs/protocol.md, 'Error codes', their HTTP statuses, and Synapse's errors.

`ProtocolError` is the base of the protocol errors: `NackError` (a message we answer with a
nack: `RemoteProtocolError` when it is the partner's fault, `NotReady` when it is our own
state) and `LocalProtocolError` (this program broke a rule: never sent); `DeliveryError` says
a message could not be delivered.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from synapse.types.messages import Message


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


class SynapseException(Exception):
    """The root of every exception this package raises: `except SynapseException` catches
    them all, and nothing else.

    Below it, by whose fault: `ProtocolError` (`NackError`, answered with a `p2p:nack`:
    `RemoteProtocolError` when the partner sent what the protocol refuses, `NotReady` when we
    cannot take a message now; `LocalProtocolError`: this program broke a rule),
    `DeliveryError` (a message never got an acceptable reply), and those of
    each part: `TaskFailure` (a handler's outcome), `StoreUnavailable`, `A2AError`,
    `CliError` …
    """


class ProtocolError(SynapseException):
    """Base class of Synapse's protocol errors: catch this for either kind.

    As in h11, there are two kinds. A `RemoteProtocolError` means the partner sent something
    the protocol refuses; it is converted to a `p2p:nack` at one place only, the boundary where
    a received message enters the engine (as is a `NotReady`: both are `NackError`). A
    `LocalProtocolError` means this program was about to break the rules (a bug or a misuse of
    the API); it is raised to the caller and never sent to the partner.
    """


class NackError(ProtocolError):
    """A message we refuse, answered with a `p2p:nack` of `code`, `message` and `details`
    and `http_status` (specs/protocol.md, 'Error codes'). Catch this for every refusal; its
    two kinds say whose doing it is: `RemoteProtocolError` (the partner's message) and
    `NotReady` (our own state).
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
        return f"{type(self).__name__}({self.code.value!r}, {self.message!r}, {self.details!r})"


class RemoteProtocolError(NackError):
    """The other side sent something we refuse: its fault, and sending it again as it is
    will be refused again (unless the refusal says to retry, as `rate_limited` does)."""


class NotReady(NackError):
    """We cannot take the message now, through no fault of the sender: we are starting or
    draining, our store is unavailable, the replica owning the task is unreachable, or we
    failed inside. Answered `agent_not_ready` (503); the sender retries later."""

    def __init__(
        self,
        message: str,
        details: dict[str, Any] | None = None,
        *,
        http_status: int | None = None,
    ) -> None:
        super().__init__(ErrorCode.AGENT_NOT_READY, message, details, http_status=http_status)


#: The name `RemoteProtocolError` had first; the same class.
SynapseError = RemoteProtocolError


class LocalProtocolError(ProtocolError):
    """We were about to do something the protocol forbids: a bug on our side, never sent."""


class ReplyLike(Protocol):
    """What `DeliveryError.reply` holds: the envelope a partner answered with, and its status."""

    @property
    def status(self) -> int: ...

    @property
    def message(self) -> Message: ...

    @property
    def is_nack(self) -> bool: ...


class DeliveryError(SynapseException):
    """A message could not be delivered: a POST produced no acceptable reply.

    `retryable` is true when retries ran out on a transient failure (connection error, timeout,
    408, 429, 502, 503, 504): the message may be sent again later and stays queued until the partner
    answers again. False when the answer can never be accepted (not an envelope, forged, not
    answering our message). `status` is the last HTTP status (None if none came), `attempts`
    how many were made, `reply` the last reply if it was an envelope (a 503 nack, say), and
    `__cause__` the last exception.
    """

    def __init__(
        self,
        message: str,
        *,
        retryable: bool,
        status: int | None = None,
        attempts: int = 1,
        reply: ReplyLike | None = None,
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.status = status
        self.attempts = attempts
        self.reply = reply


def unknown_key(where: str, key: str, known: Iterable[str]) -> str:
    """The one phrasing of a configuration key nothing reads: `WHERE: unknown key 'prot'
    (did you mean 'port'?)`, with the suggestion when a known key is close enough."""
    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.7)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{where}: unknown key {key!r}{hint}"
