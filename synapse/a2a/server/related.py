"""What a handler reads of its task's A2A context: the tasks it is related to (those its
messages reference, `referenceTaskIds`, and the other tasks of its context, `contextId`), and
the extensions the call that started it activated (`active_extensions`).

`related_tasks(ctx)` reads them through the A2A service, as the caller could with `GetTask`
and `ListTasks`: scoped to the caller's principal and tenant (a task another principal owns
is as good as missing), their current state, artifacts and metadata, without history. A task
that came through a router carries what the router read for it (the router passes them on
in its sub-task's context, `RELATED_KEY`), so the partner it picked reads the same.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

from synapse.a2a import wire
from synapse.a2a.errors import A2AError
from synapse.a2a.server.extensions import CONTEXT_EXTENSIONS
from synapse.a2a.server.view import CONTEXT_KEY, REQUESTER_PREFIX, history_messages
from synapse.runtime.handler import ExecutionContext


class _Service(Protocol):
    """What is read here of `synapse.a2a.server.service.A2AService`."""

    def get_task(self, req: wire.GetTaskRequest, principal: str) -> wire.Task: ...

    def list_tasks(self, req: wire.ListTasksRequest, principal: str) -> wire.ListTasksResponse: ...


#: `context.metadata` key of a sub-task a router made: the related tasks of its original.
RELATED_KEY = "related_tasks"
#: At most this many of a context's other tasks are read (the first page of `ListTasks`).
MAX_CONTEXT_TASKS = 50

#: The A2A service of each peer's runtime (set when the service is bound to it).
_SERVICES: weakref.WeakKeyDictionary[Any, _Service] = weakref.WeakKeyDictionary()


def register(runtime: Any, service: _Service) -> None:
    _SERVICES[runtime] = service


@dataclass(frozen=True)
class RelatedTasks:
    """What a task's handler may read of the tasks related to it."""

    #: The tasks its messages reference, in the order first named.
    referenced: list[wire.Task] = field(default_factory=list)
    #: Referenced ids this caller cannot see: unknown, or another principal's.
    missing: list[str] = field(default_factory=list)
    #: The other tasks of its context, the most recently updated first.
    context: list[wire.Task] = field(default_factory=list)

    def to_builtins(self) -> dict[str, Any]:
        return {
            "referenced": [wire.to_builtins(t) for t in self.referenced],
            "missing": list(self.missing),
            "context": [wire.to_builtins(t) for t in self.context],
        }

    @classmethod
    def from_builtins(cls, value: Any) -> RelatedTasks:
        try:
            return cls(
                referenced=msgspec.convert(value.get("referenced", []), list[wire.Task]),
                missing=[str(i) for i in value.get("missing", [])],
                context=msgspec.convert(value.get("context", []), list[wire.Task]),
            )
        except (AttributeError, msgspec.ValidationError):
            return cls()


def related_tasks(ctx: ExecutionContext) -> RelatedTasks:
    """The tasks related to the task `ctx` runs: those its A2A messages reference and the
    other tasks of its context, as its caller may see them. Empty for a task that did not
    come through A2A (nor through a router that passed its related tasks on)."""
    context = ctx.context
    if context is not None and RELATED_KEY in context.metadata:
        return RelatedTasks.from_builtins(context.metadata[RELATED_KEY])
    service = _SERVICES.get(ctx.runtime)
    requester = ctx.key.requester
    if service is None or context is None or not requester.startswith(REQUESTER_PREFIX):
        return RelatedTasks()
    principal = requester[len(REQUESTER_PREFIX) :]
    found = context.metadata.get(CONTEXT_KEY)
    first = found.get("message") if isinstance(found, dict) else None
    messages: list[Any] = [first] if first is not None else []
    messages += [wire.to_builtins(m) for m in history_messages(ctx.notes)]
    referenced, missing = _referenced(service, principal, _reference_ids(messages))
    others = _context_tasks(service, principal, context.session_id or "", ctx.task_id)
    return RelatedTasks(referenced, missing, others)


def active_extensions(ctx: ExecutionContext) -> list[str]:
    """The A2A extensions the call that started this task activated
    (`synapse.a2a.server.extensions`); empty for a task that did not come through A2A."""
    context = ctx.context
    data = context.metadata.get(CONTEXT_KEY) if context is not None else None
    found = data.get(CONTEXT_EXTENSIONS) if isinstance(data, dict) else None
    return [u for u in found if isinstance(u, str)] if isinstance(found, list) else []


def _reference_ids(messages: Iterable[Any]) -> list[str]:
    ids: dict[str, None] = {}
    for message in messages:
        named = message.get("referenceTaskIds") if isinstance(message, dict) else None
        for task_id in named if isinstance(named, list) else ():
            if isinstance(task_id, str) and task_id:
                ids[task_id] = None
    return list(ids)


def _referenced(
    service: _Service, principal: str, ids: list[str]
) -> tuple[list[wire.Task], list[str]]:
    found: list[wire.Task] = []
    missing: list[str] = []
    for task_id in ids:
        try:
            found.append(
                service.get_task(wire.GetTaskRequest(id=task_id, history_length=0), principal)
            )
        except A2AError:
            missing.append(task_id)  # unknown, or not this caller's: the same to it
    return found, missing


def _context_tasks(
    service: _Service, principal: str, context_id: str, this_task: str
) -> list[wire.Task]:
    if not context_id:
        return []
    request = wire.ListTasksRequest(
        context_id=context_id,
        page_size=MAX_CONTEXT_TASKS,
        history_length=0,
        include_artifacts=True,
    )
    listed = service.list_tasks(request, principal)
    return [task for task in listed.tasks if task.id != this_task]


__all__ = [
    "MAX_CONTEXT_TASKS",
    "RELATED_KEY",
    "RelatedTasks",
    "active_extensions",
    "related_tasks",
]
