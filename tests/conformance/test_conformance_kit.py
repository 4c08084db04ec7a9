"""The kit against our own demo peer: every check passes, quickly, with a readable report."""

from __future__ import annotations

import json
import time
from pathlib import Path

from brokenpeers import DemoPeer, RunKit

from synapse.conformance import CHECKS, Status
from synapse.p2p.config import P2PConfig

SECTIONS = (
    "specs/protocol.md, 'Normal task'",
    "specs/protocol.md, 'Missing information'",
    "specs/protocol.md, 'Human decision'",
    "specs/protocol.md, 'Cancellation'",
    "specs/protocol.md, 'Signatures'",
    "specs/protocol.md, 'Error codes'",
    "specs/protocol.md, 'Deduplication'",
    "specs/protocol.md, 'Task states'",
)


async def test_every_check_passes_against_our_demo_peer(run_kit: RunKit) -> None:
    started = time.monotonic()
    report = await run_kit()
    elapsed = time.monotonic() - started
    assert report.ok, report.table()
    assert [r.id for r in report.results] == [c.id for c in CHECKS]
    assert all(r.status is Status.PASS for r in report.results), report.table()
    # Well under a minute: the checks run concurrently, every wait is bounded.
    assert elapsed < 20, elapsed


def test_checks_are_unique_and_cover_the_spec() -> None:
    ids = [c.id for c in CHECKS]
    assert len(ids) == len(set(ids))
    for section in SECTIONS:
        assert any(section in c.section for c in CHECKS), section
    for check in CHECKS:
        assert check.title and check.section, check.id
    assert CHECKS[0].id == "setup"


def test_the_docs_list_every_check_with_its_section_and_title() -> None:
    docs = (Path(__file__).parents[2] / "docs" / "conformance.md").read_text()
    for check in CHECKS:
        assert f"| `{check.id}` | {check.section} | {check.title} |" in docs, check.id


async def test_report_as_table_and_json(run_kit: RunKit) -> None:
    report = await run_kit(only=["flow.echo", "heartbeat"])
    assert [r.id for r in report.results] == ["setup", "heartbeat", "flow.echo"]
    table = report.table()
    assert "flow.echo" in table and "Normal task" in table and "PASS" in table
    assert "CONFORMANT" in table.splitlines()[-1]
    data = json.loads(report.to_json())
    assert data["ok"] is True
    assert data["counts"] == {"PASS": 3, "FAIL": 0, "SKIP": 0}
    assert data["agent_id"] == report.agent_id
    assert data["callback_url"].endswith("/synapse/callback")
    echo = next(r for r in data["results"] if r["id"] == "flow.echo")
    assert echo == {
        "id": "flow.echo",
        "title": echo["title"],
        "section": "specs/protocol.md, 'Normal task'",
        "status": "PASS",
        "reason": None,
        "duration": echo["duration"],
    }


async def test_a_target_that_does_not_know_the_kit_fails_setup_and_skips_the_rest(
    run_kit: RunKit,
) -> None:
    class Stranger(DemoPeer):
        def register_kit(self, url: str) -> None:
            pass  # never told about the kit

    report = await run_kit(Stranger)
    assert not report.ok
    setup = report.result("setup")
    assert setup.status is Status.FAIL
    assert setup.reason is not None and "does not know the kit's agent id" in setup.reason
    assert {r.status for r in report.results[1:]} == {Status.SKIP}
    assert "skipped" in report.table()


async def test_callback_checks_skip_when_no_task_was_requested(run_kit: RunKit) -> None:
    report = await run_kit(only=["heartbeat", "callbacks.*"])
    assert report.ok, report.table()
    assert report.result("callbacks.authenticated").status is Status.SKIP
    assert report.result("callbacks.one_at_a_time").status is Status.PASS


async def test_one_check_at_a_time_passes_against_a_peer_taking_two_tasks(
    run_kit: RunKit,
) -> None:
    class Small(DemoPeer):
        def __init__(self) -> None:
            super().__init__(config=P2PConfig(max_concurrent_tasks=2))

    report = await run_kit(Small, only=["flow.*", "sig.bad", "dedup.*"], concurrency=1)
    assert report.ok, report.table()


def test_the_refusal_checks_are_rows_of_one_table() -> None:
    from synapse.conformance.checks.refusals import REFUSALS, STALE

    registered = {c.id: c for c in CHECKS}
    assert len(REFUSALS) >= 15
    for row in REFUSALS:
        assert registered[row.id].run == row.run  # registered from the table itself
        assert registered[row.id].title == row.title and registered[row.id].section == row.section
    assert STALE.answer == (403, "permission_denied", False) and STALE.reason == "stale"
