"""Run every benchmark, print their tables and write `docs/benchmarks.md` with its chart.

    python -m benchmarks [--quick] [--only codec,e2e,instructions,memory,timers,a2a_sdk,a2a_memory,
                                               replicas,takeover_scan,scaling] [--keep]
                         [--no-write]

`--only ... --keep` measures those benchmarks again and keeps the other sections of the
last `docs/benchmarks.json` (each kept section says when it was measured, and under what
load), so that a quiet spell of a shared machine can be spent on the figures that need it.

The full run takes about four minutes (the timer benchmark alone watches 10,000 idle tasks
for 30 s). `--quick` runs each benchmark with its smallest setting, in well under a minute,
and writes nothing unless `--out` is given.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from benchmarks import (
    a2a_memory,
    a2a_sdk,
    codec,
    e2e,
    http_client,
    instructions,
    memory,
    replicas,
    report,
    scaling,
    takeover_scan,
    timers,
)
from benchmarks._common import ROOT, Section, machine, quiet_logging

FULL: dict[str, Callable[[], Section]] = {
    "codec": lambda: codec.run(seconds=6.0),
    "http_client": lambda: http_client.run(),
    "e2e": lambda: e2e.run(seconds=4.0, warmup=1.0, rounds=3, compare=True),
    "instructions": lambda: instructions.section(tasks=300),
    "memory": lambda: memory.run((10_000, 100_000), 10_000),
    "timers": lambda: timers.run(tasks=10_000, seconds=30.0),
    "a2a_sdk": lambda: a2a_sdk.run(seconds=4.0, warmup=1.0, rounds=1),
    "a2a_memory": lambda: a2a_memory.run(tasks=3000),
    "replicas": lambda: replicas.run(seconds=5.0, warmup=1.0, rounds=3),
    "takeover_scan": lambda: takeover_scan.run((10_000, 100_000), scans=200),
    "scaling": lambda: scaling.run((1_000, 10_000, 100_000), (100, 1_000, 10_000)),
}
QUICK: dict[str, Callable[[], Section]] = {
    "codec": lambda: codec.run(seconds=0.3),
    "http_client": lambda: http_client.run(requests=500, rounds=1),
    "e2e": lambda: e2e.run(seconds=0.4, warmup=0.2, rounds=1, sweep=(1,)),
    "instructions": lambda: instructions.section(tasks=3),
    "memory": lambda: memory.run((1_000,), 1_000),
    "timers": lambda: timers.run(tasks=500, seconds=1.0),
    "a2a_sdk": lambda: a2a_sdk.run(seconds=0.4, warmup=0.2),
    "a2a_memory": lambda: a2a_memory.run(tasks=50),
    "replicas": lambda: replicas.run(seconds=0.5, warmup=0.2, rounds=1, round_trips=False),
    "takeover_scan": lambda: takeover_scan.run((1_000, 10_000), scans=10),
    "scaling": lambda: scaling.run((200, 400, 800), (20, 40, 80), 50),
}

#: What the figures mean beyond the tables: written once the targets were measured.
ANALYSIS = Path(__file__).with_name("analysis.md")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smallest settings (smoke run)")
    parser.add_argument("--only", default="", help="comma-separated benchmark names")
    parser.add_argument("--out", type=Path, default=None, help="where to write (docs/)")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument(
        "--keep",
        action="store_true",
        help="with --only: keep the other sections of the last benchmarks.json",
    )
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    names = [n for n in args.only.split(",") if n] or list(plan)
    unknown = set(names) - set(plan)
    if unknown:
        parser.error(f"unknown benchmarks: {', '.join(sorted(unknown))}")
    quiet_logging()
    started = time.monotonic()
    info = machine()
    sections = []
    out = args.out if args.out is not None else (None if args.quick else ROOT / "docs")
    measured: dict[str, Section] = {}
    for name in names:
        print(f"... {name}", file=sys.stderr, flush=True)
        load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
        begun = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        section = plan[name]()
        section.notes.append(
            f"Measured {begun}; load average {load} (1 / 5 / 15 min) at its start."
        )
        measured[name] = section
        print(section.text(), end="\n\n", flush=True)
    sections = list(measured.values())
    if args.keep and out is not None and (out / "benchmarks.json").exists():
        sections = _with_kept(measured, out / "benchmarks.json", order=list(plan))
    elapsed = time.monotonic() - started
    figures: dict[str, float] = {}
    for section in sections:
        figures |= section.figures
    print(report.targets_table(figures).text())
    if out is None or args.no_write:
        return 0
    out.mkdir(parents=True, exist_ok=True)
    has_chart = report.chart(figures, out / "benchmarks.png")
    command = "python -m benchmarks" + (" --quick" if args.quick else "")
    if args.only:
        command += f" --only {args.only}" + (" --keep" if args.keep else "")
    analysis = ANALYSIS.read_text(encoding="utf-8") if ANALYSIS.exists() else ""
    text = report.markdown(
        sections,
        info,
        command=command,
        elapsed=elapsed,
        chart_file="benchmarks.png" if has_chart else None,
        analysis=analysis,
    )
    (out / "benchmarks.md").write_text(text, encoding="utf-8")
    report.write_json(sections, info, out / "benchmarks.json")
    print(f"\nwrote {out / 'benchmarks.md'}" + (", benchmarks.png" if has_chart else ""))
    if not has_chart:
        print("(no chart: matplotlib is not installed; pip install -e '.[bench]')")
    return 0


def _with_kept(measured: dict[str, Section], path: Path, *, order: list[str]) -> list[Section]:
    """The sections just measured, and the others as the last run wrote them, in `order`."""
    data = json.loads(path.read_text(encoding="utf-8"))
    old = data.get("machine", {})
    when = f"{old.get('date', 'an earlier run')}, load average " + " / ".join(
        str(x) for x in old.get("load", [])
    )
    kept: dict[str, Section] = {}
    for raw in data.get("sections", []):
        section = Section.from_json(raw)
        if section.name in measured:
            continue
        if not any(note.startswith(("Measured ", "Not measured again")) for note in section.notes):
            section.notes.append(f"Not measured again in this run: kept from the run of {when}.")
        kept[section.name] = section
    both = {**kept, **measured}
    return [both[name] for name in order if name in both]


if __name__ == "__main__":
    raise SystemExit(main())
