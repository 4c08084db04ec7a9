"""benchmarks/codec.py keeps running (a smoke run; timings are printed, never asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_codec_benchmark_runs_briefly() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.codec", "--seconds", "0.2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "µs/op" in lines[0]
    for operation in ("decode_message", "decode_typed", "parse_i_json", "encode_message"):
        assert sum(operation in line for line in lines) == 2
