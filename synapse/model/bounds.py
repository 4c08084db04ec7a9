"""How far the model checker looks: faults, people's and handlers' choices, timeouts."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from typing import Any


@dataclass(frozen=True, slots=True)
class Bounds:
    """Counts of each kind of event one explored history may hold (and the timeouts the two
    engines run with). Every history within them is explored."""

    #: POSTs or replies lost on the way (the sender times out and sends again).
    losses: int = 1
    #: Attempts given up on while the POST is still on its way (it arrives twice).
    stalls: int = 1
    #: Commits that fail at the receiver (the message is refused with 503, sent again).
    failures: int = 1
    #: Waits longer than the deduplication window (a parked message retried much later).
    waits: int = 1
    #: Cancels by the requester.
    cancels: int = 1
    #: Times a message's retries run out (the partner unreachable for a while).
    exhaustions: int = 0
    #: Timeouts that pass while messages are still on their way (late past a timeout).
    lates: int = 1
    #: The executor's handler: progress updates, questions (`need_info`, the synchronous
    #: one's re-ask included), decisions asked of a person.
    progress: int = 1
    questions: int = 1
    decisions: int = 1
    task_timeout: float = 300.0
    input_timeout: float = 3600.0
    dedup_window: float = 600.0

    @classmethod
    def ci(cls) -> Bounds:
        """The bound CI explores (minutes on two cores)."""
        return cls()

    @classmethod
    def larger(cls) -> Bounds:
        """`SYNAPSE_MODEL=larger`: two of every fault, a re-asked question."""
        return cls(losses=2, stalls=2, failures=1, waits=1, exhaustions=1, questions=2)

    @classmethod
    def from_environment(cls) -> Bounds:
        """`SYNAPSE_MODEL=larger`, or `SYNAPSE_MODEL=losses=2,stalls=2,...`."""
        spec = os.environ.get("SYNAPSE_MODEL", "")
        if spec in ("", "ci"):
            return cls.ci()
        if spec == "larger":
            return cls.larger()
        changes: dict[str, Any] = {}
        names = {f.name: f.type for f in fields(cls)}
        for part in spec.split(","):
            name, _, value = part.partition("=")
            if name.strip() not in names:
                raise ValueError(f"SYNAPSE_MODEL: no bound {name!r} (one of {sorted(names)})")
            changes[name.strip()] = float(value) if "." in value else int(value)
        return replace(cls.ci(), **changes)

    def describe(self) -> str:
        return ", ".join(
            f"{f.name} {getattr(self, f.name):g}"
            for f in fields(self)
            if not f.name.endswith(("timeout", "window"))
        )


__all__ = ["Bounds"]
