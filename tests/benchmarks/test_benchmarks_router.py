"""`python -m benchmarks.router` runs (a smoke run: a few tasks, both paths)."""

from __future__ import annotations

import structlog

from benchmarks import router


def test_the_router_benchmark_runs(capsys: object) -> None:
    saved = structlog.get_config()
    try:
        assert router.main(["--tasks", "10", "--concurrency", "2"]) == 0
    finally:
        structlog.configure(**saved)
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    assert "direct to the spoke" in out and "through the hub" in out
    assert "CPU per routed task" in out
