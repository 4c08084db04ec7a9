"""The protocol engine: the state machine (`states`), the sans-IO core (`engine`), the asyncio
runtime that drives it (`protocol`), handler interfaces, config, timers and deduplication.

Names are loaded on first use: `import synapse.p2p.engine` (or `states`, `timers`, `config`,
`dedup`) loads neither asyncio, structlog nor aiohttp; only the runtime's names do.
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
    "TaskKey": "synapse.p2p.engine",
    "TaskRecord": "synapse.p2p.engine",
    "Transition": "synapse.p2p.engine",
    "Validation": "synapse.p2p.engine",
    "ExecutionContext": "synapse.p2p.handler",
    "ResumableHandler": "synapse.p2p.handler",
    "TaskHandler": "synapse.p2p.handler",
    "MessageEvent": "synapse.p2p.protocol",
    "Outcome": "synapse.p2p.protocol",
    "P2PProtocol": "synapse.p2p.protocol",
    "TaskHandle": "synapse.p2p.protocol",
    "TaskAbandoned": "synapse.p2p.protocol",
    "CallbackSender": "synapse.p2p.sender",
    "DeliveryError": "synapse.p2p.sender",
    "TRANSITIONS": "synapse.p2p.states",
    "Event": "synapse.p2p.states",
    "Role": "synapse.p2p.states",
    "TransitionError": "synapse.p2p.states",
    "next_state": "synapse.p2p.states",
}

if TYPE_CHECKING:
    from synapse.p2p.config import P2PConfig
    from synapse.p2p.engine import (
        Engine,
        Step,
        TaskEvent,
        TaskEventKind,
        TaskKey,
        TaskRecord,
        Transition,
        Validation,
    )
    from synapse.p2p.handler import ExecutionContext, ResumableHandler, TaskHandler
    from synapse.p2p.protocol import MessageEvent, Outcome, P2PProtocol, TaskAbandoned, TaskHandle
    from synapse.p2p.sender import CallbackSender, DeliveryError
    from synapse.p2p.states import TRANSITIONS, Event, Role, TransitionError, next_state


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'synapse.p2p' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "TRANSITIONS",
    "CallbackSender",
    "DeliveryError",
    "Engine",
    "Event",
    "ExecutionContext",
    "MessageEvent",
    "Outcome",
    "P2PConfig",
    "P2PProtocol",
    "ResumableHandler",
    "Role",
    "Step",
    "TaskAbandoned",
    "TaskEvent",
    "TaskEventKind",
    "TaskHandle",
    "TaskHandler",
    "TaskKey",
    "TaskRecord",
    "Transition",
    "TransitionError",
    "Validation",
    "next_state",
]
