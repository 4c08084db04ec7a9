"""`RuntimeListener`: what the runtime tells observers (metrics, tracing, health, consoles).

The runtime calls every registered listener synchronously, from the event loop, at the points
below. A listener overrides the methods it needs; each must be quick and must not raise (an
exception is logged and swallowed, so that watching a peer never breaks it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import msgspec

# The audit entry is a plain value of the core (the engine keeps it on task records).
from synapse.p2p.engine import AuditEntry
from synapse.types import Message

if TYPE_CHECKING:
    from synapse.p2p.engine import TaskKey, Transition
    from synapse.runtime.sender import DeliveryError
    from synapse.types import RemoteProtocolError


#: `in`: a POSTed message we received; `reply_out`: our synchronous reply to it;
#: `out`: a message we POST; `reply_in`: the partner's synchronous reply to it.
Direction = Literal["in", "reply_out", "out", "reply_in"]


class MessageEvent(msgspec.Struct, frozen=True, gc=False):
    """A message crossing this peer, for observers (timelines, tracing, metrics). (A frozen
    msgspec struct: built in C, one per message in or out.)"""

    direction: Direction
    message: Message
    #: The agent id of the other side.
    partner: str


class RuntimeListener:
    """No-op base: subclass and override what you observe."""

    def on_message(self, event: MessageEvent) -> None:
        """A message crossed this peer (see `MessageEvent.direction`)."""

    def on_refused(self, message: Message, error: RemoteProtocolError) -> None:
        """We refused an authenticated incoming message (the transport answers a nack)."""

    def on_transition(self, transition: Transition) -> None:
        """A task changed state."""

    def on_handler_done(
        self, key: TaskKey, task_type: str, started: float, seconds: float, outcome: str
    ) -> None:
        """A handler run ended: `outcome` is `completed`, `failed` or `cancelled`;
        `started` is its wall-clock start (epoch seconds)."""

    def on_delivery_failed(self, message: Message, partner: str, error: DeliveryError) -> None:
        """A POST of ours got no usable reply (after the transport's retries)."""

    def on_dead_letter(self, message: Message, partner: str, reason: str) -> None:
        """We gave up on delivering `message`."""

    def on_commit(self, seconds: float, error: BaseException | None) -> None:
        """A store commit ended (`error` is what it raised, if it failed)."""

    def on_evicted(self, key: TaskKey) -> None:
        """A final task left memory: its record is durable in the store and its last
        callback was answered (what keeps a view of it may let that go too)."""


__all__ = ["AuditEntry", "Direction", "MessageEvent", "RuntimeListener"]
