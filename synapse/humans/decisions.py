"""The gate every answer to a question of ours passes when people are configured
(`synapse.runtime.answers.AnswerGate`), whichever front it comes from: a signed link, the
console, MCP, the command line, the Python API. Under a route it checks who answers (a
configured reviewer the question was sent to), the edited values (the options' types, the
route's schema) and counts approvals when the route asks for a quorum or a role; the
`decided_by` it sends is what the configuration says of that person. Also the policy's
time-out, which answers as `policy:<route>`.

Every check comes before anything is written: a refused answer changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Protocol

from synapse.humans.config import HumansConfig, Person
from synapse.humans.question import (
    APPROVAL,
    LINK_USED,
    QUEUED,
    REJECTION,
    TIMEOUT,
    OpenQuestion,
)
from synapse.logs import get_logger
from synapse.p2p.engine import TaskRecord
from synapse.runtime.answers import (
    AnswerRefused,
    Asked,
    OneAnswerAtATime,
    Send,
    TaskAnswer,
    check_answer,
    proposed_values,
    same_type,
    type_name,
)
from synapse.runtime.protocol import P2PProtocol
from synapse.types import DecidedBy, DecisionAction

log = get_logger("synapse.humans")

#: The refusal of `synapse.runtime.answers`, under the name this module always gave it.
DecisionRefused = AnswerRefused


class HumansHost(Protocol):
    """What these functions need of `Humans`."""

    config: HumansConfig

    @property
    def protocol(self) -> P2PProtocol: ...

    def reviewer(self, reviewer_id: str) -> Person: ...

    def question_of(self, rec: TaskRecord) -> OpenQuestion | None: ...


# --- values ----------------------------------------------------------------------------------


def defaults(question: OpenQuestion) -> dict[str, Any]:
    """The proposed value of each field: its most confident option (the first, if none says)."""
    return proposed_values(question.rec)


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
        if not same_type(value, proposed[name]):
            raise DecisionRefused(
                400,
                f"{name!r} must be {type_name(proposed[name])}, like its proposed value "
                f"{proposed[name]!r} (got {value!r})",
            )
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


# --- who may answer --------------------------------------------------------------------------


def link_used(question: OpenQuestion, nonce: str) -> bool:
    return any(e.action == LINK_USED and e.detail.get("nonce") == nonce for e in question.rec.audit)


def _by(reviewer: Person) -> DecidedBy:
    return DecidedBy(user_id=reviewer.id, user_name=reviewer.name, role=reviewer.role)


def told(question: OpenQuestion) -> set[str]:
    """The reviewers told of this question so far (a webhook channel counts as one)."""
    return {str(e.detail.get("reviewer")) for e in question.entries(QUEUED)}


def routed_to(question: OpenQuestion) -> set[str]:
    """Who may answer `question`: those told of it so far, and the reviewers of its first
    level (who are told first, and may answer in the console before the mail arrives)."""
    first = question.route.levels[question.window.first - 1].reviewers
    return told(question) | set(first)


def is_reviewer(config: HumansConfig, reviewer_id: str) -> bool:
    """Whether the configuration, as it is now, names `reviewer_id` as a person (or, as
    `channel:NAME`, one of its channels)."""
    if reviewer_id.startswith("channel:"):
        return reviewer_id[len("channel:") :] in config.channels
    return reviewer_id in config.reviewers


# --- the gate --------------------------------------------------------------------------------


class HumansGate:
    """`AnswerGate` of a peer with configured people (see the module's docstring)."""

    def __init__(self, host: HumansHost) -> None:
        self.host = host
        #: One answer to a task at a time, from every front: the checks (used link, answered
        #: already, quorum counts) and what they lead to are one step, so two never both count.
        self.locks = OneAnswerAtATime()

    async def admit(self, handle: Asked, answer: TaskAnswer, send: Send) -> str:
        async with self.locks.of(handle):
            rec = handle.record
            question = self.host.question_of(rec)
            if question is None:  # no route takes it: the question's own checks
                check_answer(rec, answer)
                await send(answer)
                return "sent"
            return await self._routed(question, answer, send)

    def _person(self, question: OpenQuestion, answer: TaskAnswer) -> Person:
        """Who answers, as the configuration says now; `DecisionRefused` if not one of the
        people this question was sent to."""
        who = answer.by.user_id
        if answer.front == "policy":
            if who != f"policy:{question.route.name}":
                raise DecisionRefused(403, f"{who!r} is not the policy of this question")
            return Person(who, f"policy {question.route.name}", "policy")
        if not is_reviewer(self.host.config, who) or (
            who.startswith("channel:") and answer.front != "link"
        ):
            raise DecisionRefused(
                403, f"{who!r} is not (or no longer) a reviewer of this peer's questions"
            )
        if who not in routed_to(question):
            raise DecisionRefused(403, f"this question was not sent to {who!r}")
        return self.host.reviewer(who)

    async def _routed(self, question: OpenQuestion, answer: TaskAnswer, send: Send) -> str:
        reviewer = self._person(question, answer)
        policy = answer.front == "policy"
        check_answer(question.rec, answer, strict=not policy)
        protocol, key = self.host.protocol, question.rec.key
        used: dict[str, Any] = {"question": question.id, "reviewer": reviewer.id}
        if answer.link:
            if link_used(question, answer.link):
                raise DecisionRefused(409, "this link was used already")
            used["nonce"] = answer.link
        by = _by(reviewer)

        def note_link(action: str) -> None:
            if answer.link:
                protocol.note_task_soon(key, LINK_USED, {**used, "action": action}, reviewer.id)

        if answer.kind == "provide":
            values = provided_fields(question, answer.fields or {})
            note_link("provide")
            await send(replace(answer, by=by, fields=values))
            return "Thank you: the information was sent."
        approve = answer.action is DecisionAction.APPROVE
        decision = "approve" if approve else "reject"
        if policy:
            await send(replace(answer, by=by))
            return f"The task was {'approved' if approve else 'rejected'} by the policy."
        values = approved_fields(question, answer.fields or {}) if approve else {}
        route = question.route
        approvals = {str(e.detail["reviewer"]): e for e in question.entries(APPROVAL)}
        rejections = {str(e.detail["reviewer"]) for e in question.entries(REJECTION)}
        if reviewer.id in approvals or reviewer.id in rejections:
            raise DecisionRefused(409, "you answered this question already")
        decided = replace(answer, by=by, fields=values if approve else None)
        counted = not route.role or reviewer.role == route.role
        if route.quorum == 1 and counted:
            note_link(decision)
            await send(decided)
            self._log(question, decision, reviewer, answer)
            return f"Thank you: the task was {'approved' if approve else 'rejected'}."
        # A quorum (or a role): record this answer; decide once it settles the question.
        entry: dict[str, Any] = {
            "question": question.id,
            "reviewer": reviewer.id,
            "counted": counted,
            "front": answer.front,
        }
        note_link(decision)
        if approve:
            entry["fields"] = values
            count = len([e for e in approvals.values() if e.detail.get("counted")]) + counted
            settled = count >= route.quorum or (bool(route.role) and counted)
        else:
            entry["reason"] = answer.rejection_reason
            against = len(rejections) + 1 if counted else len(rejections)
            settled = counted and (
                bool(route.role) or len(told(question) | {reviewer.id}) - against < route.quorum
            )
        kind = APPROVAL if approve else REJECTION
        if not settled:
            await protocol.note_task(key, kind, entry, reviewer.id)
            if approve:
                return f"Thank you: your approval is recorded ({count} of {route.quorum})."
            return "Thank you: your rejection is recorded."
        protocol.note_task_soon(key, kind, entry, reviewer.id)
        names = [*approvals, reviewer.id] if approve else [reviewer.id]
        summary = f"{'approved' if approve else 'rejected'} by {', '.join(names)}"
        await send(replace(decided, notes=f"{summary}. {answer.notes}".strip()))
        self._log(question, decision, reviewer, answer)
        return f"Thank you: the task was {'approved' if approve else 'rejected'}."

    def _log(
        self, question: OpenQuestion, decision: str, reviewer: Person, answer: TaskAnswer
    ) -> None:
        log.info(
            "human_decided",
            task_id=question.rec.task_id,
            decision=decision,
            user_id=reviewer.id,
            front=answer.front,
        )


async def _decide(
    host: HumansHost,
    question: OpenQuestion,
    decision: str,
    reviewer: Person,
    values: Mapping[str, Any],
    reason: str,
    notes: str,
) -> None:
    """The policy's decision, through the gate like any other."""
    handle = host.protocol.handle(question.rec.key)
    assert handle is not None
    await handle.decide(
        DecisionAction.APPROVE if decision == "approve" else DecisionAction.REJECT,
        approved_fields=values if decision == "approve" else None,
        rejection_reason=reason.strip() if decision == "reject" else "",
        notes=notes,
        decided_by=_by(reviewer),
        front="policy",
    )


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
            await handle.provide_info(suggested, reason, provided_by=policy.id, front="policy")
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
    "HumansGate",
    "HumansHost",
    "approved_fields",
    "defaults",
    "is_reviewer",
    "link_used",
    "provided_fields",
    "routed_to",
    "time_out",
    "told",
]
