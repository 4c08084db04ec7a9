"""The protocol engine: the state machine (`states`), the sans-IO core (`engine`), the asyncio
runtime that drives it (`protocol`), handler interfaces, config, timers and deduplication."""

from synapse.p2p.config import CapacityPolicy, P2PConfig
from synapse.p2p.engine import Engine, Step, TaskEvent, TaskKey, TaskRecord, Transition, Validation
from synapse.p2p.handler import ExecutionContext, TaskHandler
from synapse.p2p.protocol import MessageEvent, Outcome, P2PProtocol, TaskAbandoned, TaskHandle
from synapse.p2p.sender import CallbackSender, DeliveryError
from synapse.p2p.states import TRANSITIONS, Event, Role, TransitionError, next_state

__all__ = [
    "TRANSITIONS",
    "CallbackSender",
    "CapacityPolicy",
    "DeliveryError",
    "Engine",
    "Event",
    "ExecutionContext",
    "MessageEvent",
    "Outcome",
    "P2PConfig",
    "P2PProtocol",
    "Role",
    "Step",
    "TaskAbandoned",
    "TaskEvent",
    "TaskHandle",
    "TaskHandler",
    "TaskKey",
    "TaskRecord",
    "Transition",
    "TransitionError",
    "Validation",
    "next_state",
]
