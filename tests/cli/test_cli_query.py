"""`synapse caps`, `synapse ping` and `synapse schema`."""

from __future__ import annotations

import json
from pathlib import Path

from clikit import Server, client_args, error_lines, no_traceback, run, run_here

DEMO_TYPES = ["echo", "slow", "text_generation", "portrait", "fail"]


def test_caps_prints_a_table(executor: Server, requester_port: int) -> None:
    result = run("caps", *client_args(executor, requester_port))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["NAME", "VERSION", "DESCRIPTION"]
    assert [line.split()[0] for line in lines[1:6]] == DEMO_TYPES
    assert lines[1].split()[:2] == ["echo", "1.0"]
    assert lines[-1] == "exec: 5 capabilities, at most 100 tasks at once"


def test_caps_json_and_task_type_filter(executor: Server, requester_port: int) -> None:
    result = run(
        "caps", *client_args(executor, requester_port), "--json", "--task-type", "portrait"
    )
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer["agent_id"] == "exec"
    assert [c["name"] for c in answer["capabilities"]] == ["portrait"]
    assert answer["capabilities"][0]["input_schema"]["required"] == ["subject"]


def test_caps_needs_no_listening_port(executor: Server, requester_port: int) -> None:
    # Only the callback URL matters (the executor checks `from.endpoint`), not a socket.
    args = client_args(executor, requester_port)
    at = args.index("--listen")
    endpoint = f"http://127.0.0.1:{requester_port}/synapse/callback"
    result = run("caps", *args[:at], "--endpoint", endpoint, "--json")
    assert result.returncode == 0, result.stderr
    assert len(json.loads(result.stdout)["capabilities"]) == 5


def test_ping_prints_status_and_round_trip(executor: Server, requester_port: int) -> None:
    result = run("ping", *client_args(executor, requester_port))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("exec: ok, 0 active tasks with us, round trip ")
    assert result.stdout.endswith(" ms\n")
    result = run("ping", *client_args(executor, requester_port), "--json")
    answer = json.loads(result.stdout)
    assert answer["status"] == "ok" and answer["active_tasks"] == 0
    assert answer["rtt_ms"] > 0


def test_ping_with_the_wrong_secret(executor: Server, requester_port: int) -> None:
    result = run(
        "ping", *client_args(executor, requester_port, secret="nope-secret-0123456789abcdefghijk")
    )
    no_traceback(result)
    assert result.returncode == 2
    [line] = error_lines(result.stderr)
    assert line.startswith("synapse: 403 permission_denied: ")


def test_schema_prints_the_union() -> None:
    result = run("schema")
    assert result.returncode == 0
    schema = json.loads(result.stdout)
    assert schema["title"] == "Synapse P2P message"
    assert len(schema["anyOf"]) == 17


def test_schema_of_one_type() -> None:
    for name in ("task_request", "p2p:task_request"):
        status, out, _err = run_here("schema", name)
        assert status == 0
        assert json.loads(out)["title"] == "p2p:task_request"
    status, _out, err = run_here("schema", "task_teleport")
    assert status == 2
    assert err.startswith("synapse: unknown message type 'task_teleport' (one of: task_request,")


def test_schema_out_writes_every_file(tmp_path: Path) -> None:
    out = tmp_path / "schemas"
    result = run("schema", "--out", str(out))
    assert result.returncode == 0, result.stderr
    files = sorted(p.name for p in out.iterdir())
    assert len(files) == 18 and "message.json" in files and "task_cancel.json" in files
    assert json.loads((out / "heartbeat.json").read_text())["title"] == "p2p:heartbeat"
