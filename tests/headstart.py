"""A head start for the suite's long CPU-bound checks: the model checker's CI bounds, the
simulation's CI seeds and the library's strict type check need nothing from any other test,
so once collection is done they start in a process of their own, one after the other, while
the rest of the suite (mostly waiting on sockets and other processes) runs beside them. The
test that asserts each outcome waits for it (`outcome`), or runs it there and then when the
run did not start it (a run of that test alone starts it too).

One worker, so that the head start takes at most one of the machine's cores; jobs are
functions of this module (a spawned worker imports them by name).
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


# --- the jobs ------------------------------------------------------------------------------


def model_ci() -> dict[str, Any]:
    """Every CI bound of the model checker (or as `SYNAPSE_MODEL` says), one after the
    other: bound name → `Result`."""
    from synapse.model import explore
    from synapse.model.bounds import CI, LARGER, from_environment

    chosen = from_environment()
    return {name: explore(bounds) for name, bounds in (CI if chosen == LARGER else chosen).items()}


def simulation_seeds(count: int) -> dict[str, Any]:
    """`count` seeds of the simulation: what failed (each described with how to replay it),
    virtual seconds, POSTs answered and the wall time."""
    import time

    from synapse.simulation import simulate

    started = time.monotonic()
    failed: list[str] = []
    virtual = 0.0
    deliveries = 0
    for seed in range(count):
        outcome = simulate(seed)
        virtual += outcome.virtual_seconds
        deliveries += outcome.deliveries
        if not outcome.ok:
            failed.append(
                "\n".join(
                    [outcome.scenario.describe(), *outcome.violations, outcome.replay_command()]
                )
            )
    return {
        "failed": failed,
        "virtual": virtual,
        "deliveries": deliveries,
        "seconds": time.monotonic() - started,
    }


def replica_seeds(count: int) -> dict[str, Any]:
    """`count` seeds of the simulation with replicas, on a PostgreSQL server of the job's
    own (started and stopped here): what failed, POSTs answered, virtual and wall time; or
    what to install when the server binaries are missing."""
    import time

    import pgserver

    if pgserver.find_binary("initdb") is None or pgserver.find_binary("pg_ctl") is None:
        return {"missing": pgserver.INSTALL_HINT}
    from synapse.simulation.replicas import simulate_replicas
    from synapse.simulation.shared import Databases

    started = time.monotonic()
    server = pgserver.start_server()
    try:
        databases = Databases(server.url(), prefix="headstart_replicas")
        failed: list[str] = []
        virtual = 0.0
        deliveries = 0
        for seed in range(count):
            outcome = simulate_replicas(seed, databases)
            virtual += outcome.virtual_seconds
            deliveries += outcome.deliveries
            if not outcome.ok:
                failed.append("\n".join([outcome.scenario.describe(), *outcome.violations]))
        databases.close()
    finally:
        pgserver.stop_server(server)
    return {
        "failed": failed,
        "virtual": virtual,
        "deliveries": deliveries,
        "seconds": time.monotonic() - started,
    }


def doc_blocks_type_check() -> dict[str, Any]:
    """The README's and the guides' Python blocks, the examples and a handler, type-checked
    with `mypy --strict` in a folder outside the repository (`test_packaging.py`)."""
    import tempfile

    import test_packaging

    with tempfile.TemporaryDirectory(prefix="synapse-docblocks-") as tmp:
        checked, done = test_packaging.type_check_from_outside(Path(tmp))
        return {"checked": checked, "returncode": done.returncode, "output": done.stdout[-6000:]}


def module_run(*args: str, timeout: float = 600) -> tuple[int, str]:
    """`python -m ARGS` in the repository: its exit status and its output."""
    done = subprocess.run(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    return done.returncode, done.stdout + done.stderr


def wheel_install(extras: list[str], probe: str) -> dict[str, Any]:
    """A wheel built from the checkout, installed with `extras` in a new virtual environment
    outside the repository: its files, what `synapse --version` says and what `probe` (a
    Python line run there) prints. Raises with the failing command's output."""
    import tempfile
    import zipfile

    def run(*argv: str | Path, cwd: Path) -> str:
        done = subprocess.run(
            [str(a) for a in argv],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=900,
            stdin=subprocess.DEVNULL,
            env={k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}},
        )
        if done.returncode != 0:
            raise AssertionError((done.stdout + done.stderr)[-4000:])
        return done.stdout

    with tempfile.TemporaryDirectory(prefix="synapse-wheel-") as tmp:
        here = Path(tmp)
        wheels = here / "wheels"
        run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", wheels, ROOT, cwd=here)
        (wheel,) = wheels.glob("synapse_agent_p2p-*.whl")
        venv = here / "venv"
        run(sys.executable, "-m", "venv", venv, cwd=here)
        python = venv / "bin" / "python"
        run(python, "-m", "pip", "install", "-q", f"{wheel}[{','.join(extras)}]", cwd=here)
        version = run(venv / "bin" / "synapse", "--version", cwd=here)
        where, installed = run(python, "-c", probe, cwd=here).split()
        return {
            "names": zipfile.ZipFile(wheel).namelist(),
            "version": version,
            "inside": Path(where).is_relative_to(venv),
            "installed": installed,
        }


# --- starting them, and waiting for them ---------------------------------------------------

#: Job name → (the test that asserts its outcome, the job, its arguments).
JOBS: dict[str, tuple[str, Callable[..., Any], tuple[Any, ...]]] = {}
_pool: ProcessPoolExecutor | None = None
_started: dict[str, Future[Any]] = {}


def job(name: str, test: str, function: Callable[..., Any], *args: Any) -> None:
    """Give `test` (the end of its node id: `file.py::test_name`) a head start: `function`
    of this module, with `args`."""
    JOBS[name] = (test, function, args)


#: How many seeds CI simulates (`SYNAPSE_SIM_SEEDS` for more: `python -m synapse.simulation
#: --seeds N` is the same run outside pytest).
SIMULATION_SEEDS = int(os.environ.get("SYNAPSE_SIM_SEEDS", "300"))

# In the order they run: the longest first, each well before its test comes.
job("model", "model/test_model_checker.py::test_every_state_within_the_ci_bounds_holds", model_ci)
job(
    "simulation",
    "simulation/test_simulation.py::test_the_ci_seeds_hold",
    simulation_seeds,
    SIMULATION_SEEDS,
)
#: The extras a user installs (the others are the project's own: tests, benchmarks).
USER_EXTRAS = ["postgres", "grpc", "otel", "security", "speed", "docs"]
#: What the installed wheel must import, and where from.
WHEEL_PROBE = (
    "import synapse, synapse.store.postgres, synapse.a2a.grpc_proto, synapse.ops.tracing;"
    "import joserfc, uvloop, mkdocs, importlib.metadata as m;"
    "print(synapse.__file__, m.version('synapse-agent-p2p'))"
)
#: How many seeds of the simulation with replicas CI runs (`python -m synapse.simulation
#: --replicas URL --seeds N` runs more by hand).
REPLICA_SEEDS = int(os.environ.get("SYNAPSE_SIM_REPLICA_SEEDS", "12"))
job(
    "replicas",
    "simulation/test_simulation_replicas.py::test_the_ci_replica_seeds_hold",
    replica_seeds,
    REPLICA_SEEDS,
)
job(
    "docblocks",
    "test_packaging.py::test_a_handler_the_examples_and_every_doc_block_type_check_from_outside",
    doc_blocks_type_check,
)
job(
    "wheel",
    "test_packaging.py::test_the_wheel_installs_outside_the_repository_with_every_extra",
    wheel_install,
    USER_EXTRAS,
    WHEEL_PROBE,
)
job(
    "mypy",
    "test_quality.py::test_the_library_type_checks_strictly",
    module_run,
    "mypy",
    "--strict",
    "synapse",
)


def start(node_ids: Iterable[str]) -> None:
    """Start, in order, the jobs whose tests are among `node_ids` (the run's tests)."""
    global _pool
    chosen = list(node_ids)
    for name, (test, function, args) in JOBS.items():
        if name in _started or not any(node.endswith(test) for node in chosen):
            continue
        if _pool is None:
            # Spawned, not forked: the test process has threads by now.
            _pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        _started[name] = _pool.submit(function, *args)


def outcome(name: str) -> Any:
    """The outcome of job `name`: awaited if the run started it, else run now, here."""
    started = _started.pop(name, None)
    if started is not None:
        return started.result()
    _, function, args = JOBS[name]
    return function(*args)


def stop() -> None:
    global _pool
    if _pool is not None:
        _pool.shutdown(wait=False, cancel_futures=True)
        _pool = None
    _started.clear()
