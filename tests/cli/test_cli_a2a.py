"""`synapse serve --a2a` and `synapse send --a2a-agent URL`, each a subprocess on 127.0.0.1.

The server is checked with plain HTTP (card, JSON-RPC `SendMessage` with the headers of
docs/a2a.md); `send --a2a-agent` holds the same conversation as `send` with a Synapse peer.
"""

from __future__ import annotations

import asyncio
import importlib.util
import io
import json
import os
import select
import signal
import subprocess
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from clikit import (
    EXECUTOR,
    SECRET,
    Server,
    clean_env,
    command,
    error_lines,
    free_port,
    no_traceback,
    run,
    run_here,
    serve,
)

from synapse.a2a import wire
from synapse.cli.conversation import SendOptions
from synapse.cli.parsers import parse_a2a_token
from synapse.cli.send_a2a import A2AFollower
from synapse.cli.serve import A2AOptions, anonymous_a2a
from synapse.cli.terminal import LineReader, TerminalConsole

TOKEN = "tok-for-cli-tests"


@pytest.fixture(scope="module")
def agent() -> Iterator[Server]:
    """`synapse serve --a2a` with the demo handler and no Synapse partner at all."""
    with serve("--agent-id", EXECUTOR, "--a2a") as server:
        yield server


def base(server: Server) -> str:
    return f"http://127.0.0.1:{server.port}"


def send(server: Server, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    result = run("send", "--a2a-agent", base(server), *args, input=input)
    no_traceback(result)
    return result


async def rpc(
    server: Server, method: str, params: Any, headers: dict[str, str] | None = None
) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": "cli-1", "method": method, "params": params}
    sent = {"Content-Type": "application/json", "A2A-Version": "1.0", **(headers or {})}
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{base(server)}/a2a", json=body, headers=sent, timeout=aiohttp.ClientTimeout(10)
        ) as response,
    ):
        assert response.status == 200
        answer: dict[str, Any] = await response.json()
        return answer


def echo_message(text: str) -> dict[str, Any]:
    return {
        "message": {
            "messageId": f"m-{time.monotonic_ns()}",
            "role": "ROLE_USER",
            "parts": [{"data": {"text": text}}],
            "metadata": {"task_type": "echo"},
        }
    }


# --- serve --a2a ---------------------------------------------------------------------------------


def logged(server: Server, text: str, timeout: float = 5.0) -> str:
    """The first log line of `server` holding `text` (lines after the first come later)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [line for line in list(server.lines) if text in line]
        if found:
            return found[0]
        time.sleep(0.02)
    raise AssertionError(f"no {text!r} in the log: {server.lines}")


async def test_serve_a2a_serves_the_card_and_json_rpc(agent: Server) -> None:
    line = logged(agent, "serving_a2a")
    assert f"url={base(agent)}/a2a" in line
    assert f"card={base(agent)}/.well-known/agent-card.json" in line
    card_url = f"{base(agent)}/.well-known/agent-card.json"
    async with aiohttp.ClientSession() as session, session.get(card_url) as response:
        assert response.status == 200
        card = await response.json()
    assert card["name"] == EXECUTOR
    assert [(i["protocolBinding"], i["url"]) for i in card["supportedInterfaces"]] == [
        ("JSONRPC", f"{base(agent)}/a2a"),
        ("HTTP+JSON", f"{base(agent)}/a2a"),
    ]
    assert card["supportedInterfaces"][0]["protocolVersion"] == "1.0"
    assert card["capabilities"]["streaming"] is True
    assert not card["capabilities"].get("pushNotifications")  # no --a2a-push-allow
    assert "securitySchemes" not in card  # no --a2a-token
    skills = {s["id"] for s in card["skills"]}
    assert {"echo", "slow", "text_generation", "portrait", "fail"} <= skills

    answer = await rpc(agent, "SendMessage", echo_message("hello over A2A"))
    task = answer["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    assert [p["text"] for a in task["artifacts"] for p in a["parts"]] == ["hello over A2A"]
    assert task["metadata"]["taskType"] == "echo"

    answer = await rpc(agent, "SendMessage", echo_message("x"), {"A2A-Version": "0.3"})
    assert answer["error"]["code"] == -32009  # never a silent downgrade


def test_serve_a2a_settings_from_a_config_file(tmp_path: Path) -> None:
    """Tokens and push prefixes from the file; send's token from the environment."""
    port = free_port()
    config = tmp_path / "agent.toml"
    config.write_text(
        textwrap.dedent(
            f"""
            agent_id = "{EXECUTOR}"
            secret = "{SECRET}"

            [serve]
            port = {port}
            a2a = true
            a2a_tokens = ["{TOKEN}=alice"]
            a2a_tenants = ["alice=acme"]
            a2a_push_disable_after = 5
            a2a_push_allow = ["http://127.0.0.1:9/hooks/"]
            a2a_default_task_type = "slow"
            """
        )
    )
    with serve("--config", str(config), port=port, port_flag=False) as server:
        card = json.loads(run_card(server))
        assert card["capabilities"]["pushNotifications"] is True
        assert "bearer" in card["securitySchemes"]
        extension = card["capabilities"]["extensions"][0]["params"]
        assert extension["defaultTaskType"] == "slow"

        result = send(server, "echo", '{"text": "no token"}')
        assert result.returncode == 2
        [line] = error_lines(result.stderr)
        assert line.startswith("synapse: -32106 UNAUTHENTICATED: "), line

        result = run(
            "send",
            "--a2a",
            base(server),
            "echo",
            '{"text": "with a token"}',
            env={"SYNAPSE_A2A_TOKEN": TOKEN},
        )
        assert (result.returncode, result.stdout) == (0, "with a token\n"), result.stderr
        assert "principals=['alice']" in logged(server, "serving_a2a")
        # alice may name tenant acme, and no other.
        assert rest_status(server, "/acme/tasks") == 200
        assert rest_status(server, "/globex/tasks") == 403


def rest_status(server: Server, path: str) -> int:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        f"{base(server)}/a2a{path}",
        headers={"Authorization": f"Bearer {TOKEN}", "A2A-Version": "1.0"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def run_card(server: Server) -> str:
    import urllib.request

    with urllib.request.urlopen(f"{base(server)}/.well-known/agent-card.json", timeout=10) as r:
        text: str = r.read().decode()
        return text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--a2a-token", "t"], "--a2a-token needs --a2a"),
        (["--a2a-tenant", "alice=acme"], "--a2a-tenant needs --a2a"),
        (["--a2a", "--a2a-push-disable-after", "0"], "argument --a2a-push-disable-after: not a"),
        (["--a2a-push-allow", "http://h/"], "--a2a-push-allow needs --a2a"),
        (["--a2a", "--a2a-push-allow", "http://h/"], "--a2a-push-allow needs --secret"),
        (
            ["--a2a", "--a2a-push-allow", "ftp://h/"],
            "argument --a2a-push-allow: push allowlist entry 'ftp://h/' is not an http(s)",
        ),
        ([], "no partner: give at least one --peer"),
        (["--a2a-extension", "https://x.example/e/v1"], "--a2a-extension needs --a2a"),
        (
            ["--a2a", "--a2a-extension", "not a uri"],
            "argument --a2a-extension: not an extension URI",
        ),
        (
            [
                "--a2a",
                "--a2a-extension",
                "https://x/v1",
                "--a2a-required-extension",
                "https://x/v1",
            ],
            "https://x/v1 is given as optional and as required",
        ),
    ],
)
def test_serve_a2a_usage_errors(args: list[str], message: str) -> None:
    status, _out, err = run_here("serve", "--agent-id", "e", "--port", "0", *args)
    assert status == 2
    [line] = err.splitlines()
    assert line.startswith(f"synapse: {message}"), line


@pytest.mark.parametrize(
    ("text", "token", "name"),
    [
        ("s3cret=alice", "s3cret", "alice"),
        ("YWJjZA==", "YWJjZA==", None),  # base64 padding stays in the token
        ("YWJjZA===bob", "YWJjZA==", "bob"),
        ("plain", "plain", None),
    ],
)
def test_a2a_token_names(text: str, token: str, name: str | None) -> None:
    got_token, got_name = parse_a2a_token(text)
    assert got_token == token
    if name is None:  # stable, and not the token itself
        assert got_name == parse_a2a_token(token)[1] and got_name.startswith("token-")
        assert token not in got_name
    else:
        assert got_name == name


# --- send --a2a-agent -----------------------------------------------------------------------------


def test_send_a2a_echo_completes(agent: Server) -> None:
    result = send(agent, "echo", '{"text": "hello, A2A"}')
    assert (result.returncode, result.stdout) == (0, "hello, A2A\n"), result.stderr
    assert "(A2A, JSONRPC)" in result.stderr and "✓ completed" in result.stderr


GRPC_PRESENT = importlib.util.find_spec("grpc") is not None
BINDINGS = ["JSONRPC", "HTTP+JSON"] + (["GRPC"] if GRPC_PRESENT else [])


@pytest.fixture(scope="module")
def every_binding() -> Iterator[Server]:
    """`synapse serve --a2a` with gRPC too, its card preferring gRPC (REST without it)."""
    order = "GRPC,REST,JSONRPC" if GRPC_PRESENT else "REST,JSONRPC"
    grpc = ["--a2a-grpc-port", "0"] if GRPC_PRESENT else []
    with serve("--agent-id", EXECUTOR, "--a2a", "--a2a-bindings", order, *grpc) as server:
        yield server


def test_send_a2a_follows_the_cards_order(every_binding: Server) -> None:
    line = logged(every_binding, "serving_a2a")
    assert ("GRPC" in line) == GRPC_PRESENT
    result = send(every_binding, "echo", '{"text": "by preference"}')
    assert (result.returncode, result.stdout) == (0, "by preference\n"), result.stderr
    assert f"(A2A, {BINDINGS[-1]})" in result.stderr


@pytest.mark.parametrize("binding", BINDINGS)
def test_send_a2a_over_each_binding(every_binding: Server, binding: str) -> None:
    """Every flow of `send --a2a-agent` over each binding: a result, a question, a decision."""
    result = send(every_binding, "--a2a-binding", binding, "echo", '{"text": "hi"}')
    assert (result.returncode, result.stdout) == (0, "hi\n"), result.stderr
    assert f"(A2A, {binding})" in result.stderr
    result = send(
        every_binding,
        "--a2a-binding",
        binding,
        "--field",
        "style=modern",
        "text_generation",
        '{"prompt": "spring"}',
    )
    assert (result.returncode, result.stdout) == (0, "“spring”, written in the modern style\n"), (
        result.stderr
    )
    result = send(
        every_binding,
        "--a2a-binding",
        binding,
        "--approve",
        "portrait",
        '{"subject": "Ada"}',
    )
    assert result.returncode == 0, result.stderr


def test_send_a2a_need_info_answered_with_field(agent: Server) -> None:
    result = send(agent, "--field", "style=modern", "text_generation", '{"prompt": "spring"}')
    assert (result.returncode, result.stdout) == (0, "“spring”, written in the modern style\n"), (
        result.stderr
    )
    assert "Which style" not in result.stderr  # nothing was asked
    assert '→ provided style="modern"' in result.stderr


def test_send_a2a_need_info_answered_through_stdin(agent: Server) -> None:
    result = send(agent, "text_generation", '{"prompt": "p"}', input="浪漫\n")
    assert (result.returncode, result.stdout) == (0, "“p”, written in the 浪漫 style\n"), (
        result.stderr
    )
    assert (
        "Which style should the text be written in?" in result.stderr and "[古典]" in result.stderr
    )


def test_send_a2a_need_human_rejected_fails(agent: Server) -> None:
    result = send(agent, "--reject", "--notes", "no consent", "portrait", '{"subject": "Ada"}')
    assert (result.returncode, result.stdout) == (1, ""), result.stderr
    assert "[ethical_decision] An ethical decision needs a person's review" in result.stderr
    assert error_lines(result.stderr) == ["synapse: failed: permission_denied: no consent"]


def test_send_a2a_need_human_approved_through_stdin(agent: Server) -> None:
    result = send(agent, "portrait", '{"subject": "Ada"}', input="a\n\n")
    assert (result.returncode, result.stdout) == (0, "portrait of Ada\n"), result.stderr
    assert "approve or reject? [a/r]:" in result.stderr


def test_send_a2a_unknown_task_type_is_rejected(agent: Server) -> None:
    result = send(agent, "translate", '{"text": "hi"}')
    assert result.returncode == 1
    assert error_lines(result.stderr) == [
        "synapse: rejected: capability_lacking: task type 'translate' is not offered"
    ]


def test_send_a2a_json(agent: Server) -> None:
    result = send(agent, "--json", "--field", "style=modern", "text_generation", '{"prompt": "p"}')
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines()]
    kinds = [e["event"] for e in events]
    assert kinds[0] == "submitted" and kinds[-1] == "outcome"
    assert "info_provided" in kinds
    asked = next(e for e in events if e.get("state") == "TASK_STATE_INPUT_REQUIRED")
    assert asked["data"]["missing_fields"][0]["field"] == "style"
    assert events[-1] == {
        "event": "outcome",
        "state": "completed",
        "a2a_state": "TASK_STATE_COMPLETED",
        "result": {
            "output_type": "text",
            "output": "“p”, written in the modern style",
            "metadata": {"prompt": "p", "style": "modern"},
        },
    }
    assert result.stderr == ""


def test_send_a2a_ctrl_c_cancels_the_task(agent: Server) -> None:
    process = subprocess.Popen(
        command("send", "--a2a-agent", base(agent), "slow", '{"steps": 100, "delay": 0.1}'),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )
    try:
        assert process.stderr is not None
        seen = ""
        deadline = time.monotonic() + 20
        while "progress" not in seen and time.monotonic() < deadline:
            if select.select([process.stderr], [], [], 0.2)[0]:
                seen += process.stderr.readline()
        assert "progress" in seen, seen
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(5)
    assert process.returncode == 1, seen + err
    assert "cancelling" in err
    assert error_lines(err) == ["synapse: cancelled"]
    assert out == ""


def test_send_a2a_unreachable_agent_is_one_line() -> None:
    result = run("send", "--a2a-agent", f"http://127.0.0.1:{free_port()}", "echo", '{"text": "x"}')
    no_traceback(result)
    assert result.returncode == 2
    [line] = error_lines(result.stderr)
    assert line.startswith("synapse: cannot reach the A2A agent at http://127.0.0.1:"), line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--target", "http://h/"], "--target does not apply to --a2a-agent"),
        (["--as", "me"], "--as does not apply to --a2a-agent"),
        (["--listen", "127.0.0.1:1"], "--listen does not apply to --a2a-agent"),
        (["--task-id", "t"], "--task-id does not apply to --a2a-agent"),
        (["--priority", "high"], "--priority does not apply to --a2a-agent"),
    ],
)
def test_send_a2a_refuses_synapse_flags(args: list[str], message: str) -> None:
    status, _out, err = run_here("send", "--a2a-agent", "http://127.0.0.1:1", *args, "echo")
    assert status == 2
    [line] = err.splitlines()
    assert line.startswith(f"synapse: {message}"), line


def test_send_a2a_token_without_a2a_is_an_error() -> None:
    status, _out, err = run_here("send", "--a2a-token", "t", "echo")
    assert status == 2
    assert err == "synapse: --a2a-token needs --a2a-agent URL\n"


def test_send_names_the_a2a_agent_with_its_own_flag() -> None:
    """`--a2a` is a switch in `serve`; `send` names the agent with `--a2a-agent URL`, and its
    first spelling `send --a2a URL` still works for scripts, unlisted."""
    for flag in ("--a2a-agent", "--a2a"):
        status, _out, err = run_here("send", flag, "http://127.0.0.1:1", "echo", "{}")
        assert status == 2
        assert err.startswith("synapse: cannot reach the A2A agent at http://127.0.0.1:1"), err
    shown = run("send", "--help")
    assert shown.returncode == 0
    assert "--a2a-agent URL" in shown.stdout
    assert "--a2a URL" not in shown.stdout


# --- another agent's INPUT_REQUIRED (no synapse_needs): in-process, with a stand-in handle ----


class StandIn:
    """What `A2AFollower.input_required` uses of an `A2ATaskHandle`, recording the replies."""

    task_id = "t-1"

    def __init__(self, question: str) -> None:
        self.status_message = wire.Message(
            message_id=f"q-{time.monotonic_ns()}",
            role=wire.ROLE_AGENT,
            parts=[wire.text_part(question)],
        )
        self.replies: list[Any] = []

    async def reply(self, payload: Any) -> None:
        self.replies.append(payload)

    async def result(self) -> None:
        """The task does not end while its question is asked."""
        await asyncio.Event().wait()


@pytest.mark.parametrize(
    ("flags", "typed", "sent"),
    [
        ({"fields": {"city": "Paris"}}, "", {"city": "Paris"}),
        ({"decision": "reject", "notes": "not now"}, "", "reject not now"),
        ({}, "Lyon\n", "Lyon"),
        ({}, '{"city": "Nice"}\n', {"city": "Nice"}),
    ],
    ids=["fields", "decision", "line", "json-line"],
)
async def test_another_agents_question_is_answered_with_one_reply(
    flags: dict[str, Any], typed: str, sent: Any
) -> None:
    read, write = os.pipe()
    os.write(write, typed.encode())
    os.close(write)
    err = io.StringIO()
    reader = LineReader(read)
    follower = A2AFollower(
        "http://agent.example",
        SendOptions(task_type="book", payload={}, **flags),
        out=io.StringIO(),
        console=TerminalConsole(err, live=False),
        reader=reader,
        interactive=False,
    )
    handle = StandIn("Which city?")
    follower.handle = handle  # type: ignore[assignment]
    try:
        await follower.input_required()
        await follower.input_required()  # the same question again (a resumed stream): once
    finally:
        reader.close()  # the reading thread has ended: the descriptor may be closed and reused
        os.close(read)
    assert handle.replies == [sent]
    assert "? http://agent.example asks: Which city?" in err.getvalue()


async def test_a_closed_line_reader_never_reads_its_descriptor_again() -> None:
    """The root of a flake: a reader's thread outliving its case read the next case's pipe once
    the descriptor number was reused. After `close()` the thread is gone, whatever comes next."""
    read, write = os.pipe()
    reader = LineReader(read)
    os.write(write, b"first\n")
    assert await reader.readline() == "first"
    reader.close()
    os.close(read)
    os.close(write)
    reused_read, reused_write = os.pipe()  # likely the same descriptor numbers again
    try:
        os.write(reused_write, b"meant for someone else\n")
        os.close(reused_write)
        with os.fdopen(reused_read, "rb") as stream:
            assert stream.read() == b"meant for someone else\n"  # nothing was stolen
    finally:
        reader.close()  # idempotent


def test_a_push_allowlist_port_written_star_is_taken_from_flags_and_environment() -> None:
    """`*` as the port of an allowlist entry (any port of that host), as docs/cli.md shows
    it: read the same from `--a2a-push-allow` and from `SYNAPSE_A2A_PUSH_ALLOW`, and the
    server's allowlist then takes any port of that host."""
    import argparse

    from synapse.a2a.server.push import PushAllowlist
    from synapse.cli.options import A2A_PUSH_ALLOW
    from synapse.cli.settings import Settings

    entry = "http://127.0.0.1:*/hooks/"
    from_flag = Settings.load(argparse.Namespace(a2a_push_allow=[entry], config=None), {})
    from_env = Settings.load(
        argparse.Namespace(a2a_push_allow=None, config=None),
        {"SYNAPSE_A2A_PUSH_ALLOW": f"{entry},https://hooks.example/x/"},
    )
    assert from_flag.get_list(A2A_PUSH_ALLOW) == [entry]
    assert from_env.get_list(A2A_PUSH_ALLOW) == [entry, "https://hooks.example/x/"]
    allowlist = PushAllowlist(from_flag.get_list(A2A_PUSH_ALLOW))
    assert allowlist.allows("http://127.0.0.1:45123/hooks/a2a")
    assert not allowlist.allows("http://127.0.0.2:45123/hooks/a2a")


@pytest.mark.parametrize(
    ("host", "tokens", "warned"),
    [
        ("0.0.0.0", {}, True),
        ("::", {}, True),
        ("10.0.0.5", {}, True),
        ("0.0.0.0", {"t0k3n": "alice"}, False),
        ("127.0.0.1", {}, False),
        ("localhost", {}, False),
        ("::1", {}, False),
    ],
)
def test_anonymous_a2a_beyond_this_machine_is_warned_of(
    host: str, tokens: dict[str, str], warned: bool
) -> None:
    assert anonymous_a2a(host, A2AOptions(tokens=tokens)) is warned


def test_a_loopback_agent_is_not_warned_of(agent: Server) -> None:
    assert not any("a2a_anonymous" in line for line in agent.lines)


async def test_serve_a2a_declares_and_negotiates_extensions() -> None:
    """--a2a-extension and --a2a-required-extension: on the card; a call that leaves out the
    required one is refused (-32008); one that names both gets the timestamp extension's
    stamp and hears back what was activated."""
    from synapse.a2a.server.extensions import TIMESTAMP_FIELD, TIMESTAMP_URI

    policy = "https://example.com/a2a/ext/policy/v1"
    with serve(
        "--agent-id",
        EXECUTOR,
        "--a2a",
        "--a2a-extension",
        TIMESTAMP_URI,
        "--a2a-required-extension",
        policy,
    ) as server:
        card = json.loads(run_card(server))
        declared = {e["uri"]: e.get("required", False) for e in card["capabilities"]["extensions"]}
        assert declared[TIMESTAMP_URI] is False and declared[policy] is True
        refused = await rpc(server, "SendMessage", echo_message("no"))
        assert refused["error"]["code"] == -32008
        answer = await rpc(
            server,
            "SendMessage",
            echo_message("yes"),
            {"A2A-Extensions": f"{TIMESTAMP_URI},{policy}"},
        )
    (artifact,) = answer["result"]["task"]["artifacts"]
    assert TIMESTAMP_FIELD in artifact["metadata"]
    assert artifact["extensions"] == [TIMESTAMP_URI]
