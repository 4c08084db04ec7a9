"""Turning a reviewer's answer (from a link) or the policy's time-out into the protocol's
answer: `human_decision` or `task_info_provided`, or a cancel; after checking edited values
and counting approvals when a route asks for a quorum or a role.

Every check comes before anything is written: a refused answer changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from synapse.humans.config import HumansConfig, Person
from synapse.humans.links import Link
from synapse.humans.question import (
    APPROVAL,
    LINK_USED,
    QUEUED,
    REJECTION,
    TIMEOUT,
    OpenQuestion,
)
from synapse.logs import get_logger
from synapse.runtime.protocol import P2PProtocol
from synapse.types import DecidedBy, DecisionAction
from synapse.types.errors import SynapseException

log = get_logger("synapse.humans")


class DecisionRefused(SynapseException):
    """An answer that decides nothing: `status` is the HTTP status to answer with."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class HumansHost(Protocol):
    """What these functions need of `Humans`."""

    config: HumansConfig

    @property
    def protocol(self) -> P2PProtocol: ...

    def reviewer(self, reviewer_id: str) -> Person: ...


# --- values ----------------------------------------------------------------------------------


def defaults(question: OpenQuestion) -> dict[str, Any]:
    """The proposed value of each field: its most confident option (the first, if none says)."""
    best: dict[str, tuple[float, Any]] = {}
    for option in question.options:
        confidence = option.confidence if option.confidence is not None else -1.0
        if option.field not in best or confidence > best[option.field][0]:
            best[option.field] = (confidence, option.value)
    return {name: value for name, (_, value) in best.items()}


def _same_type(value: Any, like: Any) -> bool:
    if like is None:
        return True
    if isinstance(like, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(like, bool)
    if isinstance(like, int | float):
        return isinstance(value, int | float) if isinstance(like, float) else isinstance(value, int)
    return isinstance(value, type(like))


def _check_schema(question: OpenQuestion, fields: Mapping[str, Any]) -> None:
    schema = question.route.schema
    if schema is None:
        return
    import jsonschema

    errors = sorted(
        jsonschema.Draft202012Validator(dict(schema)).iter_errors(dict(fields)),
        key=lambda e: list(e.path),
    )
    if errors:
        where = "/".join(str(p) for p in errors[0].path) or "(the fields)"
        raise DecisionRefused(
            400, f"refused by the schema of {question.route.name}: {where}: {errors[0].message}"
        )


def approved_fields(question: OpenQuestion, edits: Mapping[str, Any]) -> dict[str, Any]:
    """The fields an approval sends: the proposed values, with the reviewer's edits, checked
    against the options' types and the route's schema."""
    proposed = defaults(question)
    for name, value in edits.items():
        if name not in proposed:
            raise DecisionRefused(400, f"{name!r} is not a field of this decision")
        if not _same_type(value, proposed[name]):
            kind = type(proposed[name]).__name__
            raise DecisionRefused(400, f"{name!r} must be a {kind} like its proposed value")
    fields = {**proposed, **edits}
    _check_schema(question, fields)
    return fields


def provided_fields(question: OpenQuestion, given: Mapping[str, Any]) -> dict[str, Any]:
    """The fields a `need_info` answer sends: every field asked for, checked."""
    asked = [name for name, _ in question.missing]
    missing = [name for name in asked if given.get(name) in (None, "")]
    if missing:
        raise DecisionRefused(400, f"missing fields: {', '.join(missing)}")
    fields = {name: given[name] for name in asked}
    _check_schema(question, fields)
    return fields


# --- answers ---------------------------------------------------------------------------------


def link_used(question: OpenQuestion, nonce: str) -> bool:
    return any(e.action == LINK_USED and e.detail.get("nonce") == nonce for e in question.rec.audit)


def _by(reviewer: Person) -> DecidedBy:
    return DecidedBy(user_id=reviewer.id, user_name=reviewer.name, role=reviewer.role)


def _told(question: OpenQuestion) -> set[str]:
    """The reviewers told of this question so far (a webhook channel counts as one)."""
    return {str(e.detail.get("reviewer")) for e in question.entries(QUEUED)}


async def answer(
    host: HumansHost,
    question: OpenQuestion,
    link: Link,
    *,
    decision: str,
    fields: Mapping[str, Any],
    reason: str,
    notes: str,
) -> str:
    """Apply a reviewer's answer from `link`; what to tell them. `DecisionRefused` before
    anything is written if it cannot be taken."""
    protocol, key = host.protocol, question.rec.key
    handle = protocol.handle(key)
    if handle is None:
        raise DecisionRefused(404, "no such task")
    reviewer = host.reviewer(link.reviewer)
    used = {"question": question.id, "nonce": link.nonce, "reviewer": reviewer.id}
    if question.kind == "need_info":
        if decision != "provide":
            raise DecisionRefused(400, "this question asks for information: provide it")
        values = provided_fields(question, fields)
        protocol.note_task_soon(key, LINK_USED, {**used, "action": "provide"}, reviewer.id)
        await handle.provide_info(values, notes or None, provided_by=reviewer.id)
        return "Thank you: the information was sent."
    if decision not in ("approve", "reject"):
        raise DecisionRefused(400, "the decision is approve or reject")
    if decision == "reject" and not reason.strip():
        raise DecisionRefused(400, "a rejection needs a reason")
    values = approved_fields(question, fields) if decision == "approve" else {}
    route = question.route
    approvals = {str(e.detail["reviewer"]): e for e in question.entries(APPROVAL)}
    rejections = {str(e.detail["reviewer"]) for e in question.entries(REJECTION)}
    if reviewer.id in approvals or reviewer.id in rejections:
        raise DecisionRefused(409, "you answered this question already")
    counted = not route.role or reviewer.role == route.role
    if route.quorum == 1 and counted:
        protocol.note_task_soon(key, LINK_USED, {**used, "action": decision}, reviewer.id)
        await _decide(host, question, decision, reviewer, values, reason, notes)
        return f"Thank you: the task was {'approved' if decision == 'approve' else 'rejected'}."
    # A quorum (or a role): record this answer; decide once it settles the question.
    entry = {"question": question.id, "reviewer": reviewer.id, "counted": counted}
    protocol.note_task_soon(key, LINK_USED, {**used, "action": decision}, reviewer.id)
    if decision == "approve":
        entry["fields"] = values
        count = len([e for e in approvals.values() if e.detail.get("counted")]) + counted
        settled = count >= route.quorum or (bool(route.role) and counted)
    else:
        entry["reason"] = reason
        against = len(rejections) + 1 if counted else len(rejections)
        settled = counted and (
            bool(route.role) or len(_told(question) | {reviewer.id}) - against < route.quorum
        )
    if not settled:
        kind = APPROVAL if decision == "approve" else REJECTION
        await protocol.note_task(key, kind, entry, reviewer.id)
        if decision == "approve":
            return f"Thank you: your approval is recorded ({count} of {route.quorum})."
        return "Thank you: your rejection is recorded."
    protocol.note_task_soon(
        key, APPROVAL if decision == "approve" else REJECTION, entry, reviewer.id
    )
    names = [*approvals, reviewer.id] if decision == "approve" else [reviewer.id]
    summary = f"{'approved' if decision == 'approve' else 'rejected'} by {', '.join(names)}"
    await _decide(host, question, decision, reviewer, values, reason, f"{summary}. {notes}".strip())
    return f"Thank you: the task was {'approved' if decision == 'approve' else 'rejected'}."


async def _decide(
    host: HumansHost,
    question: OpenQuestion,
    decision: str,
    reviewer: Person,
    values: Mapping[str, Any],
    reason: str,
    notes: str,
) -> None:
    handle = host.protocol.handle(question.rec.key)
    assert handle is not None
    await handle.decide(
        DecisionAction.APPROVE if decision == "approve" else DecisionAction.REJECT,
        approved_fields=values if decision == "approve" else None,
        rejection_reason=reason.strip() if decision == "reject" else "",
        notes=notes,
        decided_by=_by(reviewer),
    )
    log.info("human_decided", task_id=question.rec.task_id, decision=decision, user_id=reviewer.id)


async def time_out(host: HumansHost, question: OpenQuestion) -> None:
    """The deadline passed unanswered: apply the route's `on_timeout`, as decided by the
    policy (`decided_by.user_id` = `policy:<route>`, role `policy`)."""
    protocol, key, route = host.protocol, question.rec.key, question.route
    action = route.on_timeout
    entry = {"question": question.id, "step": "timeout", "action": action}
    policy = Person(f"policy:{route.name}", f"policy {route.name}", "policy")
    reason = f"no answer before the deadline (policy {route.name})"
    handle = protocol.handle(key)
    if handle is None or action == "protocol":
        await protocol.note_task(key, TIMEOUT, entry, policy.id)  # the protocol's timeout
        return
    if question.kind == "need_info":
        suggested = {
            name: option for name, option in _suggestions(question).items() if option is not None
        }
        if action == "approve_default" and len(suggested) == len(question.missing):
            protocol.note_task_soon(key, TIMEOUT, entry, policy.id)
            await handle.provide_info(suggested, reason, provided_by=policy.id)
        elif action == "approve_default":
            await protocol.note_task(key, TIMEOUT, {**entry, "action": "protocol"}, policy.id)
        else:
            protocol.note_task_soon(key, TIMEOUT, entry, policy.id)
            await handle.cancel(reason)
    elif action == "fail":
        protocol.note_task_soon(key, TIMEOUT, entry, policy.id)
        await handle.cancel(reason)
    else:
        protocol.note_task_soon(key, TIMEOUT, entry, policy.id)
        decision = "approve" if action == "approve_default" else "reject"
        await _decide(host, question, decision, policy, defaults(question), reason, reason)
    log.info("human_timeout", task_id=key.task_id, route=route.name, action=action)


def _suggestions(question: OpenQuestion) -> dict[str, Any]:
    rec = question.rec
    if rec.need_info is None:
        return {}
    return {f.field: f.suggested_value for f in rec.need_info.missing_fields}


__all__ = [
    "DecisionRefused",
    "HumansHost",
    "answer",
    "approved_fields",
    "defaults",
    "link_used",
    "provided_fields",
    "time_out",
]
