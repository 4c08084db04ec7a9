"""Synapse: a Python engine for the Synapse agent-to-agent P2P protocol.

The names most programs need are importable from here (loaded on first use, so that
`import synapse.types` stays light):

    from synapse import Peer, Partner, P2PConfig, TaskHandler, ExecutionContext, Validation
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "Peer": "synapse.transport.peer",
    "Partner": "synapse.transport.partners",
    "PartnerRegistry": "synapse.transport.partners",
    "P2PConfig": "synapse.p2p.config",
    "P2PProtocol": "synapse.p2p.protocol",
    "TaskHandle": "synapse.p2p.protocol",
    "Outcome": "synapse.p2p.protocol",
    "TaskAbandoned": "synapse.p2p.protocol",
    "TaskHandler": "synapse.p2p.handler",
    "ExecutionContext": "synapse.p2p.handler",
    "Validation": "synapse.p2p.engine",
    "SqliteStore": "synapse.store",
    "MemoryStore": "synapse.store",
    "DemoHandler": "synapse.demo",
}

if TYPE_CHECKING:
    from synapse.demo import DemoHandler
    from synapse.p2p.config import P2PConfig
    from synapse.p2p.engine import Validation
    from synapse.p2p.handler import ExecutionContext, TaskHandler
    from synapse.p2p.protocol import Outcome, P2PProtocol, TaskAbandoned, TaskHandle
    from synapse.store import MemoryStore, SqliteStore
    from synapse.transport.partners import Partner, PartnerRegistry
    from synapse.transport.peer import Peer


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'synapse' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "DemoHandler",
    "ExecutionContext",
    "MemoryStore",
    "Outcome",
    "P2PConfig",
    "P2PProtocol",
    "Partner",
    "PartnerRegistry",
    "Peer",
    "SqliteStore",
    "TaskAbandoned",
    "TaskHandle",
    "TaskHandler",
    "Validation",
    "__version__",
]
