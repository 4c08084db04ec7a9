"""What README.md and docs/ show is what the package does: commands, flags and printed output."""

from __future__ import annotations

import re
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SUBCOMMANDS = (
    "serve",
    "send",
    "caps",
    "ping",
    "demo",
    "outbox",
    "schema",
    "migrate",
    "conformance",
)


def _blocks(path: Path, fence: str) -> list[str]:
    text = path.read_text("utf-8")
    return [part.split("\n```", 1)[0] for part in text.split(f"```{fence}\n")[1:]]


def _commands(path: Path) -> list[tuple[str, str]]:
    """Every `synapse SUB …` command of the shell blocks, continuation lines joined."""
    found = []
    for block in _blocks(path, "sh"):
        joined = re.sub(r"\\\n\s*", " ", block)
        pieces = [p for line in joined.splitlines() for p in re.split(r"\s{2,}(?=synapse )", line)]
        for line in pieces:
            line = re.sub(r"^(\$ |export \S+ )", "", line.strip())
            line = re.sub(r"^(SYNAPSE_\w+=\S+ )+", "", line)
            words = line.split()
            if len(words) >= 2 and words[0] == "synapse" and words[1] in SUBCOMMANDS:
                found.append((words[1], line))
    return found


@cache
def _help(subcommand: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "synapse.cli.main", subcommand, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


CASES = [
    pytest.param(sub, line, id=f"{path.name}:{sub}:{n}")
    for path in DOCS
    for n, (sub, line) in enumerate(_commands(path))
]


def test_the_docs_show_commands() -> None:
    assert len(CASES) > 20


@pytest.mark.parametrize(("subcommand", "line"), CASES)
def test_every_documented_flag_exists(subcommand: str, line: str) -> None:
    flags = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", line.split("#", 1)[0]))
    helptext = _help(subcommand)
    missing = sorted(flag for flag in flags if not re.search(rf"{flag}(?![\w-])", helptext))
    assert not missing, f"{line!r}: `synapse {subcommand} --help` has no {missing}"


def test_the_demo_timeline_in_cli_md_is_what_synapse_demo_prints() -> None:
    text = (ROOT / "docs" / "cli.md").read_text("utf-8")
    section = text.split("## `synapse demo`", 1)[1]
    shown = section.split("\n```\n", 1)[1].split("\n```", 1)[0].splitlines()
    done = subprocess.run(
        [sys.executable, "-m", "synapse.cli.main", "demo"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    printed = done.stdout.splitlines()
    excerpt = [line for line in shown if line.strip() not in {"...", "…"}]
    assert excerpt, "the demo section shows no output"
    start = printed.index(excerpt[0])
    assert printed[start : start + len(excerpt)] == excerpt


LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize(
    "path",
    [*DOCS, *sorted((ROOT / "specs").glob("*.md")), ROOT / "CHANGELOG.md"],
    ids=lambda p: p.name,
)
def test_every_relative_link_names_a_file_of_the_repository(path: Path) -> None:
    text = path.read_text("utf-8")
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # a URL
        resolved = (path.parent / target).resolve()
        if not resolved.exists() or ROOT not in (resolved, *resolved.parents):
            broken.append(target)
    assert broken == []


def test_the_docs_name_no_issue_numbers_and_nothing_outside_the_repository() -> None:
    for path in [*DOCS, *sorted((ROOT / "specs").glob("*.md")), ROOT / "CHANGELOG.md"]:
        text = path.read_text("utf-8")
        assert not re.search(r"\b[Ii]ssues? #?\d+\b", text), path.name
        assert "../shared" not in text and "CONTRACT" not in text, path.name  # cite-sweep: ignore
        assert not re.search(r"\b(seed|contract) §", text, re.I), path.name


def test_help_points_to_no_docs_the_wheel_lacks() -> None:
    for subcommand in SUBCOMMANDS:
        for match in re.finditer(r"docs/\w+\.md", _help(subcommand)):
            following = _help(subcommand)[match.end() : match.end() + 40]
            assert "repository" in " ".join(following.split()), (subcommand, match.group())


def test_the_conformance_output_in_the_docs_is_the_reports_format() -> None:
    from synapse.conformance.checks import CHECKS
    from synapse.conformance.report import CheckResult, Report, Status

    text = (ROOT / "docs" / "conformance.md").read_text("utf-8")
    shown = text.split("## Output\n\n```\n", 1)[1].split("\n```", 1)[0].splitlines()
    results = [CheckResult(c.id, c.title, c.section, Status.PASS) for c in CHECKS]
    rendered = Report("t", "a", "k", "c", results).table().splitlines()
    assert shown[0] == rendered[2]  # the header, with the same column widths
    by_id = {c.id: line for c, line in zip(CHECKS, rendered[3 : 3 + len(CHECKS)], strict=True)}
    for line in shown[1:]:
        check_id = line.split()[0] if line.strip() else ""
        if check_id in by_id:
            width = len(by_id[check_id].split("PASS")[0])
            assert line[:width] == by_id[check_id][:width], line


# --- every flag of every command, in docs/cli.md -------------------------------------------------

#: Every command takes it, and the page says so once, at its top.
HELP = "--help"


def _settings_rows() -> dict[str, str]:
    """flag → the commands its row of the "Settings" table names ("all …" for every one)."""
    doc = (ROOT / "docs" / "cli.md").read_text("utf-8")
    rows: dict[str, str] = {}
    for line in doc[doc.index("## Settings") :].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or "`--" not in cells[0]:
            continue
        for flag in re.findall(r"(--[a-z][a-z0-9-]*)", cells[0]):
            rows[flag] = cells[-1]
    return rows


def _command_flags() -> dict[str, set[str]]:
    from synapse.cli.main import build_parser

    parser = build_parser()
    found: dict[str, set[str]] = {}
    for name in parser.command_names:
        command = _subparser(parser, name)
        found[name] = {
            option
            for action in command._actions
            for option in action.option_strings
            if option.startswith("--")
        }
    return found


def _subparser(parser: Any, name: str) -> Any:
    for action in parser._actions:
        choices = getattr(action, "choices", None)
        if isinstance(choices, dict) and name in choices:
            return choices[name]
    raise KeyError(name)


def _section(name: str) -> str:
    doc = (ROOT / "docs" / "cli.md").read_text("utf-8")
    headings = list(re.finditer(r"^## .*$", doc, re.M))
    for i, heading in enumerate(headings):
        if f"synapse {name}`" in heading.group() or f"synapse {name} " in heading.group():
            end = headings[i + 1].start() if i + 1 < len(headings) else len(doc)
            return doc[heading.start() : end]
    raise AssertionError(f"docs/cli.md has no section for `synapse {name}`")


def test_every_flag_of_every_command_is_in_its_section_of_cli_md() -> None:
    """A flag is documented for a command in that command's section, or in the row of the
    settings table that names the command (or "all …")."""
    rows = _settings_rows()
    missing = {}
    for name, flags in _command_flags().items():
        section = _section(name)
        absent = sorted(
            flag
            for flag in flags - {HELP}
            if not re.search(rf"{re.escape(flag)}(?![\w-])", section)
            and not (flag in rows and (name in rows[flag] or rows[flag].startswith("all")))
        )
        if absent:
            missing[name] = absent
    assert missing == {}, missing
