"""Issue 16 item 2 and issue 13 item 9: how the library emits its logs, what a level that is
off costs, and the command line's handler."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from synapse import logs
from synapse.logs import EventHandler, capture_events, get_logger


@pytest.fixture
def handler() -> Iterator[tuple[EventHandler, io.StringIO]]:
    stream = io.StringIO()
    handler = EventHandler(stream)
    synapse_logger = logging.getLogger("synapse")
    saved = synapse_logger.level
    synapse_logger.addHandler(handler)
    synapse_logger.setLevel(logging.INFO)
    yield handler, stream
    synapse_logger.removeHandler(handler)
    synapse_logger.setLevel(saved)


def test_a_level_that_is_off_processes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []

    def spy(_logger: Any, method: str, event: dict[str, Any]) -> dict[str, Any]:
        seen.append(method)
        return event

    to_record = logs._to_record
    monkeypatch.setattr(logs, "_to_record", lambda *a: (spy(*a), to_record(*a))[1])
    log = get_logger("synapse.test.off")
    logging.getLogger("synapse.test.off").setLevel(logging.WARNING)
    log.debug("hidden", x=1)
    log.info("hidden", x=1)
    assert seen == []
    with capture_events(logging.INFO) as events:
        logging.getLogger("synapse.test.off").setLevel(logging.NOTSET)
        log.info("shown", x=1)
    assert seen == ["info"]
    assert events == [{"x": 1, "event": "shown"}]


def test_records_are_stdlib_records_with_the_event_as_msg() -> None:
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    keep = Keep()
    target = logging.getLogger("synapse.test.records")
    target.addHandler(keep)
    target.setLevel(logging.INFO)
    try:
        get_logger("synapse.test.records").info("listening", url="http://x/", port=1)
    finally:
        target.removeHandler(keep)
        target.setLevel(logging.NOTSET)
    [record] = records
    assert record.getMessage() == "listening url='http://x/' port=1"
    assert dict(record.msg) == {"url": "http://x/", "port": 1, "event": "listening"}  # type: ignore[call-overload]
    # As structlog's ProcessorFormatter expects a record of its own.
    formatter = structlog.stdlib.ProcessorFormatter(processor=structlog.processors.JSONRenderer())
    assert json.loads(formatter.format(record)) == {
        "url": "http://x/",
        "port": 1,
        "event": "listening",
    }


def test_the_console_line_is_structlogs() -> None:
    event = {"event": "transition", "task_id": "t-1", "n": 3, "logger": "synapse.p2p"}
    event |= {"level": "info", "timestamp": "2026-01-01T00:00:00.000000Z"}
    renderer = structlog.dev.ConsoleRenderer(colors=False)
    assert logs.console_line(dict(event)) == renderer(None, "info", dict(event))


def test_lines_inside_a_loop_are_written_together_warnings_at_once(
    handler: tuple[EventHandler, io.StringIO],
) -> None:
    _, stream = handler
    log = get_logger("synapse.test.batch")

    async def main() -> list[int]:
        counts = []
        log.info("one")
        log.info("two")
        counts.append(stream.getvalue().count("\n"))
        await asyncio.sleep(0)  # the loop runs the scheduled write
        counts.append(stream.getvalue().count("\n"))
        log.info("three")
        log.warning("four")
        counts.append(stream.getvalue().count("\n"))
        return counts

    assert asyncio.run(main()) == [0, 2, 4]
    log.info("outside a loop")
    lines = stream.getvalue().splitlines()
    assert [line.split()[3] for line in lines] == ["one", "two", "three", "four", "outside"]
    assert "[synapse.test.batch]" in lines[0]


def test_json_lines_and_exceptions(handler: tuple[EventHandler, io.StringIO]) -> None:
    handler_, stream = handler
    handler_.json = True
    log = get_logger("synapse.test.json")
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("internal_error", error="x")
    [line] = stream.getvalue().splitlines()
    event = json.loads(line)
    assert (event["event"], event["level"], event["logger"]) == (
        "internal_error",
        "error",
        "synapse.test.json",
    )
    assert "ValueError: boom" in event["exception"]
    assert event["timestamp"].endswith("Z")


def test_the_sole_handler_gets_the_same_line_without_a_record() -> None:
    """The command line's configuration (one EventHandler, on the root): a Synapse event is
    written without building its record, as the same line; anything else that could see the
    record (a filter, a second handler, a record factory) gets the stdlib's path."""
    root = logging.getLogger()
    saved = root.handlers
    stream = io.StringIO()
    handler = EventHandler(stream)
    emitted: list[logging.LogRecord] = []
    stdlib_emit = handler.emit

    def counting_emit(record: logging.LogRecord) -> None:
        emitted.append(record)
        stdlib_emit(record)

    handler.emit = counting_emit  # type: ignore[method-assign]
    log = get_logger("synapse.test.sole")
    target = logging.getLogger("synapse.test.sole")
    target.setLevel(logging.INFO)
    factory = logging.getLogRecordFactory()
    try:
        root.handlers = [handler]
        log.info("transition", task_id="t-1", to_state="completed", n=3, none=None)
        assert emitted == []  # no record: written directly
        handler.addFilter(lambda record: True)
        log.info("transition", task_id="t-1", to_state="completed", n=3, none=None)
        assert len(emitted) == 1  # a filter must see the record
        handler.filters.clear()
        logging.setLogRecordFactory(lambda *a, **k: factory(*a, **k))
        log.info("factory")
        logging.setLogRecordFactory(factory)
        assert len(emitted) == 2  # the application's record factory is used
        handler.flush()
        direct, through, _ = stream.getvalue().splitlines()
        assert direct.split(" ", 1)[1] == through.split(" ", 1)[1]  # all but the time
        assert "task_id=t-1" in direct and "none=None" in direct and "[synapse.test.sole]" in direct
        # A second handler, or a filter on the logger: both see the record.
        seen: list[logging.LogRecord] = []

        class Keep(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                seen.append(record)

        keep = Keep()
        target.addHandler(keep)
        log.info("second")
        target.removeHandler(keep)
        target.addFilter(lambda record: seen.append(record) or True)
        log.info("filtered")
        assert [dict(r.msg)["event"] for r in seen] == ["second", "filtered"]  # type: ignore[call-overload]
        assert len(emitted) == 4
    finally:
        logging.setLogRecordFactory(factory)
        root.handlers = saved
        target.filters.clear()
        target.setLevel(logging.NOTSET)


def test_the_sole_handler_path_in_json_and_below_the_handlers_level() -> None:
    root = logging.getLogger()
    saved = root.handlers
    stream = io.StringIO()
    handler = EventHandler(stream, json=True)
    target = logging.getLogger("synapse.test.sole_json")
    target.setLevel(logging.DEBUG)
    try:
        root.handlers = [handler]
        get_logger("synapse.test.sole_json").info("hello", n=1)
        handler.setLevel(logging.WARNING)
        get_logger("synapse.test.sole_json").info("dropped")  # below the handler's level
        handler.flush()
        [line] = stream.getvalue().splitlines()
        event = json.loads(line)
        assert event["event"] == "hello" and event["n"] == 1 and event["level"] == "info"
        assert event["logger"] == "synapse.test.sole_json" and event["timestamp"].endswith("Z")
    finally:
        root.handlers = saved
        target.setLevel(logging.NOTSET)
