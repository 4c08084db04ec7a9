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
        self._events: asyncio.Queue[EventT] = asyncio.Queue()
        self._done: asyncio.Future[OutcomeT] = asyncio.get_running_loop().create_future()

    def _is_last(self, event: EventT) -> bool:
        """Whether iteration ends after `event` (subclasses say which events are final)."""
        raise NotImplementedError

    def _push(self, event: EventT) -> None:
        self._events.put_nowait(event)

    def _settle_with(self, outcome: OutcomeT) -> None:
        if not self._done.done():
            self._done.set_result(outcome)

    def _fail_with(self, error: BaseException) -> None:
        if not self._done.done():
            self._done.set_exception(error)

    @property
    def settled(self) -> bool:
        return self._done.done()

    async def result(self, timeout: float | None = None) -> OutcomeT:
        """Wait for the outcome (at most `timeout` seconds)."""
        return await asyncio.wait_for(asyncio.shield(self._done), timeout)

    def __await__(self) -> Generator[Any, None, OutcomeT]:
        return self.result().__await__()

    async def events(self) -> AsyncIterator[EventT]:
        """Every event, in order, ending with the last one."""
        while True:
            if self._events.empty() and self._done.done():
                return
            getter: asyncio.Future[EventT] = asyncio.ensure_future(self._events.get())
            waiting: set[asyncio.Future[Any]] = {getter, self._done}
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if getter.done():
                event = getter.result()
                yield event
                if self._is_last(event):
                    return
            else:
                getter.cancel()

    def __aiter__(self) -> AsyncIterator[EventT]:
        return self.events()
