"""What routing one task ended with: the partners that declined it (`Declined`), and the
one that ran it (`Routed`). Shared by the router and its fan-out."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from synapse.types import ErrorCode, LocalProtocolError, TaskError, TaskResult, TaskState

#: Reject codes after which the task goes to the next candidate (the partner ran nothing).
FAILOVER_CODES = frozenset(
    {
        ErrorCode.RATE_LIMITED.value,
        ErrorCode.CAPABILITY_LACKING.value,
        ErrorCode.AGENT_NOT_READY.value,
    }
)


@dataclass(frozen=True, slots=True)
class Declined:
    """The partner did not take the task (it runs nothing for it)."""

    partner: str
    code: str
    message: str = ""
    retry_after: float | None = None
    suggested: str | None = None
    unreachable: bool = False
    #: The partner refused the request message itself (a `nack`: authentication, capacity,
    #: draining …): nothing of the task reached its handler, so another partner may try.
    refused: bool = False

    @property
    def fails_over(self) -> bool:
        """Whether another partner should get the task (else the refusal is the outcome)."""
        return (
            self.code in FAILOVER_CODES
            or self.suggested is not None
            or self.retry_after is not None
            or self.unreachable
            or self.refused
        )


@dataclass(frozen=True, slots=True)
class Routed:
    """How a routed task ended at the partner that accepted it."""

    partner: str
    state: TaskState
    result: TaskResult | None = None
    error: TaskError | None = None
    #: The partners that declined it first, in order.
    declined: tuple[Declined, ...] = ()
    #: The sub-task's id at the partner (Synapse task id, or A2A task id).
    remote_task_id: str = ""

    @property
    def ok(self) -> bool:
        return self.state is TaskState.COMPLETED


@dataclass(slots=True)
class Commitments:
    """Which partner accepted which (original task, part): never two for one."""

    #: (requester, task id, part) → partner, oldest first; the last `keep` are kept (a
    #: router runs for months: this must not grow without bound).
    by_task: OrderedDict[tuple[str, str, int], str] = field(default_factory=OrderedDict)
    keep: int = 10_000

    def commit(self, key: tuple[str, str, int], partner: str) -> None:
        held = self.by_task.get(key)
        if held is not None:
            raise LocalProtocolError(f"{key} was already accepted by {held}")
        self.by_task[key] = partner
        while len(self.by_task) > self.keep:
            self.by_task.popitem(last=False)


__all__ = ["FAILOVER_CODES", "Declined", "Routed"]
