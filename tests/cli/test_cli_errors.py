"""Every user error is one readable line on stderr, a meaningful exit status, no traceback."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import pytest
from clikit import (
    EXECUTOR,
    REQUESTER,
    SECRET,
    Server,
    client_args,
    error_lines,
    free_port,
    no_traceback,
    run,
    run_here,
    url,
)

from synapse.cli.options import PORT


def one_error(result: subprocess.CompletedProcess[str], status: int = 2) -> str:
    no_traceback(result)
    assert result.returncode == status, result.stderr
    [line] = error_lines(result.stderr)
    return line


def test_wrong_secret_is_403_permission_denied(executor: Server, requester_port: int) -> None:
    result = run(
        "send",
        *client_args(executor, requester_port, secret="wrong-secret-0123456789abcdefghij"),
        "echo",
        '{"text": "x"}',
    )
    line = one_error(result)
    assert line.startswith("synapse: 403 permission_denied: "), line
    assert result.stdout == ""


@pytest.mark.parametrize("command", ["send", "caps", "ping"])
def test_unreachable_target_is_reported_quickly(command: str) -> None:
    dead = free_port()  # nobody listens there
    args = [
        "--target",
        url(dead),
        "--agent-id",
        EXECUTOR,
        "--as",
        REQUESTER,
        "--secret",
        SECRET,
        "--listen",
        f"127.0.0.1:{free_port()}",
    ]
    extra = ["echo", '{"text": "x"}'] if command == "send" else []
    started = time.monotonic()
    result = run(command, *args, *extra)
    elapsed = time.monotonic() - started
    line = one_error(result)
    assert line.startswith(f"synapse: cannot reach {EXECUTOR} at {url(dead)}: "), line
    assert "after 3 attempts" in line
    assert elapsed < 8, elapsed  # the CLI's small retry budget, not the contract's 62 s


def test_retries_flag_sets_the_budget() -> None:
    result = run(
        "ping",
        "--target",
        url(free_port()),
        "--agent-id",
        EXECUTOR,
        "--as",
        REQUESTER,
        "--secret",
        SECRET,
        "--listen",
        "127.0.0.1:9",
        "--retries",
        "0",
    )
    assert "after 1 attempts" in one_error(result)


def here_error(*args: str, env: dict[str, str] | None = None) -> str:
    """Run in this process an invocation that fails before anything starts; its one line."""
    status, out, err = run_here(*args, env=env)
    assert status == 2, err
    assert out == ""
    [line] = err.splitlines()
    assert line.startswith("synapse: "), line
    return line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--field", "x", "echo", "{}"], "malformed --field 'x': expected NAME=VALUE"),
        (["echo", '{"text": '], "bad PAYLOAD_JSON '{\"text\": ': Expecting value"),
    ],
)
def test_malformed_input_is_refused_before_anything_is_sent(
    executor: Server, requester_port: int, args: list[str], message: str
) -> None:
    line = one_error(run("send", *client_args(executor, requester_port), *args))
    assert line.startswith(f"synapse: {message}"), line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--field", "=x", "echo", "{}"], "malformed --field '=x': expected NAME=VALUE"),
        (["echo", "[1, 2]"], "bad PAYLOAD_JSON '[1, 2]': expected a JSON object"),
        (["echo", '{"n": NaN}'], "bad PAYLOAD_JSON '{\"n\": NaN}': NaN is not JSON"),
    ],
)
def test_more_malformed_input(args: list[str], message: str) -> None:
    assert here_error("send", *args).startswith(f"synapse: {message}")


def test_port_in_use_for_listen(executor: Server) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run("send", *client_args(executor, port), "echo", '{"text": "x"}')
    line = one_error(result)
    assert line == f"synapse: cannot listen on 127.0.0.1:{port}: address already in use"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            [
                "--as",
                "me",
                "--target",
                "http://127.0.0.1:9/x",
                "--agent-id",
                "e",
                "--secret",
                "s" * 32,
            ],
            "missing --listen HOST:PORT",
        ),
        (["--target", "not a url"], "argument --target: not an absolute URL"),
        (["--listen", "nowhere"], "argument --listen: expected HOST:PORT"),
        (["--signing", "both"], "argument --signing: signing must be 'header' or 'body'"),
        (["--approve", "--reject"], "argument --reject: not allowed with argument --approve"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_send_usage_errors(args: list[str], message: str) -> None:
    line = here_error("send", *args, "echo", '{"text": "x"}')
    assert line.startswith(f"synapse: {message}"), line


def test_every_missing_setting_is_named_in_one_run() -> None:
    """Not one a run: what `send` lacks comes in one message, a line for each."""
    status, out, err = run_here("send", "echo", '{"text": "x"}', env={})
    assert status == 2 and out == ""
    head, *lines = err.splitlines()
    assert head == "synapse: missing 5 settings:"
    starts = ["--as ID", "--target URL", "--agent-id ID", "a secret shared", "--listen HOST:PORT"]
    assert [line.strip().split(" (")[0].split(": ")[0] for line in lines] == [
        "--as ID",
        "--target URL",
        "--agent-id ID",
        "a secret shared with the executor",
        "--listen HOST:PORT",
    ]
    assert all(line.strip().startswith(start) for line, start in zip(lines, starts, strict=True))
    # Given some, only the others are named.
    status, _, err = run_here("send", "--as", "me", "--secret", "s" * 32 * 32, "echo", "{}", env={})
    assert err.splitlines()[0] == "synapse: missing 3 settings:"
    assert "--as" not in err and "secret" not in err


def test_a_usage_error_in_a_real_process_is_one_line_too() -> None:
    result = run("send", "--bogus", "echo")
    assert one_error(result).startswith("synapse: unrecognized arguments: --bogus")
    assert result.stderr.count("\n") == 1


def test_no_command_prints_help_and_exits_2() -> None:
    status, _out, err = run_here()
    assert status == 2
    assert "usage: synapse" in err


@pytest.mark.parametrize("command", ["serve", "send", "caps", "ping", "schema", "demo"])
def test_help_everywhere(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit:
        run_here(command, "--help")
    assert exit.value.code == 0
    assert f"usage: synapse {command}" in capsys.readouterr().out


def test_a_bad_config_file_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("agent_id = \n")
    line = here_error("serve", "--config", str(config))
    assert line.startswith(f"synapse: config file {config} is not valid TOML"), line
    config.write_text('agent_idd = "x"\n')
    line = here_error("serve", "--config", str(config))
    assert line == (
        f"synapse: config file {config}: unknown key 'agent_idd' (did you mean 'agent_id'?)"
    )
    line = here_error("serve", "--config", str(config.parent / "missing.toml"))
    assert line.startswith("synapse: cannot read config file"), line
    config.write_text("port = true\n")
    line = here_error("serve", "--config", str(config), "--agent-id", "e")
    assert line == f"synapse: config file {config}: `port` must be an integer, not a boolean"


def test_a_bad_environment_variable_is_one_line() -> None:
    line = here_error("serve", "--agent-id", "e", env={"SYNAPSE_PORT": "eighty"})
    assert (
        line == "synapse: environment variable SYNAPSE_PORT: not a port number (0-65535): 'eighty'"
    )


def test_the_installed_entry_point() -> None:
    import shutil
    import sys

    script = Path(sys.executable).parent / "synapse"
    if not script.exists():
        found = shutil.which("synapse")
        if found is None:
            pytest.skip("the `synapse` script is not installed")
        script = Path(found)
    result = subprocess.run(
        [str(script), "--version"], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0
    assert result.stdout.startswith("synapse ")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('port = "8080"', "`port` must be an integer, not a string"),
        ("secret = 5", "`secret` must be a string, not an integer"),
        ('agent_id = "e"\nverbose = "yes"', "`verbose` must be a boolean, not a string"),
        ("[serve]\nport = 1.5", "[serve] `port` must be an integer, not a number"),
        (
            '[p2p]\nmax_concurrent_tasks = "many"',
            "[p2p] `max_concurrent_tasks` must be an integer, not a string",
        ),
        (
            '[p2p]\ntask_timeout = "soon"',
            "[p2p] `task_timeout` must be a number or a duration (30s, 15m, 12h, 7d), not 'soon'",
        ),
        ('[p2p]\nmax_retries = "5m"', "[p2p] `max_retries` must be an integer, not a string"),
        ("[p2p]\nmax_retries = true", "[p2p] `max_retries` must be an integer, not a boolean"),
        (
            "[p2p]\nmax_retriez = 3",
            "[p2p]: unknown key 'max_retriez' (did you mean 'max_retries'?)",
        ),
        (
            '[http]\nheader_timeout = "10s"',
            "[http] `header_timeout` must be a number, not a string",
        ),
        ('[[peer]]\nagent_id = "r"\nendpoint = 5', "[[peer]] #1"),
        (
            '[[peer]]\nagent_id = "r"\nendpoint = "http://127.0.0.1:9/cb"\nsecrets = "s"',
            "[[peer]] #1",
        ),
    ],
)
def test_a_value_of_the_wrong_type_is_refused_in_one_line(
    tmp_path: Path, text: str, message: str
) -> None:
    """TOML values are typed as written: never converted, never accepted as something else."""
    config = tmp_path / "typed.toml"
    config.write_text(text + "\n")
    line = here_error(
        "serve",
        "--config",
        str(config),
        "--agent-id",
        "e",
        "--port",
        "0",
        "--peer",
        "r=http://127.0.0.1:9/cb",
        "--secret",
        "s" * 32,
    )
    assert line.startswith(f"synapse: config file {config}"), line
    assert message in line, line


def test_typed_values_of_the_right_type_still_work(tmp_path: Path) -> None:
    from synapse.cli.main import build_parser
    from synapse.cli.settings import Settings

    config = tmp_path / "good.toml"
    config.write_text(
        f'port = 8080\nsecret = "{"s" * 32}"\n'
        "[p2p]\nmax_concurrent_tasks = 7\ntask_timeout = 60\n"
        "[http]\nheader_timeout = 2\nmax_connections = 50\n"
    )
    s = Settings.load(build_parser().parse_args(["serve", "--config", str(config)]), {})
    assert s.get(PORT) == 8080
    assert s.p2p_config().max_concurrent_tasks == 7
    assert s.p2p_config().task_timeout == 60.0
    limits = s.http_limits()
    assert (limits.header_timeout, limits.max_connections, limits.body_timeout) == (2.0, 50, 30.0)


def test_an_accepted_case_fails_in_bounded_time_instead_of_hanging() -> None:
    """The guard of every in-process case above: settings that `serve` accepts start a
    server, and the case fails after its timeout with a message saying so."""
    started = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match=r"was still running after 1\.5 s"):
        run_here(
            "serve",
            *("--agent-id", "e", "--port", "0", "--peer", "r=http://127.0.0.1:9/cb"),
            *("--secret", "s" * 32, "--store", "memory"),
            timeout=1.5,
        )
    assert time.monotonic() - started < 10


@pytest.mark.parametrize(
    ("toml", "said"),
    [
        ("prot = 8080\n", "unknown key 'prot' (did you mean 'port'?)"),
        ("[serve]\nprot = 8080\n", "[serve]: unknown key 'prot' (did you mean 'port'?)"),
        ("[serve]\nzzz = 1\n", "[serve]: unknown key 'zzz'"),
    ],
)
def test_a_config_typo_reads_one_way_with_a_suggestion(
    tmp_path: Path, toml: str, said: str
) -> None:
    """Wherever the unknown key stands (the top level, a command's table; [p2p] above), one
    phrasing, with the nearest known key when one is close."""
    config = tmp_path / "typo.toml"
    config.write_text(toml)
    line = here_error("serve", "--config", str(config))
    assert line == f"synapse: config file {config}: {said}", line


def test_a_store_in_a_missing_folder_says_so(tmp_path: Path) -> None:
    store = tmp_path / "no-such-folder" / "agent.sqlite"
    line = here_error(
        "serve", "--agent-id", "e", "--port", "0", "--store", str(store),
        "--peer", "r=http://127.0.0.1:9/cb", "--secret", "s" * 32,
    )  # fmt: skip
    assert line == (
        f"synapse: cannot open store {str(store)!r}: its folder {store.parent} does not exist "
        "(create it, or give another --store)"
    )


def test_a_store_in_a_read_only_folder_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(As root every folder is writable: the permission is what `os.access` says.)"""
    from synapse.cli import serve

    folder = tmp_path / "ro"
    folder.mkdir()
    monkeypatch.setattr(serve.os, "access", lambda path, mode: Path(path) != folder)
    problem = serve.store_path_problem(str(folder / "agent.sqlite"))
    assert problem == (
        f"its folder {folder} is read-only for this user (SQLite creates the file and its "
        "journal there)"
    )
    (folder / "agent.sqlite").touch()
    monkeypatch.setattr(serve.os, "access", lambda path, mode: Path(path).suffix != ".sqlite")
    assert serve.store_path_problem(str(folder / "agent.sqlite")) == (
        "the file is read-only for this user"
    )
    assert serve.store_path_problem("memory") is None
    assert serve.store_path_problem("postgresql://u@h:5432/db") is None
