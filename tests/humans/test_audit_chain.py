"""The hash-chained audit trail: each entry links to the one before; a changed, removed or
moved entry breaks the chain where it happened; a kept head detects a lost tail."""

from __future__ import annotations

import dataclasses

from synapse.p2p.audit import AuditKeys, append_audit, audit_seal, entry_digest, verify_chain
from synapse.p2p.records import AuditEntry, TaskKey


def trail() -> list[AuditEntry]:
    audit: list[AuditEntry] = []
    append_audit(audit, 1.0, "synapse-humans", "notified", None, {"channel": "mail", "level": 1})
    append_audit(audit, 2.0, "alice", "viewed", None, {"link": "approve"})
    append_audit(audit, 3.0, "alice", "approve", "msg-1", {"approved_fields": {"w": 1024}})
    return audit


def test_each_entry_links_to_the_one_before() -> None:
    audit = trail()
    assert audit[0].prev == ""
    assert [e.prev for e in audit[1:]] == [e.digest for e in audit[:-1]]
    first = audit[0]
    recomputed = entry_digest("", 1.0, first.actor, first.action, None, first.detail)
    assert first.digest == recomputed and len(recomputed) == 64
    verdict = verify_chain(audit)
    assert verdict.intact and verdict.entries == 3 and verdict.head == audit[-1].digest


def test_a_changed_entry_is_detected_where_it_is() -> None:
    audit = trail()
    audit[1] = dataclasses.replace(audit[1], actor="mallory")
    verdict = verify_chain(audit)
    assert not verdict.intact and verdict.broken_at == 1
    assert "changed" in verdict.reason
    audit = trail()
    audit[2] = dataclasses.replace(audit[2], detail={"approved_fields": {"w": 1}})
    assert verify_chain(audit).broken_at == 2


def test_a_removed_or_moved_entry_is_detected() -> None:
    audit = trail()
    del audit[1]
    verdict = verify_chain(audit)
    assert not verdict.intact and verdict.broken_at == 1
    assert "removed or moved" in verdict.reason
    audit = trail()
    audit[0], audit[1] = audit[1], audit[0]
    assert verify_chain(audit).broken_at == 0


def test_a_lost_tail_is_detected_against_a_kept_head() -> None:
    audit = trail()
    head = audit[-1].digest
    assert verify_chain(audit[:-1]).intact  # without the head kept, a shorter chain holds
    verdict = verify_chain(audit[:-1], head=head)
    assert not verdict.intact and "head is gone" in verdict.reason
    assert not verify_chain(audit[:-1], head=head[:16]).intact
    append_audit(audit, 4.0, "bob", "viewed")
    assert verify_chain(audit, head=head).intact  # entries added since: still holds
    assert verify_chain(audit, head=head[:16].upper()).intact  # a prefix as it was printed
    too_short = verify_chain(audit, head=head[:8])
    assert not too_short.intact and "too short" in too_short.reason


def test_entries_written_before_the_chain_are_reported_unchained() -> None:
    audit = [AuditEntry(1.0, "alice", "approve")]
    verdict = verify_chain(audit)
    assert not verdict.intact and verdict.reason == "it is not chained"


# --- keyed chains ------------------------------------------------------------------------------

KEY = b"audit-key-of-the-tests-0123456789"
TASK = TaskKey("agent-r", "t-1")


def keyed_trail(keys: AuditKeys) -> tuple[list[AuditEntry], str]:
    audit: list[AuditEntry] = []
    for at, actor, action in ((1.0, "synapse-humans", "notified"), (2.0, "alice", "approve")):
        append_audit(audit, at, actor, action, None, {"n": at}, keys)
    return audit, audit_seal(TASK, audit, keys)


def test_a_keyed_chain_verifies_with_its_key_only() -> None:
    keys = AuditKeys({"2026": KEY}, "2026")
    audit, seal = keyed_trail(keys)
    assert all(e.digest.startswith("k:2026:") for e in audit)
    assert verify_chain(audit, keys=keys, task=TASK, seal=seal).intact
    without = verify_chain(audit)
    assert not without.intact and "give that key" in without.reason
    other = AuditKeys({"2026": b"another-key-0123456789abcdef"}, "2026")
    assert not verify_chain(audit, keys=other, task=TASK, seal=seal).intact


def test_a_chain_rewritten_without_the_key_does_not_verify() -> None:
    """Whoever can write the store edits an entry and recomputes every digest after it: as
    an unkeyed chain (refused: not keyed), or keyed with a key of their own (refused)."""
    keys = AuditKeys({"1": KEY}, "1")
    audit, seal = keyed_trail(keys)
    rewritten: list[AuditEntry] = []
    for e in audit:
        append_audit(rewritten, e.at, "mallory" if e.action == "approve" else e.actor, e.action)
    verdict = verify_chain(rewritten, keys=keys, task=TASK, seal=seal)
    assert not verdict.intact and "not keyed" in verdict.reason
    forged_keys = AuditKeys({"1": b"mallory-guessed-key-0123456789"}, "1")
    forged: list[AuditEntry] = []
    for e in audit:
        append_audit(forged, e.at, "mallory", e.action, None, e.detail, forged_keys)
    verdict = verify_chain(forged, keys=keys, task=TASK, seal=seal)
    assert not verdict.intact and verdict.broken_at == 0 and "changed" in verdict.reason


def test_a_cut_or_emptied_trail_breaks_the_seal_without_a_kept_head() -> None:
    keys = AuditKeys({"1": KEY}, "1")
    audit, seal = keyed_trail(keys)
    for cut in (audit[:-1], []):
        verdict = verify_chain(cut, keys=keys, task=TASK, seal=seal)
        assert not verdict.intact and "seal does not match" in verdict.reason
    # The seal is the task's own: another task's seal does not cover this trail.
    assert not verify_chain(audit, keys=keys, task=TaskKey("agent-r", "t-2"), seal=seal).intact
    assert "no seal" in verify_chain(audit, keys=keys, task=TASK, seal="").reason


def test_rotation_keeps_older_entries_verifiable() -> None:
    old = AuditKeys({"old": KEY}, "old")
    audit: list[AuditEntry] = []
    append_audit(audit, 1.0, "alice", "viewed", None, {}, old)
    rotated = AuditKeys({"new": b"the-new-audit-key-0123456789ab", "old": KEY}, "new")
    append_audit(audit, 2.0, "alice", "approve", None, {}, rotated)
    seal = audit_seal(TASK, audit, rotated)
    assert [e.digest.split(":")[1] for e in audit] == ["old", "new"]
    assert verify_chain(audit, keys=rotated, task=TASK, seal=seal).intact
    dropped = AuditKeys({"new": b"the-new-audit-key-0123456789ab"}, "new")
    assert "'old'" in verify_chain(audit, keys=dropped, task=TASK, seal=seal).reason
    # The head as printed (`k:new:` and hex) and its hex start are accepted back.
    head = audit[-1].digest
    assert verify_chain(audit, keys=rotated, task=TASK, seal=seal, head=head).intact
    assert verify_chain(audit, head=head.rpartition(":")[2][:16], keys=rotated).intact
