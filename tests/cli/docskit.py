"""Running what README.md and docs/ show, as shown: their shell lines through `bash`, their
Python blocks as programs, on free loopback ports put in place of the documents' fixed ones.

A document's command is taken from its fenced block (continuation lines joined, a trailing
`# comment` kept apart); only the ports change (`Shell.ported`). A `synapse serve` line runs in
the background until its log says it is ready; every process started is stopped by its PID.
"""

from __future__ import annotations

import ast
import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from clikit import TIMEOUT, clean_env, free_port

ROOT = Path(__file__).resolve().parents[2]


def document(name: str) -> str:
    """README.md, or docs/NAME."""
    path = ROOT / name if name == "README.md" else ROOT / "docs" / name
    return path.read_text("utf-8")


def block(text: str, holding: str, fence: str = "sh") -> str:
    """The fenced block of kind `fence` that holds `holding`."""
    found = [b.split("\n```", 1)[0] for b in text.split(f"```{fence}\n")[1:]]
    matching = [b for b in found if holding in b]
    assert len(matching) == 1, f"{len(matching)} ```{fence} blocks hold {holding!r}"
    return matching[0]


@dataclass(frozen=True)
class Line:
    command: str
    comment: str


def lines(shown: str) -> list[Line]:
    """The commands of a shell block: continuation lines joined, a quoted argument that
    spans lines kept whole, comment lines left out."""
    joined = re.sub(r"\\\n\s*", " ", shown)
    found: list[Line] = []
    pending = ""
    for raw in joined.splitlines():
        text = pending + ("\n" if pending else "") + raw.strip()
        if not text or text.startswith("#"):
            continue
        try:
            shlex.split(text)
        except ValueError:  # a quotation still open: the command goes on
            pending = text
            continue
        pending = ""
        command, _, comment = text.partition("  #")
        try:
            shlex.split(command)
        except ValueError:  # the "  #" was inside quotes
            command, comment = text, ""
        found.append(Line(command.strip(), comment.strip()))
    assert not pending, f"an unfinished command: {pending!r}"
    return found


def starting(shown: str, prefix: str) -> list[Line]:
    return [line for line in lines(shown) if line.command.startswith(prefix)]


@dataclass
class Background:
    """A command of a document running in the background (`synapse serve`, say)."""

    process: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)

    def logged(self, text: str, timeout: float = TIMEOUT) -> str:
        """The first log line holding `text`, once it is out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if text in line:
                    return line
            if self.process.poll() is not None and not any(text in x for x in self.lines):
                raise AssertionError(f"exited ({self.process.returncode}): {self.lines[-20:]}")
            time.sleep(0.02)  # another process's log, read by a thread: poll it, bounded
        raise AssertionError(f"no {text!r} within {timeout} s: {self.lines[-20:]}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


class Shell:
    """Runs a document's lines in `cwd` with `bash`, its fixed ports replaced by free ones."""

    def __init__(self, cwd: Path, ports: tuple[int, ...], env: Mapping[str, str] | None = None):
        self.cwd = cwd
        self.ports = {shown: free_port() for shown in ports}
        bin_dir = str(Path(sys.executable).parent)  # where this environment's `synapse` is
        self.env = clean_env({"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"})
        self.env.update(env or {})
        self.started: list[Background] = []

    def port(self, shown: int) -> int:
        return self.ports[shown]

    def ported(self, text: str) -> str:
        for shown, port in self.ports.items():
            text = re.sub(rf"(?<![\d.]){shown}(?!\d)", str(port), text)
        return text

    def run(
        self, line: Line | str, *, input: str = "", timeout: float = TIMEOUT
    ) -> subprocess.CompletedProcess[str]:
        command = line.command if isinstance(line, Line) else line
        return subprocess.run(
            ["bash", "-c", self.ported(command)],
            input=input,
            capture_output=True,
            text=True,
            env=self.env,
            cwd=self.cwd,
            timeout=timeout,
        )

    def background(self, line: Line | str, ready: str = "listening") -> Background:
        """Start the command (`exec`ed by bash: the PID is its own) and wait for `ready`."""
        command = line.command if isinstance(line, Line) else line
        process = subprocess.Popen(
            ["bash", "-c", "exec " + self.ported(command)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
            cwd=self.cwd,
        )
        started = Background(process)
        self.started.append(started)

        def drain() -> None:  # until the process closes its stderr (it exits)
            assert process.stderr is not None
            for line in process.stderr:
                started.lines.append(line)

        threading.Thread(target=drain, daemon=True).start()
        started.logged(ready)
        return started

    def close(self) -> None:
        for started in reversed(self.started):
            started.stop()


@contextlib.contextmanager
def shell(
    cwd: Path, ports: tuple[int, ...], env: Mapping[str, str] | None = None
) -> Iterator[Shell]:
    running = Shell(cwd, ports, env)
    try:
        yield running
    finally:
        running.close()


async def run_block(source: str, namespace: dict[str, object]) -> None:
    """Run a Python block of a document as the asyncio REPL would: top-level `await` and
    `async with` allowed; its names stay in `namespace` for the next block."""
    code = compile(source, "<document>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    result = types.FunctionType(code, namespace)()
    if result is not None:
        await result
