"""How Synapse and A2A v1.0 correspond: task states, messages ⇄ payloads, results ⇄ artifacts.

Pure functions, no I/O; the server binding and the client both use them.
"""

from __future__ import annotations

import base64
import binascii
import uuid
from collections.abc import Mapping
from typing import Any, Final, TypedDict

import msgspec

from synapse.a2a import wire
from synapse.a2a.errors import A2ACode, A2AError, invalid_params
from synapse.types import (
    MissingField,
    TaskError,
    TaskNeedHumanPayload,
    TaskNeedInfoPayload,
    TaskRejectPayload,
    TaskResult,
    TaskState,
)

#: Synapse task state → A2A task state.
STATE_MAP: Final[Mapping[TaskState, str]] = {
    TaskState.IDLE: wire.SUBMITTED,
    TaskState.PENDING: wire.SUBMITTED,
    TaskState.CONFIRMED: wire.SUBMITTED,
    TaskState.EXECUTING: wire.WORKING,
    TaskState.INFO_PROVIDED: wire.WORKING,
    TaskState.HUMAN_APPROVED: wire.WORKING,
    TaskState.INFO_NEEDED: wire.INPUT_REQUIRED,
    TaskState.NEED_HUMAN: wire.INPUT_REQUIRED,
    TaskState.HUMAN_DECIDING: wire.INPUT_REQUIRED,
    TaskState.COMPLETED: wire.COMPLETED,
    TaskState.FAILED: wire.FAILED,
    TaskState.HUMAN_REJECTED: wire.FAILED,
    TaskState.CANCELLED: wire.CANCELED,
    TaskState.REJECTED: wire.REJECTED,
}

#: A2A terminal state → the Synapse final state it reports (the client's outcome).
FINAL_STATE_MAP: Final[Mapping[str, TaskState]] = {
    wire.COMPLETED: TaskState.COMPLETED,
    wire.FAILED: TaskState.FAILED,
    wire.CANCELED: TaskState.CANCELLED,
    wire.REJECTED: TaskState.REJECTED,
}

#: Where the task type travels in an A2A message (a skill id of the agent card). Metadata
#: keys are camelCase like every member of A2A's JSON; the snake_case spelling of earlier
#: versions is still read.
TASK_TYPE_KEY: Final = "taskType"
LEGACY_TASK_TYPE_KEY: Final = "task_type"
#: What an INPUT_REQUIRED status message asks for, in its metadata.
NEEDS_KEY: Final = "synapseNeeds"
LEGACY_NEEDS_KEY: Final = "synapse_needs"
#: Marks the output artifact while it holds partial output (`intermediate_result` chunks).
PARTIAL_KEY: Final = "synapsePartial"
#: The Synapse `output_type` of a result artifact, in its metadata.
OUTPUT_TYPE_KEY: Final = "outputType"
LEGACY_OUTPUT_TYPE_KEY: Final = "output_type"


def meta_value(metadata: Mapping[str, Any] | None, key: str, legacy: str) -> Any:
    """`metadata[key]`, else `metadata[legacy]` (the snake_case spelling), else None."""
    if not metadata:
        return None
    value = metadata.get(key)
    return metadata.get(legacy) if value is None else value


NEEDS_INFO: Final = "info"
NEEDS_HUMAN: Final = "human_decision"


class TaskIds(TypedDict):
    """The ids an agent message about a task carries."""

    task_id: str
    context_id: str


def a2a_state(state: TaskState) -> str:
    return STATE_MAP[state]


def new_id() -> str:
    return str(uuid.uuid4())


_OUTPUT_ARTIFACTS = uuid.UUID("1f0c7a8e-5b7d-4c1e-9a43-2d6f0b9e8a51")


def output_artifact_id(task_id: str) -> str:
    """The id of a task's output artifact (its streamed chunks, then its result): the same
    whether the task's view is the one in memory or one rebuilt from the store."""
    return str(uuid.uuid5(_OUTPUT_ARTIFACTS, task_id))


def agent_message(
    text: str,
    data: Any = msgspec.UNSET,
    *,
    task_id: str,
    context_id: str,
    metadata: dict[str, Any] | None = None,
) -> wire.Message:
    parts = [wire.text_part(text)] if text else []
    if data is not msgspec.UNSET:
        parts.append(wire.data_part(data))
    return wire.Message(
        message_id=new_id(),
        role=wire.ROLE_AGENT,
        parts=parts,
        task_id=task_id,
        context_id=context_id,
        metadata=metadata,
    )


# --- an incoming A2A message → a Synapse task ---------------------------------------------------


_MAX_SAFE_INTEGER = 2**53 - 1


def json_numbers(value: Any) -> Any:
    """`value` with integral floats as integers.

    A2A v1.0 carries data parts as protobuf `Value`s, whose numbers are doubles: an SDK client
    sends `{"steps": 3}` as `{"steps": 3.0}`. JSON itself does not tell 3 from 3.0, so a
    handler that wants an integer gets one.
    """
    if isinstance(value, float) and value.is_integer() and abs(value) <= _MAX_SAFE_INTEGER:
        return int(value)
    if isinstance(value, dict):
        return {k: json_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_numbers(v) for v in value]
    return value


def first_data(message: wire.Message) -> Any | msgspec.UnsetType:
    """The first data part's value (numbers normalized by `json_numbers`)."""
    for part in message.parts:
        if part.data is not msgspec.UNSET:
            return json_numbers(part.data)
    return msgspec.UNSET


def message_text(message: wire.Message, delimiter: str = "\n") -> str:
    return delimiter.join(p.text for p in message.parts if isinstance(p.text, str))


def task_type_of(message: wire.Message, default: str | None) -> str:
    """`message.metadata["taskType"]` (or `"task_type"`), else the configured default."""
    value = meta_value(message.metadata, TASK_TYPE_KEY, LEGACY_TASK_TYPE_KEY)
    if value is None:
        if default is None:
            raise invalid_params(
                f"message.metadata.{TASK_TYPE_KEY} is required: this agent has no default",
                path="message.metadata",
            )
        return default
    if not isinstance(value, str) or not value:
        raise invalid_params(
            f"message.metadata.{TASK_TYPE_KEY} must be a non-empty string",
            path=f"message.metadata.{TASK_TYPE_KEY}",
        )
    return value


#: Where a message's file parts go in the task payload.
FILES_KEY: Final = "files"
#: The Synapse `output_type`s of file results: one file (`output` a file object), or a list.
FILE_OUTPUT: Final = "file"
FILES_OUTPUT: Final = "files"


def file_of(part: wire.Part, where: str = "message.parts") -> dict[str, Any] | None:
    """A file part as a payload value: `{"url": …}` or `{"raw": <base64>}`, with
    `filename` and `media_type` when given; None for any other part."""
    found: dict[str, Any]
    if isinstance(part.url, str):
        if not part.url:
            raise invalid_params("a file part's url must not be empty", path=where)
        found = {"url": part.url}
    elif isinstance(part.raw, str):
        try:
            base64.b64decode(part.raw, validate=True)
        except (binascii.Error, ValueError):
            raise invalid_params("a file part's raw bytes must be base64", path=where) from None
        found = {"raw": part.raw}
    else:
        return None
    if part.filename:
        found["filename"] = part.filename
    if part.media_type:
        found["media_type"] = part.media_type
    return found


def file_part(value: Any) -> wire.Part:
    """A file object of a handler's result (`{"url" | "raw", "filename", "media_type"}`)
    as a part."""
    if not isinstance(value, Mapping):
        raise ValueError(f"a file result must be an object with url or raw: {value!r}")
    filename = str(value.get("filename") or "")
    media_type = str(value.get("media_type") or value.get("mediaType") or "")
    if isinstance(value.get("url"), str):
        return wire.Part(url=value["url"], filename=filename, media_type=media_type)
    if isinstance(value.get("raw"), bytes | bytearray):
        raw = base64.b64encode(bytes(value["raw"])).decode()
        return wire.Part(raw=raw, filename=filename, media_type=media_type)
    if isinstance(value.get("raw"), str):
        return wire.Part(raw=value["raw"], filename=filename, media_type=media_type)
    raise ValueError(f"a file result needs url or raw: {value!r}")


def payload_of(message: wire.Message) -> dict[str, Any]:
    """The task payload: the first data part (an object), else `{"text": <the text>}`; the
    message's file parts (inline bytes or URLs) under `files`, in order."""
    if not message.parts:
        raise invalid_params("message.parts must not be empty", path="message.parts")
    files = [f for i, p in enumerate(message.parts) if (f := file_of(p, f"message.parts[{i}]"))]
    payload: dict[str, Any]
    data = first_data(message)
    if data is not msgspec.UNSET:
        if not isinstance(data, dict):
            raise invalid_params(
                "the first data part must hold a JSON object (the task payload)",
                path="message.parts",
            )
        payload = dict(data)
    elif any(isinstance(p.text, str) for p in message.parts):
        payload = {"text": message_text(message)}
    elif files:
        payload = {}
    else:
        raise A2AError(
            A2ACode.CONTENT_TYPE_NOT_SUPPORTED,
            "this agent takes a data part (the task payload), text or files",
        )
    if files:
        if FILES_KEY in payload:
            raise invalid_params(
                f"the data part has a {FILES_KEY!r} member and the message has file parts: "
                "the files would overwrite it",
                path="message.parts",
            )
        payload[FILES_KEY] = files
    return payload


def partial_parts(value: Any) -> list[wire.Part]:
    """A handler's `intermediate_result` as the parts of an artifact chunk."""
    if isinstance(value, str):
        return [wire.text_part(value)]
    return [wire.data_part(value)]


def info_fields(message: wire.Message, need: TaskNeedInfoPayload | None) -> dict[str, Any]:
    """The fields a follow-up message provides: its data part, or its text for the one
    missing field."""
    data = first_data(message)
    if data is not msgspec.UNSET:
        if not isinstance(data, dict) or not data:
            raise invalid_params(
                "the data part must be an object of the missing fields", path="message.parts"
            )
        return dict(data)
    text = message_text(message).strip()
    missing = [m.field for m in need.missing_fields] if need is not None else []
    if text and len(missing) == 1:
        return {missing[0]: text}
    raise invalid_params(
        "answer with a data part holding the missing fields"
        + (f" ({', '.join(missing)})" if missing else ""),
        path="message.parts",
    )


_APPROVE_WORDS = frozenset({"approve", "approved", "yes", "y", "ok", "accept", "同意", "批准"})
_REJECT_WORDS = frozenset({"reject", "rejected", "no", "n", "deny", "decline", "拒绝"})


def decision_of(message: wire.Message) -> tuple[bool, dict[str, Any], str, str]:
    """(approve?, approved_fields, rejection_reason, notes) from a follow-up message.

    A data part `{"action": "approve" | "reject", "approved_fields": {...},
    "rejection_reason": str, "notes": str}` (or `{"approve": bool}`), else the text
    `approve` / `reject` (and a few synonyms).
    """
    data = first_data(message)
    text = message_text(message).strip()
    if isinstance(data, dict):
        action = data.get("action")
        if action is None and isinstance(data.get("approve"), bool):
            action = "approve" if data["approve"] else "reject"
        if action not in ("approve", "reject"):
            raise invalid_params(
                'a decision needs "action": "approve" or "reject"', path="message.parts"
            )
        fields = data.get("approved_fields") or {}
        if not isinstance(fields, dict):
            raise invalid_params("approved_fields must be an object", path="message.parts")
        reason = data.get("rejection_reason") or (text if action == "reject" else "")
        notes = data.get("notes") or ""
        return action == "approve", dict(fields), str(reason), str(notes)
    word = text.split(maxsplit=1)[0].lower().rstrip(".!,:;") if text else ""
    rest = text.split(maxsplit=1)[1] if len(text.split(maxsplit=1)) > 1 else ""
    if word in _APPROVE_WORDS:
        return True, {}, "", rest
    if word in _REJECT_WORDS:
        return False, {}, rest, ""
    raise invalid_params(
        'a decision is the text "approve" or "reject", or a data part with "action"',
        path="message.parts",
    )


# --- Synapse outcomes → A2A status messages and artifacts ---------------------------------------


def _fields(need: TaskNeedInfoPayload) -> list[Any]:
    return [msgspec.to_builtins(m) for m in need.missing_fields]


def need_info_message(need: TaskNeedInfoPayload, *, task_id: str, context_id: str) -> wire.Message:
    names = ", ".join(m.field for m in need.missing_fields)
    text = need.question or f"More information is needed: {names}"
    if need.question:
        text = f"{need.question} ({names})"
    data: dict[str, Any] = {"missing_fields": _fields(need)}
    if need.required_by is not None:
        data["required_by"] = wire.timestamp(need.required_by)
    return agent_message(
        text, data, task_id=task_id, context_id=context_id, metadata={NEEDS_KEY: NEEDS_INFO}
    )


def need_human_message(
    need: TaskNeedHumanPayload, *, task_id: str, context_id: str
) -> wire.Message:
    summary = need.context.task_summary if need.context is not None else ""
    text = need.reason.message or need.reason.code
    if summary:
        text = f"{text}: {summary}"
    text += ' — answer "approve" or "reject"'
    data: dict[str, Any] = {
        "reason": msgspec.to_builtins(need.reason),
        "options": [msgspec.to_builtins(o) for o in need.options],
        "answer": {"action": "approve | reject", "approved_fields": {}, "rejection_reason": ""},
    }
    if need.context is not None:
        data["context"] = msgspec.to_builtins(need.context)
    if need.deadline is not None:
        data["deadline"] = wire.timestamp(need.deadline)
    return agent_message(
        text, data, task_id=task_id, context_id=context_id, metadata={NEEDS_KEY: NEEDS_HUMAN}
    )


def error_message(error: TaskError, *, task_id: str, context_id: str) -> wire.Message:
    text = f"{error.code}: {error.message}" if error.message else error.code
    return agent_message(
        text,
        {"error": msgspec.to_builtins(error)},
        task_id=task_id,
        context_id=context_id,
    )


def reject_message(reject: TaskRejectPayload, *, task_id: str, context_id: str) -> wire.Message:
    reason = reject.reason
    text = f"{reason.code}: {reason.message}" if reason.message else reason.code
    data: dict[str, Any] = {"reason": msgspec.to_builtins(reason)}
    if reject.alternatives is not None:
        data["alternatives"] = msgspec.to_builtins(reject.alternatives)
    return agent_message(text, data, task_id=task_id, context_id=context_id)


def result_artifact(
    result: TaskResult, *, name: str, summary: str = "", artifact_id: str = ""
) -> wire.Artifact:
    """A `task_complete.result` as one artifact: text as a text part, a file (`output_type`
    "file") or files ("files": a list) as file parts, anything else as data."""
    parts: list[wire.Part] | None = None
    if result.output_type == "text" and isinstance(result.output, str):
        parts = [wire.text_part(result.output)]
    elif result.output_type in (FILE_OUTPUT, FILES_OUTPUT):
        outputs = result.output if result.output_type == FILES_OUTPUT else [result.output]
        try:
            parts = [file_part(o) for o in outputs] if isinstance(outputs, list) else None
        except ValueError:
            parts = None  # not files after all: carried as data, as any other output
    if not parts:
        parts = [wire.data_part(result.output)]
    metadata: dict[str, Any] = {OUTPUT_TYPE_KEY: result.output_type}
    if result.metadata:
        metadata["metadata"] = result.metadata
    return wire.Artifact(
        artifact_id=artifact_id or new_id(),
        name=name,
        description=summary,
        parts=parts,
        metadata=metadata,
    )


# --- A2A outcomes → Synapse values (the client side) -----------------------------------------


def artifact_result(artifacts: list[wire.Artifact]) -> TaskResult | None:
    """The artifacts of a completed task as one `TaskResult` (the inverse of
    `result_artifact` for a Synapse agent's single artifact)."""
    if not artifacts:
        return None
    parts = [p for a in artifacts for p in a.parts]
    found = dict(artifacts[0].metadata or {})
    output_type = meta_value(found, OUTPUT_TYPE_KEY, LEGACY_OUTPUT_TYPE_KEY)
    if isinstance(output_type, str) and output_type:  # written by `result_artifact`
        inner = found.get("metadata")
        metadata = dict(inner) if isinstance(inner, dict) else {}
    else:
        output_type, metadata = None, found
    texts = [p.text for p in parts if isinstance(p.text, str)]
    data = [p.data for p in parts if p.data is not msgspec.UNSET]
    files = [f for p in parts if (f := file_of(p)) is not None]
    if files and len(files) == len(parts):
        if len(files) == 1 and output_type != FILES_OUTPUT:
            return TaskResult(output_type=FILE_OUTPUT, output=files[0], metadata=metadata)
        return TaskResult(output_type=FILES_OUTPUT, output=files, metadata=metadata)
    if len(parts) == len(texts):
        return TaskResult(
            output_type=output_type or "text", output="".join(texts), metadata=metadata
        )
    if len(data) == 1 and len(parts) == 1:
        return TaskResult(output_type=output_type or "json", output=data[0], metadata=metadata)
    return TaskResult(
        output_type="json", output=[msgspec.to_builtins(p) for p in parts], metadata=metadata
    )


def status_error(status: wire.TaskStatus) -> TaskError:
    """A failed (or rejected, cancelled) A2A task's status message as a `TaskError`."""
    message = status.message
    if message is not None:
        data = first_data(message)
        if isinstance(data, dict):
            for key in ("error", "reason"):
                found = data.get(key)
                if isinstance(found, dict) and isinstance(found.get("code"), str):
                    return TaskError(
                        code=found["code"] or "a2a_failed",
                        message=str(found.get("message", "")),
                        recoverable=bool(found.get("recoverable", False)),
                        details=found.get("details"),
                    )
        text = message_text(message)
    else:
        text = ""
    code = {
        wire.FAILED: "execution_failed",
        wire.REJECTED: "task_rejected",
        wire.CANCELED: "cancelled",
    }.get(status.state, "a2a_error")
    return TaskError(code=code, message=text)


def missing_fields_of(message: wire.Message | None) -> list[MissingField]:
    """The missing fields an INPUT_REQUIRED status message lists (ours), if any."""
    if message is None:
        return []
    data = first_data(message)
    found = data.get("missing_fields") if isinstance(data, dict) else None
    if not isinstance(found, list):
        return []
    try:
        return msgspec.convert(found, list[MissingField])
    except msgspec.ValidationError:
        return []


def need_human_of(message: wire.Message, task_id: str) -> TaskNeedHumanPayload | None:
    """The `task_need_human` a Synapse agent's INPUT_REQUIRED message carries, if it parses."""
    data = first_data(message)
    if not isinstance(data, dict):
        return None
    known = {"reason", "context", "options", "deadline"}
    try:
        return msgspec.convert(
            {"task_id": task_id, **{k: v for k, v in data.items() if k in known}},
            TaskNeedHumanPayload,
        )
    except msgspec.ValidationError:
        return None


__all__ = [
    "FINAL_STATE_MAP",
    "STATE_MAP",
    "TASK_TYPE_KEY",
    "a2a_state",
    "artifact_result",
    "decision_of",
    "info_fields",
    "payload_of",
    "result_artifact",
    "status_error",
    "task_type_of",
]
