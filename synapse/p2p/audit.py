"""A task's audit trail as a hash chain: each entry carries the digest of the one before it,
and its own digest covers that and everything it says. Changing an entry, or deleting or
reordering one before the last, breaks the chain at that entry (`verify_chain`).

Unkeyed, the digest is SHA-256 over the canonical JSON (sorted keys, no spaces) of
`[prev, at, actor, action, message_id, detail]`, in lowercase hex: anyone can recompute it,
so it finds accidents and careless edits, not someone who can write the store (they edit an
entry and recompute every digest after it). Keyed (`AuditKeys`: secrets kept outside the
store), the digest is `k:KEY_ID:` followed by HMAC-SHA256 under that key of the same bytes,
and the record carries a seal, `k:KEY_ID:` and HMAC-SHA256 of `[requester, task_id, entry
count, last digest]`: without the key, no entry can be changed, added or removed, and the
trail cannot be cut or emptied, without `verify_chain` saying so. What a key cannot show:
a whole record put back as it was at an earlier moment (an old copy of the store), which a
head kept elsewhere (`head`) finds.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from synapse.p2p.records import AuditEntry, TaskKey

_canonical = msgspec.json.Encoder(order="sorted")
#: How a keyed digest or seal begins: `k:KEY_ID:HEX`.
KEYED = "k:"


@dataclass(frozen=True, slots=True)
class AuditKeys:
    """The secrets audit trails are keyed with (never in the store): `current` keys new
    entries and seals; every key verifies what it keyed (rotation: add a new key as current,
    keep the old ones to verify older entries)."""

    keys: Mapping[str, bytes] = field(default_factory=dict)
    current: str = ""

    def __post_init__(self) -> None:
        if self.current not in self.keys:
            raise ValueError(f"the current audit key {self.current!r} is not among the keys")
        for key_id, secret in self.keys.items():
            if not key_id or ":" in key_id:
                raise ValueError(f"an audit key id is a non-empty name without ':': {key_id!r}")
            if len(secret) < 16:
                raise ValueError(f"audit key {key_id!r} is shorter than 16 bytes")

    def mac(self, body: bytes, key_id: str | None = None) -> str | None:
        """`k:KEY_ID:HEX` of `body` under `key_id` (default: the current key); None if that
        key is not known here."""
        key_id = self.current if key_id is None else key_id
        secret = self.keys.get(key_id)
        if secret is None:
            return None
        return f"{KEYED}{key_id}:{hmac.new(secret, body, hashlib.sha256).hexdigest()}"


def _key_id(digest: str) -> str:
    return digest[len(KEYED) :].partition(":")[0]


def entry_digest(
    prev: str,
    at: float,
    actor: str,
    action: str,
    message_id: str | None,
    detail: Any,
    keys: AuditKeys | None = None,
    key_id: str | None = None,
) -> str:
    """The entry's digest: SHA-256, or with `keys` the keyed digest (`key_id`: which key;
    default the current one)."""
    body = _canonical.encode([prev, at, actor, action, message_id, detail])
    if keys is None:
        return hashlib.sha256(body).hexdigest()
    keyed = keys.mac(body, key_id)
    return keyed if keyed is not None else ""


def audit_seal(key: TaskKey, audit: Sequence[AuditEntry], keys: AuditKeys) -> str:
    """The seal of a whole trail: it covers the task, how many entries there are and the
    last one's digest, so a trail cut short (or emptied) no longer matches it."""
    last = audit[-1].digest if audit else ""
    body = _canonical.encode([key.requester, key.task_id, len(audit), last])
    sealed = keys.mac(body)
    assert sealed is not None
    return sealed


def _seal_holds(key: TaskKey, audit: Sequence[AuditEntry], seal: str, keys: AuditKeys) -> bool:
    last = audit[-1].digest if audit else ""
    body = _canonical.encode([key.requester, key.task_id, len(audit), last])
    expected = keys.mac(body, _key_id(seal))
    return expected is not None and hmac.compare_digest(expected, seal)


def append_audit(
    audit: list[AuditEntry],
    at: float,
    actor: str,
    action: str,
    message_id: str | None = None,
    detail: Mapping[str, Any] | None = None,
    keys: AuditKeys | None = None,
) -> AuditEntry:
    """Append the next entry to `audit`, linked to its last one (keyed with `keys`' current
    key when given: reseal the record then, `audit_seal`); return it."""
    prev = audit[-1].digest if audit else ""
    values = dict(detail or {})
    digest = entry_digest(prev, at, actor, action, message_id, values, keys)
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


def verify_chain(
    audit: Sequence[AuditEntry],
    *,
    head: str | None = None,
    keys: AuditKeys | None = None,
    task: TaskKey | None = None,
    seal: str = "",
) -> ChainVerdict:
    """Check each entry's link and digest, in order; with `head` (a digest kept elsewhere:
    the whole digest, or its first 16 hex digits or more), also that the chain still holds it
    (entries removed from the end are seen so). With `keys` every entry must be keyed with
    one of them, and the record's `seal` (for `task`) must match the trail as it is: a
    trail rewritten without the key, cut short or emptied is found. Keyed entries without
    `keys` cannot be checked: the verdict says so."""
    prev = ""
    for index, entry in enumerate(audit):
        if not entry.digest:
            return ChainVerdict(False, len(audit), index, "it is not chained")
        if entry.prev != prev:
            why = "it does not follow the entry before it (one was removed or moved)"
            return ChainVerdict(False, len(audit), index, why)
        fields = (entry.prev, entry.at, entry.actor, entry.action, entry.message_id, entry.detail)
        if entry.digest.startswith(KEYED):
            key_id = _key_id(entry.digest)
            if keys is None or key_id not in keys.keys:
                why = f"it is keyed with audit key {key_id!r}: give that key to check it"
                return ChainVerdict(False, len(audit), index, why)
            expected = entry_digest(*fields, keys, key_id)
        elif keys is not None:
            why = "it is not keyed: anyone who can write the store could have written it"
            return ChainVerdict(False, len(audit), index, why)
        else:
            expected = entry_digest(*fields)
        if not hmac.compare_digest(entry.digest, expected):
            return ChainVerdict(False, len(audit), index, "its content was changed")
        prev = entry.digest
    if keys is not None and task is not None:
        if not seal:
            why = "the record has no seal (its trail was never keyed, or the seal was removed)"
            return ChainVerdict(False, len(audit), len(audit), why, prev)
        if not _seal_holds(task, audit, seal, keys):
            why = "the seal does not match: entries were removed from the end, or it was changed"
            return ChainVerdict(False, len(audit), len(audit), why, prev)
    kept = (head or "").strip()
    if kept:
        # A kept head: the digest as printed (`k:KEY_ID:` and hex, or hex), or its start.
        prefix, _, digits = kept.rpartition(":")
        kept = f"{prefix}:{digits.lower()}" if prefix else digits.lower()
        found = any(e.digest.startswith(kept) or _hex(e.digest).startswith(kept) for e in audit)
        if len(digits) < MIN_HEAD or not found:
            # Entries may have been added since `head` was kept, never removed.
            why = "the kept head is gone"
            if len(digits) < MIN_HEAD:
                why = f"the kept head is too short: give at least {MIN_HEAD} hex digits"
            return ChainVerdict(False, len(audit), len(audit), why, prev)
    return ChainVerdict(True, len(audit), head=prev)


def _hex(digest: str) -> str:
    return digest.rpartition(":")[2]


__all__ = [
    "AuditKeys",
    "ChainVerdict",
    "append_audit",
    "audit_seal",
    "entry_digest",
    "verify_chain",
]
