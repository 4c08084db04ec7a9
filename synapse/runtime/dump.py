"""What a peer is doing right now, for a person looking at a hang: every asyncio task with the
chain of what it awaits, and the runtime's own state (tasks held by a commit in flight,
delivery queues, running handlers, commits, announcements waiting for a commit).

`synapse serve` writes it to standard error on SIGUSR1 (`kill -USR1 PID`); the cluster tests
put it in their failure reports. Reading it changes nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from types import CoroutineType, FrameType, GeneratorType
from typing import Any, Protocol


class Describing(Protocol):
    """A runtime that says what it holds (`P2PProtocol.describe`)."""

    def describe(self) -> list[str]: ...


#: How deep an await chain is followed (a chain deeper than this is cut, and says so).
MAX_DEPTH = 40


def _frame_of(awaitable: Any) -> FrameType | None:
    frame = getattr(awaitable, "cr_frame", None) or getattr(awaitable, "gi_frame", None)
    return frame if isinstance(frame, FrameType) else None


def _awaits(awaitable: Any) -> Iterator[str]:
    """The chain of coroutines `awaitable` awaits, outermost first, each as `name (file:line)`,
    ending with what the innermost one waits on (a future, a task, an event)."""
    current: Any = awaitable
    for _ in range(MAX_DEPTH):
        if current is None:
            return
        frame = _frame_of(current)
        if isinstance(current, CoroutineType | GeneratorType):
            name = getattr(current, "__qualname__", type(current).__name__)
            where = f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame else "finished"
            yield f"{name} ({where})"
            current = getattr(current, "cr_await", None) or getattr(current, "gi_yieldfrom", None)
            continue
        if isinstance(current, asyncio.Task):
            yield f"task {current.get_name()}"
            return
        if isinstance(current, asyncio.Future):
            state = "done" if current.done() else "pending"
            yield f"future ({state})"
            return
        yield type(current).__qualname__  # an awaitable of another kind: a C-level wait
        return
    yield "… (deeper than the dump follows)"


def task_lines() -> list[str]:
    """Every task of the running loop with its await chain."""
    lines: list[str] = []
    tasks = sorted(asyncio.all_tasks(), key=lambda t: t.get_name())
    lines.append(f"asyncio tasks: {len(tasks)}")
    for task in tasks:
        lines.append(f"- {task.get_name()}")
        lines.extend(f"    {step}" for step in _awaits(task.get_coro()))
    return lines


def dump(runtime: Describing | None) -> str:
    """The whole dump, as text."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    lines = [f"=== synapse state dump {stamp} ==="]
    if runtime is not None:
        lines.extend(runtime.describe())
    lines.extend(task_lines())
    lines.append("=== end of dump ===")
    return "\n".join(lines) + "\n"


__all__ = ["Describing", "dump", "task_lines"]
