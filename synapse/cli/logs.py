"""structlog for the command line: events on stderr, for a person or as JSON lines.

Logs always go to stderr: stdout carries what a command produces (a task's result, a JSON
event stream, a schema), so that it can be piped. By default a person sees one line per
message (`message_in`, `message_out`) plus lifecycle events and warnings; `--verbose` adds
every state transition and HTTP attempt. The standard library's `logging` (aiohttp, asyncio)
is routed through the same renderer, so `--log-json` output stays one JSON object a line.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

#: Info events that repeat what the per-message lines already say; shown with --verbose.
DETAIL_EVENTS = frozenset({"transition", "post_attempt"})


def _drop_details(_logger: WrappedLogger, method: str, event: EventDict) -> EventDict:
    if method in ("debug", "info") and event.get("event") in DETAIL_EVENTS:
        raise structlog.DropEvent
    return event


def _drop_all(_logger: WrappedLogger, _method: str, _event: EventDict) -> EventDict:
    raise structlog.DropEvent


def configure_logging(
    *,
    json: bool = False,
    verbose: bool = False,
    quiet: bool = False,
    stream: TextIO | None = None,
) -> None:
    """Send structlog and stdlib logging to `stream` (stderr), as console lines or JSON.

    `quiet` (the client commands without --verbose, which report what matters themselves)
    drops every event; `verbose` keeps the detail events and debug.
    """
    stream = stream or sys.stderr
    level = logging.DEBUG if verbose else logging.INFO
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if not verbose:
        shared.insert(0, _drop_details)
    if quiet:
        shared.insert(0, _drop_all)
    renderer: Processor
    if json:
        renderer = structlog.processors.JSONRenderer(ensure_ascii=False)
    else:
        renderer = structlog.dev.ConsoleRenderer(
            colors=_is_tty(stream), exception_formatter=structlog.dev.plain_traceback
        )
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, renderer]
        if json
        else [*shared, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(stream),
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(stream)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
            foreign_pre_chain=[
                structlog.stdlib.add_logger_name,
                structlog.processors.add_log_level,
                structlog.processors.TimeStamper(fmt="iso", utc=True),
            ],
        )
    )
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(logging.CRITICAL + 1 if quiet else max(level, logging.WARNING))
    logging.captureWarnings(True)


def _is_tty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
