"""`synapse conformance` as a command: flags, environment, output, exit status."""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
from typing import Any

import pytest
from brokenpeers import KIT_ID, SECRET, TARGET_ID, DemoPeer

from benchmarks.ports import free_port
from synapse.conformance import CHECKS, cli


def report_of(out: str) -> dict[str, Any]:
    """The JSON report in `out` (the in-process target may have logged lines before it)."""
    start = out.index("{\n")
    report: dict[str, Any] = json.loads(out[start:])
    return report


async def test_the_command_checks_a_running_peer(capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    async with DemoPeer() as peer:
        peer.register_kit(f"http://127.0.0.1:{port}/synapse/callback")
        argv = [
            "--target",
            peer.endpoint,
            "--agent-id",
            TARGET_ID,
            "--secret",
            SECRET,
            "--as",
            KIT_ID,
            "--listen",
            f"127.0.0.1:{port}",
            "--only",
            "flow.echo",
            "--only",
            "error.*",
        ]
        code = await asyncio.to_thread(cli.main, argv)
        out = capsys.readouterr().out
        assert code == 0, out
        assert "flow.echo" in out and "error.not_json" in out and "CONFORMANT" in out

        code = await asyncio.to_thread(cli.main, [*argv, "--json"])
        report = report_of(capsys.readouterr().out)
        assert code == 0
        assert report["ok"] is True
        assert report["callback_url"] == f"http://127.0.0.1:{port}/synapse/callback"
        assert {r["status"] for r in report["results"]} == {"PASS"}


async def test_settings_come_from_the_environment_and_failures_exit_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    async with DemoPeer() as peer:
        peer.register_kit(f"http://127.0.0.1:{port}/synapse/callback")
        monkeypatch.setenv("SYNAPSE_TARGET", peer.endpoint)
        monkeypatch.setenv("SYNAPSE_AGENT_ID", TARGET_ID)
        monkeypatch.setenv("SYNAPSE_SECRET", "not-the-secret")
        monkeypatch.setenv("SYNAPSE_AS", KIT_ID)
        monkeypatch.setenv("SYNAPSE_LISTEN", f"127.0.0.1:{port}")
        code = await asyncio.to_thread(cli.main, ["--only", "heartbeat", "--json"])
        report = report_of(capsys.readouterr().out)
        assert code == 1
        assert report["ok"] is False
        setup = report["results"][0]
        assert setup["status"] == "FAIL"
        assert "does not share the secret" in setup["reason"]
        # A flag wins over its variable.
        code = await asyncio.to_thread(cli.main, ["--only", "heartbeat", "--secret", SECRET])
        assert code == 0, capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "missing --target, --agent-id, --secret"),
        (["--target", "http://x/", "--agent-id", "a"], "missing --secret"),
        (["--target", "x", "--agent-id", "a", "--secret", "s" * 32], "http(s) URL"),
        (
            ["--target", "http://x/", "--agent-id", "a", "--secret", "s" * 32, "--listen", "8766"],
            "HOST:PORT",
        ),
    ],
)
def test_usage_errors_exit_2_on_one_line(
    argv: list[str],
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name in ("TARGET", "AGENT_ID", "SECRET", "AS", "LISTEN"):
        monkeypatch.delenv(f"SYNAPSE_{name}", raising=False)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_list_prints_every_check(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out] == [c.id for c in CHECKS]


def test_add_parser_hooks_into_a_parent_command() -> None:
    parser = argparse.ArgumentParser(prog="synapse")
    cli.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        ["conformance", "--target", "http://h/", "--as", "me", "--json", "--endpoint", "http://e/"]
    )
    assert args.func is cli.run
    assert (args.target, args.as_agent, args.json, args.listen) == ("http://h/", "me", True, None)
    assert args.endpoint == "http://e/"


def test_python_dash_m_runs_the_command() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "synapse.conformance", "--list"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "flow.need_info" in done.stdout
