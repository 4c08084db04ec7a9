"""`EventStream`: a task's events in order and its final outcome, for handles to build on.

A handle is awaited (`await handle` → the outcome), iterated (`async for event in handle`,
ending with the last event) and waited on with a timeout (`await handle.result(5)`); the
Synapse `TaskHandle` and the A2A client's handle share this behaviour.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Generator
from typing import Any, Generic, TypeVar

EventT = TypeVar("EventT")
OutcomeT = TypeVar("OutcomeT")


class EventStream(Generic[EventT, OutcomeT]):
    """Events pushed by the runtime, consumed in order; an outcome settled once."""

    def __init__(self) -> None:
        # A list and the futures of waiting readers rather than an `asyncio.Queue`: a handle
        # lives as long as its task is kept, and a queue is five deques and an event more.
        self._buffer: list[EventT] = []
        self._readers: list[asyncio.Future[None]] = []
        self._done: asyncio.Future[OutcomeT] = asyncio.get_running_loop().create_future()

    def _is_last(self, event: EventT) -> bool:
        """Whether iteration ends after `event` (subclasses say which events are final)."""
        raise NotImplementedError

    # The producer's side (the runtime, or the A2A client reading its stream): callers read.

    def push(self, event: EventT) -> None:
        """Add `event` for the readers (the producer's call)."""
        self._buffer.append(event)
        readers, self._readers = self._readers, []
        for reader in readers:
            if not reader.done():
                reader.set_result(None)

    def settle_with(self, outcome: OutcomeT) -> None:
        """Settle the outcome, once (the producer's call)."""
        if not self._done.done():
            self._done.set_result(outcome)

    def fail_with(self, error: BaseException) -> None:
        """Settle the outcome as `error`, once (the producer's call)."""
        if not self._done.done():
            self._done.set_exception(error)

    @property
    def settled(self) -> bool:
        return self._done.done()

    async def result(self, timeout: float | None = None) -> OutcomeT:
        """Wait for the outcome (at most `timeout` seconds)."""
        if timeout is None:
            return await asyncio.shield(self._done)
        return await asyncio.wait_for(asyncio.shield(self._done), timeout)

    def __await__(self) -> Generator[Any, None, OutcomeT]:
        return self.result().__await__()

    async def events(self) -> AsyncIterator[EventT]:
        """Every event, in order, ending with the last one. Several readers share them: each
        event goes to one of them."""
        while True:
            if self._buffer:
                event = self._buffer.pop(0)
                yield event
                if self._is_last(event):
                    return
                continue
            if self._done.done():
                return
            reader: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._readers.append(reader)
            try:
                waiting: set[asyncio.Future[Any]] = {reader, self._done}
                await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            finally:
                reader.cancel()

    def __aiter__(self) -> AsyncIterator[EventT]:
        return self.events()
