"""`synapse send` against a real `synapse serve`, for every demo task type, each a subprocess."""

from __future__ import annotations

import json
import select
import signal
import subprocess
import time
from datetime import UTC, datetime, timedelta

import pytest
from clikit import (
    Server,
    clean_env,
    client_args,
    command,
    error_lines,
    no_traceback,
    run,
)

from synapse.cli.parsers import parse_when


def send(
    executor: Server, port: int, *args: str, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    result = run("send", *client_args(executor, port), *args, input=input)
    no_traceback(result)
    return result


def test_echo_prints_the_text(executor: Server, requester_port: int) -> None:
    result = send(executor, requester_port, "echo", '{"text": "hello, exec"}')
    assert result.returncode == 0, result.stderr
    assert result.stdout == "hello, exec\n"
    assert "✓ confirmed" in result.stderr
    assert "✓ completed" in result.stderr


def test_slow_reports_progress_as_plain_lines_off_a_tty(
    executor: Server, requester_port: int
) -> None:
    result = send(executor, requester_port, "slow", '{"steps": 4, "delay": 0.01}')
    assert result.returncode == 0, result.stderr
    assert result.stdout == "done after 4 steps\n"
    progress = [line for line in result.stderr.splitlines() if line.startswith("progress")]
    assert progress == [
        "progress 25% step 1/4",
        "progress 50% step 2/4",
        "progress 75% step 3/4",
        "progress 100% step 4/4",
    ]


def test_need_info_answered_through_stdin(executor: Server, requester_port: int) -> None:
    result = send(executor, requester_port, "text_generation", '{"prompt": "春天"}', input="现代\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "“春天”, written in the 现代 style\n"
    # The question, its reason, the suggested value and the alternatives were shown.
    assert "Which style should the text be written in?" in result.stderr
    assert "no style given" in result.stderr
    assert "[古典]" in result.stderr
    assert "现代, 浪漫" in result.stderr


def test_need_info_empty_answer_takes_the_suggested_value(
    executor: Server, requester_port: int
) -> None:
    result = send(executor, requester_port, "text_generation", '{"prompt": "p"}', input="\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "“p”, written in the 古典 style\n"


def test_need_info_answered_with_field(executor: Server, requester_port: int) -> None:
    result = send(
        executor, requester_port, "--field", "style=浪漫", "text_generation", '{"prompt": "p"}'
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "“p”, written in the 浪漫 style\n"
    assert "Which style should the text be written in?" not in result.stderr  # nothing was asked


def test_need_info_without_an_answer_cancels_and_says_how(
    executor: Server, requester_port: int
) -> None:
    result = send(executor, requester_port, "text_generation", '{"prompt": "p"}', input="")
    assert result.returncode == 2
    assert error_lines(result.stderr) == [
        "synapse: no answer for `style`: stdin is closed (answer with --field style=VALUE)"
    ]


@pytest.mark.parametrize(
    ("answer", "status", "stdout", "error"),
    [
        (["--approve"], 0, "portrait of Ada\n", None),
        (["--reject", "--notes", "no consent"], 1, "", "failed: permission_denied: no consent"),
    ],
    ids=["approve", "reject"],
)
def test_need_human_answered_with_flags(
    executor: Server,
    requester_port: int,
    answer: list[str],
    status: int,
    stdout: str,
    error: str | None,
) -> None:
    result = send(executor, requester_port, *answer, "portrait", '{"subject": "Ada"}')
    assert result.returncode == status, result.stderr
    assert result.stdout == stdout
    assert "[ethical_decision] An ethical decision needs a person's review" in result.stderr
    if error:
        assert error_lines(result.stderr) == [f"synapse: {error}"]


@pytest.mark.parametrize(
    ("lines", "status", "stdout"),
    [("a\nlooks fine\n", 0, "portrait of Ada\n"), ("reject\nnot today\n", 1, "")],
    ids=["approve", "reject"],
)
def test_need_human_answered_through_stdin(
    executor: Server, requester_port: int, lines: str, status: int, stdout: str
) -> None:
    result = send(executor, requester_port, "portrait", '{"subject": "Ada"}', input=lines)
    assert result.returncode == status, result.stderr
    assert result.stdout == stdout
    # Reason, context, progress and the option were all shown before the question.
    for shown in (
        "An ethical decision needs a person's review",
        "task: Paint a portrait of Ada",
        "progress: 30%",
        "blocked: The right to paint this person must be confirmed",
        "option: authorized = true",
        "approve or reject? [a/r]:",
    ):
        assert shown in result.stderr
    if status:
        assert error_lines(result.stderr) == ["synapse: failed: permission_denied: not today"]


def test_fail_exits_1_with_the_error(executor: Server, requester_port: int) -> None:
    result = send(executor, requester_port, "fail")
    assert result.returncode == 1
    assert result.stdout == ""
    assert error_lines(result.stderr) == [
        "synapse: failed: execution_failed: the demo task `fail` always fails (recoverable)"
    ]


def test_unknown_task_type_is_rejected(executor: Server, requester_port: int) -> None:
    result = send(executor, requester_port, "translate", '{"text": "hi"}')
    assert result.returncode == 1
    assert error_lines(result.stderr) == [
        "synapse: rejected: capability_lacking: task type 'translate' is not offered"
    ]


def test_json_prints_one_event_per_line_and_the_outcome(
    executor: Server, requester_port: int
) -> None:
    result = send(
        executor,
        requester_port,
        "--json",
        "--task-id",
        "cli-json-1",
        "--field",
        "style=现代",
        "text_generation",
        '{"prompt": "p"}',
    )
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines()]
    kinds = [e["event"] for e in events]
    assert kinds[0] == "submitted"
    assert kinds[1:3] == ["task_need_info", "info_provided"]
    assert kinds[-2:] == ["task_complete", "outcome"]
    assert {e["task_id"] for e in events[:-1]} == {"cli-json-1"}
    assert events[1]["payload"]["missing_fields"][0]["field"] == "style"
    assert events[-1] == {
        "event": "outcome",
        "state": "completed",
        "result": {
            "output_type": "text",
            "output": "“p”, written in the 现代 style",
            "metadata": {"prompt": "p", "style": "现代"},
        },
    }
    assert result.stderr == ""  # no narrative with --json


def test_body_signing(executor: Server, requester_port: int) -> None:
    result = send(executor, requester_port, "--signing", "body", "echo", '{"text": "signed"}')
    assert result.returncode == 0, result.stderr
    assert result.stdout == "signed\n"
    assert any("signed_by=body" in line for line in executor.lines)


def test_ctrl_c_cancels_the_task(executor: Server, requester_port: int) -> None:
    process = subprocess.Popen(
        command(
            "send",
            *client_args(executor, requester_port),
            "slow",
            '{"steps": 100, "delay": 0.1}',
        ),
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
        while "progress" not in seen and time.monotonic() < deadline:  # it is executing
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
    assert any("p2p:task_cancel" in line and "task_ack" in line for line in executor.lines)


def _converse(
    args: list[str], answers: dict[bytes, str], timeout: float = 20
) -> tuple[int, str, str]:
    """Run `synapse send ARGS` with stdin and stderr on a pseudo-terminal; type each answer
    once its prompt appears. Returns (status, stdout, what the terminal showed)."""
    pty = pytest.importorskip("pty")
    import os

    master, slave = pty.openpty()
    process = subprocess.Popen(
        command("send", *args),
        stdin=slave,
        stdout=subprocess.PIPE,
        stderr=slave,
        env=clean_env(),
        text=True,
    )
    os.close(slave)
    shown, pending = b"", dict(answers)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if not select.select([master], [], [], 0.2)[0]:
                if process.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(master, 4096)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            shown += chunk
            for prompt in [p for p in pending if p in shown]:
                os.write(master, pending.pop(prompt).encode())
        assert process.stdout is not None
        out = process.stdout.read()
        status = process.wait(10)
    finally:
        os.close(master)
        if process.poll() is None:
            process.kill()
            process.wait(5)
    return status, out, shown.decode()


def test_on_a_terminal_a_person_answers_and_sees_a_progress_bar(
    executor: Server, requester_port: int
) -> None:
    args = client_args(executor, requester_port)
    status, out, shown = _converse(
        [*args, "text_generation", '{"prompt": "p"}'], {"style [古典]: ".encode(): "浪漫\n"}
    )
    assert (status, out) == (0, "“p”, written in the 浪漫 style\n"), shown
    status, out, shown = _converse([*args, "slow", '{"steps": 2, "delay": 0.01}'], {})
    assert (status, out) == (0, "done after 2 steps\n"), shown
    assert "\r\x1b[2K[" in shown and "░] 50% step 1/2" in shown and "█] 100% step 2/2" in shown
    status, out, shown = _converse(
        [*args, "portrait", '{"subject": "Ada"}'],
        {b"[a/r]: ": "a\n", b"notes (optional): ": "\n"},
    )
    assert (status, out) == (0, "portrait of Ada\n"), shown


def test_a_deadline_travels_with_the_task_and_the_executor_keeps_it(
    executor: Server, requester_port: int
) -> None:
    """--deadline is the task's own bound: the executor fails the task when it passes."""
    result = send(
        executor, requester_port, "--deadline", "1s", "slow", '{"steps": 100, "delay": 0.1}'
    )
    assert result.returncode == 1, result.stderr
    [line] = error_lines(result.stderr)
    assert line.startswith("synapse: failed: execution_timeout: the task's deadline passed")
    # A deadline already past is a usage error: nothing is sent.
    result = send(executor, requester_port, "--deadline", "2020-01-01T00:00:00Z", "echo", "{}")
    assert result.returncode == 2
    assert error_lines(result.stderr)[0].startswith(
        "synapse: argument --deadline: '2020-01-01T00:00:00Z' has already passed"
    )


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90.0), ("15m", 900.0), ("2h", 7200.0), ("30", 30.0)],
)
def test_a_deadline_is_a_duration_from_now(text: str, seconds: float) -> None:
    now = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
    assert parse_when(text, now) == now + timedelta(seconds=seconds)


def test_a_deadline_is_an_rfc_3339_time_with_its_offset() -> None:
    now = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
    assert parse_when("2026-12-24T18:00:00+01:00", now) == datetime(2026, 12, 24, 17, tzinfo=UTC)
    with pytest.raises(ValueError, match="already passed"):
        parse_when("2026-12-06T11:59:59Z", now)
    with pytest.raises(ValueError, match="needs its offset"):
        parse_when("2026-12-24T18:00:00")
    with pytest.raises(ValueError, match="not a duration"):
        parse_when("next week")
