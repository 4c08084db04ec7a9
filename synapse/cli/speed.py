"""How `synapse serve` runs its process: the event loop and the garbage collector.

These are an application's choices, so they live in the command line, never in the library:
a program that embeds Synapse keeps its own loop and collector settings (docs/performance.md
says what we chose and why, for embedders who want the same).

- **uvloop** (`pip install 'synapse-agent-p2p[speed]'`): used when installed, else asyncio's loop.
- **Collector thresholds** `(20000, 20, 20)`: each exchange allocates short-lived containers
  and every task leaves long-lived records; with the default `(700, 10, 10)` the young
  generation is collected every few tasks and the older ones, which hold every task record,
  are rescanned often. Measured A/B in `python -m benchmarks.e2e --compare`
  (docs/benchmarks.md). Cycles are still collected, just in larger batches.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

#: `gc.set_threshold` arguments for `serve`; None keeps the interpreter's.
GC_THRESHOLDS: tuple[int, int, int] | None = (20_000, 20, 20)


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop factory if uvloop is installed (the `speed` extra), else None."""
    try:
        import uvloop
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def tune_collector() -> None:
    if GC_THRESHOLDS is not None:
        gc.set_threshold(*GC_THRESHOLDS)


def run_server(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` for a long-running server: uvloop if installed, tuned collector."""
    tune_collector()
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)
