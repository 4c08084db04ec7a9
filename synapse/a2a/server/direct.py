"""Messages a handler answers itself, without a task: A2A's `Message` response.

Some requests need no task: a greeting, a lookup answered at once. A2A lets an agent answer
`SendMessage` with a `Message` instead of a `Task`. A handler opts in per task type: it
lists the types it may answer directly (`immediate_task_types`), and for a new message of
such a type (no `taskId`) the binding asks it first (`answer_message`); what it returns is
the answer (a string: a text part; anything else JSON: a data part), and no task is started.
Returning None starts a task as usual, so a handler may answer some messages of a type and
not others. `SendStreamingMessage` streams that one `Message` and ends.

    class Greeter:
        def immediate_task_types(self) -> list[str]:
            return ["hello"]

        async def answer_message(self, task_type, payload, request):
            return f"hello, {payload.get('text', 'you')}"
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Collection
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from synapse.a2a import mapping, wire
from synapse.runtime.protocol import P2PProtocol


@dataclass(frozen=True, slots=True)
class DirectRequest:
    """What `answer_message` knows of the message besides its payload."""

    message_id: str
    context_id: str
    principal: str
    metadata: dict[str, Any]


@runtime_checkable
class DirectAnswers(Protocol):
    """A handler that answers some messages itself (see the module's docstring)."""

    def immediate_task_types(self) -> Collection[str]: ...

    def answer_message(
        self, task_type: str, payload: dict[str, Any], request: DirectRequest
    ) -> Awaitable[Any]: ...


class _Service(Protocol):
    @property
    def protocol(self) -> P2PProtocol: ...

    default_task_type: str | None


async def direct_answer(
    service: _Service, message: wire.Message, principal: str
) -> wire.Message | None:
    """The service's handler's own answer to a new `message`, or None: start a task."""
    handler = service.protocol.handler
    if message.task_id or not isinstance(handler, DirectAnswers):
        return None
    task_type = mapping.task_type_of(message, service.default_task_type)
    if task_type not in handler.immediate_task_types():
        return None
    context_id = message.context_id or mapping.new_id()
    request = DirectRequest(message.message_id, context_id, principal, message.metadata or {})
    answer = await handler.answer_message(task_type, mapping.payload_of(message), request)
    if answer is None:
        return None
    if isinstance(answer, str):
        return mapping.agent_message(answer, task_id="", context_id=context_id)
    return mapping.agent_message("", answer, task_id="", context_id=context_id)


class DirectStream:
    """The stream of a direct answer: that one message."""

    task_id = ""

    def __init__(self, message: wire.Message) -> None:
        self.message = message

    async def events(self, keepalive: float | None) -> AsyncIterator[wire.StreamResponse | None]:
        yield wire.StreamResponse(message=self.message)

    def close(self) -> None:
        pass


__all__ = ["DirectAnswers", "DirectRequest", "DirectStream", "direct_answer"]
