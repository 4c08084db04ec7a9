"""`synapse serve`: /healthz, /readyz and /metrics always; `--console` with its tokens."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from typing import Any

from clikit import (
    EXECUTOR,
    REQUESTER,
    SECRET,
    Server,
    error_lines,
    executor_args,
    free_port,
    no_traceback,
    run,
    serve,
    url,
)
from prometheus_client.parser import text_string_to_metric_families

TOKEN = "console-token-of-alice-0123456789"
TIMEOUT = 10.0


def base(server: Server) -> str:
    return f"http://127.0.0.1:{server.port}"


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def logged(server: Server, event: str) -> dict[str, Any]:
    """The first log line of `event` (key=value pairs), once the server wrote it."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        for line in list(server.lines):
            if f" {event} " in line:
                return dict(re.findall(r"(\w+)=(\S+)", line))
        time.sleep(0.02)  # the log arrives on another thread; poll it, bounded
    raise AssertionError(f"no {event} in {server.lines}")


def test_serve_answers_health_readiness_and_metrics() -> None:
    with serve(*executor_args(free_port())) as server:
        assert get(base(server) + "/healthz") == (200, '{"status": "alive"}')
        status, body = get(base(server) + "/readyz")
        assert status == 200 and json.loads(body)["status"] == "ready"
        status, text = get(base(server) + "/metrics")
        assert status == 200
        names = {family.name for family in text_string_to_metric_families(text)}
        assert {"synapse_tasks", "synapse_outbox_messages", "synapse_partner_reachable"} <= names
        assert get(base(server) + "/console")[0] == 404  # no console without --console
        assert server.stop() == 0


def test_serve_console_with_a_token() -> None:
    with serve(*executor_args(free_port()), "--console", "--console-token", f"{TOKEN}=alice") as s:
        line = logged(s, "serving_console")
        assert line["url"] == base(s) + "/console"
        assert "token" not in line  # given tokens are never logged
        status, page = get(base(s) + "/console")
        assert status == 200 and "signin-form" in page
        assert get(base(s) + "/console/api/session")[0] == 401
        status, body = get(base(s) + "/console/api/session", {"Authorization": f"Bearer {TOKEN}"})
        assert status == 200 and json.loads(body)["reviewer"]["user_id"] == "alice"
        assert s.stop() == 0


def test_serve_console_without_a_token_logs_a_random_one() -> None:
    with serve(*executor_args(free_port()), "--console") as s:
        token = logged(s, "serving_console")["token"]
        assert len(token) >= 16
        status, body = get(base(s) + "/console/api/session", {"Authorization": f"Bearer {token}"})
        assert status == 200 and json.loads(body)["reviewer"]["user_id"] == "operator"
        assert s.stop() == 0


def test_console_token_needs_console() -> None:
    result = run("serve", "--port", "0", *executor_args(free_port()), "--console-token", TOKEN)
    no_traceback(result)
    assert result.returncode == 2, result.stderr
    assert error_lines(result.stderr) == ["synapse: --console-token needs --console"]


def api(server: Server, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        base(server) + "/console/api" + path,
        data=data,
        method=method,
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def wait_state(server: Server, task_id: str, states: set[str]) -> dict[str, Any]:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        status, task = api(server, "GET", f"/tasks/{REQUESTER}/{task_id}")
        if status == 200 and task["state"] in states:
            return dict(task)
        time.sleep(0.05)  # another process's state: poll it, bounded
    raise AssertionError(f"{task_id} never reached {states}")


def test_demo_flows_end_to_end_between_two_serve_processes() -> None:
    """`portrait` and `text_generation` answered through the console of the requester's
    `synapse serve`, the executor another `synapse serve` (the demo handler)."""
    r_port, e_port = free_port(), free_port()
    requester = [
        "--agent-id", REQUESTER, "--secret", SECRET, "--peer", f"{EXECUTOR}={url(e_port)}",
        "--console", "--console-token", f"{TOKEN}=alice",
    ]  # fmt: skip
    with serve(*executor_args(r_port), port=e_port), serve(*requester, port=r_port) as r:
        portrait = {"partner": EXECUTOR, "task_type": "portrait", "payload": {"subject": "Ada"}}
        status, task = api(r, "POST", "/tasks", portrait)
        assert status == 200, task
        task = wait_state(r, task["task_id"], {"need_human"})
        assert task["need_human"]["options"][0]["field"] == "authorized"
        approve = {"action": "approve", "approved_fields": {"authorized": True}}
        status, _ = api(r, "POST", f"/tasks/{task['task_id']}/decision", approve)
        assert status == 200
        done = wait_state(r, task["task_id"], {"completed", "failed"})
        assert done["state"] == "completed"
        assert done["result"]["metadata"] == {"approved_fields": {"authorized": True}}
        assert [(a["actor"], a["action"]) for a in done["audit"]] == [("alice", "approve")]

        writing = {"partner": EXECUTOR, "task_type": "text_generation", "payload": {"prompt": "春"}}
        status, task = api(r, "POST", "/tasks", writing)
        task = wait_state(r, task["task_id"], {"info_needed"})
        assert task["need_info"]["missing_fields"][0]["alternatives"] == ["现代", "浪漫"]
        status, _ = api(r, "POST", f"/tasks/{task['task_id']}/info", {"fields": {"style": "古典"}})
        assert status == 200
        done = wait_state(r, task["task_id"], {"completed", "failed"})
        assert done["result"]["output"] == "“春”, written in the 古典 style"
