"""The question a waiting task asks, and the names of the audit entries `synapse.humans`
writes about it (each with `detail.question`: the question's id)."""

from __future__ import annotations

from dataclasses import dataclass

from synapse.humans.config import NotifyRoute
from synapse.humans.notices import Option
from synapse.humans.policy import Window
from synapse.p2p.engine import AuditEntry, TaskRecord
from synapse.types import TaskState

#: Audit actions of this module (all begin with `human.`).
QUEUED = "human.queued"
NOTIFIED = "human.notified"
VIEWED = "human.viewed"
LINK_USED = "human.link_used"
APPROVAL = "human.approval"
REJECTION = "human.rejection"
TIMEOUT = "human.timeout"

WAITING = frozenset({TaskState.NEED_HUMAN, TaskState.HUMAN_DECIDING, TaskState.INFO_NEEDED})


@dataclass(frozen=True, slots=True)
class OpenQuestion:
    """The question a waiting task asks, and the route and window that handle it."""

    rec: TaskRecord
    route: NotifyRoute
    window: Window
    #: need_human or need_info.
    kind: str
    #: Unique per question of the task (a task may ask for information more than once).
    id: str
    reason_code: str
    reason: str
    summary: str
    options: tuple[Option, ...]
    missing: tuple[tuple[str, str], ...]

    def entries(self, action: str) -> list[AuditEntry]:
        """This question's audit entries of `action`."""
        return [
            e for e in self.rec.audit if e.action == action and e.detail.get("question") == self.id
        ]


__all__ = [
    "APPROVAL",
    "LINK_USED",
    "NOTIFIED",
    "QUEUED",
    "REJECTION",
    "TIMEOUT",
    "VIEWED",
    "WAITING",
    "OpenQuestion",
]
