"""The runtime's handler runner: it starts `execute_task`, carries out what a running
handler asks (report status, ask for information, ask a person), and records its outcome."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from synapse.p2p.commands import Complete, Fail, ReportStatus, RequestHuman, RequestInfo
from synapse.p2p.engine import (
    StartExecution,
    TaskKey,
    TaskRecord,
)
from synapse.runtime.handler import (
    ExecutionContext,
    TaskFailure,
    as_result,
)
from synapse.runtime.runtime_base import RuntimeBase, log
from synapse.runtime.sender import CallbackSender
from synapse.types import (
    ErrorCode,
    HumanDecisionPayload,
    LocalProtocolError,
    TaskError,
)


class HandlerRunning(RuntimeBase):
    """Runs the handler of each executor task, and carries out what it asks."""

    def expect_resume(self, key: TaskKey) -> asyncio.Future[Any]:
        """A future the next `ResumeExecution` for `key` resolves (used by the handler context)."""
        waiter: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiters[key] = waiter
        return waiter

    def task_record(self, key: TaskKey) -> TaskRecord | None:
        return self.engine.get(key)

    def report_status(self, command: ReportStatus) -> None:
        """Send a `task_status_update` for the running task."""
        self.apply(self.engine.handle(command, self.clock()))

    async def request_info(self, command: RequestInfo) -> Mapping[str, Any]:
        """Send `task_need_info` and wait for the fields of the `task_info_provided`."""
        await self.settled(command.key)
        waiter = self.expect_resume(command.key)
        self.apply(self.engine.handle(command, self.clock()))
        fields: Mapping[str, Any] = await waiter
        return fields

    async def request_human(self, command: RequestHuman) -> HumanDecisionPayload:
        """Send `task_need_human` and wait for an approving `human_decision`."""
        await self.settled(command.key)
        waiter = self.expect_resume(command.key)
        self.apply(self.engine.handle(command, self.clock()))
        decision: HumanDecisionPayload = await waiter
        return decision

    async def note_task(
        self, key: TaskKey, action: str, detail: Mapping[str, Any], actor: str | None = None
    ) -> None:
        """Add an entry to the task's audit trail (by `actor`: this agent unless said), and
        return once it is durable (it is written with the task's record: a resumed handler
        reads it back)."""
        await self.settled(key)
        moves = self.held_here(key)
        if self.note_task_soon(key, action, detail, actor):
            await self._commit_patiently()
            self._still_held(*moves)

    def note_task_soon(
        self, key: TaskKey, action: str, detail: Mapping[str, Any], actor: str | None = None
    ) -> bool:
        """`note_task`, written with the next commit, whoever makes it (not waited for);
        whether the task was there to note."""
        rec = self.engine.get(key)
        if rec is None or (not rec.is_final and key not in self.engine.tasks):
            return False  # unknown, or another replica's (a stale copy from the store)
        self.append_audit(rec, actor or self.engine.agent_id, action, None, detail)
        self.store.put_task(rec, [])
        return True

    async def _settled_for_handler(self, key: TaskKey) -> bool:
        """`settled`, for a handler that ended: False if the task was cancelled meanwhile
        (the message being committed was its task_cancel: the outcome is moot)."""
        try:
            await self.settled(key)
        except asyncio.CancelledError:
            return False
        return True

    def _start_handler(self, action: StartExecution) -> None:
        rec = self.engine.get(action.key)
        assert rec is not None
        task = asyncio.create_task(
            self._run_handler(
                action, ExecutionContext(self, action.key, rec.task, action.answered)
            ),
            name=f"synapse-task-{action.key}",
        )
        self._running[action.key] = task

    async def _run_handler(self, action: StartExecution, ctx: ExecutionContext) -> None:
        key = action.key
        started, wall = time.perf_counter(), self.clock()
        outcome = "completed"
        try:
            if self._handler is None:
                raise LocalProtocolError("no TaskHandler set")
            value = await self._handler.execute_task(ctx, action.task_type, action.payload)
            # A message about this task is being committed (a task_cancel, say): its effect
            # on the task is not settled until that commit succeeds (then it is carried out:
            # a cancel cancels us here) or fails (then it is rolled back). The outcome is
            # applied after that, so that it is judged on what holds, and built once.
            await self.settled(key)
        except asyncio.CancelledError:
            outcome = "cancelled"
            if not self._closed:
                log.info("handler_cancelled", task_id=key.task_id, requester=key.requester)
            return
        except TaskFailure as failure:  # the handler's own verdict: no bug, no traceback
            outcome = "failed"
            log.info(
                "handler_failed",
                task_id=key.task_id,
                requester=key.requester,
                code=failure.error.code,
                error=failure.error.message,
            )
            if await self._settled_for_handler(key):
                self.apply(self.engine.handle(Fail(key, failure.error), self.clock()))
        except Exception as exc:
            outcome = "failed"
            # A bug in the handler: its traceback for whoever runs this peer (where the
            # application's logging sends errors), only its type and message for the partner.
            log.error(
                "handler_failed",
                task_id=key.task_id,
                requester=key.requester,
                task_type=action.task_type,
                error=repr(exc),
                exc_info=exc,
            )
            text = str(exc)
            error = TaskError(
                code=ErrorCode.EXECUTION_FAILED.value,
                message=f"{type(exc).__name__}: {text}" if text else type(exc).__name__,
                recoverable=True,
            )
            if await self._settled_for_handler(key):
                self.apply(self.engine.handle(Fail(key, error), self.clock()))
        else:
            step = self.engine.handle(Complete(key, as_result(value)), self.clock())
            if step.discarded:
                log.info("late_result_discarded", task_id=key.task_id, requester=key.requester)
            self.apply(step)
        finally:
            self._running.pop(key, None)
            self._waiters.pop(key, None)
            if self.listeners:
                seconds = time.perf_counter() - started
                self.listeners.on_handler_done(key, action.task_type, wall, seconds, outcome)

    def _require_sender(self, partner: str) -> CallbackSender:
        for prefix, local in self._local_senders.items():
            if partner.startswith(prefix):
                return local
        if self._sender is None:
            raise LocalProtocolError("no CallbackSender set")
        return self._sender
