"""CI: the kit against our own `synapse serve`, a real process started from the command line."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from benchmarks.ports import free_port
from synapse.conformance import DEFAULT_KIT_ID, run_conformance

AGENT_ID = "agent-serve"
SECRET = "conformance-serve-secret-0123456"
READY_TIMEOUT = 30.0


@asynccontextmanager
async def serve(store: str, kit_port: int) -> AsyncIterator[str]:
    """`synapse serve` with the demo handler, knowing the kit at `kit_port`; yields its URL."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "synapse.cli.main",
        "serve",
        "--agent-id",
        AGENT_ID,
        "--port",
        "0",
        "--secret",
        SECRET,
        "--peer",
        f"{DEFAULT_KIT_ID}=http://127.0.0.1:{kit_port}/synapse/callback",
        "--store",
        store,
        "--log-json",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stderr is not None
    lines: list[str] = []
    listening: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def drain(stream: asyncio.StreamReader) -> None:
        # Read every log line, so that a full pipe never blocks the server.
        async for raw in stream:
            line = raw.decode("utf-8", "replace")
            lines.append(line)
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if event.get("event") == "listening" and not listening.done():
                    listening.set_result(str(event["url"]))
        if not listening.done():
            listening.set_exception(RuntimeError("synapse serve exited:\n" + "".join(lines)))

    reader = asyncio.create_task(drain(process.stderr))
    try:
        url = await asyncio.wait_for(listening, READY_TIMEOUT)
        yield url
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), 15)
            except TimeoutError:
                process.kill()
                await process.wait()
        await asyncio.wait_for(reader, 5)


async def test_the_kit_passes_against_synapse_serve_with_a_sqlite_store(tmp_path: Path) -> None:
    kit_port = free_port()
    async with serve(str(tmp_path / "serve.db"), kit_port) as url:
        report = await run_conformance(url, AGENT_ID, SECRET, listen=f"127.0.0.1:{kit_port}")
    assert report.ok, report.table()
    assert report.duration < 30, report.duration


async def test_the_conformance_command_passes_against_synapse_serve() -> None:
    kit_port = free_port()
    async with serve("memory", kit_port) as url:
        done = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "synapse.conformance",
            "--target",
            url,
            "--agent-id",
            AGENT_ID,
            "--secret",
            SECRET,
            "--listen",
            f"127.0.0.1:{kit_port}",
            "--json",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(done.communicate(), 60)
    report: dict[str, Any] = json.loads(out)
    failed = [r for r in report["results"] if r["status"] != "PASS"]
    assert done.returncode == 0, (failed, err.decode())
    assert report["ok"] is True and not failed
