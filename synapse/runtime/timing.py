"""The runtime's clock: one task sleeps until the engine's next timer is due, and fires it."""

from __future__ import annotations

import asyncio
import contextlib

from synapse.runtime.runtime_base import RuntimeBase


class TimerFiring(RuntimeBase):
    """Fires the engine's timers (task timeouts, deadlines, heartbeats) when they are due."""

    def _rearm_timer(self) -> None:
        deadline = self.engine.next_deadline()
        if deadline is not None and deadline < self._sleep_until:
            self._wake.set()

    async def _timer_loop(self) -> None:
        while not self._closed:
            deadline = self.engine.next_deadline()
            self._sleep_until = deadline if deadline is not None else float("inf")
            self._wake.clear()
            timeout = None if deadline is None else max(0.0, deadline - self.clock())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
            now = self.clock()
            # A timer of a task whose incoming message is being committed fires once that
            # commit is done or undone (`settled`), judged on what holds then.
            while holds := [
                held
                for key, pending in self._committing.items()
                if self.engine.timer_due(key, now)
                for held in pending
            ]:
                await asyncio.wait(holds)
                now = self.clock()
            self.apply(self.engine.on_timer(now))
