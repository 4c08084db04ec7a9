"""`synapse mcp` ends cleanly: exit status 0 when its MCP client closes stdio, and on SIGINT or
SIGTERM over stdio and over HTTP (after closing its partners); a usage error is status 2."""

from __future__ import annotations

import select
import signal
import subprocess
import time

import pytest
from clikit import clean_env, command, free_port, run

AGENT = f"painter=http://127.0.0.1:{free_port()}"


def start(*extra: str) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        command("mcp", "--a2a-agent", AGENT, *extra),
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )
    assert process.stderr is not None
    ready, _, _ = select.select([process.stderr], [], [], 30)
    assert ready, "synapse mcp said nothing"
    assert "serving MCP" in process.stderr.readline()
    return process


def test_the_client_closing_stdio_ends_it() -> None:
    process = start()
    assert process.stdin is not None
    process.stdin.close()
    assert process.wait(15) == 0


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("http", [False, True], ids=["stdio", "http"])
def test_a_signal_ends_it_cleanly(signum: signal.Signals, http: bool) -> None:
    process = start(*(["--http", "127.0.0.1:0"] if http else []))
    started = time.monotonic()
    process.send_signal(signum)
    assert process.wait(15) == 0
    assert time.monotonic() - started < 10


def test_usage_errors_are_one_line() -> None:
    nothing = run("mcp")
    assert nothing.returncode == 2 and "no partners" in nothing.stderr
    no_listen = run(
        "mcp",
        "--peer",
        "exec=http://127.0.0.1:9/synapse/callback",
        "--secret",
        "x" * 32,
        "--as",
        "me",
    )
    assert no_listen.returncode == 2 and "--listen" in no_listen.stderr
    token_on_stdio = run("mcp", "--a2a-agent", AGENT, "--mcp-token", "t" * 20)
    assert token_on_stdio.returncode == 2 and "--http" in token_on_stdio.stderr
