"""What an A2A follow-up message (a message naming an existing `taskId`) becomes.

A task waiting for input takes the message as the answer its executor asked for: the
requester-to-executor message its state lets it receive in the executor's transition table
(`task_info_provided` for `task_need_info`, `human_decision` for `task_need_human`).

A task that is working and asked nothing keeps the message: it joins the task's history and,
durably, the task's audit trail as a note (`FOLLOW_UP_NOTE`), where the handler reads it
(`follow_up_messages(ctx)`). It changes no state: Synapse has no message for it, and the
handler decides what, if anything, it means.

An answer is noted too (`ANSWER_NOTE`), durably, before it is applied: the task's history
keeps it across a restart, a retry of it is recognized, and the handler reads the messages
that answered its questions (`answer_messages(ctx)`: their ids, parts and metadata, beyond
the fields the answer carries).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from synapse.a2a import mapping, wire
from synapse.a2a.errors import invalid_params, unsupported
from synapse.a2a.server import view as views
from synapse.a2a.server.retries import fingerprint, reused
from synapse.a2a.server.view import ANSWER_NOTE, ANSWER_REFUSED_NOTE, FOLLOW_UP_NOTE, A2ATask
from synapse.p2p.engine import TaskRecord
from synapse.p2p.states import Role, allowed_events
from synapse.runtime.answers import AnswerRefused, TaskAnswer, check_answer
from synapse.runtime.handler import ExecutionContext
from synapse.types import (
    DecidedBy,
    Decision,
    DecisionAction,
    HumanDecision,
    HumanDecisionPayload,
    Message,
    MessageType,
    TaskInfoProvided,
    TaskInfoProvidedPayload,
    TaskState,
    new_message_id,
)

#: Follow-up messages one task keeps; the next is refused (-32004): the task's record is
#: not a mailbox a caller may grow without end.
MAX_FOLLOW_UP_MESSAGES = 100

#: An answer to an interruption: (envelope type, payload), built from the task's view and
#: record, the message and the principal who sent it.
Answer = tuple[type[Message], Any]
_AnswerBuilder = Callable[[A2ATask, TaskRecord, wire.Message, str], Answer]


def _info_provided(view: A2ATask, rec: TaskRecord, message: wire.Message, principal: str) -> Answer:
    fields = mapping.info_fields(message, rec.need_info)
    return TaskInfoProvided, TaskInfoProvidedPayload(task_id=view.id, fields=fields)


def _human_decision(
    view: A2ATask, rec: TaskRecord, message: wire.Message, principal: str
) -> Answer:
    approve, fields, reason, notes = mapping.decision_of(message)
    if rec.need_human_id is None:
        raise unsupported(f"Task {view.id} has no pending decision", taskId=view.id)
    decision = HumanDecisionPayload(
        task_id=view.id,
        decision_id=f"dec-{new_message_id()[4:]}",
        reply_to=rec.need_human_id,
        decided_by=DecidedBy(user_id=principal),
        decision=Decision(
            action=DecisionAction.APPROVE if approve else DecisionAction.REJECT,
            approved_fields=fields,
            rejection_reason=reason,
        ),
        notes=notes,
        timestamp=datetime.now(UTC),
    )
    return HumanDecision, decision


#: What an A2A follow-up message becomes, for each requester-to-executor message type that
#: answers an interruption. Which one applies is not decided here but by the executor's
#: transition table: the type the task's state lets it receive.
_ANSWERS: Mapping[MessageType, _AnswerBuilder] = {
    MessageType.TASK_INFO_PROVIDED: _info_provided,
    MessageType.HUMAN_DECISION: _human_decision,
}


def check(rec: TaskRecord, payload: Any) -> None:
    """The checks every answer passes whatever its front (`synapse.runtime.answers`): an
    approval's edits keep the types of the values proposed, and information gives every
    field asked for. A refused answer is invalid params (-32602) and changes nothing."""
    if isinstance(payload, HumanDecisionPayload):
        answer = TaskAnswer(
            "decide",
            payload.decided_by,
            "a2a",
            action=payload.decision.action,
            fields=payload.decision.approved_fields,
            rejection_reason=payload.decision.rejection_reason or "",
        )
    else:
        answer = TaskAnswer("provide", DecidedBy(user_id=""), "a2a", fields=payload.fields)
    try:
        check_answer(rec, answer)
    except AnswerRefused as exc:
        raise invalid_params(exc.reason, path="message.parts") from None


def answer_builder(state: TaskState) -> _AnswerBuilder | None:
    """The builder of the answer a follow-up to a task in `state` (executor side) is, if
    the state waits for one."""
    for event in allowed_events(Role.EXECUTOR, state):
        build = _ANSWERS.get(event.message_type) if event.message_type else None
        if build is not None and event.value.startswith("recv "):
            return build
    return None


def to_keep(view: A2ATask, rec: TaskRecord, message: wire.Message) -> bool:
    """Whether `message` is still to keep or apply (False: a retry of one received already,
    as a kept message or an answer), read in one pass over those. The same `messageId` on
    another message is refused, as for a new task's, and so is one more than
    `MAX_FOLLOW_UP_MESSAGES`."""
    kept = views.history_messages(rec.audit)
    for earlier in kept:
        if earlier.message_id == message.message_id:
            if fingerprint(earlier) != fingerprint(message):
                raise reused(message.message_id)
            return False
    if len(kept) >= MAX_FOLLOW_UP_MESSAGES:
        raise unsupported(
            f"Task {view.id} keeps at most {MAX_FOLLOW_UP_MESSAGES} follow-up messages",
            taskId=view.id,
        )
    return True


def answered_already(rec: TaskRecord, message: wire.Message) -> bool:
    """Whether `message` is a retry of an answer the task took (same `messageId`, same
    content): it answers nothing more. The same `messageId` on another answer is a new
    answer: clients reuse ids (the A2A TCK sends every answer of a session under one)."""
    return any(
        earlier.message_id == message.message_id and fingerprint(earlier) == fingerprint(message)
        for earlier in views.answer_messages(rec.audit)
    )


def follow_up_messages(ctx: ExecutionContext) -> list[wire.Message]:
    """The A2A messages sent to this task while it worked (not answers to its questions),
    oldest first: what a handler reads to take later instructions into account."""
    return views.kept_messages(ctx.notes)


def answer_messages(ctx: ExecutionContext) -> list[wire.Message]:
    """The A2A messages that answered this task's questions, oldest first: the last one is
    the answer `need_info` or `need_human` just returned (its `messageId`, its parts and
    metadata, beyond the fields or decision the answer carries)."""
    return views.answer_messages(ctx.notes)


__all__ = [
    "ANSWER_NOTE",
    "ANSWER_REFUSED_NOTE",
    "FOLLOW_UP_NOTE",
    "MAX_FOLLOW_UP_MESSAGES",
    "Answer",
    "answer_builder",
    "answer_messages",
    "answered_already",
    "follow_up_messages",
    "to_keep",
]
