"""What the engine receives: POSTed requests and callbacks (`receive`), the replies to what
it POSTed (`on_reply`), and the news that a message could not be delivered."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from synapse.p2p.engine_base import (
    _ACKED,
    _DECISIONS,
    _REPLY_EVENTS,
    UNDELIVERABLE,
    EngineBase,
    EngineTimer,
    _epoch,
    _not_found,
)
from synapse.p2p.records import (
    CancelExecution,
    DropQueued,
    Refusal,
    Step,
    TaskEvent,
    TaskKey,
    TaskNote,
    TaskRecord,
    Validation,
    as_capability,
)
from synapse.p2p.states import (
    AWAITING_REPLY,
    Event,
    Role,
    next_state,
)
from synapse.types import (
    EXECUTOR_TO_REQUESTER,
    Ack,
    AckPayload,
    Alternatives,
    Capability,
    CapabilityQuery,
    CapabilityResponse,
    CapabilityResponsePayload,
    DecisionAction,
    ErrorCode,
    Heartbeat,
    HumanDecision,
    Message,
    Nack,
    NackPayload,
    NotReady,
    Reason,
    RemoteProtocolError,
    TaskAck,
    TaskAckPayload,
    TaskCancel,
    TaskComplete,
    TaskConfirmPayload,
    TaskError,
    TaskFailed,
    TaskInfoProvided,
    TaskNeedHuman,
    TaskNeedInfo,
    TaskNeedInfoPayload,
    TaskReject,
    TaskRejectPayload,
    TaskRequest,
    TaskSpec,
    TaskState,
    TaskStatusUpdate,
)


class Receiving(EngineBase):
    """The engine's answers to what its partners POST, and what it makes of their replies."""

    def receive(self, message: Message, now: float) -> Step:
        """Apply a POSTed message from an authenticated partner; `step.reply` answers it.

        Raises `RemoteProtocolError` (and changes nothing) when the message is refused: only an
        accepted message is a sign of life of its sender.
        """
        step = Step()
        if isinstance(message, TaskRequest):
            self._on_task_request(message, now, step)
        elif isinstance(message, TaskInfoProvided | TaskCancel | HumanDecision):
            self._on_requester_message(message, now, step)
        elif message.message_type in EXECUTOR_TO_REQUESTER:
            self._on_executor_callback(message, now, step)
        elif isinstance(message, Heartbeat):
            reply = self.heartbeat(message.from_.agent_id, now)
            step.reply = self._reply(Heartbeat, reply.payload, message, now)
        elif isinstance(message, CapabilityQuery):
            step.reply = self._capability_response(message, now)
        else:
            raise RemoteProtocolError(
                ErrorCode.INVALID_PARAMS,
                f"{message.message_type.value} is only ever a synchronous reply",
                {"reason": "reply_only_type"},
            )
        self.heard(message.from_.agent_id, now, step)
        return step

    def _capability_response(self, query: CapabilityQuery, now: float) -> CapabilityResponse:
        wanted = query.payload.task_type
        caps = [as_capability(c) for c in self.capabilities()]
        if wanted is not None:
            caps = [c for c in caps if c.name == wanted]
        payload = CapabilityResponsePayload(
            agent_id=self.agent_id,
            capabilities=caps,
            max_concurrent_tasks=self.config.max_concurrent_tasks,
        )
        response: CapabilityResponse = self._reply(CapabilityResponse, payload, query, now)
        return response

    def _on_task_request(self, message: TaskRequest, now: float, step: Step) -> None:
        spec = message.payload.task
        key = TaskKey(message.from_.agent_id, spec.id)
        existing = self.get(key)
        if existing is not None:
            if existing.role is Role.EXECUTOR and existing.task == spec:
                step.reply = self._decision_reply(existing, message, now)
                return
            if existing.is_final:
                raise RemoteProtocolError(
                    ErrorCode.TASK_ALREADY_COMPLETED,
                    f"task {spec.id!r} is already {existing.state.value}",
                    {"state": existing.state.value, "task_id": spec.id},
                )
            raise RemoteProtocolError(
                ErrorCode.INVALID_PARAMS,
                f"task id {spec.id!r} is already in use for another task",
                {"reason": "task_id_in_use", "task_id": spec.id},
            )
        if not self.ready or self.draining:
            raise NotReady(
                "draining: not accepting new tasks" if self.draining else "starting up",
                {"reason": "draining" if self.draining else "starting"},
            )
        rec = TaskRecord(
            key=key,
            role=Role.EXECUTOR,
            partner=message.from_.agent_id,
            task=spec,
            context=message.payload.context,
            request_id=message.id,
            created_at=now,
            updated_at=now,
        )
        verdict = self._judge(spec, now)
        if not isinstance(verdict, TaskRejectPayload):
            verdict = self._share_refusal(spec, key.requester) or verdict
        self._track(rec, now)
        if isinstance(verdict, TaskRejectPayload):
            rec.reject = verdict
            self._move(rec, Event.SEND_TASK_REJECT, now, message.id, step)
        elif isinstance(verdict, TaskNeedInfoPayload):
            rec.need_info = verdict
            self._move(
                rec,
                Event.SEND_TASK_NEED_INFO,
                now,
                message.id,
                step,
                wait_until=verdict.required_by,
            )
        else:
            self._move(rec, Event.SEND_TASK_CONFIRM, now, message.id, step)
            self._start(rec, now, step)
        if spec.deadline is not None and not rec.is_final:
            self._timers.set((EngineTimer.DEADLINE, key), _epoch(spec.deadline))
        rec.decision = self._reply(_DECISIONS[type(verdict)], verdict, message, now)
        step.reply = rec.decision

    def _share_refusal(self, spec: TaskSpec, partner: str) -> TaskRejectPayload | None:
        """`rate_limited` if `partner` holds its whole share of the capacity already."""
        share = self.config.max_tasks_per_partner
        if share is None or self._executing_for.get(partner, 0) < share:
            return None
        retry = self.config.capacity_retry_after
        return TaskRejectPayload(
            task_id=spec.id,
            reason=Reason(
                code=ErrorCode.RATE_LIMITED.value, message=f"at max tasks per partner ({share})"
            ),
            alternatives=Alternatives(retry_after=retry) if retry else None,
        )

    def _judge(
        self, spec: TaskSpec, now: float
    ) -> TaskConfirmPayload | TaskRejectPayload | TaskNeedInfoPayload:
        """Decide the synchronous answer to a new task (specs/protocol.md, 'Transport' and
        'Error codes')."""

        def reject(code: ErrorCode, text: str, retry_after: int | None = None) -> TaskRejectPayload:
            alternatives = Alternatives(retry_after=retry_after) if retry_after else None
            return TaskRejectPayload(
                task_id=spec.id,
                reason=Reason(code=code.value, message=text),
                alternatives=alternatives,
            )

        if spec.deadline is not None and _epoch(spec.deadline) <= now:
            return reject(ErrorCode.EXECUTION_TIMEOUT, "the task's deadline has already passed")
        offered = self.capabilities()
        if not isinstance(offered, list | tuple):
            offered = list(offered)  # a provider may hand back any iterable
        # Names as plain strings are the common case: one C-level search of the list.
        if spec.type not in offered and not any(
            isinstance(c, Capability) and c.name == spec.type for c in offered
        ):
            return reject(ErrorCode.CAPABILITY_LACKING, f"task type {spec.type!r} is not offered")
        if self._executing >= self.config.max_concurrent_tasks:
            return reject(
                ErrorCode.RATE_LIMITED,
                "at max concurrent tasks",
                self.config.capacity_retry_after,
            )
        try:
            validation = Validation.coerce(self.validator(spec.type, dict(spec.payload)))
        except Exception as exc:  # the handler's bug must not become a 500
            return reject(ErrorCode.EXECUTION_FAILED, f"validate_task raised: {exc!r}")
        if not validation.ok:
            reason = validation.reason or Reason(
                code=ErrorCode.INVALID_PARAMS.value, message="task payload not acceptable"
            )
            return TaskRejectPayload(task_id=spec.id, reason=reason)
        if validation.missing_fields:
            return TaskNeedInfoPayload(
                task_id=spec.id,
                missing_fields=validation.missing,
                question=validation.question,
                required_by=validation.required_by,
            )
        return TaskConfirmPayload(
            task_id=spec.id,
            confirmed=True,
            estimated_duration=validation.estimated_duration,
            capabilities_used=[spec.type],
        )

    def _decision_reply(self, rec: TaskRecord, request: TaskRequest, now: float) -> Message:
        """The original synchronous answer again, now answering `request`."""
        decision = rec.decision
        assert decision is not None
        reply: Message = self._reply(type(decision), decision.payload, request, now)
        return reply

    def _moved_by_message(self, key: TaskKey) -> TaskRecord | None:
        """The task a partner's message moves: held here, or finished (read from the
        store, answered as it was). A live task the store keeps and this engine does not
        hold is another process's (a replica's): a copy of it moved here would write a
        history whose row never moves. The sender retries, and reaches whoever holds it."""
        rec = self.tasks.get(key)
        if rec is not None:
            return rec
        stored = self.finished_lookup(key)
        if stored is not None and not stored.is_final:
            raise NotReady(
                "the task is not held here; retry later", {"reason": "task_held_elsewhere"}
            )
        return stored

    def _executor_record(self, message: Message, task_id: str) -> TaskRecord:
        rec = self._moved_by_message(TaskKey(message.from_.agent_id, task_id))
        if rec is None or rec.role is not Role.EXECUTOR:
            raise _not_found(task_id)
        return rec

    def _on_requester_message(
        self, message: TaskInfoProvided | TaskCancel | HumanDecision, now: float, step: Step
    ) -> None:
        rec = self._executor_record(message, message.payload.task_id)
        if self._answered_before(rec, message, now, step):
            return
        if isinstance(message, TaskCancel):
            self._move(rec, Event.RECV_TASK_CANCEL, now, message.id, step)
            step.reply = self.task_ack(message, rec, now)
            step.actions += [CancelExecution(rec.key, "cancelled"), DropQueued(rec.key)]
        elif isinstance(message, TaskInfoProvided):
            self._move(rec, Event.RECV_TASK_INFO_PROVIDED, now, message.id, step)
            step.reply = self.task_ack(message, rec, now)
            rec.provided.update(message.payload.fields)
            self._after_info(rec, message.payload.fields, now, step)
        else:
            decision = message.payload.decision
            approve = decision.action is DecisionAction.APPROVE
            event = Event.RECV_HUMAN_APPROVE if approve else Event.RECV_HUMAN_REJECT
            next_state(rec.role, rec.state, event)  # refuse a wrong state before the payload
            if message.payload.reply_to != rec.need_human_id:
                raise RemoteProtocolError(
                    ErrorCode.INVALID_PARAMS,
                    "human_decision.reply_to is not the pending task_need_human",
                    {"reason": "reply_to_mismatch", "expected": rec.need_human_id},
                )
            self._move(rec, event, now, message.id, step)
            step.reply = self.task_ack(message, rec, now)
            if approve:
                self._start(rec, now, step)
                self._resume(rec, message.payload, step)
            else:
                reason = decision.rejection_reason or "a person rejected the task"
                error = TaskError(
                    code=ErrorCode.PERMISSION_DENIED.value, message=reason, recoverable=False
                )
                self._fail(rec, error, now, step)

    def _after_info(
        self, rec: TaskRecord, fields: Mapping[str, Any], now: float, step: Step
    ) -> None:
        if rec.handler_started:
            self._start(rec, now, step)
            self._resume(rec, dict(fields), step)
            return
        # The information answered the synchronous task_need_info: judge the task again.
        payload = self._payload(rec)
        try:
            validation = Validation.coerce(self.validator(rec.task.type, dict(payload)))
        except Exception as exc:
            validation = Validation(
                ok=False, reason=Reason(code="execution_failed", message=repr(exc))
            )
        if not validation.ok:
            reason = validation.reason or Reason(
                code=ErrorCode.INVALID_PARAMS.value, message="task payload not acceptable"
            )
            error = TaskError(code=reason.code, message=reason.message, recoverable=False)
            self._fail(rec, error, now, step)
        elif validation.missing_fields:
            need = TaskNeedInfoPayload(
                task_id=rec.task_id,
                missing_fields=validation.missing,
                question=validation.question,
                required_by=validation.required_by,
            )
            rec.need_info = need
            self._move(rec, Event.SEND_TASK_NEED_INFO, now, None, step, wait_until=need.required_by)
            step.outgoing.append(self._callback(rec, TaskNeedInfo, need, now))
        else:
            self._start(rec, now, step)

    def _requester_record(self, message: Message, task_id: str) -> TaskRecord:
        rec = self._moved_by_message(TaskKey(self.agent_id, task_id))
        if rec is None or rec.role is not Role.REQUESTER or rec.partner != message.sender_id:
            raise _not_found(task_id)
        return rec

    def _answered_before(self, rec: TaskRecord, message: Message, now: float, step: Step) -> bool:
        """A message this task already applied (its id is in the task's history), received
        again: answered as it was the first time, and applied never again, however late it
        comes (a retry past the deduplication window: specs/protocol.md, 'Deduplication')."""
        applied = next((t for t in rec.history if t.message_id == message.id), None)
        if applied is None:
            return False
        if message.message_type in _ACKED:
            step.reply = self._reply(Ack, AckPayload(), message, now)
        else:
            payload = TaskAckPayload(task_id=rec.task_id, state=applied.to_state)
            step.reply = self._reply(TaskAck, payload, message, now)
        return True

    def _on_executor_callback(self, message: Message, now: float, step: Step) -> None:
        payload: Any = message.payload
        rec = self._requester_record(message, payload.task_id)
        if self._answered_before(rec, message, now, step):
            return
        if isinstance(message, TaskStatusUpdate):
            self._move(rec, Event.RECV_TASK_STATUS_UPDATE, now, message.id, step)
            if message.payload.progress is not None:
                rec.progress = message.payload.progress
            rec.status_message = message.payload.message
            step.reply = self._reply(Ack, AckPayload(), message, now)
        elif isinstance(message, TaskNeedInfo):
            self._move(rec, Event.RECV_TASK_NEED_INFO, now, message.id, step)
            rec.need_info = message.payload
            step.reply = self._reply(Ack, AckPayload(), message, now)
        elif isinstance(message, TaskNeedHuman):
            self._move(rec, Event.RECV_TASK_NEED_HUMAN, now, message.id, step)
            rec.need_human, rec.need_human_id = message.payload, message.id
            step.reply = self._reply(Ack, AckPayload(), message, now)
        elif isinstance(message, TaskComplete):
            self._move(rec, Event.RECV_TASK_COMPLETE, now, message.id, step)
            rec.result = message.payload.result
            step.reply = self.task_ack(message, rec, now)
        elif isinstance(message, TaskFailed):
            self._move(rec, Event.RECV_TASK_FAILED, now, message.id, step)
            rec.error = message.payload.error
            step.reply = self.task_ack(message, rec, now)
        step.actions.append(TaskEvent(rec.key, message.message_type, rec.state, message))

    def on_reply(self, sent: Message, reply: Message, now: float) -> Step:
        """Apply the synchronous reply to a message we POSTed (delivered or refused)."""
        step = Step()
        self.heard(sent.to.agent_id, now, step)
        if isinstance(reply, Nack):
            self._on_nack(sent, reply.payload, now, step)
            return step
        if isinstance(sent, TaskRequest):
            rec = self.get(TaskKey(self.agent_id, sent.payload.task.id))
            event = _REPLY_EVENTS.get(type(reply))
            if rec is None or event is None:
                return step
            if rec.state in AWAITING_REPLY:
                self._move(rec, event, now, reply.id, step)
                if isinstance(reply, TaskReject):
                    rec.reject = reply.payload
                elif isinstance(reply, TaskNeedInfo):
                    rec.need_info = reply.payload
                step.actions.append(TaskEvent(rec.key, reply.message_type, rec.state, reply))
            # Otherwise a callback overtook this reply and implicitly confirmed the task.
            self._send_requested_cancel(rec, now, step)
        elif isinstance(sent, TaskCancel) and isinstance(reply, TaskAck):
            rec = self.get(TaskKey(self.agent_id, sent.payload.task_id))
            if rec is not None and not rec.is_final and reply.payload.state is TaskState.CANCELLED:
                self._move(rec, Event.RECV_CANCEL_ACK, now, reply.id, step)
                step.actions.append(TaskEvent(rec.key, reply.message_type, rec.state, reply))
        return step

    def _on_nack(self, sent: Message, nack: NackPayload, now: float, step: Step) -> None:
        key = self._key_of(sent)
        step.actions.append(Refusal(key, sent, nack))
        rec = self.tasks.get(key) if key is not None else None
        if rec is None or rec.role is not Role.REQUESTER:
            return
        if isinstance(sent, TaskRequest) and rec.state in AWAITING_REPLY:
            rec.refusal = nack
            self._move(rec, Event.REQUEST_REFUSED, now, None, step)
            step.actions.append(TaskEvent(rec.key, TaskNote.REFUSED, rec.state, None, nack.message))
        elif not rec.is_final and nack.code == ErrorCode.TASK_NOT_FOUND.value:
            # E has no such task (it lost it, or never had it): waiting would be forever.
            text = f"{rec.partner} has no such task: {nack.message}"
            self._give_up(rec, ErrorCode.TASK_NOT_FOUND, text, now, step)
        elif not rec.is_final:
            # 409 on a cancel: E finished first; its final callback is on its way.
            step.actions.append(TaskEvent(rec.key, TaskNote.REFUSED, rec.state, None, nack.message))

    def incoming_key(self, message: Message) -> TaskKey | None:
        """The key of the task a POSTed `message` is about (None if about no task)."""
        if isinstance(message, TaskRequest):
            return TaskKey(message.from_.agent_id, message.payload.task.id)
        task_id = getattr(message.payload, "task_id", None)
        if task_id is None:
            return None
        if message.message_type in EXECUTOR_TO_REQUESTER:
            return TaskKey(self.agent_id, task_id)
        return TaskKey(message.from_.agent_id, task_id)

    def _key_of(self, sent: Message) -> TaskKey | None:
        if isinstance(sent, TaskRequest):
            return TaskKey(self.agent_id, sent.payload.task.id)
        task_id = getattr(sent.payload, "task_id", None)
        if task_id is None:
            return None
        if sent.message_type in EXECUTOR_TO_REQUESTER:
            return TaskKey(sent.to.agent_id, task_id)
        return TaskKey(self.agent_id, task_id)

    def on_undeliverable(self, sent: Message, now: float, cause: str = "") -> Step:
        """Retries of `sent` ran out; it stays queued until the partner answers again.

        Except a `task_request` never answered (`P2PConfig.fail_undelivered_requests`, the
        default): waiting for a partner that may never come back would hold the task
        forever, so the task fails here (`undeliverable`) and the request is dropped."""
        step = Step()
        key = self._key_of(sent)
        rec = self.tasks.get(key) if key is not None else None
        if (
            rec is not None
            and isinstance(sent, TaskRequest)
            and rec.state in AWAITING_REPLY
            and self.config.fail_undelivered_requests
        ):
            text = f"the task_request never reached {rec.partner}: " + (
                cause or "its deliveries ran out"
            )
            self._give_up(rec, UNDELIVERABLE, text, now, step)
            return step
        if rec is not None and rec.role is Role.REQUESTER and not rec.is_final:
            # (A final task's outcome was told: that its task_cancel waits is no news.)
            step.actions.append(
                TaskEvent(
                    rec.key, TaskNote.UNDELIVERABLE, rec.state, sent, "partner did not answer"
                )
            )
        return step
