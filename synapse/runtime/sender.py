"""`CallbackSender` (specs/protocol.md, 'Peer interfaces and configuration'): how the runtime
reaches a partner, whatever the transport."""

from __future__ import annotations

from typing import Protocol

from synapse.types import DeliveryError, Message


class CallbackSender(Protocol):
    """Transports implement this (HTTP here; gRPC or WebSocket would too)."""

    async def send_callback(self, partner: str, message: Message, *, retry: bool = True) -> Message:
        """POST `message` to the registered endpoint of `partner`; return its synchronous reply.

        A refusal is a reply too (a `nack`). Raise `DeliveryError` when there is no usable reply.
        With `retry=False` a single attempt is made (heartbeats: the next one comes anyway).
        """
        ...


__all__ = ["CallbackSender", "DeliveryError"]
