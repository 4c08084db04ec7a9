"""What a task asks of a person, as an MCP elicitation form, and the form's answer back.

A `task_need_info` becomes a form with one property per missing field (its reason as the
description, its suggested value as the default, its alternatives as the choices); a
`task_need_human` becomes a form with the decision (approve or reject), one property per
proposed field (the proposal as the default, so a reviewer may change it before approving,
its pros and cons and confidence in the description), a rejection reason and notes.

Elicitation forms hold flat primitive values only (string, number, integer, boolean, a list of
strings). A value of another shape (an object, a list of numbers) is asked as JSON text and
parsed back. Pure functions: no I/O, no MCP import.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import msgspec

from synapse.types import DecisionAction, MissingField, TaskNeedHumanPayload, TaskNeedInfoPayload
from synapse.types.errors import SynapseException

#: The form properties of a `task_need_human` that are not proposed fields.
DECISION, REJECTION_REASON, NOTES = "decision", "rejection_reason", "notes"
_RESERVED = frozenset({DECISION, REJECTION_REASON, NOTES})


@dataclass(frozen=True, slots=True)
class Question:
    """What a task waits for: missing information, or a person's decision (one of them set),
    or free text from an A2A agent that is not a Synapse peer (`text` only)."""

    info: TaskNeedInfoPayload | None = None
    human: TaskNeedHumanPayload | None = None
    text: str = ""

    @property
    def kind(self) -> Literal["need_info", "need_human", "input"]:
        if self.info is not None:
            return "need_info"
        if self.human is not None:
            return "need_human"
        return "input"

    def describe(self) -> dict[str, Any]:
        """The question as JSON for a tool result: what to answer, and how."""
        out: dict[str, Any] = {"kind": self.kind, "message": self.message()}
        if self.info is not None:
            out["missing_fields"] = [msgspec.to_builtins(f) for f in self.info.missing_fields]
            if self.info.required_by is not None:
                out["required_by"] = _iso(self.info.required_by)
        elif self.human is not None:
            human = self.human
            out["reason"] = msgspec.to_builtins(human.reason)
            out["options"] = [msgspec.to_builtins(o) for o in human.options]
            out["escalation_level"] = human.escalation_level
            if human.context is not None:
                out["context"] = msgspec.to_builtins(human.context)
            if human.deadline is not None:
                out["deadline"] = _iso(human.deadline)
        return out

    def message(self) -> str:
        """One paragraph a person reads above the form."""
        if self.info is not None:
            names = ", ".join(f.field for f in self.info.missing_fields)
            lead = self.info.question or "The task needs more information"
            return f"{lead} (missing: {names})"
        if self.human is not None:
            reason = self.human.reason
            text = reason.message or reason.code
            context = self.human.context
            if context is not None and context.task_summary:
                text = f"{context.task_summary}: {text}"
            if self.human.deadline is not None:
                text += f" (decide by {_iso(self.human.deadline)})"
            return f"A decision is needed: {text}"
        return self.text or "The agent asks for input"

    def form(self) -> dict[str, Any]:
        """The elicitation's `requestedSchema` (a flat object of primitive properties)."""
        if self.info is not None:
            return _object(
                {f.field: _field_schema(f) for f in self.info.missing_fields},
                [f.field for f in self.info.missing_fields],
            )
        if self.human is not None:
            return _decision_form(self.human)
        return _object({"answer": {"type": "string", "description": self.text}}, ["answer"])


@dataclass(frozen=True, slots=True)
class PersonAnswer:
    """A person's answer, ready for `provide_info` or `decide`."""

    fields: dict[str, Any] = field(default_factory=dict)
    action: DecisionAction | None = None
    rejection_reason: str = ""
    notes: str = ""
    #: Free text for an agent that asked in words.
    text: str | None = None


class BadAnswer(SynapseException, ValueError):
    """The answer does not fit the question (a missing field, a value that is not JSON)."""


def answer_from_form(question: Question, content: Mapping[str, Any]) -> PersonAnswer:
    """An accepted elicitation's content → the answer it stands for."""
    if question.info is not None:
        missing = [f.field for f in question.info.missing_fields if content.get(f.field) is None]
        if missing:
            raise BadAnswer(f"missing {', '.join(missing)}")
        fields = {
            f.field: _from_form(f.field, content[f.field], _sample(f))
            for f in question.info.missing_fields
        }
        return PersonAnswer(fields=fields, notes=str(content.get(NOTES) or ""))
    if question.human is not None:
        decision = str(content.get(DECISION) or "")
        try:
            action = DecisionAction(decision)
        except ValueError:
            raise BadAnswer(f"decision must be approve or reject, not {decision!r}") from None
        proposals = _proposals(question.human)
        unknown = sorted(set(content) - set(proposals) - {DECISION, REJECTION_REASON, NOTES})
        if unknown:
            raise BadAnswer(f"{', '.join(map(repr, unknown))}: not a field of this decision")
        fields = {
            name: _from_form(name, content[name], values[0], strict=True)
            for name, values in proposals.items()
            if content.get(name) is not None
        }
        return PersonAnswer(
            fields=fields if action is DecisionAction.APPROVE else {},
            action=action,
            rejection_reason=str(content.get(REJECTION_REASON) or ""),
            notes=str(content.get(NOTES) or ""),
        )
    return PersonAnswer(text=str(content.get("answer") or ""))


def answer_from_arguments(
    question: Question,
    *,
    fields: Mapping[str, Any] | None,
    decision: str | None,
    rejection_reason: str,
    notes: str,
) -> PersonAnswer:
    """`answer_task`'s arguments → the answer, checked against what the task asks."""
    if question.human is not None:
        if decision is None:
            raise BadAnswer("this task waits for a decision: give decision approve or reject")
        content: dict[str, Any] = {**(fields or {}), DECISION: decision}
        content[REJECTION_REASON], content[NOTES] = rejection_reason, notes
        return answer_from_form(question, content)
    if decision is not None:
        raise BadAnswer(f"this task asks for {question.kind}, not a decision")
    if question.info is not None:
        return answer_from_form(question, {**(fields or {}), NOTES: notes})
    if fields:
        return PersonAnswer(fields=dict(fields), notes=notes)
    return PersonAnswer(text=notes)


# --- the forms --------------------------------------------------------------------------------


def _object(properties: dict[str, Any], required: Sequence[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required)}


def _decision_form(human: TaskNeedHumanPayload) -> dict[str, Any]:
    properties: dict[str, Any] = {
        DECISION: {
            "type": "string",
            "title": "Decision",
            "description": human.reason.message or human.reason.code,
            "enum": [a.value for a in DecisionAction],
        }
    }
    for name, values in _proposals(human).items():
        if name in _RESERVED:
            continue
        options = [o for o in human.options if o.field == name]
        notes = "; ".join(_option_note(o.value, o.pros_cons, o.confidence) for o in options)
        schema = _value_schema(values[0], f"proposed {name}: {notes}")
        if len(values) > 1 and all(isinstance(v, str) for v in values):
            schema["enum"] = list(dict.fromkeys(values))
        properties[name] = schema
    properties[REJECTION_REASON] = {"type": "string", "description": "why, if you reject"}
    properties[NOTES] = {"type": "string", "description": "notes for the agent (optional)"}
    return _object(properties, [DECISION])


def _option_note(value: Any, pros_cons: str, confidence: float | None) -> str:
    text = json.dumps(value, ensure_ascii=False)
    if pros_cons:
        text += f" ({pros_cons})"
    if confidence is not None:
        text += f", confidence {confidence:g}%"
    return text


def _proposals(human: TaskNeedHumanPayload) -> dict[str, list[Any]]:
    """Each proposed field and its values, in the order given."""
    found: dict[str, list[Any]] = {}
    for option in human.options:
        found.setdefault(option.field, []).append(option.value)
    return found


def _field_schema(f: MissingField) -> dict[str, Any]:
    schema = _value_schema(_sample(f), f.reason or f.field)
    choices = [f.suggested_value, *f.alternatives] if f.suggested_value is not None else []
    choices = choices or list(f.alternatives)
    if choices and all(isinstance(c, str) for c in choices):
        schema["enum"] = list(dict.fromkeys(choices))
    return schema


def _sample(f: MissingField) -> Any:
    """A value of the shape the field takes: its suggestion, else its first alternative."""
    if f.suggested_value is not None:
        return f.suggested_value
    return f.alternatives[0] if f.alternatives else None


def _value_schema(sample: Any, description: str) -> dict[str, Any]:
    """The primitive schema for values like `sample` (its default when it has one)."""
    schema: dict[str, Any]
    if isinstance(sample, bool):
        schema = {"type": "boolean"}
    elif isinstance(sample, int):
        schema = {"type": "integer"}
    elif isinstance(sample, float):
        schema = {"type": "number"}
    elif sample is None or isinstance(sample, str):
        schema = {"type": "string"}
    elif isinstance(sample, list) and all(isinstance(v, str) for v in sample):
        schema = {"type": "array", "items": {"type": "string"}}
    else:  # an object, or a list of other things: asked as JSON text
        return {"type": "string", "description": f"{description} (JSON)", "default": _json(sample)}
    schema["description"] = description
    if sample is not None:
        schema["default"] = sample
    return schema


#: How a boolean may be written where a client sends text ("yes" for an approval's `true`).
_TRUE, _FALSE = (
    frozenset({"true", "yes", "y", "1", "on"}),
    frozenset({"false", "no", "n", "0", "off"}),
)


def _scalar(name: str, value: str, sample: bool | int | float) -> Any:
    """Text given for a boolean or a number, read as one (never sent as the text)."""
    text = value.strip().lower()
    if isinstance(sample, bool):
        if text in _TRUE or text in _FALSE:
            return text in _TRUE
        raise BadAnswer(f"{name} must be true or false, not {value!r}")
    try:
        return int(text) if isinstance(sample, int) else float(text)
    except ValueError:
        kind = "an integer" if isinstance(sample, int) else "a number"
        raise BadAnswer(f"{name} must be {kind}, not {value!r}") from None


def _from_form(name: str, value: Any, sample: Any, *, strict: bool = False) -> Any:
    """A form value back in the field's own shape (JSON text parsed where it was asked so,
    text read as the boolean or number the field holds: always for a decision's option,
    `strict`; where it reads as one for a suggested value, which binds nothing)."""
    if isinstance(value, str) and isinstance(sample, bool | int | float):
        try:
            return _scalar(name, value, sample)
        except BadAnswer:
            if strict:
                raise
            return value
    structured = sample is not None and not isinstance(sample, bool | int | float | str)
    flat_strings = isinstance(sample, list) and all(isinstance(v, str) for v in sample)
    if structured and not flat_strings and isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            raise BadAnswer(f"{name} must be JSON like {_json(sample)}") from None
    return value


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _iso(value: datetime) -> str:
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.isoformat().replace("+00:00", "Z")


__all__ = [
    "BadAnswer",
    "PersonAnswer",
    "Question",
    "answer_from_arguments",
    "answer_from_form",
]
