"""How the library emits its logs: structlog events handed to the standard `logging` module.

A library does not decide where its logs go, nor how much of them: the program that embeds it
does. So every Synapse logger is a structlog logger bound to a standard-library logger of the
`synapse` hierarchy (`synapse.p2p`, `synapse.transport`, ...), whatever structlog's global
configuration is. Nothing is configured at import: used from Python, Synapse stays quiet
(only warnings and errors reach stderr, through `logging`'s last-resort handler) until the
application configures `logging`:

    logging.basicConfig(level=logging.INFO)                  # plain text lines
    logging.getLogger("synapse").setLevel(logging.DEBUG)     # every message in and out

Each record's `msg` is the event: a dict (`{"event": "listening", "url": ...}`) whose `str()`
is `listening url=... agent_id=...`, so plain formatters print a readable line, while
`structlog.stdlib.ProcessorFormatter` renders it as structlog would (the record carries
`_logger` and `_name`, as `ProcessorFormatter.wrap_for_formatter` sets them). The command line
(`synapse.cli.logs`) is the one place that configures logging.

Cost: a call at a level that is off returns after one `Logger.isEnabledFor` (a cached
lookup): no event dict is processed, nothing is formatted. Loggers are built once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
import traceback
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, TextIO

import msgspec
import structlog
from structlog.typing import EventDict

__all__ = ["EventHandler", "EventMessage", "capture_events", "get_logger"]


_NOT_SHOWN = frozenset({"event", "exc_info", "logger", "level"})


class EventMessage(dict[str, Any]):
    """A record's `msg`: the event's fields; `str()` is `event key=value ...`."""

    __slots__ = ()

    def __str__(self) -> str:
        fields = " ".join(f"{k}={v!r}" for k, v in self.items() if k not in _NOT_SHOWN)
        event = str(self.get("event", ""))
        return f"{event} {fields}" if fields else event


def _to_record(logger: logging.Logger, method: str, event: EventDict) -> Any:
    """The last processor: what `logging.Logger.<method>` is called with."""
    kwargs: dict[str, Any] = {"extra": {"_logger": logger, "_name": method}}
    exc_info = event.get("exc_info")
    if exc_info:
        kwargs["exc_info"] = exc_info
    return (EventMessage(event),), kwargs


_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}


class SynapseLogger(structlog.stdlib.BoundLogger):
    """`structlog.stdlib.BoundLogger` that checks the level before it builds anything, and
    hands the event to its stdlib logger directly: what structlog's processor chain would do
    with our two processors (bound and context variables merged, then the record's
    arguments), without its layers of calls."""

    def debug(self, event: str | None = None, *args: Any, **kw: Any) -> Any:
        if self._logger.isEnabledFor(logging.DEBUG):
            return self._proxy_to_logger("debug", event, *args, **kw)
        return None

    def info(self, event: str | None = None, *args: Any, **kw: Any) -> Any:
        if self._logger.isEnabledFor(logging.INFO):
            return self._proxy_to_logger("info", event, *args, **kw)
        return None

    def warning(self, event: str | None = None, *args: Any, **kw: Any) -> Any:
        if self._logger.isEnabledFor(logging.WARNING):
            return self._proxy_to_logger("warning", event, *args, **kw)
        return None

    def error(self, event: str | None = None, *args: Any, **kw: Any) -> Any:
        if self._logger.isEnabledFor(logging.ERROR):
            return self._proxy_to_logger("error", event, *args, **kw)
        return None

    def exception(self, event: str | None = None, *args: Any, **kw: Any) -> Any:
        if self._logger.isEnabledFor(logging.ERROR):
            kw.setdefault("exc_info", True)
            return self._proxy_to_logger("error", event, *args, **kw)
        return None

    def _proxy_to_logger(
        self, method_name: str, event: str | None = None, *event_args: Any, **event_kw: Any
    ) -> Any:
        level = _LEVELS.get(method_name)
        if level is None or event_args or self._processors is not _PROCESSORS:
            return super()._proxy_to_logger(method_name, event, *event_args, **event_kw)
        fields: Any = {**self._context, **event_kw} if self._context else event_kw
        fields["event"] = event
        fields = structlog.contextvars.merge_contextvars(self._logger, method_name, fields)
        if not fields.get("exc_info"):
            sole = _sole_event_handler(self._logger, level)
            if sole is not None and sole.write_event(self._logger.name, level, fields):
                return None
        args, kwargs = _to_record(self._logger, method_name, fields)
        self._logger._log(level, args[0], (), **kwargs)
        return None


def _sole_event_handler(logger: logging.Logger, level: int) -> EventHandler | None:
    """The `EventHandler` a record of `logger` at `level` would reach, when it is the only
    handler on its way and nothing else could see the record: no filter on the logger or the
    handler, no handler of another kind, the stdlib's record factory and `makeRecord`. Then
    the line it would write can be written without building the record (the command line's
    configuration: one handler, on the root). Otherwise None: the record is made and
    handled as `logging` does."""
    if logger.filters or logger.disabled or logging.getLogRecordFactory() is not _FACTORY:
        return None
    if type(logger).makeRecord is not _MAKE_RECORD:
        return None
    found: EventHandler | None = None
    current: logging.Logger | None = logger
    while current is not None:
        for handler in current.handlers:
            if found is not None or type(handler) is not EventHandler or handler.filters:
                return None
            found = handler
        current = current.parent if current.propagate else None
    if found is None or level < found.level:
        return None
    return found


_FACTORY = logging.getLogRecordFactory()
_MAKE_RECORD = logging.Logger.makeRecord


#: The chain for `structlog`'s own path (positional arguments, say); the usual path does the same.
_PROCESSORS = [structlog.contextvars.merge_contextvars, _to_record]


def get_logger(name: str) -> SynapseLogger:
    """The structlog logger of stdlib logger `name` (a `synapse.` name), built once."""
    # Built here, not lazily through structlog's global configuration: the embedding
    # program's `structlog.configure` (if any) neither reroutes nor slows our events.
    return SynapseLogger(logging.getLogger(name), _PROCESSORS, {})


_second: list[Any] = [None, ""]


def _iso(created: float) -> str:
    """RFC 3339 UTC with microseconds; the date and time are formatted once a second."""
    second = int(created)
    if _second[0] != second:
        _second[:] = [second, datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S")]
    return f"{_second[1]}.{int((created - second) * 1e6):06d}Z"


def _value(value: Any) -> str:
    return value if isinstance(value, str) else repr(value)


def console_line(event: dict[str, Any]) -> str:
    """`structlog.dev.ConsoleRenderer(colors=False)`'s line, for the fields we log, at a
    fraction of its cost: `timestamp [level    ] event    [logger] key=value ...`."""
    timestamp = event.pop("timestamp", "")
    level = event.pop("level", "")
    name = event.pop("event", "")
    logger = event.pop("logger", None)
    exception = event.pop("exception", None)
    parts = [f"{timestamp} [{level:<9}] {_value(name):<30}"]
    if logger is not None:
        parts.append(f"[{logger}]")
    # _value inlined: this runs for every field of every line.
    parts += [
        f"{key}={value}" if isinstance(value := event[key], str) else f"{key}={value!r}"
        for key in sorted(event)
    ]
    line = " ".join(parts)
    return f"{line}\n{exception}" if exception else line


_json_encoder = msgspec.json.Encoder(enc_hook=repr)


class EventHandler(logging.Handler):
    """A `logging` handler that writes each record as one line on `stream`: a console line
    for a person (structlog's console format; colors with `colors=True`), or a JSON object
    (`json=True`). Synapse's records keep their fields; other libraries' records (aiohttp,
    asyncio) become `event` + `logger`.

    The command line installs it on the root logger (`synapse.cli.logs`); an application
    may do the same, or use its own handlers.

    Inside a running event loop, lines below warning are written together once the loop's
    current callbacks have run (one write for many lines, not one each); a warning or
    error, a line outside a loop, `flush()` and `close()` write at once.
    """

    def __init__(
        self, stream: TextIO | None = None, *, json: bool = False, colors: bool = False
    ) -> None:
        super().__init__()
        self.stream = stream
        self.json = json
        self._pending: list[str] = []
        self._scheduled = False
        self.colored = (
            structlog.dev.ConsoleRenderer(
                colors=True, exception_formatter=structlog.dev.plain_traceback
            )
            if colors and not json
            else None
        )

    def render(self, record: logging.LogRecord) -> str:
        msg = record.msg
        if isinstance(msg, dict):
            event = dict(msg)
            event.pop("exc_info", None)
        else:
            event = {"event": record.getMessage(), "logger": record.name}
        event.setdefault("logger", record.name)
        event["level"] = record.levelname.lower()
        event["timestamp"] = _iso(record.created)
        if record.exc_info:
            if self.colored is not None:
                event["exc_info"] = record.exc_info
            else:
                event["exception"] = "".join(traceback.format_exception(*record.exc_info))
        return self._line(event)

    def _line(self, event: dict[str, Any]) -> str:
        """`event` (with its `level` and `timestamp`) as this handler writes it."""
        if self.colored is not None:
            return str(self.colored(None, event["level"], event))
        if self.json:
            return _json_encoder.encode(event).decode()
        return console_line(event)

    def write_event(self, logger: str, level: int, fields: dict[str, Any]) -> bool:
        """Write the line `emit` writes for the record of a Synapse event without an
        exception (`fields`, logged by `logger` at `level`), without the record (see
        `_sole_event_handler`). False if it cannot be rendered: then the record goes the
        stdlib's way, whose `handleError` reports it."""
        event = dict(fields)
        event.setdefault("logger", logger)
        event["level"] = logging.getLevelName(level).lower()
        event["timestamp"] = _iso(time.time())
        try:
            line = self._line(event)
        except Exception:
            return False
        with self.lock or contextlib.nullcontext():
            try:
                self._queue(line, level)
            except Exception:  # the stream failed: reported as `emit` reports it
                self.handleError(logging.makeLogRecord({"name": logger, "msg": line}))
        return True

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._queue(self.render(record), record.levelno)
        except Exception:
            self.handleError(record)

    def _queue(self, line: str, level: int) -> None:
        self._pending.append(f"{line}\n")
        if level < logging.WARNING:
            if self._scheduled:
                return
            with contextlib.suppress(RuntimeError):  # RuntimeError: no loop running
                asyncio.get_running_loop().call_soon(self.flush)
                self._scheduled = True
                return
        self._write()

    def _write(self) -> None:
        self._scheduled = False
        if self._pending:
            text = "".join(self._pending)
            self._pending.clear()
            stream = self.stream if self.stream is not None else sys.stderr
            stream.write(text)
            stream.flush()

    def flush(self) -> None:
        with self.lock or contextlib.nullcontext():
            self._write()

    def close(self) -> None:
        self.flush()
        super().close()


class _Collector(logging.Handler):
    def __init__(self, events: list[dict[str, Any]]) -> None:
        super().__init__(logging.DEBUG)
        self.events = events

    def emit(self, record: logging.LogRecord) -> None:
        if isinstance(record.msg, dict):
            self.events.append({k: v for k, v in record.msg.items() if k != "logger"})


@contextlib.contextmanager
def capture_events(level: int = logging.DEBUG) -> Iterator[list[dict[str, Any]]]:
    """Collect the event dicts Synapse logs at `level` and above meanwhile (for tests, like
    `structlog.testing.capture_logs`); levels and handlers come back afterwards."""
    events: list[dict[str, Any]] = []
    synapse_logger = logging.getLogger("synapse")
    handler = _Collector(events)
    saved = synapse_logger.level
    synapse_logger.addHandler(handler)
    synapse_logger.setLevel(level)
    try:
        yield events
    finally:
        synapse_logger.removeHandler(handler)
        synapse_logger.setLevel(saved)
