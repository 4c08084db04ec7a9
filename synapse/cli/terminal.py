"""Talking to the person at the terminal while the event loop keeps serving callbacks.

`LineReader` reads stdin on a daemon thread, so that waiting for an answer never blocks the
loop (the executor's callbacks still get their acks) and works the same with a TTY, a pipe or
a file; it reads the raw file descriptor, so an unfinished read never holds a lock at exit.
`TerminalConsole` draws the live progress bar on a TTY and plain lines otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import sys
import threading
from typing import Any, TextIO

from synapse.cli.errors import CliError


class LineReader:
    """Lines of a file descriptor (stdin), one `await readline()` at a time; None at EOF.

    A daemon thread reads the descriptor. `close()` stops it for good: once it returns the
    thread has ended and will never read the descriptor again, so the caller may close it (a
    thread outliving its reader would otherwise read whatever file next gets that descriptor
    number, and post to a loop that is closed).
    """

    def __init__(self, fd: int = 0) -> None:
        self.fd = fd
        self._queue: asyncio.Queue[str | None] | None = None
        self._eof = False
        self._thread: threading.Thread | None = None
        self._wake: tuple[int, int] | None = None  # (read end, write end) that stops the thread

    def _start(self) -> asyncio.Queue[str | None]:
        if self._queue is None:
            loop = asyncio.get_running_loop()
            queue: asyncio.Queue[str | None] = asyncio.Queue()
            self._queue = queue

            def put(line: str | None) -> None:
                # The loop may be gone already (the command ended while a line was on its way).
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(queue.put_nowait, line)

            self._wake = os.pipe()
            self._thread = threading.Thread(
                target=self._read, args=(put, self._wake[0]), name="synapse-stdin", daemon=True
            )
            self._thread.start()
        return self._queue

    def _read(self, put: Any, wake: int) -> None:
        buffer = b""
        while True:
            try:
                ready, _, _ = select.select([self.fd, wake], [], [])
            except (OSError, ValueError):
                ready = [self.fd]  # let os.read report what is wrong with it
            if wake in ready:
                return  # closed: never touch the descriptor again
            try:
                chunk = os.read(self.fd, 4096)
            except OSError:
                chunk = b""
            if not chunk:
                if buffer:
                    put(buffer.decode("utf-8", "replace"))
                put(None)
                return
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                put(line.rstrip(b"\r").decode("utf-8", "replace"))

    async def readline(self) -> str | None:
        """The next line without its newline, or None once the input is closed."""
        if self._eof:
            return None
        line = await self._start().get()
        if line is None:
            self._eof = True
        return line

    def close(self) -> None:
        """Stop the reading thread and wait for it; idempotent."""
        thread, wake = self._thread, self._wake
        self._thread = self._wake = None
        if wake is None:
            return
        os.write(wake[1], b"x")
        if thread is not None:
            thread.join()
        os.close(wake[0])
        os.close(wake[1])


def parse_value(text: str) -> Any:
    """An answer as JSON if it parses (`42`, `true`, `{"a": 1}`), else as the string itself."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_field(text: str) -> tuple[str, Any]:
    """`--field NAME=VALUE`, VALUE parsed by `parse_value`."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise CliError(f"malformed --field {text!r}: expected NAME=VALUE")
    return name.strip(), parse_value(value)


def is_tty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class TerminalConsole:
    """`send`'s side of the conversation: notes, progress and prompts on stderr.

    stdout is kept for what the task produced (or `--json` events); everything a person reads
    while it runs goes to stderr: a live progress bar when stderr is a TTY, plain lines when
    it is not.
    """

    BAR_WIDTH = 30

    def __init__(
        self, err: TextIO | None = None, *, live: bool | None = None, quiet: bool = False
    ) -> None:
        self.err = err or sys.stderr
        self.live = is_tty(self.err) if live is None else live
        self.quiet = quiet
        self._bar_shown = False

    def _clear_bar(self) -> None:
        # The bar's last state stays on screen; what follows starts on a new line.
        if self._bar_shown:
            self.err.write("\n")
            self._bar_shown = False

    def note(self, text: str) -> None:
        """A line of narrative (suppressed with --json)."""
        if self.quiet:
            return
        self._clear_bar()
        self.err.write(text + "\n")
        self.err.flush()

    def say(self, text: str) -> None:
        """A line the person must see even with --json (questions, errors)."""
        self._clear_bar()
        self.err.write(text + "\n")
        self.err.flush()

    def ask(self, prompt: str) -> None:
        self._clear_bar()
        self.err.write(prompt)
        self.err.flush()

    def progress(self, percent: float | None, message: str) -> None:
        if self.quiet:
            return
        shown = "" if percent is None else f"{percent:.0f}%"
        if not self.live:
            self.note(" ".join(part for part in ("progress", shown, message) if part))
            return
        filled = 0 if percent is None else round(self.BAR_WIDTH * max(0.0, min(percent, 100)) / 100)
        bar = "█" * filled + "░" * (self.BAR_WIDTH - filled)
        self.err.write(f"\r\x1b[2K[{bar}] {shown} {message}".rstrip())
        self.err.flush()
        self._bar_shown = True

    def close(self) -> None:
        with contextlib.suppress(ValueError):
            self._clear_bar()
            self.err.flush()
