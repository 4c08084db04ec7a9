"""Lint, formatting, types and the documentation build are tests too: `pytest` runs what CI
runs, so the README's one test command checks everything."""

from __future__ import annotations

import re
from pathlib import Path

import headstart
import pytest

ROOT = Path(__file__).resolve().parent.parent
CODE = ["synapse", "tests", "benchmarks", "examples"]

pytestmark = pytest.mark.slow


def run(*args: str, timeout: float = 600) -> None:
    status, output = headstart.module_run(*args, timeout=timeout)
    assert status == 0, output[-4000:]


def test_ruff_finds_nothing() -> None:
    run("ruff", "check", *CODE)


def test_the_code_is_formatted() -> None:
    run("ruff", "format", "--check", *CODE)


def test_the_library_type_checks_strictly() -> None:
    status, output = headstart.outcome("mypy")  # started as the run began
    assert status == 0, output[-4000:]


def test_the_examples_type_check_strictly() -> None:
    """What a newcomer copies first holds to the library's own bar."""
    run("mypy", "--strict", "examples")


def test_the_documentation_builds_without_a_warning_and_without_a_dead_link(
    tmp_path: Path,
) -> None:
    # The API reference comes from the docstrings: a broken reference is a warning.
    site = tmp_path / "site"
    run("mkdocs", "build", "--strict", "--quiet", "--site-dir", str(site))
    dead = []
    for page in site.rglob("*.html"):
        for target in re.findall(r'(?:href|src)="([^"#?]+)', page.read_text("utf-8")):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("/"):
                continue  # absolute: another site
            found = (page.parent / target).resolve()
            if not (found.is_file() or (found / "index.html").is_file()):
                dead.append(f"{page.relative_to(site)} → {target}")
    assert dead == [], dead[:20]


def test_every_guide_is_in_the_sites_navigation() -> None:
    nav = yaml_nav_pages((ROOT / "mkdocs.yml").read_text("utf-8"))
    guides = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert guides <= nav, guides - nav
    assert {"specs/protocol.md", "specs/state-machine.md"} <= nav


def yaml_nav_pages(text: str) -> set[str]:
    """The pages `nav:` of mkdocs.yml names (`- Title: page.md` lines)."""
    return set(re.findall(r"^\s+- [^:]+: (\S+\.md)$", text, re.M))
