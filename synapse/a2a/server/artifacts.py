"""Named artifacts a handler emits while it works, any number of them, each streamed in
chunks (`append`, `lastChunk`) like the A2A `TaskArtifactUpdateEvent` they become.

`await emit_artifact(ctx, name=..., text=... | data=... | parts=[...])` sends one artifact,
or one chunk of it (`append=True` adds parts to the artifact of the same id), as the task's
progress: a `task_status_update` whose `intermediate_result` is `{"a2a_artifact": {...}}` (the
artifact as A2A writes it, with `append` and `lastChunk`). An A2A caller gets an artifact
update event on every binding; a Synapse requester reads the same object in the update's
`intermediate_result`. The emission is also noted with the task, durably in the commit that
sends the update (`ARTIFACT_NOTE`), so `GetTask` and `ListTasks` list the artifacts after a
restart too. The task's result is its own artifact at the end, as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec

from synapse.a2a import mapping, wire
from synapse.p2p.engine import AuditEntry
from synapse.runtime.handler import ExecutionContext

#: The `intermediate_result` member that carries an artifact (or a chunk of one).
ARTIFACT_KEY = "a2a_artifact"
#: The note an emission leaves with the task.
ARTIFACT_NOTE = "a2a_artifact"
#: The most bytes (as JSON) the artifacts a handler emits for one task may add up to: each
#: is kept with the task's record, and any one update must fit in a Synapse message (1 MiB
#: by default) to reach a Synapse requester.
MAX_ARTIFACT_BYTES = 512 * 1024


class ArtifactChunk(msgspec.Struct, rename="camel"):
    """An emitted artifact, or a chunk of one, as it travels and is kept."""

    artifact: wire.Artifact
    append: bool = False
    last_chunk: bool = True


async def emit_artifact(
    ctx: ExecutionContext,
    *,
    name: str = "",
    text: str | None = None,
    data: Any = None,
    parts: Sequence[wire.Part] | None = None,
    description: str = "",
    artifact_id: str | None = None,
    append: bool = False,
    last_chunk: bool = True,
    metadata: Mapping[str, Any] | None = None,
    message: str = "",
) -> str:
    """Emit an artifact of the task `ctx` runs (its `text`, its `data`, or its `parts`), or
    with `append` one more chunk of the artifact `artifact_id`; `last_chunk=False` says more
    chunks follow. Returns the artifact's id (a new one unless given). Raises `ValueError`
    past `MAX_ARTIFACT_BYTES` for the task, or for an artifact with no content."""
    chosen: list[wire.Part] = list(parts or [])
    if text is not None:
        chosen.append(wire.text_part(text))
    if data is not None:
        chosen.append(wire.data_part(data))
    if not chosen:
        raise ValueError("an artifact needs content: text, data or parts")
    if append and not artifact_id:
        raise ValueError("append adds to an artifact emitted before: give its artifact_id")
    artifact = wire.Artifact(
        artifact_id=artifact_id or mapping.new_id(),
        parts=chosen,
        name=name,
        description=description,
        metadata=dict(metadata) if metadata else None,
    )
    chunk = wire.to_builtins(ArtifactChunk(artifact, append=append, last_chunk=last_chunk))
    size = len(wire.encode(chunk)) + sum(
        len(wire.encode(e.detail)) for e in ctx.notes if e.action == ARTIFACT_NOTE
    )
    if size > MAX_ARTIFACT_BYTES:
        raise ValueError(
            f"the artifacts of task {ctx.task_id} would pass {MAX_ARTIFACT_BYTES:,} bytes"
        )
    ctx.note_soon(ARTIFACT_NOTE, **chunk)  # durable with the update that carries it
    await ctx.progress(message=message, intermediate_result={ARTIFACT_KEY: chunk})
    return artifact.artifact_id


def chunk_of(intermediate_result: Any) -> ArtifactChunk | None:
    """The artifact an `intermediate_result` carries, if it is one of `emit_artifact`'s."""
    if not isinstance(intermediate_result, dict) or set(intermediate_result) != {ARTIFACT_KEY}:
        return None
    try:
        return msgspec.convert(intermediate_result[ARTIFACT_KEY], ArtifactChunk)
    except msgspec.ValidationError:
        return None


def noted_artifacts(audit: Iterable[AuditEntry]) -> list[wire.Artifact]:
    """The artifacts a task emitted, from its notes: chunks appended, in the order of the
    first chunk of each."""
    found: dict[str, wire.Artifact] = {}
    for entry in audit:
        if entry.action != ARTIFACT_NOTE:
            continue
        try:
            chunk = msgspec.convert(entry.detail, ArtifactChunk)
        except msgspec.ValidationError:
            continue  # not one of ours: a handler's own note of the same name
        known = found.get(chunk.artifact.artifact_id)
        if chunk.append and known is not None:
            found[known.artifact_id] = msgspec.structs.replace(
                known, parts=[*known.parts, *chunk.artifact.parts]
            )
        else:
            found[chunk.artifact.artifact_id] = chunk.artifact
    return list(found.values())


__all__ = [
    "ARTIFACT_KEY",
    "ARTIFACT_NOTE",
    "MAX_ARTIFACT_BYTES",
    "ArtifactChunk",
    "chunk_of",
    "emit_artifact",
    "noted_artifacts",
]
