"""The kit catches real faults: broken peers fail the checks about their fault, and only those."""

from __future__ import annotations

import pytest
from brokenpeers import (
    Bare500Peer,
    CompleteAfterCancelPeer,
    DemoPeer,
    NoSignatureCheckPeer,
    ReplayTwicePeer,
    RunKit,
    WrongCallbackSecretPeer,
)

from synapse.conformance import Status

CASES: dict[str, tuple[type[DemoPeer], set[str]]] = {
    "skips signature checks": (
        NoSignatureCheckPeer,
        {"sig.bad", "sig.missing", "sig.header_decides"},
    ),
    "answers bad JSON with a bare 500": (Bare500Peer, {"error.not_json", "replies.signed"}),
    "sends task_complete after a cancel": (
        CompleteAfterCancelPeer,
        {"flow.cancel", "rules.nothing_after_final"},
    ),
    "executes a replayed request twice": (
        ReplayTwicePeer,
        {
            "dedup.same_bytes",
            "dedup.refreshed",
            "dedup.id_reused",
            "rules.nothing_after_final",
        },
    ),
    "signs callbacks with the wrong secret": (
        WrongCallbackSecretPeer,
        {"callbacks.authenticated"},
    ),
}


@pytest.mark.parametrize("fault", list(CASES))
async def test_the_kit_fails_exactly_the_checks_about_the_fault(
    run_kit: RunKit, fault: str
) -> None:
    peer_class, expected = CASES[fault]
    report = await run_kit(peer_class)
    assert not report.ok
    assert report.failed_ids == expected, report.table()
    assert not any(r.status is Status.SKIP for r in report.results), report.table()
    for result in report.failed:
        assert result.reason, result


async def test_reasons_name_the_fault(run_kit: RunKit) -> None:
    report = await run_kit(NoSignatureCheckPeer, only=["sig.missing"])
    reason = report.result("sig.missing").reason or ""
    assert "expected HTTP 403 nack permission_denied" in reason
    assert "task_confirm" in reason

    report = await run_kit(CompleteAfterCancelPeer, only=["flow.cancel"])
    reason = report.result("flow.cancel").reason or ""
    assert "callbacks after its final state: task_complete" in reason

    report = await run_kit(ReplayTwicePeer, only=["dedup.same_bytes"])
    reason = report.result("dedup.same_bytes").reason or ""
    assert "reply differs from the original's" in reason

    report = await run_kit(Bare500Peer, only=["error.not_json"])
    reason = report.result("error.not_json").reason or ""
    assert "got HTTP 500 with a body that is no envelope" in reason
