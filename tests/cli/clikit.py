"""Running `synapse` as a real subprocess on real 127.0.0.1 ports, with timeouts and cleanup."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from benchmarks.ports import free_port as free_port  # re-exported

SECRET = "cli-test-secret-0123456789abcdef"
EXECUTOR = "exec"
REQUESTER = "req"
#: Every subprocess gets this long at most.
TIMEOUT = 30.0


def url(port: int) -> str:
    return f"http://127.0.0.1:{port}/synapse/callback"


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment without any SYNAPSE_… setting of the person running the tests."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYNAPSE_")}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "synapse.cli.main", *args]


def run(
    *args: str,
    input: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = TIMEOUT,
    cwd: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `synapse ARGS` to its end; stdin is empty unless `input` is given."""
    return subprocess.run(
        command(*args),
        input=input if input is not None else "",
        capture_output=True,
        text=True,
        env=clean_env(env),
        timeout=timeout,
        cwd=cwd,
    )


def asyncio_running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running in this thread, if any (read from a signal handler)."""
    return asyncio._get_running_loop()


class _Overran(BaseException):
    """Raised by the alarm of `run_here` (a BaseException: no `except Exception` takes it)."""


#: How long an in-process invocation may take: errors are found before anything starts.
HERE_TIMEOUT = 20.0


def run_here(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = HERE_TIMEOUT
) -> tuple[int, str, str]:
    """`synapse ARGS` in this process (for errors found before anything starts): the exit
    status, stdout and stderr.

    Bounded: an invocation still running after `timeout` seconds (settings wrongly accepted:
    `serve` started serving) fails the test instead of hanging it. The alarm interrupts the
    command's event loop, which then closes what it started."""
    from synapse.cli.main import main

    overran: list[bool] = []

    def alarm(signum: int, frame: object) -> None:
        overran.append(True)
        loop = asyncio_running_loop()
        if loop is None:
            raise _Overran
        loop.stop()  # `asyncio.run` then cancels what the command started and returns

    out, err = io.StringIO(), io.StringIO()
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGALRM, alarm) if in_main else None
    if in_main:
        signal.setitimer(signal.ITIMER_REAL, timeout)
    status = -1
    try:
        status = main(list(args), env=clean_env(env), out=out, err=err)
    except BaseException:
        if not overran:
            raise
    finally:
        if in_main:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    if overran:
        import pytest

        pytest.fail(
            f"`synapse {' '.join(args)}` was still running after {timeout:g} s: it accepted "
            f"what it should refuse (stderr: {err.getvalue()[-500:]!r})",
            pytrace=False,
        )
    return status, out.getvalue(), err.getvalue()


@dataclass
class Server:
    """A `synapse serve` process; `lines` collects its stderr (its log) as it comes."""

    process: subprocess.Popen[str]
    port: int
    lines: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return url(self.port)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)
            raise


def _first_line(process: subprocess.Popen[str], timeout: float) -> str:
    assert process.stderr is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([process.stderr], [], [], 0.1)
        if ready:
            return process.stderr.readline()
        if process.poll() is not None:
            return process.stderr.readline()
    raise TimeoutError("serve printed nothing")


@contextlib.contextmanager
def serve(
    *args: str,
    port: int | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    port_flag: bool = True,
) -> Iterator[Server]:
    """`synapse serve --port PORT ARGS`, once its first log line (`listening`) is out.

    With `port_flag=False` the port must come from the environment or a config file.
    """
    port = port or free_port()
    flags = ["--port", str(port)] if port_flag else []
    process = subprocess.Popen(
        command("serve", *flags, *args),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(env),
        cwd=cwd,
    )
    server = Server(process, port)
    try:
        first = _first_line(process, TIMEOUT)
        server.lines.append(first)

        def drain() -> None:
            assert process.stderr is not None
            for line in process.stderr:
                server.lines.append(line)

        threading.Thread(target=drain, daemon=True).start()
        yield server
    finally:
        stop_process(process)


def stop_process(process: subprocess.Popen[str]) -> None:
    """SIGTERM, then SIGKILL if it is still there 10 s later (by its PID, as every test does)."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def executor_args(requester_port: int, *extra: str) -> list[str]:
    """The executor's flags: agent `exec`, partner `req` at `requester_port`."""
    return [
        "--agent-id",
        EXECUTOR,
        "--secret",
        SECRET,
        "--peer",
        f"{REQUESTER}={url(requester_port)}",
        *extra,
    ]


def client_args(server: Server, requester_port: int, *, secret: str = SECRET) -> list[str]:
    """`send`/`caps`/`ping` flags to talk to `server` as `req` listening on `requester_port`."""
    return [
        "--target",
        server.url,
        "--agent-id",
        EXECUTOR,
        "--as",
        REQUESTER,
        "--secret",
        secret,
        "--listen",
        f"127.0.0.1:{requester_port}",
    ]


def error_lines(stderr: str) -> list[str]:
    """The lines of stderr that are `synapse: …` errors."""
    return [line for line in stderr.splitlines() if line.startswith("synapse: ")]


def no_traceback(result: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in result.stderr, result.stderr


__all__: Sequence[str] = [
    "EXECUTOR",
    "REQUESTER",
    "SECRET",
    "Server",
    "client_args",
    "command",
    "error_lines",
    "executor_args",
    "free_port",
    "no_traceback",
    "run",
    "run_here",
    "serve",
    "url",
]
