"""Helpers of the end-to-end flow tests: the pair of peers, its timeline, bounded waits."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from synapse.p2p.config import P2PConfig
from synapse.p2p.engine import TaskEvent
from synapse.runtime.protocol import MessageEvent, TaskHandle
from synapse.transport.client import SenderMode
from synapse.transport.peer import Peer
from synapse.types import Message, TaskState

R, E = "agent-r", "agent-e"
SECRET = "flows-secret-r-e-0123456789abcde"
#: An older secret both still accept (rotation); nobody signs with it.
OLD_SECRET = "flows-secret-r-e-2025-0123456789"
#: Fast retries, the default 30 s heartbeat (tests that want heartbeats ask for them).
FAST = P2PConfig(max_retries=2, retry_base_delay=0.02, retry_max_delay=0.1, request_timeout=5)
#: The bound of every wait in these tests.
WAIT = 10.0

#: `make_pair(mode, config=..., r_handler=..., e_handler=...)`: an async context manager.
PairFactory = Callable[..., Any]


@dataclass(frozen=True)
class Seen:
    """One message crossing one peer, in the order the whole test saw them."""

    seq: int
    peer: str
    event: MessageEvent

    @property
    def message(self) -> Message:
        return self.event.message

    @property
    def direction(self) -> str:
        return self.event.direction

    @property
    def type(self) -> str:
        return self.event.message.message_type.value

    @property
    def task_id(self) -> str | None:
        payload = self.event.message.payload
        task = getattr(payload, "task", None)
        task_id = task.id if task is not None else getattr(payload, "task_id", None)
        return task_id if isinstance(task_id, str) else None


@dataclass(frozen=True)
class Authenticated:
    """One POST a peer's server authenticated."""

    receiver: str
    type: str
    signed_by: str


@dataclass
class Pair:
    r: Peer
    e: Peer
    mode: SenderMode
    timeline: list[Seen]
    authenticated: list[Authenticated]

    def seen(
        self,
        peer: str,
        direction: str | None = None,
        type_: str | None = None,
        task_id: str | None = None,
    ) -> list[Seen]:
        """What `peer` saw, filtered."""
        return [
            s
            for s in self.timeline
            if s.peer == peer
            and (direction is None or s.direction == direction)
            and (type_ is None or s.type == f"p2p:{type_}")
            and (task_id is None or s.task_id == task_id)
        ]

    def assert_signed_in_mode(self) -> None:
        """Every POST either server received was signed, in the pair's mode."""
        assert self.authenticated, "no POST was authenticated"
        modes = {a.signed_by for a in self.authenticated}
        assert modes == {self.mode}, self.authenticated

    def assert_states_agree(self, task_id: str, state: TaskState) -> None:
        """Both sides hold the task in `state`, and list it the same way."""
        assert self.r.protocol.get_task_status(task_id) is state
        assert self.e.protocol.get_task_status(task_id, requester=R) is state
        key = f"{R}/{task_id}"
        assert self.r.protocol.list_tasks()[key] is state
        assert self.e.protocol.list_tasks()[key] is state


async def collect(
    handle: TaskHandle,
    react: Callable[[TaskEvent], Awaitable[None]] | None = None,
    timeout: float = WAIT,
) -> list[TaskEvent]:
    """Every event of `handle` up to the final one; `react` is awaited on each as it comes."""

    async def run() -> list[TaskEvent]:
        events: list[TaskEvent] = []
        async for event in handle:
            events.append(event)
            if react is not None:
                await react(event)
        return events

    return await asyncio.wait_for(run(), timeout)


async def eventually(predicate: Callable[[], bool], timeout: float = WAIT) -> None:
    async def until() -> None:
        # The state lives in other tasks' objects; a short poll is the plain way to watch it.
        while not predicate():  # noqa: ASYNC110
            await asyncio.sleep(0.01)

    await asyncio.wait_for(until(), timeout)
