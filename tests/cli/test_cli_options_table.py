"""One table of settings (`synapse.cli.options`): every flag, environment variable, config-file
key and parser of the command line is declared once there, and the parser, the settings lookup,
the config file's known keys and docs/cli.md all follow it."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from synapse.cli import options
from synapse.cli.main import build_parser
from synapse.cli.options import CONFIG_KEYS, SETTINGS, Setting

ROOT = Path(__file__).resolve().parents[2]
CLI_SOURCES = sorted((ROOT / "synapse" / "cli").glob("*.py"))


def actions() -> dict[str, list[tuple[str, argparse.Action]]]:
    """Every flag of every command: flag → [(command, action)]."""
    found: dict[str, list[tuple[str, argparse.Action]]] = {}
    parser = build_parser()
    for command, sub in parser.commands().items():
        for action in sub._actions:
            for flag in action.option_strings:
                found.setdefault(flag, []).append((command, action))
    return found


def test_rows_are_distinct() -> None:
    assert len({(s.flag, s.env) for s in SETTINGS}) == len(SETTINGS)
    assert len({s.env for s in SETTINGS if s.env}) == len([s for s in SETTINGS if s.env])
    assert len({s.key for s in SETTINGS if s.key}) == len([s for s in SETTINGS if s.key])


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.env or s.flag)
def test_each_setting_is_a_flag_with_its_destination(setting: Setting[object]) -> None:
    """Declared by a command, stored where the settings look for it, and its `--help` names
    the variable that sets it too (`--a2a-token` is two rows: serve's tokens, send's token)."""
    declared = actions().get(setting.flag, [])
    assert declared, f"{setting.flag} is declared by no command"
    mine = [(command, a) for command, a in declared if a.dest == setting.dest]
    assert mine, f"{setting.flag}: no command stores it in {setting.dest}"
    if setting.env is not None:
        assert any(f"${setting.env}" in (a.help or "") for _, a in mine), setting.flag
    rows_of_flag = [s for s in SETTINGS if s.flag == setting.flag and s.env]
    for command, action in mine:
        assert any(f"${s.env}" in (action.help or "") for s in rows_of_flag), command


def test_the_flags_type_is_the_rows_parser() -> None:
    """A flag read at parse time is read by its row's parser: a bad value is the same error
    whether it comes from the flag, the variable or the file."""
    port = options.PORT
    parser = build_parser()
    with pytest.raises(Exception, match="port"):
        parser.parse_args(["serve", "--port", "70000"])
    with pytest.raises(ValueError, match="port"):
        port.parse("70000")


def test_every_environment_variable_the_cli_reads_is_a_row() -> None:
    known = {s.env for s in SETTINGS if s.env}
    read = set()
    for path in CLI_SOURCES:
        if path.name == "options.py":
            continue
        read |= set(re.findall(r"env(?:\.get)?\(?\[?\"(SYNAPSE_[A-Z0-9_]+)\"", path.read_text()))
    assert read <= known, read - known


def test_the_config_keys_follow_from_the_table() -> None:
    assert {s.key for s in SETTINGS if s.key} <= CONFIG_KEYS
    assert CONFIG_KEYS - {s.key for s in SETTINGS} == options.TABLE_KEYS


@pytest.mark.parametrize("setting", [s for s in SETTINGS if s.env], ids=lambda s: s.env)
def test_each_environment_variable_is_documented(setting: Setting[object]) -> None:
    assert setting.env is not None
    assert setting.env in (ROOT / "docs" / "cli.md").read_text("utf-8")


def test_a_keyword_flag_gets_a_usable_destination() -> None:
    assert options.AS.dest == "as_"
    assert options.A2A_PUSH_ALLOW.dest == "a2a_push_allow"
    assert options.A2A_PUSH_ALLOW.described("x") == "x ($SYNAPSE_A2A_PUSH_ALLOW, comma-separated)"
