"""A handler that raises, between two real peers: the executor's operator gets the traceback
(an error-level record with the exception), the requester only the exception's type and
message; a `TaskFailure` is the handler's own verdict, passed on as it is, without one."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from flowkit import WAIT, PairFactory

from synapse import ExecutionContext, TaskFailure, Validation
from synapse.types import TaskError, TaskState


class Buggy:
    def get_capabilities(self) -> list[str]:
        return ["lookup", "refuse"]

    def validate_task(self, task_type: str, payload: dict[str, Any]) -> Validation:
        return Validation()

    async def execute_task(
        self, ctx: ExecutionContext, task_type: str, payload: dict[str, Any]
    ) -> str:
        if task_type == "refuse":
            raise TaskFailure(TaskError(code="quota_exceeded", message="no more today"))
        return str(payload["txt"])  # the payload says "text": KeyError('txt')


async def test_a_failing_handler_logs_its_traceback_and_tells_the_partner_what_failed(
    make_pair: PairFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="synapse")
    async with make_pair(e_handler=Buggy()) as pair:
        handle = await pair.r.submit(pair.e.agent_id, "lookup", {"text": "x"})
        outcome = await handle.result(timeout=WAIT)
    assert outcome.state is TaskState.FAILED and outcome.error is not None
    assert (outcome.error.code, outcome.error.message) == ("execution_failed", "KeyError: 'txt'")
    assert "Traceback" not in outcome.error.message
    (record,) = [r for r in caplog.records if "handler_failed" in r.getMessage()]
    assert record.levelno == logging.ERROR
    assert record.exc_info is not None and isinstance(record.exc_info[1], KeyError)
    formatted = logging.Formatter().format(record)
    assert "Traceback (most recent call last)" in formatted and 'payload["txt"]' in formatted


async def test_a_task_failure_is_passed_on_as_the_handler_said_without_a_traceback(
    make_pair: PairFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="synapse")
    async with make_pair(e_handler=Buggy()) as pair:
        handle = await pair.r.submit(pair.e.agent_id, "refuse", {})
        outcome = await handle.result(timeout=WAIT)
    assert outcome.error is not None
    assert (outcome.error.code, outcome.error.message) == ("quota_exceeded", "no more today")
    (record,) = [r for r in caplog.records if "handler_failed" in r.getMessage()]
    assert record.levelno == logging.INFO and record.exc_info is None
