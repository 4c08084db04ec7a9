"""The values the A2A client takes and hands out: the events and outcome of a task it
follows (`A2AEvent`, `A2AOutcome`), the messages it builds (`user_message`), the cards it
parses (`parse_card`)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec

from synapse.a2a import mapping, v03, wire
from synapse.a2a.errors import A2ACode, A2AError, A2AVersionError
from synapse.types import TaskError, TaskResult, TaskState

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class A2AEvent:
    """One event of an A2A task, as a handle sees it.

    `kind`: `task`, `status_update`, `artifact_update`, `message` (a reply that is a message,
    not a task), or `reconnected` (a broken stream was resumed). `state` is the task's A2A
    state after the event; `text` and `data` are the event's status message or artifact.
    """

    kind: str
    state: str
    task_id: str
    text: str = ""
    data: Any = None
    raw: wire.StreamResponse | None = None
    #: The task still reports the interruption we already answered (some agents, such as
    #: those built on the JavaScript SDK, repeat it at the start of the reply's stream).
    answered: bool = False

    @property
    def final(self) -> bool:
        return wire.is_terminal(self.state)

    @property
    def interrupted(self) -> bool:
        """The task waits for us (INPUT_REQUIRED or AUTH_REQUIRED), and we have not answered."""
        return self.state in wire.INTERRUPTED_STATES and not self.answered

    @property
    def input_required(self) -> bool:
        return self.state == wire.INPUT_REQUIRED and not self.answered


@dataclass(frozen=True, slots=True)
class A2AOutcome:
    """How an A2A task ended (like `synapse.runtime.protocol.Outcome`)."""

    a2a_state: str
    task: wire.Task | None = None
    #: The agent's reply when it answered with a message instead of a task.
    message: wire.Message | None = None

    @property
    def state(self) -> TaskState:
        """The Synapse final state this corresponds to."""
        if self.task is None and self.message is not None:
            return TaskState.COMPLETED
        return mapping.FINAL_STATE_MAP.get(self.a2a_state, TaskState.FAILED)

    @property
    def ok(self) -> bool:
        return self.state is TaskState.COMPLETED

    @property
    def result(self) -> TaskResult | None:
        """The artifacts (or the reply message) as a Synapse `TaskResult`."""
        if self.task is not None and self.ok:
            return mapping.artifact_result(self.task.artifacts)
        if self.message is not None:
            parts = [wire.Artifact(artifact_id="message", parts=self.message.parts)]
            return mapping.artifact_result(parts)
        return None

    @property
    def error(self) -> TaskError | None:
        if self.ok or self.task is None:
            return None
        return mapping.status_error(self.task.status)

    @property
    def text(self) -> str:
        """Every text part of the artifacts (or of the reply message)."""
        if self.task is not None:
            parts = [p for a in self.task.artifacts for p in a.parts]
        elif self.message is not None:
            parts = list(self.message.parts)
        else:
            parts = []
        return "".join(p.text for p in parts if isinstance(p.text, str))


def card_major(interface: wire.AgentInterface) -> int | None:
    return wire.major(interface.protocol_version)


def user_message(
    payload: Mapping[str, Any] | str | None = None,
    task_type: str | None = None,
    context_id: str = "",
    *,
    task_id: str = "",
    references: Sequence[str] = (),
) -> wire.Message:
    """A user message: a mapping as a data part, a string as a text part; `references`:
    the ids of earlier tasks it relates to (`referenceTaskIds`)."""
    parts: list[wire.Part] = []
    if isinstance(payload, str):
        parts.append(wire.text_part(payload))
    elif payload is not None:
        parts.append(wire.data_part(dict(payload)))
    return wire.Message(
        message_id=mapping.new_id(),
        role=wire.ROLE_USER,
        parts=parts,
        context_id=context_id,
        task_id=task_id,
        metadata={mapping.TASK_TYPE_KEY: task_type} if task_type else None,
        reference_task_ids=list(references),
    )


def parse_card(raw: bytes) -> wire.AgentCard:
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise A2AError(A2ACode.INVALID_AGENT_RESPONSE, f"agent card is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise A2AError(A2ACode.INVALID_AGENT_RESPONSE, "agent card is not a JSON object")
    if "supportedInterfaces" not in data:
        version = str(data.get("protocolVersion") or "0.3")
        if not v03.is_v03(version) or not data.get("url"):
            raise A2AVersionError(
                f"agent card is A2A {version} (no supportedInterfaces); this client speaks A2A "
                f"{wire.PROTOCOL_VERSION} and 0.3",
                {"offered": version},
            )
        data = v03.card_to_v1(data)  # an A2A 0.3 agent: its interfaces say 0.3
    return convert_wire(data, wire.AgentCard)


def convert_wire(value: Any, cls: type[T]) -> T:
    try:
        # Not strict: gRPC's proto JSON writes 64-bit integers as strings.
        return msgspec.convert(value, cls, strict=False)
    except msgspec.ValidationError as exc:
        raise A2AError(
            A2ACode.INVALID_AGENT_RESPONSE, f"unexpected {cls.__name__} from the agent: {exc}"
        ) from None


def content_parts(parts: list[wire.Part]) -> tuple[str, Any]:
    text = "".join(p.text for p in parts if isinstance(p.text, str))
    data = next((p.data for p in parts if p.data is not msgspec.UNSET), None)
    return text, data


def content_of(message: wire.Message | None) -> tuple[str, Any]:
    return content_parts(message.parts) if message is not None else ("", None)


def merge_artifact(task: wire.Task, update: wire.TaskArtifactUpdateEvent) -> None:
    for i, known in enumerate(task.artifacts):
        if known.artifact_id == update.artifact.artifact_id:
            if update.append:
                known.parts.extend(update.artifact.parts)
            else:
                task.artifacts[i] = update.artifact
            return
    task.artifacts.append(update.artifact)
