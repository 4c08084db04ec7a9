"""docs/handlers.md, "Writing a handler": its two files run as shown and print what it says,
and its handler module is one `synapse serve --handler` can load."""

from __future__ import annotations

import re
import select
import shlex
import subprocess
import sys
from pathlib import Path

from benchmarks.ports import free_port

DOC = (Path(__file__).resolve().parent.parent / "docs" / "handlers.md").read_text("utf-8")


def _blocks(fence: str) -> list[str]:
    return [part.split("\n```", 1)[0] for part in DOC.split(f"```{fence}\n")[1:]]


def _files(tmp_path: Path) -> dict[str, Path]:
    """The guide's Python blocks, each written to the file its first line names."""
    written = {}
    for block in _blocks("python"):
        name = block.splitlines()[0].removeprefix("# ")
        assert name.endswith(".py"), block.splitlines()[0]
        (tmp_path / name).write_text(block + "\n", encoding="utf-8")
        written[name] = tmp_path / name
    assert set(written) == {"studio.py", "run_studio.py"}
    return written


def test_the_guide_runs_and_prints_what_it_shows(tmp_path: Path) -> None:
    files = _files(tmp_path)
    done = subprocess.run(
        [sys.executable, str(files["run_studio.py"])],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    shown = DOC.split("It prints:\n\n```\n", 1)[1].split("\n```", 1)[0]
    assert done.stdout.strip() == shown.strip()


def test_serve_runs_the_guides_handler_module(tmp_path: Path) -> None:
    """`--handler studio:Studio` imports the module without running anything of its own
    (a module-level `asyncio.run` would start a second program inside serve)."""
    _files(tmp_path)
    serve = _start(
        [
            sys.executable,
            "-m",
            "synapse.cli.main",
            "serve",
            "--agent-id",
            "studio",
            "--port",
            "0",
            "--secret",
            "s3cret-s3cret-s3cret-s3cret-s3cret",
            "--peer",
            "client=http://127.0.0.1:9/synapse/callback",
            "--handler",
            "studio:Studio",
        ],
        cwd=tmp_path,
    )
    try:
        _wait_listening(serve)
    finally:
        serve.terminate()
        serve.wait(10)


def test_the_second_terminal_of_the_guide_sends_the_studio_a_poem(tmp_path: Path) -> None:
    """ "From a second terminal": its serve and send lines, on free ports, as shown."""
    _files(tmp_path)
    block = DOC.split("# terminal 1: the studio\n", 1)[1].split("\n```", 1)[0]
    joined = re.sub(r"\\\n\s*", " ", block)
    keygen, serve_line, send_line = [
        line.split("  #")[0].strip()
        for line in joined.splitlines()
        if line.strip() and not line.startswith("#")
    ]
    ports = {"8001": str(free_port()), "8002": str(free_port())}
    for shown, port in ports.items():
        serve_line = serve_line.replace(f":{shown}", f":{port}").replace(f" {shown} ", f" {port} ")
        send_line = send_line.replace(f":{shown}", f":{port}")
    subprocess.run(["bash", "-c", keygen], cwd=tmp_path, check=True)
    serve = _start(
        [sys.executable, "-m", "synapse.cli.main", *shlex.split(serve_line)[1:]],
        cwd=tmp_path,
    )
    try:
        _wait_listening(serve)
        done = subprocess.run(
            [sys.executable, "-m", "synapse.cli.main", *shlex.split(send_line)[1:]],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        serve.terminate()
        serve.wait(10)
    assert (done.returncode, done.stdout) == (0, "a short poem about rain\n"), done.stderr


def _start(argv: list[str], *, cwd: Path) -> subprocess.Popen[str]:
    """`synapse serve ARGV` in `cwd`, its log read from stderr."""
    return subprocess.Popen(
        argv,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_listening(serve: subprocess.Popen[str]) -> None:
    """Until serve's first log line, which must be `listening`."""
    assert serve.stderr is not None
    ready, _, _ = select.select([serve.stderr], [], [], 30)
    assert ready, "serve printed nothing in 30 s"
    first = serve.stderr.readline()
    assert "listening" in first, first
