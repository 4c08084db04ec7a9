"""Synapse: a Python engine for the Synapse agent-to-agent P2P protocol.

What someone embedding a task handler needs is importable from here (loaded on first use, so
that `import synapse.types` stays light):

    from synapse import ExecutionContext, Partner, Peer, TaskHandle, TaskHandler, Validation

Everything else lives in its own module, one folder per layer: `synapse.types` (wire
types), `synapse.p2p` (the sans-IO engine), `synapse.store`, `synapse.runtime` (asyncio),
`synapse.transport`, `synapse.a2a`, `synapse.router`, `synapse.ops`, `synapse.conformance`.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from synapse._distribution import NAME as _DISTRIBUTION

try:
    #: The one version string is the package metadata's (`pyproject.toml`).
    __version__ = version(_DISTRIBUTION)
except PackageNotFoundError:  # pragma: no cover - running from a tree that was never installed
    __version__ = "0.0.0+unknown"

_EXPORTS = {
    # the handler's side
    "TaskHandler": "synapse.runtime.handler",
    "ResumableHandler": "synapse.runtime.handler",
    "ExecutionContext": "synapse.runtime.handler",
    "Validation": "synapse.p2p.engine",
    # what a handler builds for need_info, need_human and its result
    "MissingField": "synapse.types",
    "Reason": "synapse.types",
    "HumanContext": "synapse.types",
    "HumanOption": "synapse.types",
    "TaskResult": "synapse.types",
    "TaskFailure": "synapse.runtime.handler",
    # running it
    "Peer": "synapse.transport.peer",
    "Partner": "synapse.transport.partners",
    "P2PConfig": "synapse.p2p.config",
    # what `Peer.submit` returns, and what its handle says
    "TaskHandle": "synapse.runtime.protocol",
    "TaskEvent": "synapse.p2p.engine",
    "TaskEventKind": "synapse.p2p.engine",
    "TaskNote": "synapse.p2p.engine",
    "Outcome": "synapse.runtime.protocol",
    "TaskAbandoned": "synapse.runtime.protocol",
    "TaskUndeliverable": "synapse.runtime.protocol",
    # errors
    "SynapseException": "synapse.types.errors",
    "ProtocolError": "synapse.types.errors",
    "NackError": "synapse.types.errors",
    "RemoteProtocolError": "synapse.types.errors",
    "NotReady": "synapse.types.errors",
    "LocalProtocolError": "synapse.types.errors",
    "DeliveryError": "synapse.types.errors",
}

if TYPE_CHECKING:
    from synapse.p2p.config import P2PConfig
    from synapse.p2p.engine import TaskEvent, TaskEventKind, TaskNote, Validation
    from synapse.runtime.handler import ExecutionContext, ResumableHandler, TaskFailure, TaskHandler
    from synapse.runtime.protocol import Outcome, TaskAbandoned, TaskHandle, TaskUndeliverable
    from synapse.transport.partners import Partner
    from synapse.transport.peer import Peer
    from synapse.types import HumanContext, HumanOption, MissingField, Reason, TaskResult
    from synapse.types.errors import (
        DeliveryError,
        LocalProtocolError,
        NackError,
        NotReady,
        ProtocolError,
        RemoteProtocolError,
        SynapseException,
    )


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'synapse' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "DeliveryError",
    "ExecutionContext",
    "HumanContext",
    "HumanOption",
    "LocalProtocolError",
    "MissingField",
    "NackError",
    "NotReady",
    "Outcome",
    "P2PConfig",
    "Partner",
    "Peer",
    "ProtocolError",
    "Reason",
    "RemoteProtocolError",
    "ResumableHandler",
    "SynapseException",
    "TaskAbandoned",
    "TaskEvent",
    "TaskEventKind",
    "TaskFailure",
    "TaskHandle",
    "TaskHandler",
    "TaskNote",
    "TaskResult",
    "TaskUndeliverable",
    "Validation",
    "__version__",
]
