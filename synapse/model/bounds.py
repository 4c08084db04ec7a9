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

    def with_(self, spec: str) -> Bounds:
        """These bounds changed by `spec`: `"losses=2,stalls=0"`."""
        changes: dict[str, Any] = {}
        names = {f.name for f in fields(self)}
        for part in filter(None, (p.strip() for p in spec.split(","))):
            name, _, value = part.partition("=")
            if name.strip() not in names:
                raise ValueError(f"no bound {name.strip()!r} (one of {', '.join(sorted(names))})")
            changes[name.strip()] = float(value) if "." in value else int(value)
        return replace(self, **changes)

    def describe(self) -> str:
        return ", ".join(
            f"{f.name} {getattr(self, f.name):g}"
            for f in fields(self)
            if not f.name.endswith(("timeout", "window"))
        )


#: No fault at all: what each bound of `CI` adds faults to.
_CLEAN = Bounds(losses=0, stalls=0, failures=0, waits=0, exhaustions=0)

#: The bounds CI explores, each every state of one task with every choice of the people
#: and the handler (a progress update, a question, a decision, a cancel, late timers) and
#: one kind of fault; a few minutes on two cores in all.
CI: dict[str, Bounds] = {
    "a message lost": _CLEAN.with_("losses=1"),
    "a commit failing": _CLEAN.with_("failures=1"),
    "a retry overtaking its POST": _CLEAN.with_("stalls=1,questions=0"),
    "a retry past the deduplication window": _CLEAN.with_("waits=1"),
    "a duplicate past the window": _CLEAN.with_(
        "stalls=1,waits=1,progress=0,decisions=0,cancels=0"
    ),
    "retries running out": _CLEAN.with_("exhaustions=1,questions=0"),
}

#: `SYNAPSE_MODEL=larger`: two faults in one history, with every choice (tens of minutes).
LARGER: dict[str, Bounds] = {
    "two messages lost": _CLEAN.with_("losses=2"),
    "two retries overtaking their POSTs": _CLEAN.with_("stalls=2,questions=0"),
    "a loss and a failed commit": _CLEAN.with_("losses=1,failures=1"),
    "a loss and a duplicate, a question asked twice": _CLEAN.with_(
        "losses=1,stalls=1,questions=2,progress=0,decisions=0"
    ),
}


def from_environment() -> dict[str, Bounds]:
    """The bounds `SYNAPSE_MODEL` names: unset or `ci` the CI's, `larger` the larger one,
    or changes to every CI bound (`SYNAPSE_MODEL=losses=2,stalls=1`)."""
    spec = os.environ.get("SYNAPSE_MODEL", "").strip()
    if spec in ("", "ci"):
        return dict(CI)
    if spec == "larger":
        return dict(LARGER)
    return {f"{name}, {spec}": bounds.with_(spec) for name, bounds in CI.items()}


__all__ = ["CI", "LARGER", "Bounds", "from_environment"]
