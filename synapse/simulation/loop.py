"""An asyncio event loop on virtual time: what would wait, does not.

`VirtualTimeLoop` is asyncio's own selector loop with two changes. Its clock (`time()`) is a
number only the loop moves: when nothing is ready to run, it jumps to the next timer instead
of sleeping, so an hour of timeouts, backoffs and heartbeats passes in the milliseconds its
callbacks take. And work handed to a thread (`run_in_executor`, `asyncio.to_thread`) runs at
once on the loop's own thread, so that nothing happens in an order a scheduler chose. The
simulation does no real I/O: a loop with nothing ready and no timer is stuck for good, and
says so (`Stalled`) rather than wait forever.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from typing import Any, TypeVar

from synapse.types.errors import SynapseException

T = TypeVar("T")


class Stalled(SynapseException, RuntimeError):
    """Nothing can ever run again: every task waits for something no timer will bring."""


class _NoIO(selectors.BaseSelector):
    """A selector without files: `select(timeout)` moves the loop's clock by `timeout`.

    It keeps what is registered (the loop's own wake-up pipe) so that the loop can close,
    but never reports it ready: nothing in the simulation reads a real socket."""

    def __init__(self) -> None:
        self._keys: dict[Any, selectors.SelectorKey] = {}
        self.loop: VirtualTimeLoop | None = None

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        key = selectors.SelectorKey(fileobj, _fd(fileobj), events, data)
        self._keys[key.fd] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._keys.pop(_fd(fileobj))

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        self.unregister(fileobj)
        return self.register(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        assert self.loop is not None
        if timeout is None:
            raise Stalled("nothing is ready to run and no timer is set: every task waits forever")
        self.loop.advance(timeout)
        return []

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return dict(self._keys)

    def close(self) -> None:
        self._keys.clear()


def _fd(fileobj: Any) -> int:
    return fileobj if isinstance(fileobj, int) else int(fileobj.fileno())


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock moves only when nothing is ready (to the next timer)."""

    def __init__(self, start: float = 0.0) -> None:
        selector = _NoIO()
        super().__init__(selector)
        selector.loop = self
        self._virtual_now = start

    def time(self) -> float:
        return self._virtual_now

    def advance(self, seconds: float) -> None:
        """Move the clock `seconds` on, and at least to the first timer due by then (the
        loop computed `seconds` from it: adding it back must not fall a rounding short)."""
        target = self._virtual_now + max(0.0, seconds)
        scheduled: list[asyncio.TimerHandle] = getattr(self, "_scheduled", [])
        if scheduled and scheduled[0].when() - target <= 1e-9 * max(1.0, abs(target)):
            target = max(target, scheduled[0].when())
        self._virtual_now = target

    def run_in_executor(  # type: ignore[override]
        self, executor: Executor | None, func: Callable[..., T], *args: Any
    ) -> asyncio.Future[T]:
        """Run `func(*args)` now, on this thread: its future is done when this returns."""
        future: asyncio.Future[T] = self.create_future()
        try:
            future.set_result(func(*args))
        except BaseException as exc:  # the caller awaits it, as it would a thread's
            future.set_exception(exc)
        return future


__all__ = ["Stalled", "VirtualTimeLoop"]
