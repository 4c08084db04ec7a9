"""The kit's verdict: one result per check, as a table for people and JSON for machines."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any


class Status(StrEnum):
    """The outcome of one check."""

    PASS = "PASS"
    """The target behaved as specs/protocol.md says."""
    FAIL = "FAIL"
    """It did not; `reason` says how."""
    SKIP = "SKIP"
    """The check could not run (its prerequisite failed); `reason` says why."""


@dataclass(frozen=True, slots=True)
class CheckResult:
    id: str
    title: str
    #: The part of the spec it covers, e.g. "specs/protocol.md, 'Missing information'" or
    #: "specs/protocol.md, 'Signatures'".
    section: str
    status: Status
    #: Why it failed or was skipped (None when it passed).
    reason: str | None = None
    #: Seconds it took.
    duration: float = 0.0

    @property
    def passed(self) -> bool:
        return self.status is Status.PASS


@dataclass(frozen=True, slots=True)
class Report:
    """Every check run against one target."""

    target: str
    agent_id: str
    kit_agent_id: str
    callback_url: str
    results: list[CheckResult] = field(default_factory=list)
    #: Seconds the whole run took.
    duration: float = 0.0
    #: The target never answered: nothing about it could be checked.
    unreachable: bool = False

    @property
    def setup_failure(self) -> str | None:
        """Why the setup failed (then every other check was skipped), or None."""
        setup = next((r for r in self.results if r.id == "setup"), None)
        return setup.reason if setup is not None and setup.status is Status.FAIL else None

    @property
    def ok(self) -> bool:
        """True when no check failed (and at least one passed)."""
        return any(r.passed for r in self.results) and not self.failed

    @property
    def failed(self) -> list[CheckResult]:
        return [r for r in self.results if r.status is Status.FAIL]

    @property
    def failed_ids(self) -> set[str]:
        return {r.id for r in self.failed}

    def result(self, check_id: str) -> CheckResult:
        for result in self.results:
            if result.id == check_id:
                return result
        raise KeyError(check_id)

    def counts(self) -> dict[str, int]:
        return {s.value: sum(1 for r in self.results if r.status is s) for s in Status}

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "agent_id": self.agent_id,
            "kit_agent_id": self.kit_agent_id,
            "callback_url": self.callback_url,
            "ok": self.ok,
            "unreachable": self.unreachable,
            "duration": round(self.duration, 3),
            "counts": self.counts(),
            "results": [
                {**asdict(r), "status": r.status.value, "duration": round(r.duration, 3)}
                for r in self.results
            ],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, indent=2)

    def table(self) -> str:
        """A plain-text table: check, section, result, title; each failure's reason below it."""
        head = ("CHECK", "SECTION OF specs/protocol.md", "RESULT", "TIME", "TITLE")
        rows = [
            (r.id, _short_section(r.section), r.status.value, f"{r.duration:.2f}s", r.title)
            for r in self.results
        ]
        widths = [max(len(row[i]) for row in [head, *rows]) for i in range(4)]

        def line(row: tuple[str, ...]) -> str:
            cells = [cell.ljust(widths[i]) for i, cell in enumerate(row[:4])]
            return "  ".join([*cells, row[4]]).rstrip()

        out = [
            f"Synapse conformance: {self.agent_id} at {self.target} "
            f"(kit {self.kit_agent_id}, callbacks on {self.callback_url})",
            "",
            line(head),
        ]
        shown: set[str] = set()
        for result, row in zip(self.results, rows, strict=True):
            out.append(line(row))
            # Every failure's reason; a skip's only the first time (they are all alike).
            if result.reason and result.status is not Status.PASS and result.reason not in shown:
                out.append(" " * (widths[0] + 2) + "↳ " + result.reason)
                if result.status is Status.SKIP:
                    shown.add(result.reason)
        counts = self.counts()
        verdict = "CONFORMANT" if self.ok else "NOT CONFORMANT"
        if self.setup_failure is not None:
            # Nothing else ran: the summary says why, not only that.
            verdict = ("NOT CHECKED" if self.unreachable else verdict) + f": {self.setup_failure}"
        out += [
            "",
            f"{len(self.results)} checks: {counts['PASS']} passed, {counts['FAIL']} failed, "
            f"{counts['SKIP']} skipped in {self.duration:.1f} s — {verdict}",
        ]
        return "\n".join(out)


__all__ = ["CheckResult", "Report", "Status"]


def _short_section(section: str) -> str:
    """`specs/protocol.md, 'A' and 'B'` as the table shows it, under its header: `A, B`."""
    prefix = "specs/protocol.md, "
    if not section.startswith(prefix):
        return section
    return section[len(prefix) :].replace("' and '", ", ").replace("', '", ", ").strip("'")
