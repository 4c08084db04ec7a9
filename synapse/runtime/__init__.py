"""The asyncio runtime: drives the sans-IO engine (`synapse.p2p`) with a clock, a store
(`synapse.store`), a callback sender and the user's `TaskHandler`.

`P2PProtocol` is one peer's runtime, transport-agnostic: the transport (`synapse.transport`)
hands it verified messages and gives it a sender. `TaskHandle` is a task as its requester
follows it; `RuntimeView` is what the layers above read.
"""

from synapse.runtime.handler import (
    ExecutionContext,
    ResumableHandler,
    TaskFailure,
    TaskHandler,
)
from synapse.runtime.listener import MessageEvent, RuntimeListener
from synapse.runtime.protocol import (
    Outcome,
    P2PProtocol,
    TaskAbandoned,
    TaskHandle,
    TaskUndeliverable,
)
from synapse.runtime.sender import CallbackSender, DeliveryError
from synapse.runtime.view import RuntimeView

__all__ = [
    "CallbackSender",
    "DeliveryError",
    "ExecutionContext",
    "MessageEvent",
    "Outcome",
    "P2PProtocol",
    "ResumableHandler",
    "RuntimeListener",
    "RuntimeView",
    "TaskAbandoned",
    "TaskFailure",
    "TaskHandle",
    "TaskHandler",
    "TaskUndeliverable",
]
