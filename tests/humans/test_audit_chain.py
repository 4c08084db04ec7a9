"""The hash-chained audit trail: each entry links to the one before; a changed, removed or
moved entry breaks the chain where it happened; a kept head detects a lost tail."""

from __future__ import annotations

import dataclasses

from synapse.p2p.audit import append_audit, entry_digest, verify_chain
from synapse.p2p.records import AuditEntry


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
