"""Logging for the command line: the one place where Synapse configures logging.

Logs always go to stderr: stdout carries what a command produces (a task's result, a JSON
event stream, a schema), so that it can be piped. The library emits structlog events through
the standard `logging` module (`synapse.logs`); here the root logger gets one handler that
renders every record, Synapse's and other libraries' (aiohttp, asyncio), as a console line
or a JSON object a line (`--log-json`).

Levels (`--log-level`, `SYNAPSE_LOG_LEVEL`, `log_level` in the TOML file): `info`, the
default of `serve`, is what an operator needs: startup and shutdown, one line a task with its
outcome (its last transition), refusals, retries, warnings; `debug` (or `--verbose`) adds
every message in and out, every transition and every HTTP attempt; `warning`, `error`, and
`off`. Whatever the level but `off`, `serve`'s first line is `listening`, with the URL.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, TextIO

from synapse.logs import EventHandler

#: `--log-level` values.
LEVELS: dict[str, int] = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "off": logging.CRITICAL + 1,
}


def parse_log_level(value: str) -> int:
    try:
        return LEVELS[value.strip().lower()]
    except KeyError:
        raise ValueError(f"expected one of {', '.join(LEVELS)}") from None


def configure_logging(
    *,
    json: bool = False,
    verbose: bool = False,
    quiet: bool = False,
    level: int | None = None,
    stream: TextIO | None = None,
) -> None:
    """Send Synapse's and stdlib logging to `stream` (stderr), as console lines or JSON.

    `quiet` (the client commands without --verbose, which report what matters themselves)
    drops every event; `verbose` means debug; otherwise `level` (default info) applies to
    Synapse's loggers, and other libraries log their warnings and errors.
    """
    stream = stream or sys.stderr
    if verbose:
        level = logging.DEBUG
    elif quiet:
        level = LEVELS["off"]
    elif level is None:
        level = logging.INFO
    # A command line is an application: it may spare every record the work of finding its
    # caller, thread and process, which no renderer here shows (logging HOWTO, "Optimization").
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    root = logging.getLogger()
    # https://no-color.org: any non-empty NO_COLOR turns colors off, whatever the terminal.
    colors = _is_tty(stream) and not os.environ.get("NO_COLOR")
    root.handlers = [EventHandler(stream, json=json, colors=colors)]
    root.setLevel(max(level, logging.WARNING))
    logging.getLogger("synapse").setLevel(level)
    # `listening` (the peer's one event) stays the first line at every level but `off`:
    # scripts and supervisors wait for it to know the port.
    peer_level = level if level > logging.CRITICAL else min(level, logging.INFO)
    logging.getLogger("synapse.peer").setLevel(peer_level)
    logging.captureWarnings(True)


def _is_tty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
