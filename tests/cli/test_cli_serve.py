"""`synapse serve` as a process: first log line, signals, settings from everywhere, handlers."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import textwrap
from pathlib import Path

import pytest
from clikit import (
    EXECUTOR,
    REQUESTER,
    SECRET,
    client_args,
    error_lines,
    executor_args,
    free_port,
    no_traceback,
    run,
    run_here,
    serve,
    url,
)

from synapse.store import SqliteStore


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_listening_is_the_first_line_and_a_signal_exits_0(sig: signal.Signals) -> None:
    port = free_port()
    with serve(*executor_args(free_port()), port=port) as server:
        assert "listening" in server.lines[0]
        assert url(port) in server.lines[0]
        assert server.stop(sig) == 0
    log = "".join(server.lines)
    assert "shutting_down" in log and "stopped" in log
    assert "Traceback" not in log


def test_log_json_is_one_object_a_line_listening_first() -> None:
    requester_port = free_port()
    with serve(*executor_args(requester_port), "--log-json", "--log-level", "debug") as server:
        result = run("ping", *client_args(server, requester_port))
        assert result.returncode == 0, result.stderr
        assert server.stop() == 0
    events = [json.loads(line) for line in server.lines]
    assert events[0]["event"] == "listening"
    assert events[0]["url"] == server.url
    received = [e for e in events if e["event"] == "message_in"]
    assert [e["type"] for e in received] == ["p2p:heartbeat"]  # one line per message
    assert received[0]["sender"] == REQUESTER
    assert received[0]["level"] == "debug"


@pytest.mark.parametrize("where", ["default", "flag", "env", "config"])
def test_the_default_log_level_shows_a_task_once_with_its_outcome(
    where: str, tmp_path: Path
) -> None:
    """Info (the default): no line per message; one line a task, its last transition.
    `warning`, by flag, environment or config file, leaves `listening` only."""
    requester_port = free_port()
    extra: list[str] = []
    env: dict[str, str] = {}
    if where == "flag":
        extra = ["--log-level", "warning"]
    elif where == "env":
        env = {"SYNAPSE_LOG_LEVEL": "warning"}
    elif where == "config":
        (tmp_path / "serve.toml").write_text('log_level = "warning"\n')
        extra = ["--config", str(tmp_path / "serve.toml")]
    with serve(*executor_args(requester_port), "--log-json", *extra, env=env) as server:
        result = run("send", *client_args(server, requester_port), "echo", '{"text": "x"}')
        assert (result.returncode, result.stdout) == (0, "x\n"), result.stderr
        assert server.stop() == 0
    events = [json.loads(line) for line in server.lines]
    # The test passes --secret as a flag, which serve warns about (`ps` shows it): not a
    # message of the task.
    events = [e for e in events if e["event"] != "secret_on_command_line"]
    names = [e["event"] for e in events]
    assert names[0] == "listening"
    assert not {"message_in", "message_out", "reply_in", "post_attempt"} & set(names)
    transitions = [(e["from_state"], e["to_state"]) for e in events if e["event"] == "transition"]
    if where == "default":
        assert transitions == [("executing", "completed")]
        assert all(e["level"] == "info" for e in events)
    else:
        assert names == ["listening"]


def test_settings_from_the_environment() -> None:
    requester_port, port = free_port(), free_port()
    env = {
        "SYNAPSE_AGENT_ID": EXECUTOR,
        "SYNAPSE_PORT": str(port),
        "SYNAPSE_SECRET": SECRET,
        "SYNAPSE_PEERS": f"someone=http://127.0.0.1:1/x,{REQUESTER}={url(requester_port)}",
        # One default secret for two partners: accepted only when explicitly allowed.
        "SYNAPSE_ALLOW_SHARED_SECRET": "1",
    }
    with serve(port=port, env=env, port_flag=False) as server:
        assert url(port) in server.lines[0]
        result = run("send", *client_args(server, requester_port), "echo", '{"text": "env"}')
        assert (result.returncode, result.stdout) == (0, "env\n"), result.stderr


NEWEST, OLDER = "newest-secret-0123456789abcdefghij", "older-secret-0123456789abcdefghijk"


def test_settings_from_a_config_file_with_per_partner_secrets(tmp_path: Path) -> None:
    requester_port, port = free_port(), free_port()
    (tmp_path / "req.secrets").write_text(f"{NEWEST}\n{OLDER}\n")
    config = tmp_path / "exec.toml"
    config.write_text(
        textwrap.dedent(
            f"""
            agent_id = "{EXECUTOR}"
            secret = "the-default-secret-0123456789abcd"

            [serve]
            port = {port}

            [[peer]]
            agent_id = "{REQUESTER}"
            endpoint = "{url(requester_port)}"
            secret_file = "req.secrets"

            [p2p]
            max_concurrent_tasks = 7
            """
        )
    )
    with serve("--config", str(config), port=port, port_flag=False) as server:
        args = client_args(server, requester_port)
        # req signs with the older secret (its first): the executor accepts any of req's.
        (tmp_path / "exec.secrets").write_text(f"{OLDER}\n{NEWEST}\n")
        rotated = [*args, "--peer-secret-file", f"{EXECUTOR}={tmp_path / 'exec.secrets'}"]
        result = run("caps", *rotated)
        assert result.returncode == 0, result.stderr
        assert "at most 7 tasks at once" in result.stdout
        result = run("caps", *args)  # the default secret is not req's
        assert result.returncode == 2
        assert error_lines(result.stderr)[0].startswith("synapse: 403 permission_denied: ")


def test_a_flag_beats_the_environment() -> None:
    requester_port, port = free_port(), free_port()
    env = {"SYNAPSE_PORT": "1", "SYNAPSE_AGENT_ID": "not-this-one"}
    with serve(*executor_args(requester_port), port=port, env=env) as server:
        assert url(port) in server.lines[0]
        assert f"agent_id={EXECUTOR}" in server.lines[0]


HANDLER = """
from synapse.types import Capability


class Upper:
    def get_capabilities(self):
        return [Capability(name="upper", description="uppercases text", version="2.0")]

    def validate_task(self, task_type, payload):
        return [], True

    async def execute_task(self, ctx, task_type, payload):
        return payload["text"].upper()
"""


def test_handler_names_another_task_handler(tmp_path: Path) -> None:
    (tmp_path / "myhandler.py").write_text(HANDLER)
    requester_port = free_port()
    with serve(
        *executor_args(requester_port, "--handler", "myhandler:Upper"), cwd=str(tmp_path)
    ) as server:
        result = run("send", *client_args(server, requester_port), "upper", '{"text": "abc"}')
        assert (result.returncode, result.stdout) == (0, "ABC\n"), result.stderr
        caps = run("caps", *client_args(server, requester_port), "--json")
        assert [c["name"] for c in json.loads(caps.stdout)["capabilities"]] == ["upper"]


@pytest.mark.parametrize(
    ("handler", "message"),
    [
        ("nomodule_here:Thing", "cannot import handler module 'nomodule_here'"),
        ("json:NoSuchThing", "handler 'json:NoSuchThing': json has no 'NoSuchThing'"),
        ("json:dumps", "handler 'json:dumps' is not a TaskHandler"),
        ("json", "bad --handler 'json': expected MODULE:ATTR"),
    ],
)
def test_a_bad_handler_is_one_line(handler: str, message: str) -> None:
    status, _out, err = run_here("serve", "--port", "0", *executor_args(1), "--handler", handler)
    assert status == 2
    [line] = err.splitlines()
    assert line.startswith(f"synapse: {message}"), line


def test_store_path_keeps_tasks_in_sqlite(tmp_path: Path) -> None:
    requester_port = free_port()
    db = tmp_path / "exec.sqlite"
    with serve(*executor_args(requester_port, "--store", str(db))) as server:
        result = run(
            "send", *client_args(server, requester_port), "--task-id", "kept", "echo", "{}"
        )
        assert result.returncode == 1  # echo needs `text`: rejected, which is a task too
        assert server.stop() == 0
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT task_id, state FROM tasks").fetchall()
    assert rows == [("kept", "rejected")]


def test_port_in_use_is_one_line() -> None:
    requester_port = free_port()
    with serve(*executor_args(requester_port)) as server:
        result = run("serve", "--port", str(server.port), *executor_args(requester_port))
        no_traceback(result)
        assert result.returncode == 2
        assert error_lines(result.stderr) == [
            f"synapse: cannot listen on 127.0.0.1:{server.port}: address already in use"
        ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--port", "0", "--secret", "s" * 32, "--peer", "r=http://h/"], "missing --agent-id"),
        (["--agent-id", "e", "--secret", "s" * 32, "--peer", "r=http://h/"], "missing --port"),
        (["--agent-id", "e", "--port", "0", "--secret", "s" * 32], "no partner"),
        (["--agent-id", "e", "--port", "0", "--peer", "r=http://h/"], "no secret for partner"),
        (["--agent-id", "e", "--port", "0", "--secret", "s" * 32, "--peer", "r"], "bad --peer 'r'"),
        (["--agent-id", "e", "--port", "x"], "argument --port: not a port number"),
    ],
)
def test_serve_usage_errors(args: list[str], message: str) -> None:
    status, _out, err = run_here("serve", *args)
    assert status == 2
    [line] = err.splitlines()
    assert line.startswith(f"synapse: {message}"), line


def test_synapse_serve_on_a_store_another_process_serves_says_who_and_exits_2(
    tmp_path: Path,
) -> None:
    path = tmp_path / "agent.db"
    held = SqliteStore(path)
    held.hold()
    status, _out, err = run_here(
        "serve", *executor_args(free_port(), "--port", str(free_port()), "--store", str(path))
    )
    assert status == 2
    assert "cannot serve the store" in err
    assert f"served by another process (process {os.getpid()} on " in err
    assert "Traceback" not in err
