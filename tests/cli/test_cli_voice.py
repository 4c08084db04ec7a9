"""One voice across the command line: help texts, exit-status lines, unknown commands,
NO_COLOR, and the conformance command's settings and exit statuses."""

from __future__ import annotations

import io
import logging
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from clikit import command, free_port, run, url

from synapse.cli.errors import CliError
from synapse.cli.logs import configure_logging
from synapse.cli.main import build_parser

COMMANDS = build_parser().command_names


def help_of(name: str) -> str:
    done = run(name, "--help")
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("name", COMMANDS)
def test_every_help_names_its_variables_alike_and_its_own_exit_statuses(name: str) -> None:
    text = help_of(name)
    assert "[env " not in text  # variables are written ($SYNAPSE_…) everywhere
    assert "Exit status" in " ".join(text.split())
    if name in ("serve", "demo", "schema", "outbox", "migrate", "conformance", "caps", "ping"):
        # No task is requested by these: the exit status of a task does not apply.
        assert "task failed/rejected/cancelled" not in " ".join(text.split())


def test_conformance_takes_the_settings_every_command_takes() -> None:
    text = " ".join(help_of("conformance").split())
    for flag in ("--config PATH", "--log-json", "($SYNAPSE_TARGET)", "($SYNAPSE_SECRET)"):
        assert flag in text, flag


def test_serve_says_taskType_as_the_card_and_the_docs_do() -> None:
    text = " ".join(help_of("serve").split())
    assert "metadata.taskType" in text and "metadata.task_type" not in text


@pytest.mark.parametrize(
    ("typed", "meant"), [("sned", "send"), ("serv", "serve"), ("pnig", "ping")]
)
def test_an_unknown_command_says_which_it_may_be(typed: str, meant: str) -> None:
    done = run(typed)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"synapse: unknown command {typed!r} (did you mean {meant!r}?); "
        "run 'synapse --help' for the commands"
    )


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("no_color", ["", "1"])
def test_no_color_turns_colors_off_on_a_terminal(
    no_color: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NO_COLOR", no_color)
    root = logging.getLogger()
    saved = root.handlers[:], root.level, logging.getLogger("synapse").level
    stream = Terminal()
    try:
        configure_logging(stream=stream)
        logging.getLogger("synapse.test").warning({"event": "a_warning", "field": 1})
    finally:
        root.handlers, root.level = saved[0], saved[1]
        logging.getLogger("synapse").setLevel(saved[2])
    written = stream.getvalue()
    assert "a_warning" in written
    assert ("\x1b[" in written) is (no_color == "")


def test_conformance_against_an_unreachable_target_exits_2_and_says_why() -> None:
    done = run(
        "conformance",
        "--target",
        url(free_port()),
        "--agent-id",
        "x",
        "--secret",
        "s",
        "--listen",
        f"127.0.0.1:{free_port()}",
    )
    assert done.returncode == 2, done.stdout + done.stderr
    summary = done.stdout.strip().splitlines()[-1]
    assert "NOT CHECKED: cannot reach the target" in summary, summary
    assert done.stderr.startswith("synapse conformance: cannot reach the target")


def test_conformance_reads_its_settings_from_a_config_file(tmp_path: Path) -> None:
    config = tmp_path / "kit.toml"
    target = url(free_port())
    config.write_text(
        f'secret = "{"s" * 32}"\n'
        f'[conformance]\ntarget = "{target}"\nagent_id = "x"\n'
        f'listen = "127.0.0.1:{free_port()}"\n',
        encoding="utf-8",
    )
    done = subprocess.run(
        command("conformance", "--config", str(config), "--json"),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2, done.stderr  # it got every setting: only the target is down
    assert f'"target": "{target}"' in done.stdout


@pytest.mark.parametrize("name", [n for n in COMMANDS if n != "conformance"])
def test_every_help_ends_with_example_lines_that_parse(name: str) -> None:
    """Two or three example command lines close each help, and each is a valid invocation."""
    text = help_of(name)
    shown = text.split("\nexamples:\n", 1)[1]
    examples = [shlex.split(line) for line in re.sub(r"\\\n\s*", " ", shown).splitlines()]
    assert 2 <= len(examples) <= 3, shown
    parser = build_parser()
    for words in examples:
        assert words[:2] == ["synapse", name], words
        parser.parse_command_line(words[1:])  # raises CliError on an unknown or bad flag


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_takes_the_output_flags(name: str) -> None:
    """--config, --log-json and -v everywhere (docs/cli.md lists them for all commands)."""
    text = help_of(name)
    for flag in ("--config", "--log-json", "-v, --verbose"):
        assert flag in text, (name, flag)


def test_an_unknown_flag_points_to_its_commands_help() -> None:
    with pytest.raises(CliError, match=r"unrecognized arguments: --bogus \(see 'synapse send"):
        build_parser().parse_command_line(["send", "--bogus", "echo"])


def test_help_reads_the_same_at_any_terminal_width() -> None:
    """Wrapped to one width (not the terminal's): what tests and docs show is what users see."""
    narrow = run("serve", "--help", env={"COLUMNS": "60"}).stdout
    wide = run("serve", "--help", env={"COLUMNS": "200"}).stdout
    assert narrow == wide
    assert max(len(line) for line in wide.splitlines()) <= 100
