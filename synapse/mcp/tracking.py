"""One delegated task as the MCP server follows it: a Synapse task or an A2A task, one shape.

A `Delegation` reads its handle's events in the background and keeps what a tool call
reports (state, progress, the question the task waits on, the outcome), with a version that
grows at each change so that several tool calls can wait for the next one. Its answers go back
through the handle: `task_info_provided` / `human_decision` for a Synapse peer, a follow-up
message for an A2A agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, Literal

import msgspec

from synapse.a2a import A2AError, A2AEvent, A2AOutcome, A2ATaskHandle, mapping, wire
from synapse.logs import get_logger
from synapse.mcp.questions import PersonAnswer, Question
from synapse.p2p.engine_base import UNDELIVERABLE
from synapse.runtime.protocol import Outcome, TaskAbandoned, TaskHandle, TaskUndeliverable
from synapse.types import DecidedBy, TaskError, TaskNeedInfoPayload, TaskResult, TaskState
from synapse.types.errors import SynapseException

#: The states in which a Synapse task still waits for a person's answer.
_WAITING = frozenset({TaskState.NEED_HUMAN, TaskState.HUMAN_DECIDING, TaskState.INFO_NEEDED})

log = get_logger("synapse.mcp")

#: MCP's task statuses (the Tasks extension's `TaskStatus`).
McpStatus = Literal["working", "input_required", "completed", "failed", "cancelled"]

#: A Synapse state → the MCP task status it reads as (docs/mcp.md, the mapping table).
MCP_STATUS: dict[TaskState, McpStatus] = {
    TaskState.IDLE: "working",
    TaskState.PENDING: "working",
    TaskState.CONFIRMED: "working",
    TaskState.EXECUTING: "working",
    TaskState.INFO_PROVIDED: "working",
    TaskState.HUMAN_APPROVED: "working",
    TaskState.INFO_NEEDED: "input_required",
    TaskState.NEED_HUMAN: "input_required",
    TaskState.HUMAN_DECIDING: "input_required",
    TaskState.HUMAN_REJECTED: "failed",
    TaskState.COMPLETED: "completed",
    TaskState.FAILED: "failed",
    TaskState.REJECTED: "failed",
    TaskState.CANCELLED: "cancelled",
}

#: An A2A state → the MCP task status.
A2A_STATUS: dict[str, McpStatus] = {
    wire.INPUT_REQUIRED: "input_required",
    wire.AUTH_REQUIRED: "input_required",
    wire.COMPLETED: "completed",
    wire.CANCELED: "cancelled",
    wire.FAILED: "failed",
    wire.REJECTED: "failed",
}


class Delegation:
    """A task this server delegated (or found in its store), followed for its tool calls."""

    def __init__(
        self,
        handle: TaskHandle | A2ATaskHandle,
        *,
        partner: str,
        task_type: str,
        follow: bool = True,
        owner: str | None = None,
    ) -> None:
        self.handle = handle
        self.partner = partner
        self.task_type = task_type
        #: The authenticated principal that delegated it (None: anyone of this server's
        #: clients may see it: stdio, no tokens, or a task read back from the store).
        self.owner = owner
        self.created_at = self.updated_at = time.time()
        self.protocol: Literal["synapse", "a2a"] = (
            "a2a" if isinstance(handle, A2ATaskHandle) else "synapse"
        )
        self.progress: float | None = None
        self.message = ""
        #: What the task waits on, until answered.
        self.question: Question | None = None
        self.result: TaskResult | None = None
        self.error: TaskError | None = None
        self.final = False
        #: It ended without running: refused, rejected, or never delivered.
        self.refused = False
        self.version = 0
        self._changed = asyncio.Event()
        self._follower: asyncio.Task[None] | None = None
        if isinstance(handle, TaskHandle):
            rec = handle.record
            self.progress, self.message = rec.progress, rec.status_message
            self.created_at = rec.created_at
            # A task found in the store after a restart: the question it waits on is in its
            # record (no event will ask it again).
            if rec.state is TaskState.INFO_NEEDED and rec.need_info is not None:
                self.question = Question(info=rec.need_info)
            elif rec.state in _WAITING and rec.need_human is not None:
                self.question = Question(human=rec.need_human)
        if follow:
            self._follower = asyncio.create_task(self._follow(), name=f"mcp-{self.task_id}")
        else:
            self._settle_now()

    @property
    def task_id(self) -> str:
        return self.handle.task_id

    @property
    def state(self) -> str:
        """The protocol's own state: Synapse's (`info_needed`, …) or A2A's (`TASK_STATE_…`)."""
        if isinstance(self.handle, A2ATaskHandle):
            return self.handle.state
        return self.handle.state.value

    @property
    def status(self) -> McpStatus:
        if isinstance(self.handle, A2ATaskHandle):
            status = A2A_STATUS.get(self.handle.state, "working")
        else:
            status = MCP_STATUS[self.handle.state]
        if status in ("completed", "failed", "cancelled") and not self.final:
            # The task's record has ended, but its outcome is not read yet: an ended status
            # comes with its result or error, never before them.
            return "working"
        return status

    def view(self) -> dict[str, Any]:
        """The task as a tool result reports it."""
        out: dict[str, Any] = {
            "task_id": self.task_id,
            "partner": self.partner,
            "task_type": self.task_type,
            "protocol": self.protocol,
            "status": self.status,
            "state": self.state,
        }
        if self.progress is not None:
            out["progress"] = self.progress
        if self.message:
            out["message"] = self.message
        if self.question is not None and not self.final:
            out["question"] = self.question.describe()
        if self.result is not None:
            out["result"] = msgspec.to_builtins(self.result)
        if self.error is not None:
            out["error"] = msgspec.to_builtins(self.error)
        return out

    # --- waiting ----------------------------------------------------------------------------

    async def changed(self, since: int, timeout: float) -> bool:
        """Wait until the version passes `since` (at most `timeout` s); whether it did."""
        loop = asyncio.get_running_loop()
        until = loop.time() + timeout
        while self.version <= since:
            left = until - loop.time()
            if left <= 0:
                return False
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)
        return True

    def _bump(self) -> None:
        self.version += 1
        self.updated_at = time.time()
        self._changed.set()

    # --- answers ----------------------------------------------------------------------------

    async def answer(self, answer: PersonAnswer, *, by: str) -> str:
        """Send `answer` to what the task asks (the caller checked there is a question); what
        to tell whoever answered (an answer a quorum only records leaves the question open)."""
        handle = self.handle
        said = "sent"
        if answer.action is not None and isinstance(handle, A2ATaskHandle):
            await handle.decide(
                answer.action,
                approved_fields=answer.fields,
                rejection_reason=answer.rejection_reason,
                notes=answer.notes,
            )
        elif answer.action is not None:
            assert isinstance(handle, TaskHandle)
            said = await handle.decide(
                answer.action,
                approved_fields=answer.fields,
                rejection_reason=answer.rejection_reason,
                notes=answer.notes,
                decided_by=DecidedBy(user_id=by),
                front="mcp",
            )
        elif answer.text is not None and isinstance(handle, A2ATaskHandle):
            await handle.reply(answer.text)
        elif isinstance(handle, A2ATaskHandle):
            await handle.provide_info(answer.fields, answer.notes or None)
        else:
            assert isinstance(handle, TaskHandle)
            said = await handle.provide_info(
                answer.fields, answer.notes or None, provided_by=by, front="mcp"
            )
        if isinstance(handle, A2ATaskHandle) or handle.state not in _WAITING:
            self.question = None
        self._bump()
        if isinstance(handle, A2ATaskHandle) and (self._follower is None or self._follower.done()):
            self._follower = asyncio.create_task(self._follow(), name=f"mcp-{self.task_id}")
        return said

    async def cancel(self, reason: str | None) -> None:
        await self.handle.cancel(reason)
        self._bump()

    async def close(self) -> None:
        if self._follower is not None and not self._follower.done():
            self._follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._follower
        if isinstance(self.handle, A2ATaskHandle):
            await self.handle.close()

    # --- following ----------------------------------------------------------------------------

    async def _follow(self) -> None:
        try:
            if isinstance(self.handle, A2ATaskHandle):
                async for a2a_event in self.handle.events():
                    self._on_a2a(a2a_event)
                    if a2a_event.final or a2a_event.kind == "message" or self.question:
                        break
            else:
                async for event in self.handle.events():
                    if (info := event.need_info) is not None:
                        self.question = Question(info=info)
                    elif (human := event.need_human) is not None:
                        self.question = Question(human=human)
                    elif (status := event.status_update) is not None:
                        self.progress = status.progress
                        self.message = status.message or status.status.value
                    self._bump()
                    if event.state.is_final:
                        break
            await self._settle()
        except (SynapseException, A2AError) as exc:
            log.warning("mcp_follow_failed", task_id=self.task_id, error=str(exc))
            self._bump()

    def _on_a2a(self, event: A2AEvent) -> None:
        assert isinstance(self.handle, A2ATaskHandle)
        if event.kind == "status_update" and event.text:
            self.message = event.text
        if isinstance(event.data, dict):
            progress = event.data.get("progress")
            if isinstance(progress, int | float) and not isinstance(progress, bool):
                self.progress = float(progress)
        asked = self.handle.input_required
        if asked is not None and not event.answered:
            self.question = a2a_question(asked, self.task_id)
        self._bump()

    async def _settle(self) -> None:
        """Read the outcome once the task is final (an A2A task stops at its question)."""
        handle = self.handle
        if isinstance(handle, A2ATaskHandle):
            if not handle.settled:
                return
            a2a = await handle.result()
            self._take(a2a)
        else:
            if not handle.state.is_final:
                return
            try:
                outcome = await handle.result()
            except (TaskAbandoned, TaskUndeliverable) as exc:
                outcome = exc.outcome
            self._take(outcome)
        self._bump()

    def _settle_now(self) -> None:
        """A task found in the store: its outcome is in its record already."""
        if isinstance(self.handle, TaskHandle) and self.handle.state.is_final:
            rec = self.handle.record
            self._take(Outcome.of(rec))

    def _take(self, outcome: Outcome | A2AOutcome) -> None:
        self.final = True
        self.question = None
        self.result = outcome.result
        error = outcome.error
        if isinstance(outcome, Outcome):
            if outcome.reject is not None:
                reason = outcome.reject.reason
                error = TaskError(code=reason.code, message=reason.message)
            elif outcome.refusal is not None:
                error = TaskError(code=outcome.refusal.code, message=outcome.refusal.message)
            refused = outcome.reject is not None or outcome.refusal is not None
            self.refused = refused or (error is not None and error.code == UNDELIVERABLE)
        else:
            self.refused = outcome.a2a_state == wire.REJECTED
        self.error = error


def a2a_question(message: wire.Message, task_id: str) -> Question:
    """What an A2A agent's INPUT_REQUIRED message asks: a Synapse agent says which fields or
    which decision (`metadata.synapseNeeds`); any other agent asks in words."""
    missing = mapping.missing_fields_of(message)
    if missing:
        text = mapping.message_text(message, " ")
        return Question(
            info=TaskNeedInfoPayload(task_id=task_id, missing_fields=missing, question=text)
        )
    needs = mapping.meta_value(message.metadata, mapping.NEEDS_KEY, mapping.LEGACY_NEEDS_KEY)
    if needs == mapping.NEEDS_HUMAN:
        human = mapping.need_human_of(message, task_id)
        if human is not None:
            return Question(human=human)
    return Question(text=mapping.message_text(message, " "))


__all__ = ["A2A_STATUS", "MCP_STATUS", "Delegation", "McpStatus", "a2a_question"]
