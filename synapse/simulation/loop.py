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
import contextvars
import selectors
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from typing import Any, Protocol, TypeVar

from synapse.types.errors import SynapseException

T = TypeVar("T")

#: Turns of the loop in one virtual instant taken for a livelock (a busy run of callbacks that
#: never lets time move: far more than anything real schedules at one moment).
SPIN_LIMIT = 200_000


class Stalled(SynapseException, RuntimeError):
    """Nothing can ever run again: every task waits for something no timer will bring."""


#: A callback parked while its process was paused: callback, arguments, context, handle.
Parked = tuple[Callable[..., Any], tuple[Any, ...], contextvars.Context, list[asyncio.Handle]]


class Pausable(Protocol):
    """What a process the loop can pause offers (`VirtualTimeLoop.enable_pauses`)."""

    #: True while it is stopped (SIGSTOP): none of its callbacks runs.
    paused: bool
    #: Its callbacks that came due while it was paused, in order, with their contexts and
    #: handles (a handle cancelled meanwhile is not run).
    parked: list[Parked]


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
        self._turns_in_an_instant = 0

    def time(self) -> float:
        return self._virtual_now

    # --- pauses (SIGSTOP and SIGCONT) -------------------------------------------------------

    _owner: contextvars.ContextVar[Any] | None = None

    def enable_pauses(self, owner: contextvars.ContextVar[Any]) -> None:
        """From now on, a callback whose context's `owner` is a `Pausable` that is paused
        when the callback comes due does not run: it is parked until `resume`, as a stopped
        process's work waits for SIGCONT (its timers fire late, its sockets' data waits).
        Off by default: a run without pauses schedules nothing differently."""
        self._owner = owner

    def call_soon(  # type: ignore[override]
        self,
        callback: Callable[..., Any],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> asyncio.Handle:
        if self._owner is None:
            return super().call_soon(callback, *args, context=context)
        ctx = context if context is not None else contextvars.copy_context()
        cell: list[asyncio.Handle] = []
        handle = super().call_soon(self._gated, callback, args, ctx, cell, context=ctx)
        cell.append(handle)
        return handle

    def call_at(  # type: ignore[override]
        self,
        when: float,
        callback: Callable[..., Any],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> asyncio.TimerHandle:
        if self._owner is None:
            return super().call_at(when, callback, *args, context=context)
        ctx = context if context is not None else contextvars.copy_context()
        cell: list[asyncio.Handle] = []
        handle = super().call_at(when, self._gated, callback, args, ctx, cell, context=ctx)
        cell.append(handle)
        return handle

    def _gated(
        self,
        callback: Callable[..., Any],
        args: tuple[Any, ...],
        ctx: contextvars.Context,
        cell: list[asyncio.Handle],
    ) -> None:
        """Run `callback`, unless its owner is paused (then park it) or its handle was
        cancelled while it was parked (a timeout left, a wait given up)."""
        if cell and cell[0].cancelled():
            return
        assert self._owner is not None
        owner = ctx.get(self._owner)
        if owner is not None and getattr(owner, "paused", False):
            owner.parked.append((callback, args, ctx, cell))
            return
        callback(*args)

    def resume(self, process: Pausable) -> None:
        """SIGCONT: `process` runs again, its parked callbacks first, in their order."""
        process.paused = False
        parked, process.parked = process.parked, []
        for callback, args, ctx, cell in parked:
            super().call_soon(self._gated, callback, args, ctx, cell, context=ctx)

    def advance(self, seconds: float) -> None:
        """Move the clock `seconds` on, and at least to the first timer due by then (the
        loop computed `seconds` from it: adding it back must not fall a rounding short).
        Raises `Stalled` after `SPIN_LIMIT` turns of the loop in one instant: something runs
        in circles (a wait on what is already done) and time would never move again."""
        target = self._virtual_now + max(0.0, seconds)
        scheduled: list[asyncio.TimerHandle] = getattr(self, "_scheduled", [])
        if scheduled and scheduled[0].when() - target <= 1e-9 * max(1.0, abs(target)):
            target = max(target, scheduled[0].when())
        if target == self._virtual_now:
            self._turns_in_an_instant += 1
            if self._turns_in_an_instant > SPIN_LIMIT:
                raise Stalled(
                    f"{SPIN_LIMIT:,} turns of the loop at {target:.3f} s and time never moves: "
                    "something waits, in circles, on what is already done"
                )
        else:
            self._turns_in_an_instant = 0
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


__all__ = ["Parked", "Pausable", "Stalled", "VirtualTimeLoop"]
