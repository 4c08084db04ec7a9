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

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Literal, Self, SupportsIndex

import msgspec

from synapse.logs import get_logger

# The audit entry is a plain value of the core (the engine keeps it on task records).
from synapse.p2p.engine import AuditEntry
from synapse.types import Message

if TYPE_CHECKING:
    from synapse.p2p.engine import TaskKey, Transition
    from synapse.runtime.sender import DeliveryError
    from synapse.types import NackError

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
    #: For a reply (`reply_in`, `reply_out`): the message it answers.
    answering: Message | None = None


class RuntimeListener:
    """No-op base: subclass and override what you observe."""

    def on_message(self, event: MessageEvent) -> None:
        """A message crossed this peer (see `MessageEvent.direction`)."""

    def on_refused(self, message: Message, error: NackError) -> None:
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

    def on_restored(self, keys: tuple[TaskKey, ...]) -> None:
        """Tasks were taken back from the store: at start, or taken over from a replica
        that stopped renewing their leases (what plans work for a task looks again)."""

    def on_released(self, key: TaskKey) -> None:
        """Replicas: another replica took task `key` over, and this one let it go (what
        follows the task here reads it from the shared store from now on)."""

    def on_nack_sent(self, error: NackError) -> None:
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


class Listeners(list[RuntimeListener], RuntimeListener):
    """The listeners of one peer, and how they are told: the list is itself a listener, whose
    every method tells the listeners that implement it (`listeners.on_transition(t)`), so the
    type checker matches each call to its hook.

    The no-ops of `RuntimeListener` are left out (a dozen notifications a task, most of them to
    listeners that ignore them). Who implements what is found once, and again after the list
    changes (each way a list can change forgets it), not on every event.
    """

    def __init__(self, listeners: Iterable[RuntimeListener] = ()) -> None:
        super().__init__(listeners)
        self._hooks: dict[str, tuple[tuple[RuntimeListener, Callable[..., Any]], ...]] = {}

    def _tell(self, method: str, *args: Any) -> None:
        hooks = self._hooks.get(method)
        if hooks is None:
            hooks = self._found(method)
        for listener, hook in hooks:
            try:
                hook(*args)
            except Exception as exc:  # watching a peer must never break it
                _failed(listener, exc)

    def _found(self, method: str) -> tuple[tuple[RuntimeListener, Callable[..., Any]], ...]:
        hooks = self._hooks[method] = self._implementing(method)
        return hooks

    def _implementing(self, method: str) -> tuple[tuple[RuntimeListener, Callable[..., Any]], ...]:
        noop = getattr(RuntimeListener, method)
        # A listener need not derive from `RuntimeListener`: what it has is called.
        found = [(listener, getattr(listener, method, None)) for listener in self]
        return tuple(
            (listener, hook)
            for listener, hook in found
            if hook is not None and getattr(hook, "__func__", None) is not noop
        )

    # --- each way a list changes forgets who implements what ----------------------------------

    def append(self, listener: RuntimeListener) -> None:
        super().append(listener)
        self._hooks.clear()

    def extend(self, listeners: Iterable[RuntimeListener]) -> None:
        super().extend(listeners)
        self._hooks.clear()

    def insert(self, index: SupportsIndex, listener: RuntimeListener) -> None:
        super().insert(index, listener)
        self._hooks.clear()

    def remove(self, listener: RuntimeListener) -> None:
        super().remove(listener)
        self._hooks.clear()

    def pop(self, index: SupportsIndex = -1) -> RuntimeListener:
        self._hooks.clear()
        return super().pop(index)

    def clear(self) -> None:
        super().clear()
        self._hooks.clear()

    def __setitem__(self, index: Any, value: Any) -> None:
        super().__setitem__(index, value)
        self._hooks.clear()

    def __delitem__(self, index: SupportsIndex | slice) -> None:
        super().__delitem__(index)
        self._hooks.clear()

    def __iadd__(self, listeners: Iterable[RuntimeListener]) -> Self:  # type: ignore[override,misc]
        self.extend(listeners)
        return self

    # --- the hooks, each telling the listeners that implement it -------------------------------

    def on_message(self, event: MessageEvent) -> None:
        # Told several times a task: the loop of `_tell`, without its call and argument tuple.
        hooks = self._hooks.get("on_message")
        for listener, hook in self._found("on_message") if hooks is None else hooks:
            try:
                hook(event)
            except Exception as exc:  # watching a peer must never break it
                _failed(listener, exc)

    def on_refused(self, message: Message, error: NackError) -> None:
        self._tell("on_refused", message, error)

    def on_transition(self, transition: Transition) -> None:
        hooks = self._hooks.get("on_transition")
        for listener, hook in self._found("on_transition") if hooks is None else hooks:
            try:
                hook(transition)
            except Exception as exc:  # watching a peer must never break it
                _failed(listener, exc)

    def on_handler_done(
        self, key: TaskKey, task_type: str, started: float, seconds: float, outcome: str
    ) -> None:
        self._tell("on_handler_done", key, task_type, started, seconds, outcome)

    def on_delivery_failed(self, message: Message, partner: str, error: DeliveryError) -> None:
        self._tell("on_delivery_failed", message, partner, error)

    def on_dead_letter(self, message: Message, partner: str, reason: str) -> None:
        self._tell("on_dead_letter", message, partner, reason)

    def on_commit(self, seconds: float, error: BaseException | None) -> None:
        hooks = self._hooks.get("on_commit")
        for listener, hook in self._found("on_commit") if hooks is None else hooks:
            try:
                hook(seconds, error)
            except Exception as exc:  # watching a peer must never break it
                _failed(listener, exc)

    def on_evicted(self, key: TaskKey) -> None:
        self._tell("on_evicted", key)

    def on_restored(self, keys: tuple[TaskKey, ...]) -> None:
        self._tell("on_restored", keys)

    def on_released(self, key: TaskKey) -> None:
        self._tell("on_released", key)

    def on_nack_sent(self, error: NackError) -> None:
        self._tell("on_nack_sent", error)

    def on_retry(self, message: Message, attempt: int) -> None:
        self._tell("on_retry", message, attempt)

    def on_http_request(self, method: str, route: str, status: int, seconds: float) -> None:
        self._tell("on_http_request", method, route, status, seconds)


def _failed(listener: RuntimeListener, exc: Exception) -> None:
    log.warning("listener_failed", listener=type(listener).__name__, error=repr(exc))


__all__ = [
    "AuditEntry",
    "Direction",
    "Listeners",
    "MessageEvent",
    "OnMessage",
    "RuntimeListener",
]
