"""A task's audit trail as a hash chain: each entry carries the digest of the one before it,
and its own digest covers that and everything it says. Changing an entry, or deleting or
reordering one before the last, breaks the chain at that entry (`verify_chain`).

The digest is SHA-256 over the canonical JSON (sorted keys, no spaces) of
`[prev, at, actor, action, message_id, detail]`, in lowercase hex. Anyone can recompute it:
`synapse audit TASK_ID` does, and so can a script reading `--export`'s JSON Lines.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from synapse.p2p.records import AuditEntry

_canonical = msgspec.json.Encoder(order="sorted")


def entry_digest(
    prev: str, at: float, actor: str, action: str, message_id: str | None, detail: Any
) -> str:
    body = _canonical.encode([prev, at, actor, action, message_id, detail])
    return hashlib.sha256(body).hexdigest()


def append_audit(
    audit: list[AuditEntry],
    at: float,
    actor: str,
    action: str,
    message_id: str | None = None,
    detail: Mapping[str, Any] | None = None,
) -> AuditEntry:
    """Append the next entry to `audit`, linked to its last one; return it."""
    prev = audit[-1].digest if audit else ""
    values = dict(detail or {})
    digest = entry_digest(prev, at, actor, action, message_id, values)
    entry = AuditEntry(at, actor, action, message_id, values, prev, digest)
    audit.append(entry)
    return entry


#: The fewest hex digits of a digest accepted as a kept head (64 bits: no accidental match).
MIN_HEAD = 16


@dataclass(frozen=True, slots=True)
class ChainVerdict:
    """What `verify_chain` found."""

    #: Whether every entry links to the one before and matches its digest.
    intact: bool
    entries: int
    #: The index of the first entry that does not hold, and why.
    broken_at: int | None = None
    reason: str = ""
    #: The last entry's digest: keep it elsewhere to detect a later loss of the tail.
    head: str = ""

    def __str__(self) -> str:
        if self.intact:
            return f"chain intact: {self.entries} entries, head {self.head}"
        return f"chain BROKEN at entry {self.broken_at}: {self.reason}"


def verify_chain(audit: Sequence[AuditEntry], *, head: str | None = None) -> ChainVerdict:
    """Check each entry's link and digest, in order; with `head` (a digest kept elsewhere:
    the whole digest, or its first 16 hex digits or more), also that the chain still holds it
    (entries removed from the end are seen so)."""
    prev = ""
    for index, entry in enumerate(audit):
        if not entry.digest:
            return ChainVerdict(False, len(audit), index, "it is not chained")
        if entry.prev != prev:
            why = "it does not follow the entry before it (one was removed or moved)"
            return ChainVerdict(False, len(audit), index, why)
        expected = entry_digest(
            entry.prev, entry.at, entry.actor, entry.action, entry.message_id, entry.detail
        )
        if entry.digest != expected:
            return ChainVerdict(False, len(audit), index, "its content was changed")
        prev = entry.digest
    kept = (head or "").strip().lower()
    if kept and (len(kept) < MIN_HEAD or not any(e.digest.startswith(kept) for e in audit)):
        # Entries may have been added since `head` was kept, never removed.
        why = "the kept head is gone"
        if len(kept) < MIN_HEAD:
            why = f"the kept head is too short: give at least {MIN_HEAD} hex digits"
        return ChainVerdict(False, len(audit), len(audit), why, prev)
    return ChainVerdict(True, len(audit), head=prev)


__all__ = ["ChainVerdict", "append_audit", "entry_digest", "verify_chain"]
