"""Where settings come from: flags, then SYNAPSE_… variables, then the config file (in-process)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from synapse.cli.errors import CliError
from synapse.cli.main import build_parser
from synapse.cli.options import AGENT_ID, AS, HOST, PORT, STORE
from synapse.cli.parsers import parse_listen
from synapse.cli.settings import Settings
from synapse.cli.terminal import parse_field, parse_value


def settings(argv: list[str], env: dict[str, str] | None = None) -> Settings:
    return Settings.load(build_parser().parse_args(argv), env or {})


def write(path: Path, text: str) -> str:
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_flag_beats_environment_beats_config_file(tmp_path: Path) -> None:
    config = write(tmp_path / "c.toml", 'agent_id = "from-file"\nhost = "10.0.0.1"\nport = 3\n')
    env = {"SYNAPSE_AGENT_ID": "from-env", "SYNAPSE_PORT": "2"}
    s = settings(["serve", "--config", config, "--port", "1"], env)
    assert s.get(PORT) == 1
    assert s.get(AGENT_ID) == "from-env"
    assert s.get(HOST) == "10.0.0.1"
    assert s.get(STORE, "memory") == "memory"


def test_config_file_from_the_environment_and_command_tables(tmp_path: Path) -> None:
    config = write(
        tmp_path / "c.toml",
        """
        agent_id = "agent-e"
        [send]
        as = "agent-r"
        agent_id = "agent-x"
        """,
    )
    s = settings(["send", "echo"], {"SYNAPSE_CONFIG": config})
    assert s.get(AS) == "agent-r"
    assert s.get(AGENT_ID) == "agent-x"
    s = settings(["serve"], {"SYNAPSE_CONFIG": config})
    assert s.get(AGENT_ID) == "agent-e"


def test_partners_merge_by_id_and_own_secrets_beat_the_default(tmp_path: Path) -> None:
    (tmp_path / "b.secrets").write_text("\nb-new\n  b-old  \n\n")
    config = write(
        tmp_path / "c.toml",
        """
        secret = "file-default-0123456789abcdefghij"
        [[peer]]
        agent_id = "a"
        endpoint = "http://a.example/cb"
        secrets = ["a-1", "a-2"]
        [[peer]]
        agent_id = "b"
        endpoint = "http://b.example/cb"
        [[peer]]
        agent_id = "c"
        endpoint = "http://c.example/cb"
        """,
    )
    env = {"SYNAPSE_PEERS": "b=http://b2.example/cb, d=http://d.example/cb"}
    argv = ["serve", "--config", config, "--peer", "c=http://c2.example/cb"]
    argv += [
        "--peer-secret-file",
        f"b={tmp_path / 'b.secrets'}",
        "--secret",
        "flag-default-0123456789abcdefghij",
    ]
    argv += ["--allow-shared-secret"]  # c and d share the default
    argv += ["--allow-weak-secret"]  # a's and b's short secrets: what is merged is the point
    partners = {p.agent_id: p for p in settings(argv, env).partners()}
    assert {k: p.endpoint for k, p in partners.items()} == {
        "a": "http://a.example/cb",
        "b": "http://b2.example/cb",
        "c": "http://c2.example/cb",
        "d": "http://d.example/cb",
    }
    assert partners["a"].secrets == ("a-1", "a-2")  # its own, from the file
    assert partners["b"].secrets == ("b-new", "b-old")  # its own file, newest first
    assert partners["c"].secrets == ("flag-default-0123456789abcdefghij",)
    assert partners["d"].secrets == ("flag-default-0123456789abcdefghij",)


def test_a_secret_file_for_an_unknown_partner_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "s").write_text("x\n")
    s = settings(["serve", "--peer-secret-file", f"z={tmp_path / 's'}", "--secret", "k" * 32])
    with pytest.raises(CliError, match="--peer-secret-file for 'z', which is not a partner"):
        s.partners()


def test_p2p_table_and_retries(tmp_path: Path) -> None:
    config = write(tmp_path / "c.toml", "[p2p]\nheartbeat_interval = 5.0\nmax_retries = 9\n")
    s = settings(["serve", "--config", config, "--retries", "1"])
    p2p = s.p2p_config(max_retries=2)
    assert (p2p.heartbeat_interval, p2p.max_retries) == (5.0, 1)
    bad = write(tmp_path / "bad.toml", "[p2p]\nheartbeat_intervall = 5\n")
    with pytest.raises(CliError, match="unknown key 'heartbeat_intervall' \\(did you mean"):
        settings(["serve", "--config", bad]).p2p_config()


def test_target_id_from_a_configured_partner(tmp_path: Path) -> None:
    from synapse.cli.client import client_setup

    config = write(
        tmp_path / "c.toml",
        """
        as = "me"
        secret = "kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk"
        listen = "127.0.0.1:7001"
        [[peer]]
        agent_id = "exec"
        endpoint = "http://127.0.0.1:7000/synapse/callback"
        """,
    )
    by_url = client_setup(
        settings(
            ["ping", "--config", config, "--target", "http://127.0.0.1:7000/synapse/callback"]
        ),
        listen_required=False,
    )
    assert by_url.target.agent_id == "exec"
    assert by_url.endpoint == "http://127.0.0.1:7001/synapse/callback"
    by_id = client_setup(
        settings(["ping", "--config", config, "--agent-id", "exec"]), listen_required=False
    )
    assert by_id.target.endpoint == "http://127.0.0.1:7000/synapse/callback"
    assert by_id.config.max_retries == 2  # the command line's small budget


@pytest.mark.parametrize(
    ("text", "value"),
    [("42", 42), ("true", True), ('{"a": 1}', {"a": 1}), ("现代", "现代"), ('"7"', "7"), ("", "")],
)
def test_answers_are_json_if_they_parse(text: str, value: object) -> None:
    assert parse_value(text) == value
    assert parse_field(f"k={text}") == ("k", value)


def test_listen_addresses() -> None:
    assert parse_listen("127.0.0.1:80") == ("127.0.0.1", 80)
    assert parse_listen("[::1]:8080") == ("::1", 8080)
    for bad in ("8080", ":80", "h:", "h:99999"):
        with pytest.raises(ValueError):
            parse_listen(bad)


def test_serve_settings_for_running_for_months(tmp_path: Path) -> None:
    from synapse.cli.main import serve_p2p_config

    config = write(
        tmp_path / "c.toml",
        """
        [p2p]
        retain = "12h"
        drain_timeout = "1m"
        input_timeout = "15m"
        rate_limit = 20
        """,
    )
    s = settings(["serve", "--config", config])
    c = serve_p2p_config(s)
    assert (c.retain, c.drain_timeout, c.input_timeout, c.rate_limit) == (43200, 60, 900, 20)
    assert c.max_tasks_per_partner is None
    env = {"SYNAPSE_RETAIN": "7d", "SYNAPSE_MAX_TASKS_PER_PARTNER": "4"}
    c = serve_p2p_config(settings(["serve", "--config", config], env))
    assert (c.retain, c.max_tasks_per_partner) == (7 * 86400, 4)
    flags = ["serve", "--config", config, "--retain", "30s", "--drain-timeout", "2"]
    c = serve_p2p_config(settings([*flags, "--rate-limit", "0.5"], env))
    assert (c.retain, c.drain_timeout, c.rate_limit) == (30, 2, 0.5)
    defaults = serve_p2p_config(settings(["serve"]))
    assert (defaults.retain, defaults.drain_timeout, defaults.input_timeout) == (
        7 * 86400,
        30,
        3600,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--retain", "5x"], "not a duration"),
        (["--drain-timeout", "-1"], "not a duration"),
        (["--rate-limit", "0"], "positive"),
    ],
)
def test_bad_serve_durations_are_usage_errors(args: list[str], message: str) -> None:
    from clikit import run_here

    status, _, err = run_here("serve", "--agent-id", "e", "--port", "0", *args)
    assert status == 2 and message in err and "Traceback" not in err


def test_a_bad_duration_in_the_config_file_names_it(tmp_path: Path) -> None:
    from synapse.cli.main import serve_p2p_config

    config = write(tmp_path / "c.toml", '[p2p]\nretain = "soon"\n')
    with pytest.raises(CliError, match="retain"):
        serve_p2p_config(settings(["serve", "--config", config]))


def test_lease_ttl_from_the_file_the_environment_and_the_flag(tmp_path: Path) -> None:
    from synapse.cli.main import serve_p2p_config

    config = write(tmp_path / "c.toml", '[p2p]\nlease_ttl = "30s"\n')
    assert serve_p2p_config(settings(["serve"])).lease_ttl == 10  # the default
    assert serve_p2p_config(settings(["serve", "--config", config])).lease_ttl == 30
    env = {"SYNAPSE_LEASE_TTL": "5s"}
    assert serve_p2p_config(settings(["serve", "--config", config], env)).lease_ttl == 5
    flags = ["serve", "--config", config, "--lease-ttl", "2"]
    assert serve_p2p_config(settings(flags, env)).lease_ttl == 2
