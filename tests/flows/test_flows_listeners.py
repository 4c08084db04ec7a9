"""Runtime listeners over a real task: each is told of what it implements, in order, and a
listener that implements only part of `RuntimeListener` (or none of it) breaks nothing.

Two real peers on 127.0.0.1 (the `pair` fixture).
"""

from __future__ import annotations

import asyncio
from typing import Any

from flowkit import WAIT, E, Pair

from synapse.p2p.engine import Transition
from synapse.runtime.listener import MessageEvent, RuntimeListener
from synapse.types import TaskState


class Transitions(RuntimeListener):
    """Implements one method: only that one is called."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def on_transition(self, transition: Transition) -> None:
        self.seen.append((transition.from_state.value, transition.to_state.value))


class Duck:
    """Not a RuntimeListener: only the methods it has are called."""

    def __init__(self) -> None:
        self.messages: list[str] = []

    def on_message(self, event: MessageEvent) -> None:
        self.messages.append(f"{event.direction} {event.message.type.value}")


class Failing(RuntimeListener):
    def on_commit(self, seconds: float, error: BaseException | None) -> None:
        raise RuntimeError("a listener that fails")


async def test_listeners_are_told_what_they_implement(pair: Pair) -> None:
    transitions, duck, failing = Transitions(), Duck(), Failing()
    commits: list[float] = []
    late = RuntimeListener()
    late.on_commit = lambda seconds, error: commits.append(seconds)  # type: ignore[method-assign]
    listeners: list[Any] = pair.e.protocol.listeners
    listeners += [transitions, duck, failing]
    handle = await pair.r.submit(E, "echo", {"text": "hi"})
    outcome = await asyncio.wait_for(handle, WAIT)
    assert outcome.state is TaskState.COMPLETED
    assert transitions.seen == [
        ("idle", "confirmed"),
        ("confirmed", "executing"),
        ("executing", "completed"),
    ]
    assert "in p2p:task_request" in duck.messages and "reply_in p2p:task_ack" in duck.messages
    # A listener added later (the list changed) is told too, its instance's own method included.
    listeners.append(late)
    handle = await pair.r.submit(E, "echo", {"text": "again"})
    assert (await asyncio.wait_for(handle, WAIT)).state is TaskState.COMPLETED
    assert commits
    assert len(transitions.seen) == 6
