"""The package as a user installs and type-checks it, from outside the repository.

- The distribution is ours (`synapse-agent-p2p`: "synapse-p2p" on the index is another
  project) and every place that names it says so.
- With the README's editable install, `mypy --strict` on code outside the checkout finds
  `synapse` and its `py.typed`: a handler module, `examples/` and every Python block of the
  README and `docs/` type-check strictly; a lone string given as a partner's secrets does not.
- A wheel built from the checkout installs in a clean virtual environment outside the
  repository, with every extra, and its command runs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import headstart
import pytest

import synapse
from synapse import _distribution

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
USER_EXTRAS = headstart.USER_EXTRAS


def test_the_distribution_is_named_as_the_code_says() -> None:
    assert PYPROJECT["project"]["name"] == _distribution.NAME == "synapse-agent-p2p"
    assert _distribution.install("grpc") == "pip install 'synapse-agent-p2p[grpc]'"
    import importlib.metadata

    assert importlib.metadata.version(_distribution.NAME) == synapse.__version__


def test_nothing_names_the_other_projects_distribution() -> None:
    """ "synapse-p2p" is another project on the index: no install hint may point at it (the
    A2A extension URI `https://synapse-p2p.dev/...` is an identifier, not a package)."""
    found = []
    for folder in ("synapse", "docs", "specs", "examples", "benchmarks", "tests"):
        for path in (ROOT / folder).rglob("*"):
            if "node_modules" in path.parts or path.suffix not in {".py", ".md", ".toml"}:
                continue
            if path == Path(__file__).resolve():
                continue  # this test names it to look for it
            for n, line in enumerate(path.read_text("utf-8").splitlines(), 1):
                if re.search(r"synapse-p2p(?![.\w-])", line):
                    found.append(f"{path.relative_to(ROOT)}:{n}")
    readme = (ROOT / "README.md").read_text("utf-8")
    assert not re.search(r"synapse-p2p(?![.\w-])", readme)
    assert found == [], found


def test_the_readme_lists_every_extra_and_how_to_install_from_a_clone() -> None:
    readme = (ROOT / "README.md").read_text("utf-8")
    extras = set(PYPROJECT["project"]["optional-dependencies"])
    assert set(USER_EXTRAS) <= extras
    for extra in extras - {"bench"}:
        assert f"| `{extra}` |" in readme, extra
    assert "pip install synapse-agent-p2p" in readme
    assert "pip install -e" in readme


# --- type checking from outside the repository -----------------------------------------------

HANDLER = '''\
"""A handler written by a user, in a project of their own."""

from typing import Any

from synapse import (
    ExecutionContext,
    HumanOption,
    Outcome,
    Peer,
    TaskEvent,
    TaskFailure,
    TaskHandle,
    TaskResult,
    Validation,
)
from synapse.types import TaskError


class Translator:
    def get_capabilities(self) -> list[str]:
        return ["translate"]

    def validate_task(self, task_type: str, payload: dict[str, Any]) -> Validation:
        return Validation() if "text" in payload else Validation(missing_fields=["text"])

    async def execute_task(
        self, ctx: ExecutionContext, task_type: str, payload: dict[str, Any]
    ) -> TaskResult:
        decision = await ctx.need_human(
            "review", message="Publish?", options=[HumanOption(field="ok", value=True)]
        )
        if not decision.decision.approved_fields:
            raise TaskFailure(TaskError(code="execution_failed", message="nothing approved"))
        return TaskResult(output_type="text", output=str(payload["text"]).upper())


async def follow(peer: Peer) -> Outcome:
    handle: TaskHandle = await peer.submit("translator", "translate", {"text": "hi"})
    event: TaskEvent
    async for event in handle:
        if (asked := event.need_info) is not None:
            await handle.provide_info({f.field: "hi" for f in asked.missing_fields})
        if event.need_human is not None:
            await handle.approve({"ok": True})
    return await handle
'''


def python_blocks(text: str) -> list[str]:
    return [part.split("\n```", 1)[0] + "\n" for part in text.split("```python\n")[1:]]


def document_modules(name: str, text: str) -> dict[str, str]:
    """The Python blocks of one document as modules: a block whose first line is `# NAME.py`
    is that module; the others run one after another as in the asyncio REPL (top-level
    `await`, names shared), so they are checked as the body of one async function."""
    modules: dict[str, str] = {}
    session: list[str] = []
    for block in python_blocks(text):
        first = block.splitlines()[0]
        if re.fullmatch(r"# [\w]+\.py", first):
            modules[first[2:]] = block
        else:
            session.append(block)
    if session:
        body = textwrap.indent("\n".join(session), "    ")
        modules[f"doc_{name}.py"] = f"async def _session() -> None:\n{body}"
    return modules


def mypy(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`mypy --strict` run in `folder`, outside the repository (its cache shared)."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--cache-dir",
            str(ROOT / ".mypy_cache" / "outside"),
            *args,
        ],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=600,
        env={k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "MYPYPATH"}},
    )


def type_check_from_outside(folder: Path) -> tuple[int, subprocess.CompletedProcess[str]]:
    """Write a handler, the examples and every document's Python blocks into `folder` (outside
    the repository) and type-check them there: how many blocks, and mypy's run."""
    assert not folder.is_relative_to(ROOT)
    (folder / "translator.py").write_text(HANDLER, "utf-8")
    for example in (ROOT / "examples").glob("*.py"):
        (folder / example.name).write_text(example.read_text("utf-8"), "utf-8")
    documents = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    checked = 0
    for document in documents:
        text = document.read_text("utf-8")
        checked += len(python_blocks(text))
        stem = document.stem.lower().replace("-", "_")
        for name, source in document_modules(stem, text).items():
            (folder / name).write_text(source, "utf-8")
    return checked, mypy(folder, ".")


@pytest.mark.slow
def test_a_handler_the_examples_and_every_doc_block_type_check_from_outside() -> None:
    """Run in the head start's process (`headstart.doc_blocks_type_check`): a minute of
    mypy that needs nothing from any other test."""
    done = headstart.outcome("docblocks")
    assert done["checked"] >= 14  # the README's two, and the guides'
    assert done["returncode"] == 0, done["output"]


@pytest.mark.slow
def test_a_lone_string_for_a_partners_secrets_is_a_type_error(tmp_path: Path) -> None:
    (tmp_path / "wrong.py").write_text(
        "from synapse import Partner, Peer\n\n"
        "peer = Peer('agent-r', port=0)\n"
        "peer.add_partner('agent-e', 'http://127.0.0.1:8001/synapse/callback', 's3cret')\n"
        "partner = Partner('agent-e', 'http://127.0.0.1:8001/synapse/callback', 's3cret')\n",
        "utf-8",
    )
    done = mypy(tmp_path, "wrong.py")
    assert done.returncode == 1
    assert done.stdout.count("[arg-type]") == 2, done.stdout


# --- a built wheel, in a clean environment -----------------------------------------------------


@pytest.mark.slow
def test_the_wheel_installs_outside_the_repository_with_every_extra() -> None:
    """Built, installed and probed from the start of the run (`headstart.wheel_install`)."""
    wheel = headstart.outcome("wheel")
    assert synapse.__version__ in wheel["version"]
    assert wheel["inside"] and wheel["installed"] == synapse.__version__
    # The wheel holds the package and its data, nothing else of the tree.
    names = wheel["names"]
    tops = {name.split("/")[0] for name in names}
    assert tops == {"synapse", f"synapse_agent_p2p-{synapse.__version__}.dist-info"}, tops
    assert "synapse/py.typed" in names
    assert any(name.startswith("synapse/ops/console/static/") for name in names)


# --- what the package index shows, and the release ---------------------------------------------

PACKAGE_DESCRIPTION = ROOT / "docs" / "package.md"


def test_the_index_page_installs_from_the_index_and_links_nowhere_relative() -> None:
    with (ROOT / "pyproject.toml").open("rb") as f:
        readme = tomllib.load(f)["project"]["readme"]
    assert readme == "docs/package.md"
    text = PACKAGE_DESCRIPTION.read_text("utf-8")
    first_block = text.split("```sh\n", 1)[1].split("```", 1)[0]
    assert first_block.splitlines()[0].startswith("pip install synapse-agent-p2p")
    assert "pip install -e" not in text and "git clone" not in text
    links = re.findall(r"\]\(([^)]+)\)", text)
    assert all(link.startswith("https://") for link in links), links


def test_the_index_pages_example_runs() -> None:
    source = PACKAGE_DESCRIPTION.read_text("utf-8").split("```python\n", 1)[1].split("```", 1)[0]
    done = subprocess.run(
        [sys.executable, "-c", source], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "hello" in done.stdout


@pytest.mark.slow
def test_the_release_builds_an_sdist_whose_wheel_is_the_trees(tmp_path: Path) -> None:
    """`tools/release.py`: sdist and wheel, `twine check` passes, and the wheel built from the
    sdist (what the index serves) holds the same files as one built from the tree."""
    import zipfile

    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import release
    finally:
        sys.path.remove(str(ROOT / "tools"))
    built = release.build(tmp_path / "dist")
    assert sorted(p.suffix for p in built) == [".gz", ".whl"]
    (from_sdist,) = (p for p in built if p.suffix == ".whl")
    tree = tmp_path / "tree"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tree), str(ROOT)],
        check=True,
        timeout=600,
    )
    (from_tree,) = tree.glob("*.whl")
    assert sorted(zipfile.ZipFile(from_sdist).namelist()) == sorted(
        zipfile.ZipFile(from_tree).namelist()
    )
