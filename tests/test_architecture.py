"""The import rules of docs/architecture.md, enforced by reading every module of synapse/."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "synapse"

IO_LIBRARIES = {"asyncio", "structlog", "aiohttp"}

#: layer (a folder of the package) → the layers it may import (besides itself). The store sits
#: below the runtime: it owns its interfaces and knows nothing of what drives it.
ALLOWED: dict[str, set[str]] = {
    "types": set(),
    "p2p": {"types"},
    "logs": set(),
    "store": {"types", "p2p", "logs"},
    "runtime": {"types", "p2p", "store", "logs"},
    # Agents of other frameworks as task handlers: they need the handler's context only.
    "frameworks": {"types", "p2p", "runtime", "logs"},
    "transport": {"types", "p2p", "store", "runtime", "frameworks", "logs"},
    "demo": {"types", "p2p", "runtime", "logs"},
    "a2a": {"types", "p2p", "store", "runtime", "transport", "logs", "top"},
    "conformance": {"types", "p2p", "store", "runtime", "transport", "logs"},
    # The model checker explores the sans-IO core only; the simulation runs whole peers.
    "model": {"types", "p2p"},
    "simulation": {
        "types",
        "p2p",
        "store",
        "runtime",
        "transport",
        "humans",
        "ops",
        "router",
        "model",
        "logs",
    },
    "ops": {"types", "p2p", "store", "runtime", "transport", "logs", "top"},
    "router": {"types", "p2p", "store", "runtime", "transport", "a2a", "logs", "top"},
    # MCP in front of Synapse peers and A2A agents, and MCP tools as a handler.
    "mcp": {"types", "p2p", "store", "runtime", "transport", "a2a", "logs", "top"},
    # People told of questions, deciding from links: on the peer, beside the console.
    "humans": {"types", "p2p", "store", "runtime", "transport", "ops", "logs", "top"},
    "cli": {
        "types",
        "p2p",
        "store",
        "runtime",
        "frameworks",
        "transport",
        "demo",
        "a2a",
        "conformance",
        "ops",
        "router",
        "mcp",
        "humans",
        "logs",
        "top",
    },
    "top": {"types", "p2p", "store", "runtime", "transport", "demo", "a2a"},
    "distribution": set(),
}


def layer_of_module(name: str) -> str:
    """`synapse.p2p.engine` → "p2p" (its folder); `synapse` → "top"."""
    parts = name.split(".")
    if parts[0] != "synapse":
        raise ValueError(name)
    if len(parts) == 1:
        return "top"
    if parts[1] == "_distribution":
        return "distribution"  # the package's name on the index: imports nothing of synapse
    return parts[1]


def test_every_folder_is_a_layer() -> None:
    """A new folder (or top-level module) of the package gets its place in the rules above."""
    found = {layer_of_module(module_name(path)) for path in PACKAGE.rglob("*.py")}
    assert found <= set(ALLOWED), found - set(ALLOWED)


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_module(name: str) -> bool:
    """Whether `synapse.a.b` names a module or package of the tree (not a name inside one)."""
    if name.split(".")[0] != "synapse":
        return False
    rel = Path(*name.split(".")[1:]) if "." in name else Path()
    return (PACKAGE / rel).with_suffix(".py").is_file() or (PACKAGE / rel / "__init__.py").is_file()


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every absolute import anywhere in `path`: at the top, under
    TYPE_CHECKING, and deferred into a function. `from synapse.a2a import wire` imports the
    module `synapse.a2a.wire` (and its package's `__init__` first, which is not an edge:
    a package importing its own submodules makes no circle with them)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.append((node.lineno, submodule if is_module(submodule) else node.module))
    return found


def runtime_imports(path: Path) -> list[tuple[int, str]]:
    """Imports that run when the module is imported: top level, outside `if TYPE_CHECKING`."""
    found: list[tuple[int, str]] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                found.extend((node.lineno, alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.append((node.lineno, node.module))
            elif isinstance(node, ast.If):
                if "TYPE_CHECKING" not in ast.unparse(node.test):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)

    visit(ast.parse(path.read_text("utf-8")).body)
    return found


MODULES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p))
def test_imports_follow_the_layers(path: Path) -> None:
    own = layer_of_module(module_name(path))
    allowed = ALLOWED[own] | {"distribution"}  # every layer may name the package
    wrong = [
        f"{module_name(path)}:{line} imports {name} ({layer_of_module(name)})"
        for line, name in imports(path)
        if name.split(".")[0] == "synapse"
        and layer_of_module(name) != own
        and layer_of_module(name) not in allowed
    ]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("path", sorted((PACKAGE / "p2p").glob("*.py")), ids=lambda p: p.stem)
def test_the_core_imports_no_io_library(path: Path) -> None:
    """Every module of the sans-IO core, its package included: no asyncio, structlog, aiohttp
    where the engine runs (the model checker and the property tests run it without a loop)."""
    wrong = [name for _, name in runtime_imports(path) if name.split(".")[0] in IO_LIBRARIES]
    assert not wrong, wrong


def test_the_library_never_imports_the_cli() -> None:
    offenders = [
        module_name(path)
        for path in MODULES
        if layer_of_module(module_name(path)) != "cli"
        and any(name.startswith("synapse.cli") for _, name in imports(path))
    ]
    assert offenders == []


#: The modules above the store that may name the PostgreSQL backend itself: `synapse migrate`
#: runs its migrations, and the simulation runs the shipped backend's own statements on a real
#: server (`synapse.simulation.shared`). Replicas ask for the interface
#: (`synapse.store.shared.SharedStore`).
POSTGRES_BY_NAME = {"synapse.cli.migrate", "synapse.simulation.shared"}


def test_replicas_are_wired_to_the_shared_store_interface_not_to_postgresql() -> None:
    offenders = [
        f"{module_name(path)}:{line}"
        for path in MODULES
        if layer_of_module(module_name(path)) != "store"
        and module_name(path) not in POSTGRES_BY_NAME
        for line, name in imports(path)
        if name == "synapse.store.postgres"
    ]
    assert offenders == []


def test_the_rules_catch_a_wrong_import(tmp_path: Path) -> None:
    """The scan itself: a core module importing the runtime, or the transport the CLI, fails."""
    bad = tmp_path / "bad.py"
    bad.write_text("from synapse.runtime.protocol import P2PProtocol\nimport synapse.cli.main\n")
    layers = {layer_of_module(name) for _, name in imports(bad)}
    assert layers == {"runtime", "cli"}
    assert "runtime" not in ALLOWED["p2p"]
    assert "runtime" not in ALLOWED["store"]
    assert "cli" not in ALLOWED["transport"]


def test_the_document_names_every_layer() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text("utf-8")
    for layer in sorted(set(ALLOWED) - {"top", "distribution"}):
        assert f"| {layer} |" in doc, layer


def import_graph() -> dict[str, set[str]]:
    names = {module_name(p) for p in MODULES}
    return {
        module_name(p): {n for _, n in imports(p) if n in names and n != module_name(p)}
        for p in MODULES
    }


def cycles_of(graph: dict[str, set[str]]) -> set[tuple[str, ...]]:
    """Every cycle of modules (counting imports under TYPE_CHECKING), as a sorted tuple."""
    found: set[tuple[str, ...]] = set()

    def walk(start: str, node: str, path: list[str]) -> None:
        for nxt in graph.get(node, ()):
            if nxt == start:
                found.add(tuple(sorted(path)))
            elif nxt not in path and len(path) < 8:
                walk(start, nxt, [*path, nxt])

    for module in graph:
        walk(module, module, [module])
    return found


def test_no_module_imports_one_that_imports_it() -> None:
    """No circle of imports anywhere in the package: not through an import deferred into a
    function, nor one made for type checking only (each hides a circle, it does not break
    it). Two modules that need each other share a third, or one sees the other through a
    protocol of its own (`synapse.a2a.server.host.BindingHost`,
    `synapse.a2a.server.push.PushTargets`, `synapse.router.fanout.PartRouter`)."""
    assert cycles_of(import_graph()) == set()


def test_the_circle_scan_sees_deferred_and_submodule_imports(tmp_path: Path) -> None:
    """The scan itself: an import inside a function is an edge, and `from synapse.a2a import
    wire` is an edge to the module `synapse.a2a.wire`, not to the package."""
    deferred = tmp_path / "deferred.py"
    deferred.write_text(
        "def f():\n    from synapse.a2a.server.app import A2AServer\nfrom synapse.a2a import wire\n"
    )
    assert {name for _, name in imports(deferred)} == {"synapse.a2a.server.app", "synapse.a2a.wire"}
    assert cycles_of({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == {("a", "b", "c")}
    assert cycles_of({"a": {"b"}, "b": set()}) == set()


def engine_reads(path: Path) -> list[int]:
    """Lines of `path` that read an attribute named `engine` (`runtime.engine.tasks`, say)."""
    tree = ast.parse(path.read_text("utf-8"))
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "engine"]


#: Layers that may hold an `Engine`: the core itself, the runtime that drives it, and the
#: model checker, which explores engines (the layers above see the runtime's `RuntimeView`).
ENGINE_HOLDERS = {"types", "p2p", "runtime", "model"}


@pytest.mark.parametrize(
    "path",
    [p for p in MODULES if layer_of_module(module_name(p)) not in ENGINE_HOLDERS],
    ids=lambda p: module_name(p),
)
def test_nothing_above_the_runtime_reads_the_engine(path: Path) -> None:
    """Store, transport, A2A, router, ops, demo, conformance, simulation and CLI talk to the
    runtime (`P2PProtocol`): what they read of tasks comes from its read-only `view`, what
    they change goes through its methods, never through the engine behind it."""
    lines = engine_reads(path)
    assert not lines, f"{module_name(path)} reads .engine at lines {lines}"


def test_the_engine_scan_finds_a_read(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f(server):\n    return server.protocol.engine.tasks\n")
    assert engine_reads(bad) == [2]


#: The most lines a module of the package may have: one a person can hold in mind.
MAX_MODULE_LINES = 800


def test_no_module_is_longer_than_a_person_can_hold() -> None:
    long = {
        module_name(path): n
        for path in MODULES
        if (n := len(path.read_text("utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}, f"split these (at most {MAX_MODULE_LINES} lines each): {long}"


#: The most lines a function of the command line may have: its flags come from the settings
#: table (`synapse.cli.options`), one line a setting, not a block of `add_argument` each.
MAX_CLI_FUNCTION_LINES = 150


def test_no_function_of_the_command_line_is_longer_than_its_bound() -> None:
    long = {
        f"{module_name(path)}.{node.name}": size
        for path in MODULES
        if module_name(path).startswith("synapse.cli.")
        for node in ast.walk(ast.parse(path.read_text("utf-8")))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (size := (node.end_lineno or node.lineno) - node.lineno + 1) > MAX_CLI_FUNCTION_LINES
    }
    assert long == {}, f"split these (at most {MAX_CLI_FUNCTION_LINES} lines each): {long}"


#: Receivers whose private members a module may read: the object itself, its class, and a
#: twin of the same class being made or explored (`Engine.clone`, `TimerQueue.copy`, the
#: model checker's worlds).
OWN_RECEIVERS = {"self", "cls", "twin", "world"}


def private_reads(path: Path) -> list[str]:
    """`other._member` reads in `path`: a private member of an object of another class, or
    of a module of the package. (Private names of the standard library are not ours.)"""
    tree = ast.parse(path.read_text("utf-8"))
    own_classes = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")):
            continue
        if node.attr.startswith("__"):
            continue
        receiver = node.value
        if isinstance(receiver, ast.Call) and ast.unparse(receiver.func) == "super":
            continue
        if isinstance(receiver, ast.Name) and (
            receiver.id in OWN_RECEIVERS
            or receiver.id in own_classes
            # Standard library names with a leading underscore that are documented API
            # (`argparse._ArgumentGroup`, `os._exit` …).
            or receiver.id in {"argparse", "logging", "os"}
        ):
            continue
        if ast.unparse(receiver) == "self._logger":  # structlog's bound logger's `_log`
            continue
        found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p))
def test_no_private_member_is_used_across_objects(path: Path) -> None:
    assert private_reads(path) == []


def test_the_private_scan_finds_a_read(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f(server):\n    return server._rebuild(1), self._ok\n")
    assert private_reads(bad) == ["2: server._rebuild"]


def a2a_side(name: str) -> str | None:
    """`synapse.a2a.server.push` → "server"; `synapse.a2a.client.core` → "client"; the
    modules both share (`synapse.a2a.wire`, `mapping`, `card_signing`, …) → "shared"."""
    parts = name.split(".")
    if parts[:2] != ["synapse", "a2a"] or len(parts) == 2:
        return None  # not A2A, or the package's facade (`from synapse.a2a import …`)
    return parts[2] if parts[2] in {"client", "server"} else "shared"


def test_the_a2a_facade_loads_neither_side_when_imported() -> None:
    """`synapse/a2a/__init__.py` runs before any of its submodules (`import
    synapse.a2a.client` runs it first): what it imports when it runs is shared only; each
    side's names are loaded on first use."""
    facade = PACKAGE / "a2a" / "__init__.py"
    sides = [f"{line}: {name}" for line, name in runtime_imports(facade) if a2a_side(name)]
    assert all(a2a_side(entry.split(": ")[1]) == "shared" for entry in sides), sides


def test_importing_the_a2a_client_loads_no_server() -> None:
    """Measured in a fresh interpreter: the client, and `from synapse.a2a import A2AClient`,
    load no module of the A2A server and not `aiohttp.web`."""
    probe = (
        "import sys\n"
        "import synapse.a2a.client\n"
        "from synapse.a2a import A2AClient\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('synapse.a2a.server'))\n"
        "print(loaded, 'aiohttp.web' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[] False", done.stdout


def test_a_peer_loads_no_agent_framework_until_it_serves_one() -> None:
    """Measured in a fresh interpreter: `Peer` and the frameworks' front door import none of
    Pydantic AI, LangGraph or the OpenAI Agents SDK (each an optional extra)."""
    probe = (
        "import sys\n"
        "from synapse import Peer\n"
        "import synapse.frameworks\n"
        "roots = ('pydantic_ai', 'langgraph', 'langchain_core', 'agents', 'openai')\n"
        "print(sorted(m for m in sys.modules if m.partition('.')[0] in roots))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout


@pytest.mark.parametrize(
    "path",
    [p for p in MODULES if a2a_side(module_name(p)) is not None],
    ids=lambda p: module_name(p),
)
def test_the_a2a_client_and_server_stand_apart(path: Path) -> None:
    """The A2A client imports nothing of the server, nor the server of the client; what both
    need (wire types, the mapping to Synapse tasks, card signing, route table) is shared and
    imports neither."""
    own = a2a_side(module_name(path))
    forbidden = {"shared": {"client", "server"}, "client": {"server"}, "server": {"client"}}[own]
    wrong = [f"{line}: {name}" for line, name in imports(path) if a2a_side(name) in forbidden]
    assert not wrong, wrong
