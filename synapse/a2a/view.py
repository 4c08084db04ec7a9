"""The A2A view of one Synapse task: status, history, artifacts, push configurations, and the
subscriptions of the streams that follow it.

Binding-independent: every binding (JSON-RPC, HTTP+JSON/REST, gRPC) reads the same views
through `A2AService` and renders their events in its own framing.
"""

from __future__ import annotations

import asyncio

import msgspec

from synapse.a2a import mapping, wire
from synapse.p2p.engine import TaskKey

#: One item of a stream subscription: (sequence number, event), or None to end it.
Queued = tuple[int, wire.StreamResponse] | None


class A2ATask:
    """The A2A view of one Synapse executor task requested over A2A."""

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
        self.status_message: wire.Message | None = None
        self.timestamp = wire.timestamp()
        self.history: list[wire.Message] = []
        self.artifacts: list[wire.Artifact] = []
        self.push: dict[str, wire.TaskPushNotificationConfig] = {}
        #: The artifact the task's output is streamed into (chunks, then the result).
        self.output_artifact_id = ""
        self.seq = 0
        self.applied: set[str] = set()
        self._subscribers: set[asyncio.Queue[Queued]] = set()

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
        history = list(self.history)
        if history_length is not None:
            history = history[-history_length:] if history_length > 0 else []
        return wire.Task(
            id=self.id,
            context_id=self.context_id,
            status=self.status(),
            artifacts=list(self.artifacts) if include_artifacts else [],
            history=history,
            metadata={mapping.TASK_TYPE_KEY: self.task_type},
        )

    # --- changes ----------------------------------------------------------------------------

    def set_status(self, state: str, message: wire.Message | None = None) -> wire.StreamResponse:
        """Move to `state` (the previous status message goes to the history)."""
        if self.status_message is not None:
            self.history.append(self.status_message)
        self.state, self.status_message, self.timestamp = state, message, wire.timestamp()
        event = wire.StreamResponse(
            status_update=wire.TaskStatusUpdateEvent(
                task_id=self.id, context_id=self.context_id, status=self.status()
            )
        )
        self.publish(event)
        return event

    def add_artifact(
        self, artifact: wire.Artifact, *, append: bool = False, last_chunk: bool = True
    ) -> wire.StreamResponse:
        """Add `artifact`, or (same id) replace it, or with `append` add its parts to it."""
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
        for queue in self._subscribers:
            queue.put_nowait((self.seq, event))

    def subscribe(self) -> asyncio.Queue[Queued]:
        queue: asyncio.Queue[Queued] = asyncio.Queue()
        self._subscribers.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[Queued]) -> None:
        self._subscribers.discard(queue)

    def close_streams(self) -> None:
        for queue in self._subscribers:
            queue.put_nowait(None)


__all__ = ["A2ATask", "Queued"]
