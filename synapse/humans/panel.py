"""What the console shows of a task's people: the channels told, who opened what, reminders,
escalations, answers and time-outs, and whether the audit trail's chain holds."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from synapse.humans.question import WAITING
from synapse.p2p.audit import verify_chain
from synapse.p2p.engine import TaskRecord

#: The entries shown, and how each reads.
_SAID = {
    "human.notify": "told level {level}",
    "human.remind": "reminded level {level}",
    "human.escalate": "escalated to level {level}",
    "human.queued": "{channel} → {to}",
    "human.notified": "delivered through {channel}",
    "human.viewed": "{reviewer} opened the {link} link",
    "human.link_used": "{reviewer} answered: {action}",
    "human.approval": "{reviewer} approved",
    "human.rejection": "{reviewer} rejected: {reason}",
    "human.timeout": "time-out: {action}",
}


def humans_panel(rec: TaskRecord) -> list[dict[str, Any]]:
    """Rows for `Console.add_panel`: one per step of `synapse.humans`, then the chain's
    verdict (nothing for a task no person was told of)."""
    rows: list[dict[str, Any]] = []
    for entry in rec.audit:
        said = _SAID.get(entry.action)
        if said is None:
            if entry.action in ("approve", "reject", "info_provided") and rows:
                rows.append(_row(entry.at, entry.actor, f"decision sent: {entry.action}"))
            continue
        if entry.action == "human.queued":
            continue  # shown once delivered (or still pending, below)
        text = said.format_map(_Blank(entry.detail))
        rows.append(_row(entry.at, entry.actor, text))
    if not rows:
        return []
    delivered = {e.detail.get("key") for e in rec.audit if e.action == "human.notified"}
    pending = [
        e for e in rec.audit if e.action == "human.queued" and e.detail.get("key") not in delivered
    ]
    status = "pending" if rec.state in WAITING else "not sent (answered first)"
    for entry in pending:
        text = f"{status}: " + _SAID["human.queued"].format_map(_Blank(entry.detail))
        rows.append(_row(entry.at, entry.actor, text))
    rows.append({"at": "", "who": "audit trail", "what": str(verify_chain(rec.audit))})
    return rows


def _row(at: float, who: str, what: str) -> dict[str, Any]:
    stamp = datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S")
    return {"at": stamp, "who": who, "what": what}


class _Blank(dict[str, Any]):
    def __missing__(self, key: str) -> str:
        return "?"


__all__ = ["humans_panel"]
