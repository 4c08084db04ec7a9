"""The command line's exit statuses and the one exception that carries a user-facing error."""

from __future__ import annotations

from enum import IntEnum

from synapse.types.errors import SynapseException


class Exit(IntEnum):
    """What `synapse`'s exit status means (docs/cli.md)."""

    OK = 0
    """Done; for `send`, the task completed."""
    TASK_UNSUCCESSFUL = 1
    """`send`: the task failed, was rejected or was cancelled; `audit`: the chain is broken."""
    USAGE = 2
    """Bad usage or settings, cannot connect or listen, or the partner refused the request."""
    INTERNAL = 70
    """A bug in synapse itself (EX_SOFTWARE)."""


class CliError(SynapseException):
    """An error for the person at the terminal: printed as one line, then exit with `status`."""

    def __init__(self, message: str, status: Exit = Exit.USAGE) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
