"""Helpers of a router's A2A members: the member's client, the message a sub-task sends,
what a refusal says, and how a task handle is awaited."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from synapse.router.outcomes import Declined
from synapse.router.relay import Relay
from synapse.runtime.protocol import TaskHandle

if TYPE_CHECKING:
    from synapse.a2a.client.core import A2AClient

T = TypeVar("T")


@dataclass(slots=True)
class A2AMember:
    url: str
    token: str | None
    require_signed: bool
    allow_foreign_interface: bool
    client: A2AClient | None = None


async def unless_settled(handle: TaskHandle, ask: Awaitable[T]) -> T | None:
    """`ask` (a question to the original requester), unless the partner ends the task first
    (it timed out waiting, say): then None, and the question is withdrawn."""
    asking = asyncio.ensure_future(ask)
    ended = asyncio.ensure_future(handle.result())
    try:
        await asyncio.wait({asking, ended}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not asking.done():
            asking.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asking
        ended.cancel()
    return asking.result() if not asking.cancelled() else None


def percent(value: Any) -> float | None:
    """Another agent's progress figure, if it is one (a number from 0 to 100)."""
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= 100:
        return float(value)
    return None


def a2a_message(relay: Relay, task_type: str, payload: Mapping[str, Any]) -> Any:
    """The A2A message of a routed task: the payload as a data part, the task type and the
    original task's id (`parent_task_id`) in its metadata."""
    from synapse.a2a import mapping, wire

    return wire.Message(
        message_id=mapping.new_id(),
        role=wire.ROLE_USER,
        parts=[wire.data_part(dict(payload))],
        metadata={mapping.TASK_TYPE_KEY: task_type, "parent_task_id": relay.task_id},
    )


def a2a_declined(partner: str, text: str, data: Any) -> Declined:
    """A REJECTED A2A task: `<code>: <message>` and `{"reason", "alternatives"}` from a
    Synapse agent, anything from others."""
    data = data if isinstance(data, dict) else {}
    reason = data.get("reason") if isinstance(data.get("reason"), dict) else {}
    alternatives = data.get("alternatives") if isinstance(data.get("alternatives"), dict) else {}
    code = str(reason.get("code") or text.partition(":")[0].strip() or "rejected")
    retry_after = alternatives.get("retry_after")
    suggested = alternatives.get("suggested_agent_id")
    return Declined(
        partner,
        code,
        str(reason.get("message") or text),
        retry_after=float(retry_after) if isinstance(retry_after, int | float) else None,
        suggested=str(suggested) if isinstance(suggested, str) else None,
    )
