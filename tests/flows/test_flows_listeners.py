"""Runtime listeners over a real task: each is told of what it implements, in order, and a
listener that implements only part of `RuntimeListener` (or none of it) breaks nothing.

Two real peers on 127.0.0.1 (the `pair` fixture).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from flowkit import WAIT, E, Pair

from synapse.p2p.engine import TaskKey, Transition
from synapse.p2p.states import Event, Role
from synapse.runtime.listener import Listeners, MessageEvent, RuntimeListener
from synapse.types import Message, RemoteProtocolError, TaskState


class Transitions(RuntimeListener):
    """Implements one method: only that one is called."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def on_transition(self, transition: Transition) -> None:
        self.seen.append((transition.from_state.value, transition.to_state.value))


class Duck:
    """Not a RuntimeListener: only the methods it has are called."""

    def __init__(self) -> None:
        self.messages: list[str] = []
        self.events: list[MessageEvent] = []

    def on_message(self, event: MessageEvent) -> None:
        self.messages.append(f"{event.direction} {event.message.type.value}")
        self.events.append(event)


class Failing(RuntimeListener):
    def on_commit(self, seconds: float, error: BaseException | None) -> None:
        raise RuntimeError("a listener that fails")


async def test_listeners_are_told_what_they_implement(pair: Pair) -> None:
    transitions, duck, failing = Transitions(), Duck(), Failing()
    commits: list[float] = []
    late = RuntimeListener()
    late.on_commit = lambda seconds, error: commits.append(seconds)  # type: ignore[method-assign]
    listeners: list[Any] = pair.e.protocol.listeners
    listeners += [transitions, duck, failing]
    handle = await pair.r.submit(E, "echo", {"text": "hi"})
    outcome = await asyncio.wait_for(handle, WAIT)
    assert outcome.state is TaskState.COMPLETED
    assert transitions.seen == [
        ("idle", "confirmed"),
        ("confirmed", "executing"),
        ("executing", "completed"),
    ]
    assert "in p2p:task_request" in duck.messages and "reply_in p2p:task_ack" in duck.messages
    # A reply's event names the message it answers (the exchange's two halves pair up); a
    # message's event names none.
    for event in duck.events:
        if event.direction in ("reply_in", "reply_out"):
            assert event.answering is not None and event.message.reply_to == event.answering.id
        else:
            assert event.answering is None
    answered = {e.answering.type.value for e in duck.events if e.answering is not None}
    assert answered == {"p2p:task_request", "p2p:task_status_update", "p2p:task_complete"}
    # A listener added later (the list changed) is told too, its instance's own method included.
    listeners.append(late)
    handle = await pair.r.submit(E, "echo", {"text": "again"})
    assert (await asyncio.wait_for(handle, WAIT)).state is TaskState.COMPLETED
    assert commits
    assert len(transitions.seen) == 6


class Everything(RuntimeListener):
    """One listener for all a peer observes: runtime, server, client and lean route."""

    def __init__(self) -> None:
        self.seen: dict[str, list[Any]] = {}

    def _saw(self, what: str, value: Any) -> None:
        self.seen.setdefault(what, []).append(value)

    def on_message(self, event: MessageEvent) -> None:
        self._saw("message", f"{event.direction} {event.message.type.value}")

    def on_transition(self, transition: Transition) -> None:
        self._saw("transition", transition.to_state.value)

    def on_nack_sent(self, error: RemoteProtocolError) -> None:
        self._saw("nack", error.code.value)

    def on_retry(self, message: Message, attempt: int) -> None:
        self._saw("retry", (message.type.value, attempt))

    def on_http_request(self, method: str, route: str, status: int, seconds: float) -> None:
        self._saw("http", (method, route, status))


async def test_one_listener_sees_the_server_the_client_and_the_lean_route(pair: Pair) -> None:
    """Nacks the server answers, retries of the client and requests the lean server answers
    reach the runtime's listeners: one observer protocol for all a peer observes."""
    everything = Everything()
    pair.e.protocol.listeners.append(everything)
    handle = await pair.r.submit(E, "echo", {"text": "hi"})
    assert (await asyncio.wait_for(handle, WAIT)).state is TaskState.COMPLETED
    assert "in p2p:task_request" in everything.seen["message"]
    assert everything.seen["transition"][-1] == "completed"
    site = pair.e._site
    if site is not None and site.callbacks is not None:  # the lean server answers callbacks
        assert ("POST", "/synapse/callback", 200) in everything.seen["http"]
    # A POST no partner signed: the server's nack reaches the same listener.
    async with (
        aiohttp.ClientSession() as session,
        session.post(pair.e.endpoint, data=b"{}") as response,
    ):
        assert response.status >= 400
    assert everything.seen["nack"]
    # The client's retries go to the same list (the metrics tests count them through it).
    assert pair.e.client.listeners is pair.e.protocol.listeners


def test_the_list_has_a_typed_method_for_every_hook() -> None:
    """Each hook of `RuntimeListener` is a method of `Listeners` (no hook called by name)."""
    hooks = {name for name in vars(RuntimeListener) if name.startswith("on_")}
    assert hooks == {name for name in vars(Listeners) if name.startswith("on_")}


def test_who_implements_a_hook_is_found_again_after_every_change_of_the_list() -> None:
    listeners = Listeners()
    first, second = Transitions(), Transitions()
    moved = Transition(
        TaskKey("r", "t"),
        Role.REQUESTER,
        TaskState.PENDING,
        TaskState.CONFIRMED,
        Event.RECV_TASK_CONFIRM,
        "m",
        1.0,
    )
    changes: list[tuple[str, Callable[[], object]]] = [
        ("append", lambda: listeners.append(first)),
        ("+=", lambda: listeners.__iadd__([second])),
        ("remove", lambda: listeners.remove(first)),
        ("insert", lambda: listeners.insert(0, first)),
        ("del", lambda: listeners.__delitem__(0)),
        ("slice", lambda: listeners.__setitem__(slice(0, 1), [first])),
        ("pop", lambda: listeners.pop()),
        ("extend", lambda: listeners.extend([second])),
        ("clear", lambda: listeners.clear()),
    ]
    for name, change in changes:
        listeners.on_transition(moved)  # the hooks found now are remembered …
        change()
        before = {id(listener): len(listener.seen) for listener in (first, second)}
        listeners.on_transition(moved)  # … and forgotten by the change
        for listener in (first, second):
            told = len(listener.seen) - before[id(listener)]
            assert told == listeners.count(listener), name


@pytest.mark.parametrize("hook", sorted(h for h in vars(RuntimeListener) if h.startswith("on_")))
def test_a_listener_that_raises_leaves_the_others_told(hook: str) -> None:
    """Watching a peer never breaks it: whichever hook a listener fails in, the call returns
    and the listeners after it are told all the same."""
    told: list[str] = []

    class Failing(RuntimeListener):
        pass

    class Telling(RuntimeListener):
        pass

    def fail(*args: object) -> None:
        raise RuntimeError("listener bug")

    def tell(*args: object) -> None:
        told.append(hook)

    failing, telling = Failing(), Telling()
    setattr(failing, hook, fail)
    setattr(telling, hook, tell)
    listeners = Listeners([failing, telling])
    arity = len(inspect.signature(getattr(RuntimeListener, hook)).parameters) - 1
    for _ in range(2):  # once finding who implements the hook, once from what was found
        getattr(listeners, hook)(*([None] * arity))
    assert told == [hook, hook]
