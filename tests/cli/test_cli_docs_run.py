"""The commands and code of README.md and docs/ run as shown, with the output they show.

Each document's own `synapse serve` line is started (one per module where documents share
it) on free loopback ports put in place of the document's; its other lines run through
`bash` against it. Synopses (`PATH`, `URL`, `[...]` placeholders) are flag-checked by
tests/test_docs.py instead; docs/cli.md's walkthrough runs in test_cli_docs_walkthrough.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import queue
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from docskit import Shell, block, document, lines, run_block, shell, starting

from synapse.cli.options import PORT

CLI = document("cli.md")
#: How the documents make the secret their peers share (never on the command line).
KEYGEN = "openssl rand -hex 32 > synapse.secret"
A2A = document("a2a.md")

# --- A2A: docs/cli.md's `serve --a2a` and its curl lines; docs/a2a.md's serve and sends ---------


@pytest.fixture(scope="module")
def a2a_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shell]:
    """docs/cli.md's `synapse serve --agent-id agent-e --port 8080 --a2a`."""
    shown = block(CLI, "curl -s")
    with shell(tmp_path_factory.mktemp("a2a"), (8080,)) as sh:
        [serve] = starting(shown, "synapse serve")
        sh.background(serve)
        yield sh


def test_the_curl_lines_of_cli_md_get_the_card_and_run_a_task(a2a_agent: Shell) -> None:
    card_line, send_line = starting(block(CLI, "curl -s"), "curl")
    card = a2a_agent.run(card_line)
    assert card.returncode == 0, card.stderr
    assert json.loads(card.stdout)["name"] == "agent-e"
    sent = a2a_agent.run(send_line)
    assert sent.returncode == 0, sent.stderr
    task = json.loads(sent.stdout)["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    assert task["metadata"]["taskType"] == "echo"


def test_the_send_a2a_transcript_of_cli_md_is_what_it_prints(a2a_agent: Shell) -> None:
    shown = CLI.split("$ synapse send --a2a-agent", 1)[1].split("\n```", 1)[0]
    command, *printed = ("synapse send --a2a-agent" + shown).splitlines()
    done = a2a_agent.run(command)
    assert done.returncode == 0, done.stderr
    out = (done.stdout + done.stderr).splitlines()
    for expected in printed:
        # A word with "…" in it (a task id) stands for any word.
        words = [re.escape(w) if "…" not in w else r"\S+" for w in expected.split(" ")]
        pattern = a2a_agent.ported(" ".join(words))
        assert any(re.fullmatch(pattern, line) for line in out), (expected, out)


@pytest.fixture(scope="module")
def a2a_agent_with_token(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shell]:
    """docs/a2a.md's `synapse serve ... --a2a --a2a-token "$TOKEN=alice" ...`."""
    shown = block(A2A, "--a2a-push-allow")
    token = "a-token-of-the-docs-0123456789"
    with shell(tmp_path_factory.mktemp("a2a-token"), (8080,), {"TOKEN": token}) as sh:
        [serve] = starting(shown, "synapse serve")
        assert "--secret-file push.secret" in serve.command
        sh.run(KEYGEN.replace("synapse.secret", "push.secret"))
        sh.background(serve)
        yield sh


def test_the_send_lines_of_a2a_md_run_with_the_exit_status_they_say(
    a2a_agent_with_token: Shell,
) -> None:
    echo, style, rejected = lines(block(A2A, "synapse send --a2a-agent"))
    done = a2a_agent_with_token.run(echo)
    assert (done.returncode, done.stdout.splitlines()[-1]) == (0, "hello"), done.stderr
    done = a2a_agent_with_token.run(style)
    assert done.returncode == 0, done.stderr
    assert "modern" in done.stdout
    assert rejected.comment == "exit 1"
    done = a2a_agent_with_token.run(rejected)
    assert done.returncode == 1, (done.stdout, done.stderr)
    without = a2a_agent_with_token.run(echo.command.replace(' --a2a-token "$TOKEN"', ""))
    assert without.returncode == 2 and "UNAUTHENTICATED" in without.stderr, without.stderr


def test_the_python_blocks_of_a2a_md_serve_and_call(tmp_path: Path) -> None:
    blocks = [b.split("\n```", 1)[0] for b in A2A.split("```python\n")[1:]]
    serving = blocks[0]  # "Serving"; the client of "Calling A2A agents" calls it
    calling = next(b for b in blocks if '"https://agent.example", token=None' in b)
    with shell(tmp_path, (8080, 50051)) as sh:
        ported = sh.ported(serving)
        # The agent the block calls is the one the block before serves, with its token.
        client = calling.replace(
            '"https://agent.example", token=None',
            f'"http://127.0.0.1:{sh.port(8080)}", token="s3cret-token"',
        )
        assert client != calling

    async def main() -> str:
        import contextlib
        import io

        namespace: dict[str, object] = {"__name__": "docs"}
        await run_block(ported, namespace)
        peer = namespace["peer"]
        try:
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                await run_block(client, namespace)
            return printed.getvalue()
        finally:
            await peer.close()  # type: ignore[attr-defined]

    printed = asyncio.run(main())
    assert printed.startswith("completed TaskResult(output_type='text'"), printed
    assert "modern" in printed


# --- routing: docs/routing.md's Python blocks and `serve --route` (docs/cli.md's too) ----------

ROUTING = document("routing.md")
POOL = """\
[[partner]]
agent_id = "writer-1"
endpoint = "http://127.0.0.1:{port}/synapse/callback"
secret = "writer-1-secret-0123456789abcdef"
"""


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shell]:
    """A pool.toml of one demo peer, `writer-1`, serving; hub at 8000, client at 8100."""
    cwd = tmp_path_factory.mktemp("routing")
    with shell(cwd, (8000, 8100, 8101)) as sh:
        writer = sh.port(8101)
        (cwd / "pool.toml").write_text(POOL.format(port=writer), encoding="utf-8")
        sh.run(KEYGEN)  # the hub's secret with its client
        sh.background(
            f"synapse serve --agent-id writer-1 --port {writer} "
            "--secret writer-1-secret-0123456789abcdef "
            "--peer hub=http://127.0.0.1:8000/synapse/callback"
        )
        yield sh


def test_the_route_command_serves_the_pool(pool: Shell) -> None:
    [serve] = lines(block(ROUTING, "--route pool.toml"))
    assert [serve] == lines(block(CLI, "--route pool.toml"))  # the same line in both
    hub = pool.background(serve, ready="serving_routes")
    try:
        done = pool.run(
            "synapse send --target http://127.0.0.1:8000/synapse/callback --agent-id hub "
            "--as client --secret-file synapse.secret --listen 127.0.0.1:8100 "
            'echo \'{"text": "routed"}\''
        )
        assert (done.returncode, done.stdout.splitlines()[-1:]) == (0, ["routed"]), done.stderr
    finally:
        hub.stop()


def test_the_python_blocks_of_routing_md_run(pool: Shell) -> None:
    starting_block, fan_out = (b.split("\n```", 1)[0] for b in ROUTING.split("```python\n")[1:3])
    namespace: dict[str, object] = {
        "__name__": "docs",
        "CLIENT_URL": pool.ported("http://127.0.0.1:8100/synapse/callback"),
    }

    async def main() -> None:
        import os

        os.chdir(pool.cwd)  # PoolConfig.load("pool.toml")
        await run_block(pool.ported(starting_block), namespace)
        await run_block(fan_out, namespace)

    cwd = Path.cwd()
    try:
        asyncio.run(main())
    finally:
        import os

        os.chdir(cwd)
    from synapse.router import Router

    router = namespace["router"]
    assert isinstance(router, Router)
    assert "translate_all" in router.plans
    assert [p.agent_id for p in namespace["pool"].partner] == ["writer-1"]  # type: ignore[attr-defined]


# --- operations: docs/operations.md's Python block and the console's two serves ---------------

OPERATIONS = document("operations.md")


def get(url: str, token: str | None = None) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_the_python_block_of_operations_md_serves_health_metrics_and_console(
    tmp_path: Path,
) -> None:
    source = block(OPERATIONS, "enable_health(peer)", "python")
    with shell(tmp_path, (8000, 8001)) as sh:
        base = f"http://127.0.0.1:{sh.port(8000)}"
        ported = sh.ported(source)

    async def main() -> dict[str, tuple[int, str]]:
        namespace: dict[str, object] = {"__name__": "docs"}
        await run_block(ported, namespace)
        peer = namespace["peer"]
        try:
            token = "a-long-random-token-for-alice"
            paths = {
                "healthz": ("/healthz", None),
                "metrics": ("/metrics", None),
                "session": ("/console/api/session", token),
                "anonymous": ("/console/api/session", None),
            }
            return {
                name: await asyncio.to_thread(get, base + path, auth)
                for name, (path, auth) in paths.items()
            }
        finally:
            await peer.close()  # type: ignore[attr-defined]

    answers = asyncio.run(main())
    assert answers["healthz"][0] == 200 and "alive" in answers["healthz"][1]
    assert answers["metrics"][0] == 200 and "synapse_" in answers["metrics"][1]
    assert answers["session"][0] == 200 and "alice" in answers["session"][1], answers["session"]
    assert answers["anonymous"][0] == 401, answers["anonymous"]


def test_the_console_lines_of_operations_md_serve_the_console(tmp_path: Path) -> None:
    keygen, executor, requester = lines(block(OPERATIONS, "--console-token"))
    with shell(tmp_path, (8000, 8001)) as sh:
        assert sh.run(keygen).returncode == 0
        sh.background(executor)
        serving = sh.background(requester, ready="serving_console")
        base = f"http://127.0.0.1:{sh.port(8000)}"
        status, page = get(base + "/console")
        assert status == 200 and "<html" in page.lower()
        assert get(base + "/console/api/session")[0] == 401  # the token is needed
        assert "alice" in serving.logged("serving_console")  # the reviewer the token names
        assert get(f"http://127.0.0.1:{sh.port(8001)}/healthz")[0] == 200


# --- the conformance kit: README.md's and docs/conformance.md's lines, and the Python call ------

README = document("README.md")
CONFORMANCE = document("conformance.md")


@pytest.fixture(scope="module")
def conformance_target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shell]:
    shown = block(README, "synapse conformance --target http")
    assert lines(shown) == lines(block(CONFORMANCE, "synapse conformance --target http"))
    with shell(tmp_path_factory.mktemp("conformance"), (8765, 8766)) as sh:
        [keygen] = starting(shown, "openssl rand")
        assert sh.run(keygen).returncode == 0
        [serve] = starting(shown, "synapse serve")
        sh.background(serve)
        yield sh


def test_the_conformance_lines_of_the_readme_pass_against_serve(
    conformance_target: Shell,
) -> None:
    [kit] = starting(block(README, "synapse conformance --target http"), "synapse conformance")
    done = conformance_target.run(kit, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert done.stdout.rstrip().endswith("CONFORMANT"), done.stdout[-500:]


def test_the_python_call_of_conformance_md_runs_the_checks_it_names(
    conformance_target: Shell,
) -> None:
    source = conformance_target.ported(block(CONFORMANCE, "run_conformance(", "python"))
    namespace: dict[str, object] = {"__name__": "docs"}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.chdir(conformance_target.cwd):
        asyncio.run(run_block(source, namespace))
    report = namespace["report"]
    ids = {r.id for r in report.results}  # type: ignore[attr-defined]
    assert "flow.echo" in ids and "rules.no_backwards" in ids and "sig.missing" not in ids
    assert report.ok, printed.getvalue()  # type: ignore[attr-defined]
    assert "flow.echo" in printed.getvalue()


# --- docs/cli.md: the log it shows, caps and ping as printed, the config files ---------------


@pytest.fixture(scope="module")
def executor(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Shell, str]]:
    """docs/cli.md's walkthrough executor (terminal 1), and its log."""
    shown = block(CLI, "# terminal 1: the executor")
    with shell(tmp_path_factory.mktemp("cli"), (8080, 9001)) as sh:
        [keygen] = starting(shown, "openssl rand")
        assert sh.run(keygen).returncode == 0
        [serve] = starting(shown, "synapse serve")
        running = sh.background(serve)
        yield sh, running.logged("listening")


def shown_log(line: str) -> re.Pattern[str]:
    """A log line of the document as a pattern: any time, any value where it shows "…"."""
    _, rest = line.split(" ", 1)
    pattern = re.escape(rest).replace("…", r"\S+")
    return re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z " + pattern)


def test_the_log_lines_cli_md_shows_are_what_serve_writes(executor: tuple[Shell, str]) -> None:
    sh, listening = executor
    shown = CLI.split("[info     ] listening", 1)[0].rsplit("```\n", 1)[1]
    listening_shown, transition_shown = CLI.split(shown, 1)[1].split("\n```", 1)[0].splitlines()
    listening_shown = shown + listening_shown.removeprefix(shown)
    assert shown_log(sh.ported(listening_shown)).fullmatch(listening.rstrip()), listening
    assert "[synapse.p2p] from_state=" in transition_shown


def test_caps_and_ping_print_what_cli_md_shows(executor: tuple[Shell, str]) -> None:
    sh, _ = executor
    transcript = CLI.split("$ synapse caps ", 1)[1].split("\n```", 1)[0]
    caps_line, *rest = ("synapse caps " + transcript).splitlines()
    ping_at = next(i for i, line in enumerate(rest) if line.startswith("$ synapse ping"))
    caps_shown, ping_shown = rest[:ping_at], rest[ping_at + 1 :]
    done = sh.run(caps_line)
    assert done.returncode == 0, done.stderr
    printed = done.stdout.splitlines()
    assert printed[0].split() == caps_shown[0].split()
    assert caps_shown[1] in printed and caps_shown[-1] == printed[-1]
    ping = sh.run(caps_line.replace("synapse caps", "synapse ping"))  # `...`: the same flags
    assert ping.returncode == 0, ping.stderr
    pattern = re.escape(ping_shown[0]).replace(r"1\.9", r"[\d.]+")
    assert re.fullmatch(pattern, ping.stdout.strip()), (ping_shown, ping.stdout)


def test_the_config_files_of_cli_md_are_taken(tmp_path: Path) -> None:
    from synapse.cli.main import build_parser
    from synapse.cli.settings import Settings

    exec_toml = block(CLI, "# exec.toml", "toml")
    (tmp_path / "exec.toml").write_text(exec_toml, encoding="utf-8")
    (tmp_path / "agent-q.secrets").write_text("q-newest\nq-previous\n", encoding="utf-8")
    args = build_parser().parse_args(["serve", "--config", str(tmp_path / "exec.toml")])
    settings = Settings.load(args, {})
    assert settings.get(PORT) == 8080
    assert settings.p2p_config().max_concurrent_tasks == 20
    assert settings.http_limits().max_connections == 1024

    r_toml = block(CLI, "# r.toml", "toml")
    command = r_toml.splitlines()[0].split("`")[1]
    with shell(tmp_path, (8080, 9001)) as sh:
        (tmp_path / "r.toml").write_text(sh.ported(r_toml), encoding="utf-8")
        sh.run(KEYGEN)
        sh.background(
            "synapse serve --agent-id agent-e --port 8080 --secret-file synapse.secret "
            "--peer agent-r=http://127.0.0.1:9001/synapse/callback"
        )
        done = sh.run(command)
    assert (done.returncode, done.stdout.splitlines()[-1:]) == (0, ["hi"]), done.stderr


# --- README.md's "Command line" -------------------------------------------------------------


def test_the_command_line_block_of_the_readme_runs(tmp_path: Path) -> None:
    shown = block(README, "synapse serve --agent-id agent-e --port 8001")
    keygen, serve, send, *more = lines(shown)
    assert keygen.command == KEYGEN
    listed = re.split(r"\s{3,}", more[0].command)
    assert [c.split()[:2] for c in listed] == [
        ["synapse", "caps"], ["synapse", "ping"], ["synapse", "schema"], ["synapse", "outbox"],
    ]  # fmt: skip
    with shell(tmp_path, (8001, 8002)) as sh:
        assert sh.run(keygen).returncode == 0
        sh.background(serve)
        done = sh.run(send, input="现代\n")  # it asks for the style at the terminal
        assert done.returncode == 0, done.stderr
        assert "a poem about spring" in done.stdout and "现代" in done.stdout, done.stdout
        flags = send.command.split("synapse send", 1)[1].rsplit(" text_generation", 1)[0]
        for command in listed:
            command = command.replace(" …", flags)  # "…": the flags of `send` above
            done = sh.run(command)
            assert done.returncode == 0, (command, done.stderr)
            assert done.stdout, command
        assert (tmp_path / "synapse.sqlite").exists()


# --- docs/conformance.md's pytest example, in a project of its own -----------------------------


def test_the_pytest_example_of_conformance_md_passes(tmp_path: Path) -> None:
    """Its handler module and its tests, as the document shows them."""
    import subprocess
    import sys

    (tmp_path / "my_agent.py").write_text(block(CONFORMANCE, "# my_agent.py", "python"), "utf-8")
    example = block(CONFORMANCE, "synapse_conformance(", "python")
    (tmp_path / "test_my_agent.py").write_text(example, encoding="utf-8")
    (tmp_path / "pytest.ini").write_text("[pytest]\npythonpath = .\n", encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "-p", "no:randomly"],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "2 passed" in done.stdout, done.stdout[-2000:]
    assert "p2p:task_complete" in done.stdout  # what its loop prints, event by event


# --- docs/performance.md: what an embedding program may choose, around the quickstart -----------

PERFORMANCE = document("performance.md")


def test_the_choices_of_performance_md_run_around_a_program(tmp_path: Path) -> None:
    import subprocess
    import sys

    logging_block, loop_block, gc_block = (
        b.split("\n```", 1)[0] for b in PERFORMANCE.split("```python\n")[1:4]
    )
    quickstart = Path(__file__).resolve().parents[2] / "examples" / "quickstart.py"
    # The block's `main` stands for the program's own: here the quickstart's.
    placeholder = "async def main() -> None:\n    ...  # your program"
    assert placeholder in loop_block
    loop_block = loop_block.replace(placeholder, "async def _shown() -> None:\n    ...  #")
    program = "\n".join(
        [
            logging_block,
            gc_block,
            "import runpy",
            f"main = runpy.run_path({str(quickstart)!r})['main']",
            loop_block,
        ]
    )
    (tmp_path / "embedding.py").write_text(program, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(tmp_path / "embedding.py")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(done.stdout.splitlines()) == 7  # the program's own prints, nothing of ours
    assert "message_in" in done.stderr and "transition" in done.stderr  # debug, as it says


# --- docs/benchmarks.md: the commands exist (they run by hand, for minutes) --------------------


@pytest.mark.parametrize(
    "command",
    [
        line.command
        for line in lines(block(document("benchmarks.md"), "python -m benchmarks.codec\n", ""))
    ],
)
def test_the_benchmark_commands_exist(command: str) -> None:
    import subprocess
    import sys

    module = command.split()[2]
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=root,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout


# --- docs/deploy.md: migrate, then three replicas on one PostgreSQL database -------------------


def test_the_replicas_of_deploy_md_start_on_one_database(tmp_path: Path, pg_url: str) -> None:
    """The block as shown but for where things are: its database is a test database, its
    host 127.0.0.1, its ports free ones (`pip install` is what made this environment)."""
    import signal
    import subprocess
    import urllib.request

    shown = block(document("deploy.md"), "synapse migrate")
    install, migrate = shown.splitlines()[:2]
    assert install == "pip install 'synapse-agent-p2p[postgres]'"
    shown_url = migrate.split("--store ", 1)[1].split()[0]
    loop = shown.split("\n", 2)[2]
    with shell(tmp_path, (8001, 8002, 8003)) as sh:
        assert sh.run(KEYGEN.replace("synapse.secret", "agent-e.secret")).returncode == 0
        done = sh.run(migrate.replace(shown_url, pg_url))
        assert done.returncode == 0, done.stderr
        script = sh.ported(loop.replace(shown_url, pg_url).replace("10.0.0.5", "127.0.0.1"))
        process = subprocess.Popen(
            # `jobs -p` in this shell (not a subshell): the three PIDs, to stop them by.
            ["bash", "-c", script + "\njobs -p > pids\necho started\nwait\n"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=sh.env,
            cwd=tmp_path,
        )
        assert process.stdout is not None and process.stderr is not None
        assert process.stdout.readline() == "started\n"
        pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
        try:
            assert len(pids) == 3
            # Each replica's first line, once its port answers. Read in a thread, so that a
            # replica that exits (the other two keep the pipe open) fails the test in a
            # bounded time instead of leaving it waiting on a line that never comes.
            said: queue.Queue[str] = queue.Queue()
            stderr = process.stderr
            threading.Thread(
                target=lambda: [said.put(line) for line in stderr], daemon=True
            ).start()
            deadline, seen, listening = time.monotonic() + 60, [], 0
            while listening < 3:
                try:
                    line = said.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    raise AssertionError(f"not three replicas listening in 60 s: {seen}") from None
                seen.append(line)
                listening += "listening" in line
            for port in sh.ports.values():
                url = f"http://127.0.0.1:{port}/healthz"
                with urllib.request.urlopen(url, timeout=10) as response:
                    assert response.status == 200
        finally:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                process.wait(5)


def test_the_nginx_location_of_deploy_md_is_the_tested_one() -> None:
    """The cluster tests run nginx with tests/lbserver.py's block: the same `location /`
    directives as docs/deploy.md shows, but for the read timeout."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from lbserver import HTTP_BLOCK

    def directives(config: str) -> list[str]:
        location = config.split("location / {", 1)[1].split("}", 1)[0]
        found = [line.strip() for line in location.splitlines()]
        return [d for d in found if d and not d.startswith("#") and "read_timeout" not in d]

    shown = block(document("deploy.md"), "upstream synapse_replicas", "nginx")
    assert directives(shown) == directives(HTTP_BLOCK.format(servers="", port=0, read_timeout=5))
