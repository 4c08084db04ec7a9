"""Each benchmark runs with its smallest setting and produces its rows and figures.

Timings are never asserted: on a shared machine they say nothing about correctness.
"""

from __future__ import annotations

import importlib.util
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from benchmarks import (
    a2a_memory,
    a2a_sdk,
    bytecodes,
    codec,
    e2e,
    http_client,
    longrun,
    memory,
    replicas,
    report,
    scaling,
    takeover_scan,
    timers,
)
from benchmarks._common import Section, machine

SDK = all(importlib.util.find_spec(m) is not None for m in ("a2a", "uvicorn", "starlette"))


def _check(section: Section, *figures: str) -> None:
    assert section.tables and all(t.rows for t in section.tables)
    for table in section.tables:
        assert all(len(row) == len(table.columns) for row in table.rows)
    for name in figures:
        assert section.figures[name] > 0, name
    assert section.text() and section.to_json()["figures"]


def test_codec() -> None:
    section = codec.run(seconds=0.05)
    _check(
        section,
        "codec.request.typed_us",
        "codec.request.pydantic_us",
        "codec.status_update.floor_us",
        "codec.status_update.sign_verify_us",
    )
    assert len(section.tables[0].rows) == 26  # 13 operations × 2 messages


def test_http_client() -> None:
    section = http_client.run(requests=200, concurrency=10, rounds=1)
    _check(section, "http_client.lean.cpu_us", "http_client.aiohttp.cpu_us")
    assert [row[0] for row in section.tables[0].rows] == [
        "synapse.transport.http1",
        "aiohttp ClientSession",
    ]


def test_memory() -> None:
    section = memory.run((200,), 200)
    _check(
        section,
        "memory.finished200.requester_bytes",
        "memory.finished200.executor_sqlite_bytes",
        "memory.inflight200.runtime_bytes",
    )
    assert section.figures["memory.inflight200.timers_per_task"] == 2


def test_e2e() -> None:
    section = e2e.run(seconds=0.2, warmup=0.1, rounds=1, headline=4, sweep=(1,))
    _check(
        section,
        "e2e.floor.tasks_per_s",
        "e2e.serve_memory.tasks_per_s",
        "e2e.serve_sqlite.cpu_us_per_task",
        "e2e.bare.requests_per_s",
        "e2e.c1.serve_exchange_p99_ms",
        "e2e.serve_memory.cpu_vs_fastest",
        "e2e.c1.serve_p50_vs_fastest",
        "e2e.c1.serve_p99_vs_fastest",
    )
    assert section.figures["e2e.floor.of_floor"] == 1.0
    assert section.figures["e2e.fastest_floor.cpu_vs_fastest"] == 1.0


def test_timers() -> None:
    section = timers.run(tasks=50, seconds=0.2)
    _check(section, "timers.tasks")
    assert section.figures["timers.executor_cpu_share"] >= 0


@pytest.mark.skipif(not SDK, reason="the official A2A SDK (a2a-sdk[http-server], uvicorn)")
def test_a2a_sdk() -> None:
    section = a2a_sdk.run(seconds=0.2, warmup=0.1, concurrencies=(2,))
    _check(section, "a2a.c2.sdk.tasks_per_s", "a2a.c2.a2a.tasks_per_s", "a2a.c2.synapse.over_sdk")


@pytest.mark.skipif(not SDK, reason="the official A2A SDK (a2a-sdk[http-server], uvicorn)")
def test_a2a_memory() -> None:
    section = a2a_memory.run(tasks=20)
    _check(section, "a2a_memory.a2a.traced_bytes_per_task")
    assert {"a2a_memory.sdk.rss_bytes_per_task", "a2a_memory.a2a.rss_bytes_per_task"} <= set(
        section.figures
    )  # RSS moves in pages: 20 tasks may not move it at all


def test_replicas() -> None:
    """The floor, SQLite and one and two replicas, with round trips counted on the wire."""
    section = replicas.run(seconds=0.5, warmup=0.2, rounds=1, durable=False, round_trips=True)
    _check(
        section,
        "replicas.floor.tasks_per_s",
        "replicas.sqlite.tasks_per_s",
        "replicas.one.tasks_per_s",
        "replicas.two.tasks_per_s",
        "replicas.one.total_cpu_ms",
        "replicas.one.explicit_per_task",
        "replicas.one.round_trips_per_task",
    )
    setups = [row[0] for row in section.tables[0].rows]
    assert setups == ["sqlite-1", "pg-floor", "postgres-1", "postgres-2"]
    judged = report.targets_table(section.figures).rows
    assert any(row[0].startswith("two replicas") and row[3] in ("yes", "no") for row in judged)


def test_takeover_scan() -> None:
    section = takeover_scan.run((500, 5_000), scans=5)
    _check(section, "takeover_scan.buffers_ratio", "takeover_scan.500.buffers")
    assert section.figures["takeover_scan.size_ratio"] == 10


def test_report(tmp_path: Path) -> None:
    section = codec.run(seconds=0.05)
    text = report.markdown(
        [section],
        machine(),
        command="python -m benchmarks",
        elapsed=1.0,
        chart_file=None,
        analysis="",
    )
    assert "| codec vs pydantic v2, decode + validate |" in text
    assert "not measured in this run" in text  # e2e and the others were not run
    if importlib.util.find_spec("matplotlib") is not None:
        assert report.chart(section.figures, tmp_path / "chart.png")
        assert (tmp_path / "chart.png").stat().st_size > 0


def test_a_partial_run_keeps_the_other_sections(tmp_path: Path) -> None:
    """`--only timers --keep`: timers measured again, codec kept from the last JSON."""
    import json

    from benchmarks.__main__ import main

    old = codec.run(seconds=0.05)
    earlier = {"date": "2026-01-01 00:00 UTC", "load": [7.0, 6.0, 5.0]}
    data = {"machine": earlier, "sections": [old.to_json()]}
    (tmp_path / "benchmarks.json").write_text(json.dumps(data), encoding="utf-8")
    assert main(["--quick", "--only", "timers", "--keep", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "benchmarks.md").read_text(encoding="utf-8")
    assert old.title in text
    assert "kept from the run of 2026-01-01 00:00 UTC, load average 7.0 / 6.0 / 5.0" in text
    assert "Timer scaling" in text and "load average" in text.split("Timer scaling")[1]
    written = json.loads((tmp_path / "benchmarks.json").read_text(encoding="utf-8"))
    assert [s["name"] for s in written["sections"]] == ["codec", "timers"]


def test_longrun() -> None:
    section = longrun.run(200, 100, restart_tasks=300)
    _check(
        section,
        "longrun.sqlite.store_growth",
        "longrun.sqlite_retain_5s.throughput_last_over_first",
        "longrun.restart.recovery_s",
        "longrun.restart.answered_s",
    )
    runs = section.raw["runs"]  # type: ignore[attr-defined]
    assert [row["tasks"] for row in runs["sqlite"]] == [0, 100, 200]
    assert all(row["in_memory"] == 0 for rows in runs.values() for row in rows[1:])


def test_security() -> None:
    """`python -m benchmarks.security` (run by hand): each table has its rows."""
    import asyncio

    from benchmarks import security

    tables = [
        security.crypto_table(0.01),
        asyncio.run(security.a2a_table(0.05)),
        asyncio.run(security.tls_table(0.05)),
    ]
    if importlib.util.find_spec("grpc") is not None:
        tables.append(asyncio.run(security.grpc_table(0.05)))
    for table in tables:
        assert table.rows and all(len(row) == len(table.columns) for row in table.rows)


def test_instructions() -> None:
    """`python -m benchmarks.instructions` (run by hand): each executor under callgrind counts
    its instructions per task, most of them the interpreter's, as a ratio to the first (the
    fastest floor: raw asyncio and httptools)."""
    import shutil

    from pgserver import missing

    from benchmarks import instructions

    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        missing("needs valgrind (Debian: apt-get install valgrind)")
    fastest, _aiohttp, serve, *_ = instructions.ladder()
    results = instructions.counts([fastest, serve], tasks=3)
    table = instructions.table_of(results)
    assert [row[0] for row in table.rows] == [fastest.name, serve.name]
    for row in table.rows:
        assert len(row) == len(table.columns)
        per_task = int(row[1].replace(",", ""))
        interpreter = int(row[3].rstrip("k").replace(",", "")) * 1000
        assert 0 < interpreter <= per_task
    figures = instructions.figures_of(results)
    assert figures["instructions.fastest_floor.x_first"] == 1.0
    assert figures["instructions.serve_memory_store.x_first"] > 1.0


def test_replicas_summary_survives_a_round_that_finished_no_task() -> None:
    """On a loaded machine a setup may finish no task in its round: the summary says n/a for
    its ratios instead of raising ZeroDivisionError."""
    floor = replicas.Run(replicas.Setup("floor"), "main", 0.0, 0, 0.0)
    one = replicas.Run(replicas.Setup("replicas", 1), "main", 100.0, 50, 1.0, 0.5)
    rows = {row["setup"]: row for row in replicas.summary([floor, one])}
    assert rows["postgres-1"]["× floor tasks/s"] == "n/a"
    assert rows["postgres-1"]["× floor CPU"] == "n/a"
    assert rows["postgres-1"]["tasks/s"] == "100"


def test_scaling() -> None:
    # In a process of its own: the benchmark collects garbage before each timed round, which
    # in this long-lived process (its heap grown by the suite's other tests) takes a second or
    # more each time (28 s in all in CI, against 2.5 s alone).
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=context) as pool:
        section = pool.submit(scaling.run, (100, 200), (10, 20), 20).result(timeout=300)
    _check(section, "scaling.tasks.largest")
    assert section.figures["scaling.tasks.largest"] == 200
    assert section.figures["scaling.partners.largest"] == 20
    assert section.figures["scaling.tasks200.new_seconds"] > 0
    assert section.figures["scaling.partners20.heartbeat_seconds"] > 0
    # A task's bytecodes, counted: hundreds at least (the request's whole path in Python).
    assert section.figures["scaling.tasks200.new_bytecodes"] > 300
    assert section.figures["scaling.partners20.heartbeat_bytecodes"] > 30


def test_bytecodes() -> None:
    rows = bytecodes.count(tasks=3)
    names = {where.rsplit(":", 1)[-1] for _, _, where in rows}
    # The request's head is read by the lean server, the signature by the HMAC helper.
    assert {"plain_callback_head", "hmac_signature"} <= names
    assert sum(n for n, _, _ in rows) > 1_000  # bytecodes per task
