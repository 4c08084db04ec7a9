"""The one gate every answer to a waiting requester task passes: a `human_decision` or a
`task_info_provided`, whichever front it comes from (a signed link, the console, MCP, the
command line's prompts, an A2A follow-up, the Python API).

`TaskHandle.decide` and `TaskHandle.provide_info` build a `TaskAnswer` and hand it to the
runtime's `AnswerGate`, which checks it and sends it (or only records it, when a quorum is not
reached yet), under one lock, so that two answers never both count. The default gate,
`BasicGate`, checks what the question itself says: an edited value must have the type of the
value proposed for its field, and every field asked for must be given. `synapse.humans`
installs a gate that adds the configuration's rules (who is a reviewer, roles, quorums,
schemas) to the same checks.

A refused answer raises `AnswerRefused` before anything is written: it changes nothing.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol

from synapse.types import DecidedBy, DecisionAction, LocalProtocolError, TaskState

if TYPE_CHECKING:
    from synapse.p2p.engine import TaskRecord


class Asked(Protocol):
    """What a gate reads of the task asked (a `TaskHandle`)."""

    @property
    def task_id(self) -> str: ...

    @property
    def record(self) -> TaskRecord: ...


class OneAnswerAtATime:
    """A lock per task: two answers to one task's question never both count, and answers
    to different tasks do not wait for each other. A lock lives while someone holds or
    waits for it."""

    def __init__(self) -> None:
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    def of(self, asked: Asked) -> asyncio.Lock:
        lock = self._locks.get(asked.task_id)
        if lock is None:
            lock = self._locks[asked.task_id] = asyncio.Lock()
        return lock


#: The fronts an answer comes from (recorded in the task's audit trail).
Front = Literal["link", "console", "mcp", "cli", "a2a", "router", "python", "policy"]

WAITING_FOR_DECISION = frozenset({TaskState.NEED_HUMAN, TaskState.HUMAN_DECIDING})


class AnswerRefused(LocalProtocolError):
    """An answer that decides nothing; `status` is the HTTP status a front answers with
    (400 a bad value, 403 not this person's to give, 409 not the question waiting)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True, slots=True)
class TaskAnswer:
    """One answer to the question a requester task waits on."""

    #: `decide` answers `task_need_human`, `provide` answers `task_need_info`.
    kind: Literal["decide", "provide"]
    #: Who answers: for a decision, its `decided_by` (a gate may replace it with what the
    #: configuration says of that person); for information, its `user_id` is the audit's actor.
    by: DecidedBy
    front: Front
    #: Approve or reject (a decision only).
    action: DecisionAction | None = None
    #: The approved fields of a decision (an approval's edits), or the provided fields.
    fields: Mapping[str, Any] | None = None
    rejection_reason: str = ""
    notes: str = ""
    #: The nonce of the signed link it came from, if any (a link is used once).
    link: str = ""


#: Sends an admitted answer (the handle's own send, committed when it returns).
Send = Callable[[TaskAnswer], Awaitable[None]]


class AnswerGate(Protocol):
    """Checks an answer and sends it (or records it, for a quorum); what to tell the person."""

    async def admit(self, handle: Asked, answer: TaskAnswer, send: Send) -> str:
        """Check `answer` to `handle`'s question (its record read under the gate's lock) and
        `send` it, or record it; `AnswerRefused` before anything is written if it cannot
        be taken."""
        ...


def proposed_values(rec: TaskRecord) -> dict[str, Any]:
    """The proposed value of each field of a `need_human`: its most confident option (the
    first, if none says)."""
    best: dict[str, tuple[float, Any]] = {}
    for option in rec.need_human.options if rec.need_human is not None else ():
        confidence = option.confidence if option.confidence is not None else -1.0
        if option.field not in best or confidence > best[option.field][0]:
            best[option.field] = (confidence, option.value)
    return {name: value for name, (_, value) in best.items()}


def same_type(value: Any, like: Any) -> bool:
    """Whether `value` may stand for `like` (an integer for a float; never a bool for a
    number, nor a string for a bool)."""
    if like is None:
        return True
    if isinstance(like, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(like, bool)
    if isinstance(like, int | float):
        return isinstance(value, int | float) if isinstance(like, float) else isinstance(value, int)
    return isinstance(value, type(like))


def type_name(value: Any) -> str:
    """The JSON name of `value`'s type, with its article: "an integer", "a string"."""
    name = {
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        list: "list",
        dict: "object",
    }.get(type(value), type(value).__name__)
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def check_answer(rec: TaskRecord, answer: TaskAnswer, *, strict: bool = False) -> None:
    """What every gate checks: the task waits for this kind of answer, edited values keep
    their proposed types, and every field asked for is given. `strict` (a person's answer
    under a configured route) adds: edits name fields of the decision, and a rejection has
    a reason (the protocol leaves it optional)."""
    if answer.kind == "decide":
        if rec.state not in WAITING_FOR_DECISION:
            raise AnswerRefused(409, f"the task is {rec.state.value}, not waiting for a decision")
        reject = answer.action is DecisionAction.REJECT
        if strict and reject and not answer.rejection_reason.strip():
            raise AnswerRefused(400, "a rejection needs a reason")
        if answer.action is DecisionAction.APPROVE:
            proposed = proposed_values(rec)
            for name, value in (answer.fields or {}).items():
                if name not in proposed:
                    if strict:
                        raise AnswerRefused(400, f"{name!r} is not a field of this decision")
                    continue
                if not same_type(value, proposed[name]):
                    raise AnswerRefused(
                        400,
                        f"{name!r} must be {type_name(proposed[name])}, like its proposed "
                        f"value {proposed[name]!r} (got {value!r})",
                    )
        return
    if rec.state is not TaskState.INFO_NEEDED or rec.need_info is None:
        raise AnswerRefused(409, f"the task is {rec.state.value}, not waiting for information")
    given = answer.fields or {}
    missing = [f.field for f in rec.need_info.missing_fields if given.get(f.field) in (None, "")]
    if missing:
        raise AnswerRefused(400, f"missing fields: {', '.join(missing)}")


def filled(rec: TaskRecord, answer: TaskAnswer) -> TaskAnswer:
    """An approval with the proposed value of each field it does not edit."""
    if answer.kind != "decide" or answer.action is not DecisionAction.APPROVE:
        return answer
    return replace(answer, fields={**proposed_values(rec), **(answer.fields or {})})


class BasicGate:
    """The gate of a peer with no configured people: the question's own checks, one answer
    at a time."""

    def __init__(self) -> None:
        self.locks = OneAnswerAtATime()

    async def admit(self, handle: Asked, answer: TaskAnswer, send: Send) -> str:
        async with self.locks.of(handle):
            check_answer(handle.record, answer)
            await send(answer)
        return "sent"


__all__ = [
    "AnswerGate",
    "AnswerRefused",
    "Asked",
    "BasicGate",
    "Front",
    "OneAnswerAtATime",
    "Send",
    "TaskAnswer",
    "check_answer",
    "filled",
    "proposed_values",
    "same_type",
    "type_name",
]
