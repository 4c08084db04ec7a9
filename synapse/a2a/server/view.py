"""The A2A view of one Synapse task: status, history, artifacts, push configurations, and the
subscriptions of the streams that follow it.

Binding-independent: every binding (JSON-RPC, HTTP+JSON/REST, gRPC) reads the same views
through `A2AService` and renders their events in its own framing.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Iterable
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import msgspec

from synapse.a2a import mapping, wire
from synapse.a2a.server.artifacts import chunk_of, noted_artifacts
from synapse.a2a.server.extensions import CONTEXT_EXTENSIONS, Annotate, annotate
from synapse.p2p.engine import AuditEntry, TaskKey, TaskRecord
from synapse.p2p.packed import Packer
from synapse.types import (
    Message,
    TaskComplete,
    TaskFailed,
    TaskNeedHuman,
    TaskNeedInfo,
    TaskResult,
    TaskState,
    TaskStatusUpdate,
)

#: One item of a stream subscription: (sequence number, event), or None to end it.
Queued = tuple[int, wire.StreamResponse] | None


class _Sealed(msgspec.Struct, array_like=True, gc=False):
    """What a finished view keeps of its contents, packed (`A2ATask.seal`)."""

    history: list[wire.Message]
    artifacts: list[wire.Artifact]
    status_message: wire.Message | None
    push: list[wire.TaskPushNotificationConfig]
    applied: list[str]


def _sample() -> _Sealed:
    """A finished echo task's contents: the dictionary views are deflated against."""
    context_id, task_id = "00000000-0000-4000-8000-000000000000", "0" * 36

    def message(message_id: str, role: str, text: str) -> wire.Message:
        return wire.Message(
            message_id=message_id,
            role=role,
            parts=[wire.text_part(text)],
            context_id=context_id,
            task_id=task_id,
        )

    return _Sealed(
        history=[
            message("0" * 32, wire.ROLE_USER, "hello"),
            message("0" * 36, wire.ROLE_AGENT, "executing"),
        ],
        artifacts=[
            wire.Artifact(
                artifact_id="0" * 36,
                name="echo",
                parts=[wire.text_part("hello")],
                metadata={"outputType": "text"},
            )
        ],
        status_message=None,
        push=[],
        applied=["msg-" + "0" * 32] * 3,
    )


@functools.cache
def _sealer() -> Packer[_Sealed]:
    return Packer(_Sealed, _sample())


class A2ATask:
    """The A2A view of one Synapse executor task requested over A2A.

    Once the task is terminal and no stream follows it, the view is sealed: its history,
    artifacts, status message, push configurations and applied callbacks are packed into
    one `bytes` (`synapse.p2p.packed`; an echo task's view goes from about 2.5 KB of
    objects to a few hundred bytes). Reading a snapshot unpacks a copy; anything that
    changes the contents (`history`, `artifacts`, `push`, `applied`) unseals it first.
    """

    __slots__ = (
        "_applied",
        "_artifacts",
        "_history",
        "_push",
        "_recent",
        "_sealed",
        "_status_message",
        "_subscribers",
        "annotators",
        "context_id",
        "extensions",
        "key",
        "output_artifact_id",
        "principal",
        "seq",
        "state",
        "task_type",
        "timestamp",
    )

    def __init__(
        self,
        *,
        key: TaskKey,
        principal: str,
        context_id: str,
        task_type: str,
    ) -> None:
        self.key = key
        self.principal = principal
        self.context_id = context_id
        self.task_type = task_type
        self.state = wire.SUBMITTED
        self._status_message: wire.Message | None = None
        self.timestamp = wire.timestamp()
        self._history: list[wire.Message] = []
        self._artifacts: list[wire.Artifact] = []
        self._push: dict[str, wire.TaskPushNotificationConfig] = {}
        #: The artifact the task's output is streamed into (chunks, then the result).
        self.output_artifact_id = ""
        self.seq = 0
        #: Ids of the engine's callbacks applied to this view (each is applied once).
        self._applied: set[str] = set()
        self._subscribers: set[asyncio.Queue[Queued]] | None = None
        #: The last events published, for a stream that resumes (`missed`); none once sealed.
        self._recent: list[tuple[int, wire.StreamResponse]] | None = None
        self._sealed: bytes | None = None
        #: The A2A extensions the call that started the task activated (kept with the task),
        #: and the hooks of those that write on what it emits (`synapse.a2a.server.extensions`).
        self.extensions: tuple[str, ...] = ()
        self.annotators: tuple[tuple[str, Annotate], ...] = ()

    # --- contents (unsealed on access) -------------------------------------------------------

    @property
    def history(self) -> list[wire.Message]:
        self._unseal()
        return self._history

    @property
    def artifacts(self) -> list[wire.Artifact]:
        self._unseal()
        return self._artifacts

    @property
    def push(self) -> dict[str, wire.TaskPushNotificationConfig]:
        self._unseal()
        return self._push

    @property
    def applied(self) -> set[str]:
        self._unseal()
        return self._applied

    @property
    def status_message(self) -> wire.Message | None:
        if self._sealed is not None:
            return _sealer().unpack(self._sealed).status_message
        return self._status_message

    @status_message.setter
    def status_message(self, message: wire.Message | None) -> None:
        self._unseal()
        self._status_message = message

    @property
    def sealed(self) -> bool:
        return self._sealed is not None

    def seal(self) -> None:
        """Pack the contents of a terminal view that no stream follows (else do nothing)."""
        if self._sealed is not None or self._subscribers or not self.is_terminal:
            return
        sealed = _Sealed(
            self._history,
            self._artifacts,
            self._status_message,
            list(self._push.values()),
            list(self._applied),
        )
        try:
            self._sealed = _sealer().pack(sealed)
        except (TypeError, ValueError, OverflowError):  # a value MessagePack cannot hold
            return
        # Sealed, the slots of the contents hold nothing at all (`_unseal` refills them).
        del self._history, self._artifacts, self._push, self._applied
        self._status_message = None
        self._recent = None

    def seal_soon(self) -> None:
        """Seal once the caller that made the view final has read it (after this step)."""
        if self._sealed is not None or self._subscribers or not self.is_terminal:
            return
        try:
            asyncio.get_running_loop().call_soon(self.seal)
        except RuntimeError:  # no loop: nothing can read it in between
            self.seal()

    def _contents(self) -> _Sealed:
        if self._sealed is not None:
            return _sealer().unpack(self._sealed)
        return _Sealed(
            self._history, self._artifacts, self._status_message, list(self._push.values()), []
        )

    def _unseal(self) -> None:
        if self._sealed is None:
            return
        contents = _sealer().unpack(self._sealed)
        self._sealed = None
        self._history, self._artifacts = contents.history, contents.artifacts
        self._status_message = contents.status_message
        self._push = {config.id: config for config in contents.push}
        self._applied = set(contents.applied)

    @property
    def id(self) -> str:
        return self.key.task_id

    @property
    def ids(self) -> mapping.TaskIds:
        return {"task_id": self.id, "context_id": self.context_id}

    @property
    def is_terminal(self) -> bool:
        return wire.is_terminal(self.state)

    def status(self) -> wire.TaskStatus:
        return wire.TaskStatus(
            state=self.state, message=self.status_message, timestamp=self.timestamp
        )

    def snapshot(
        self, *, history_length: int | None = None, include_artifacts: bool = True
    ) -> wire.Task:
        contents = self._contents()  # a sealed view stays sealed
        history = list(contents.history)
        if history_length is not None:
            history = history[-history_length:] if history_length > 0 else []
        return wire.Task(
            id=self.id,
            context_id=self.context_id,
            status=wire.TaskStatus(
                state=self.state, message=contents.status_message, timestamp=self.timestamp
            ),
            artifacts=list(contents.artifacts) if include_artifacts else [],
            history=history,
            metadata={mapping.TASK_TYPE_KEY: self.task_type},
        )

    # --- changes ----------------------------------------------------------------------------

    def set_status(self, state: str, message: wire.Message | None = None) -> wire.StreamResponse:
        """Move to `state` (the previous status message goes to the history)."""
        self._unseal()
        if self._status_message is not None:
            self._history.append(self._status_message)
        if message is not None and self.annotators:
            message = annotate(message, self.annotators)
        self.state, self._status_message, self.timestamp = state, message, wire.timestamp()
        event = wire.StreamResponse(
            status_update=wire.TaskStatusUpdateEvent(
                task_id=self.id, context_id=self.context_id, status=self.status()
            )
        )
        self.publish(event)
        self.seal_soon()
        return event

    def add_artifact(
        self, artifact: wire.Artifact, *, append: bool = False, last_chunk: bool = True
    ) -> wire.StreamResponse:
        """Add `artifact`, or (same id) replace it, or with `append` add its parts to it."""
        if self.annotators:
            artifact = annotate(artifact, self.annotators)
        for i, known in enumerate(self.artifacts):
            if known.artifact_id == artifact.artifact_id:
                if append:
                    parts = [*known.parts, *artifact.parts]
                    self.artifacts[i] = msgspec.structs.replace(known, parts=parts)
                else:
                    self.artifacts[i] = artifact
                break
        else:
            self.artifacts.append(artifact)
        event = wire.StreamResponse(
            artifact_update=wire.TaskArtifactUpdateEvent(
                task_id=self.id,
                context_id=self.context_id,
                artifact=artifact,
                append=append,
                last_chunk=last_chunk,
            )
        )
        self.publish(event)
        return event

    def add_partial(self, parts: list[wire.Part]) -> wire.StreamResponse:
        """One chunk of the task's output while it runs (a handler's `intermediate_result`):
        the first creates the output artifact, later ones are appended to it; the result
        replaces it at the end (its last chunk)."""
        first = not self.output_artifact_id
        if first:
            self.output_artifact_id = mapping.output_artifact_id(self.id)
        artifact = wire.Artifact(
            artifact_id=self.output_artifact_id,
            name=self.task_type,
            parts=parts,
            metadata={mapping.PARTIAL_KEY: True},
        )
        return self.add_artifact(artifact, append=not first, last_chunk=False)

    # --- subscribers --------------------------------------------------------------------------

    def publish(self, event: wire.StreamResponse) -> None:
        self.seq += 1
        recent = self._recent
        if recent is None:
            recent = self._recent = []
        recent.append((self.seq, event))
        if len(recent) > RECENT_EVENTS:
            del recent[0]
        if self._subscribers:
            for queue in self._subscribers:
                queue.put_nowait((self.seq, event))

    def missed(self, last: int | None) -> list[tuple[int, wire.StreamResponse]] | None:
        """The events published after event `last` (the `Last-Event-ID` of a stream that
        resumes), if every one of them is still kept; None: the stream starts with the whole
        task instead (which holds all they said)."""
        if last is None or not 0 <= last <= self.seq:
            return None
        recent = self._recent or []
        if last < self.seq and (not recent or recent[0][0] > last + 1):
            return None
        return [(seq, event) for seq, event in recent if seq > last]

    def subscribe(self) -> asyncio.Queue[Queued]:
        queue: asyncio.Queue[Queued] = asyncio.Queue()
        if self._subscribers is None:
            self._subscribers = set()
        self._subscribers.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[Queued]) -> None:
        if self._subscribers is not None:
            self._subscribers.discard(queue)
            if not self._subscribers:
                self._subscribers = None
        self.seal_soon()

    def close_streams(self) -> None:
        for queue in self._subscribers or ():
            queue.put_nowait(None)


#: Events of an in-flight task kept for streams that resume (`A2ATask.missed`).
RECENT_EVENTS = 32
#: The `Last-Event-ID` of the request being answered (set by the HTTP bindings): the last
#: event a client that resumes its stream received.
LAST_EVENT_ID: ContextVar[int | None] = ContextVar("a2a_last_event_id", default=None)


#: Agent-id prefix of the virtual requesters that stand for A2A callers.
REQUESTER_PREFIX = "a2a:"
#: Where the binding keeps its own data in `task_request.context.metadata` (made durable
#: with the task): the principal, the first message and the push configurations.
CONTEXT_KEY = "a2a"


@dataclass
class Subscription:
    """A stream of one task's events: `first` (the task as it was when the stream began),
    then every later event, until one reports a terminal or interrupted state."""

    view: A2ATask
    queue: asyncio.Queue[Queued]
    first: wire.Task
    after: int
    end_on_first: bool
    #: A stream that resumes: the events it missed, sent instead of `first`.
    replay: list[tuple[int, wire.StreamResponse]] | None = None
    #: The number of the event last yielded (SSE `id:`; `after` for `first`).
    last_seq: int = 0

    async def events(self, keepalive: float | None) -> AsyncIterator[wire.StreamResponse | None]:
        """The events in order; None every `keepalive` seconds without one (a binding that
        keeps connections alive writes something then). Unsubscribes when it ends."""
        try:
            if self.replay is None:
                self.last_seq = self.after
                yield wire.StreamResponse(task=self.first)
                if self.end_on_first and wire.ends_stream(self.first.status.state):
                    return
            for seq, event in self.replay or ():
                self.last_seq = seq
                yield event
                if event.state is not None and wire.ends_stream(event.state):
                    return
            if self.end_on_first and wire.ends_stream(self.first.status.state):
                return  # resumed after the end, with nothing missed: nothing more will come
            while True:
                try:
                    item = await asyncio.wait_for(self.queue.get(), keepalive)
                except TimeoutError:
                    yield None
                    continue
                if item is None:
                    break
                seq, event = item
                if seq <= self.after:
                    continue  # already in the snapshot (or replayed)
                self.last_seq = seq
                yield event
                state = event.state
                if state is not None and wire.ends_stream(state):
                    break
        finally:
            self.view.unsubscribe(self.queue)

    @property
    def task_id(self) -> str:
        return self.view.id

    def close(self) -> None:
        self.view.unsubscribe(self.queue)


def event_id(subscription: Subscription | Any) -> bytes:
    """The SSE `id:` line of the event a stream is about to write (its number in the task's
    events: a client that resumes sends the last one back as `Last-Event-ID`)."""
    seq = getattr(subscription, "last_seq", 0)
    return b"id: %d\n" % seq if seq else b""


def notification_of(view: A2ATask, message: Message) -> wire.StreamResponse:
    ids = view.ids
    if isinstance(message, TaskComplete | TaskFailed):
        return wire.StreamResponse(task=view.snapshot())
    if isinstance(message, TaskStatusUpdate) and message.payload.status.is_final:
        return wire.StreamResponse(task=view.snapshot())
    status: wire.TaskStatus
    if isinstance(message, TaskNeedInfo):
        status = wire.TaskStatus(
            state=wire.INPUT_REQUIRED,
            message=mapping.need_info_message(message.payload, **ids),
        )
    elif isinstance(message, TaskNeedHuman):
        status = wire.TaskStatus(
            state=wire.INPUT_REQUIRED,
            message=mapping.need_human_message(message.payload, **ids),
        )
    elif isinstance(message, TaskStatusUpdate):
        update = message.payload
        text = update.message or (f"{update.progress}%" if update.progress is not None else "")
        data: Any = {"progress": update.progress} if update.progress is not None else msgspec.UNSET
        status = wire.TaskStatus(
            state=mapping.a2a_state(update.status),
            message=mapping.agent_message(text, data, **ids) if text else None,
        )
    else:
        status = view.status()
    status.timestamp = wire.timestamp(message.timestamp)
    return wire.StreamResponse(
        status_update=wire.TaskStatusUpdateEvent(
            task_id=view.id, context_id=view.context_id, status=status
        )
    )


#: The audit action of a follow-up message kept by a working task
#: (`synapse.a2a.server.follow_ups`); its detail is `{"message": <the A2A message, as JSON>}`.
FOLLOW_UP_NOTE = "a2a_message"
#: The note of a follow-up that answers the task's question (written before the answer is
#: applied), and the one that says the answer was refused after all.
ANSWER_NOTE = "a2a_answer"
ANSWER_REFUSED_NOTE = "a2a_answer_refused"


def _noted(audit: Iterable[AuditEntry], actions: frozenset[str]) -> list[wire.Message]:
    """The A2A messages of the notes named `actions`, in the order they came, less the
    answers refused after they were noted."""
    noted: list[wire.Message] = []
    refused: set[str] = set()
    for entry in audit:
        if entry.action == ANSWER_REFUSED_NOTE:
            refused.add(str(entry.detail.get("messageId")))
        if entry.action not in actions:
            continue
        try:
            noted.append(msgspec.convert(entry.detail.get("message"), wire.Message))
        except msgspec.ValidationError:
            continue  # not one of ours: a handler's own note of the same name
    return [message for message in noted if message.message_id not in refused]


_KEPT = frozenset({FOLLOW_UP_NOTE})
_ANSWERS = frozenset({ANSWER_NOTE})
_HISTORY = frozenset({FOLLOW_UP_NOTE, ANSWER_NOTE})


def kept_messages(audit: Iterable[AuditEntry]) -> list[wire.Message]:
    """The follow-up messages a task kept (sent while it worked), in the order they came,
    from its audit trail."""
    return _noted(audit, _KEPT)


def answer_messages(audit: Iterable[AuditEntry]) -> list[wire.Message]:
    """The follow-up messages that answered the task's questions, in the order they came."""
    return _noted(audit, _ANSWERS)


def history_messages(audit: Iterable[AuditEntry]) -> list[wire.Message]:
    """Every follow-up message of the task, kept ones and answers, in the order they came."""
    return _noted(audit, _HISTORY)


def view_of_record(rec: TaskRecord) -> A2ATask:
    meta: dict[str, Any] = {}
    if rec.context is not None:
        found = rec.context.metadata.get(CONTEXT_KEY)
        meta = found if isinstance(found, dict) else {}
    context_id = (rec.context.session_id if rec.context else None) or mapping.new_id()
    view = A2ATask(
        key=rec.key,
        principal=rec.partner[len(REQUESTER_PREFIX) :],
        context_id=context_id,
        task_type=rec.task.type,
    )
    try:
        first = msgspec.convert(meta.get("message"), wire.Message)
        view.history.append(first)
    except msgspec.ValidationError:
        pass
    found = meta.get(CONTEXT_EXTENSIONS)
    if isinstance(found, list):
        view.extensions = tuple(u for u in found if isinstance(u, str))
    view.history.extend(history_messages(rec.audit))
    for raw in meta.get("push") or []:
        try:
            config = msgspec.convert(raw, wire.TaskPushNotificationConfig)
        except msgspec.ValidationError:
            continue
        view.push[config.id] = config
    ids = view.ids
    view.state = mapping.a2a_state(rec.state)
    view.artifacts.extend(noted_artifacts(rec.audit))
    if rec.result is not None:
        artifact_id = mapping.output_artifact_id(view.id)
        view.artifacts.append(result_artifact(view, rec.result, artifact_id=artifact_id))
    if rec.state is TaskState.INFO_NEEDED and rec.need_info is not None:
        view.status_message = mapping.need_info_message(rec.need_info, **ids)
    elif rec.state is TaskState.NEED_HUMAN and rec.need_human is not None:
        view.status_message = mapping.need_human_message(rec.need_human, **ids)
    elif rec.error is not None and view.is_terminal:
        view.status_message = mapping.error_message(rec.error, **ids)
    elif rec.reject is not None:
        view.status_message = mapping.reject_message(rec.reject, **ids)
    view.timestamp = wire.timestamp(datetime.fromtimestamp(rec.updated_at or time.time(), UTC))
    return view


def result_artifact(
    view: A2ATask, result: TaskResult, *, summary: str = "", artifact_id: str
) -> wire.Artifact:
    """The artifact of a task's result; the handler's data for an extension active on the
    task (`result.metadata[URI]`) goes on it as that extension's (`metadata[URI]`, and the
    URI in `extensions`), durably: it is rebuilt from the stored result."""
    artifact = mapping.result_artifact(
        result, name=view.task_type, summary=summary, artifact_id=artifact_id
    )
    data = result.metadata or {}
    lifted = {uri: data[uri] for uri in view.extensions if uri in data}
    if not lifted:
        return artifact
    metadata = {**(artifact.metadata or {}), **lifted}
    extensions = [*artifact.extensions, *(u for u in lifted if u not in artifact.extensions)]
    return msgspec.structs.replace(artifact, metadata=metadata, extensions=extensions)


def context_data(view: A2ATask) -> dict[str, Any]:
    return {
        "principal": view.principal,
        "message": wire.to_builtins(view.history[0]) if view.history else None,
        "push": [wire.to_builtins(c) for c in view.push.values()],
        **({CONTEXT_EXTENSIONS: list(view.extensions)} if view.extensions else {}),
    }


def apply_callback(view: A2ATask, message: Message) -> None:
    """What a callback of the engine (status, question, outcome) changes in the task's view."""
    ids = view.ids
    if isinstance(message, TaskStatusUpdate):
        update = message.payload
        text = update.message
        data: dict[str, Any] = {}
        if update.progress is not None:
            data["progress"] = update.progress
            text = text or f"{update.progress}%"
        chunk = chunk_of(update.intermediate_result)
        if chunk is not None:  # a named artifact the handler emitted (`emit_artifact`)
            view.add_artifact(chunk.artifact, append=chunk.append, last_chunk=chunk.last_chunk)
            if not (text or data) and view.state == wire.WORKING:
                return  # the artifact's event says it all
        elif update.intermediate_result is not None:
            data["intermediate_result"] = update.intermediate_result
            view.add_partial(mapping.partial_parts(update.intermediate_result))
        status_message = (
            mapping.agent_message(text, data if data else msgspec.UNSET, **ids)
            if text or data
            else None
        )
        state = mapping.a2a_state(update.status)
        view.set_status(state if not wire.is_terminal(state) else wire.WORKING, status_message)
    elif isinstance(message, TaskNeedInfo):
        view.set_status(wire.INPUT_REQUIRED, mapping.need_info_message(message.payload, **ids))
    elif isinstance(message, TaskNeedHuman):
        view.set_status(wire.INPUT_REQUIRED, mapping.need_human_message(message.payload, **ids))
    elif isinstance(message, TaskComplete):
        done = message.payload
        artifact_id = view.output_artifact_id or mapping.output_artifact_id(view.id)
        view.add_artifact(
            result_artifact(view, done.result, summary=done.summary, artifact_id=artifact_id)
        )
        summary = mapping.agent_message(done.summary, **ids) if done.summary else None
        view.set_status(wire.COMPLETED, summary)
    elif isinstance(message, TaskFailed):
        view.set_status(wire.FAILED, mapping.error_message(message.payload.error, **ids))


__all__ = [
    "ANSWER_NOTE",
    "ANSWER_REFUSED_NOTE",
    "CONTEXT_KEY",
    "FOLLOW_UP_NOTE",
    "REQUESTER_PREFIX",
    "A2ATask",
    "Queued",
    "Subscription",
    "answer_messages",
    "apply_callback",
    "context_data",
    "history_messages",
    "kept_messages",
    "notification_of",
    "view_of_record",
]
