"""`CallbackSender` (specs/protocol.md, 'Peer interfaces and configuration'): how the runtime
reaches a partner, whatever the transport."""

from __future__ import annotations

from typing import Protocol

from synapse.types import Message


class DeliveryError(Exception):
    """A message could not be delivered.

    `retryable` is true when retries ran out on errors worth retrying later (connection errors,
    timeouts, 429, 502–504): the message stays queued until the partner answers again. False
    means the partner's answer was not usable (not an envelope, a forged reply).
    """

    def __init__(self, message: str, *, retryable: bool, status: int | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.status = status


class CallbackSender(Protocol):
    """Transports implement this (HTTP here; gRPC or WebSocket would too)."""

    async def send_callback(self, partner: str, message: Message, *, retry: bool = True) -> Message:
        """POST `message` to the registered endpoint of `partner`; return its synchronous reply.

        A refusal is a reply too (a `nack`). Raise `DeliveryError` when there is no usable reply.
        With `retry=False` a single attempt is made (heartbeats: the next one comes anyway).
        """
        ...
