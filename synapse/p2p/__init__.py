"""The sans-IO protocol engine: the state machine (`states`), the engine that applies it
(`engine`, driven by messages, replies, timers and commands), timers, config, deduplication.

Nothing here does I/O: `import synapse.p2p` (or any module of it) loads neither asyncio,
structlog nor aiohttp. The asyncio runtime that drives the engine is `synapse.runtime`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "P2PConfig": "synapse.p2p.config",
    "Engine": "synapse.p2p.engine",
    "Step": "synapse.p2p.engine",
    "TaskEvent": "synapse.p2p.engine",
    "TaskEventKind": "synapse.p2p.engine",
    "TaskNote": "synapse.p2p.engine",
    "TaskKey": "synapse.p2p.engine",
    "TaskRecord": "synapse.p2p.engine",
    "Transition": "synapse.p2p.engine",
    "Validation": "synapse.p2p.engine",
    "TRANSITIONS": "synapse.p2p.states",
    "Event": "synapse.p2p.states",
    "Role": "synapse.p2p.states",
    "TransitionError": "synapse.p2p.states",
    "next_state": "synapse.p2p.states",
}

#: Names this package offered before the runtime had a folder of its own (0.x): where they are.
_MOVED = {
    "ExecutionContext": "synapse.runtime",
    "ResumableHandler": "synapse.runtime",
    "TaskHandler": "synapse.runtime",
    "MessageEvent": "synapse.runtime",
    "Outcome": "synapse.runtime",
    "P2PProtocol": "synapse.runtime",
    "TaskHandle": "synapse.runtime",
    "TaskAbandoned": "synapse.runtime",
    "CallbackSender": "synapse.runtime",
    "DeliveryError": "synapse.runtime",
}

if TYPE_CHECKING:
    from synapse.p2p.config import P2PConfig
    from synapse.p2p.engine import (
        Engine,
        Step,
        TaskEvent,
        TaskEventKind,
        TaskKey,
        TaskNote,
        TaskRecord,
        Transition,
        Validation,
    )
    from synapse.p2p.states import TRANSITIONS, Event, Role, TransitionError, next_state


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        moved = _MOVED.get(name)
        if moved is not None:
            # Not imported from here: the engine's package loads no asyncio.
            raise AttributeError(
                f"{name} is in {moved} now: `from {moved} import {name}` "
                f"(or `from synapse import {name}` where the top package offers it)"
            )
        raise AttributeError(f"module 'synapse.p2p' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "TRANSITIONS",
    "Engine",
    "Event",
    "P2PConfig",
    "Role",
    "Step",
    "TaskEvent",
    "TaskEventKind",
    "TaskKey",
    "TaskNote",
    "TaskRecord",
    "Transition",
    "TransitionError",
    "Validation",
    "next_state",
]
