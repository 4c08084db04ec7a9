"""`RuntimeListener`: the one observer protocol of a peer (metrics, tracing, health, consoles,
timelines, tests).

Whatever is observed — a message in or out, a transition, a handler run, a commit, a nack the
server answered, a retry of the client, a request the lean server answered — reaches the
listeners of one `Listeners` list: `P2PProtocol.listeners`, which a `Peer` shares with its
server, client and lean callback route. They are called synchronously, from the event loop. A
listener overrides the methods it needs; each must be quick and must not raise (an exception is
logged and swallowed, so that watching a peer never breaks it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from synapse.logs import get_logger

# The audit entry is a plain value of the core (the engine keeps it on task records).
from synapse.p2p.engine import AuditEntry
from synapse.types import Message

if TYPE_CHECKING:
    from synapse.p2p.engine import TaskKey, Transition
    from synapse.runtime.sender import DeliveryError
    from synapse.types import RemoteProtocolError

log = get_logger("synapse.p2p")

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

    def on_nack_sent(self, error: RemoteProtocolError) -> None:
        """The server answered a POST with a nack (any refusal, authenticated or not)."""

    def on_retry(self, message: Message, attempt: int) -> None:
        """A POST of `message` failed (`attempt`, from 1) and the client tries again."""

    def on_http_request(self, method: str, route: str, status: int, seconds: float) -> None:
        """The lean HTTP server answered a request without aiohttp (whose requests the app's
        middlewares see)."""


class OnMessage(RuntimeListener):
    """A listener of messages only, from a function: `listeners.append(OnMessage(seen.append))`."""

    def __init__(self, see: Callable[[MessageEvent], None]) -> None:
        self.see = see

    def on_message(self, event: MessageEvent) -> None:
        self.see(event)


class Listeners(list[RuntimeListener]):
    """The listeners of one peer, and how they are told.

    `notify("on_transition", transition)` calls each listener that implements the method (the
    no-ops of `RuntimeListener` left out: a dozen notifications a task, most of them to
    listeners that ignore them); the implementers are found again whenever the list changes.
    """

    def __init__(self) -> None:
        super().__init__()
        self.seen: tuple[RuntimeListener, ...] = ()
        self.implementers: dict[str, list[tuple[RuntimeListener, Callable[..., Any]]]] = {}

    def notify(self, method: str, *args: Any) -> None:
        for listener, hook in self.implementing(method):
            try:
                hook(*args)
            except Exception as exc:  # watching a peer must never break it
                log.warning("listener_failed", listener=type(listener).__name__, error=repr(exc))

    def implementing(self, method: str) -> list[tuple[RuntimeListener, Callable[..., Any]]]:
        """The listeners that implement `method`, with their bound method."""
        listeners = tuple(self)
        if listeners != self.seen:
            self.seen, self.implementers = listeners, {}
        hooks = self.implementers.get(method)
        if hooks is None:
            noop = getattr(RuntimeListener, method)
            # A listener need not derive from `RuntimeListener`: what it has is called.
            found = [(listener, getattr(listener, method, None)) for listener in listeners]
            hooks = self.implementers[method] = [
                (listener, hook)
                for listener, hook in found
                if hook is not None and getattr(hook, "__func__", None) is not noop
            ]
        return hooks


__all__ = [
    "AuditEntry",
    "Direction",
    "Listeners",
    "MessageEvent",
    "OnMessage",
    "RuntimeListener",
]
