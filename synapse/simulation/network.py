"""The simulation's network: POSTs carried between peers in one process, with seeded faults.

Each peer's `HttpClient` is given `Network.post` in place of its connections: the client
signs, retries and judges replies as it always does, and the receiving peer's
`SynapseServer.answer` judges the body as it would a socket's. In between, a POST may be
lost, late (past the sender's timeout, so that a retry overtakes it), delivered twice, or
refused because its receiver is down; a reply may be lost or late too. Every draw comes from
one seeded `random.Random`, every wait from the virtual clock: a seed replays exactly.
"""

from __future__ import annotations

import asyncio
import contextvars
import random
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec
from multidict import CIMultiDict

from synapse.p2p.dedup import StoredReply
from synapse.types.signing import SIGNATURE_HEADER


class Process(Protocol):
    """One run of a host's process, as the network sees it."""

    number: int
    #: False once killed.
    alive: bool
    #: True while it answers POSTs (started, its store loaded).
    serving: bool

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]: ...

    async def answer(self, body: bytes, headers: CIMultiDict[str]) -> StoredReply: ...

    def answered(self, body: bytes, status: int) -> None: ...


class Host(Protocol):
    """A peer's machine: its name, its URL, and the process running there (if any)."""

    @property
    def name(self) -> str: ...

    @property
    def url(self) -> str: ...

    @property
    def process(self) -> Process | None: ...


#: The process the running code belongs to (None: the simulation's own, or the network's).
CURRENT: contextvars.ContextVar[Process | None] = contextvars.ContextVar(
    "synapse_simulation_process", default=None
)


@dataclass(frozen=True, slots=True)
class NetworkFaults:
    """How often each thing goes wrong with one POST or its reply (0 to 1)."""

    #: A POST lost on its way, and a reply lost on its way back.
    loss: float = 0.0
    #: A POST delivered a second time, later.
    duplicate: float = 0.0
    #: A POST or reply that takes up to `late_by` seconds (past the sender's timeout).
    late: float = 0.0
    late_by: float = 90.0
    #: The usual one-way time: uniform up to this many seconds.
    delay: float = 0.05

    @classmethod
    def draw(cls, rng: random.Random) -> NetworkFaults:
        """Faults for one seed: some seeds lossy, some late, some clean (swarm testing: a
        seed that stresses one fault hard finds what an even mix of all of them hides)."""
        return cls(
            loss=rng.choice((0.0, 0.0, 0.02, 0.1, 0.25)),
            duplicate=rng.choice((0.0, 0.05, 0.2)),
            late=rng.choice((0.0, 0.02, 0.1)),
            late_by=rng.choice((40.0, 120.0, 900.0)),
            delay=rng.choice((0.001, 0.05, 0.5)),
        )


@dataclass(slots=True)
class Delivery:
    """One POST the network carried to its receiver, and what became of it."""

    receiver: str
    #: The message's type and id.
    message: str
    status: int | None = None
    #: The receiver's incarnation that answered (restarts count them).
    incarnation: int = -1


@dataclass
class Network:
    """Carries POSTs between the nodes of one simulation (see the module's docstring)."""

    rng: random.Random
    faults: NetworkFaults
    #: Called with a line for the trace of every fault and delivery.
    trace: Callable[[str], None]
    hosts: dict[str, Host] = field(default_factory=dict)
    #: False once the simulation heals: no more losses, duplicates or late messages.
    faulty: bool = True
    #: Every POST answered by a receiver, in order.
    deliveries: list[Delivery] = field(default_factory=list)
    #: The context the network's own tasks run in (no peer's: a peer's crash does not stop
    #: the bytes it already sent).
    _context: contextvars.Context = field(default_factory=contextvars.Context)
    _carrying: set[asyncio.Task[None]] = field(default_factory=set)

    def attach(self, host: Host) -> None:
        self.hosts[host.url] = host

    def _chance(self, p: float) -> bool:
        return self.faulty and p > 0 and self.rng.random() < p

    def _flight(self) -> float:
        """A one-way trip: usually short, sometimes late."""
        if self._chance(self.faults.late):
            return self.rng.uniform(0, self.faults.late_by)
        return self.rng.uniform(0, self.faults.delay)

    async def post(
        self, url: str, body: bytes, headers: Mapping[str, str], timeout: float
    ) -> tuple[int, bytes, str | None, str | None]:
        """What a peer's `HttpClient` calls for one attempt (`synapse.transport.client.Poster`)."""
        sender = CURRENT.get()
        if sender is not None and not sender.alive:
            raise ConnectionResetError("this peer was killed")
        node = self.hosts.get(url)
        if node is None:
            raise ConnectionRefusedError(f"nothing listens at {url}")
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[tuple[int, bytes, str | None, str | None]] = loop.create_future()
        copies = 2 if self._chance(self.faults.duplicate) else 1
        for copy in range(copies):
            # A duplicate's reply goes nowhere: nobody waits for it.
            target = answer if copy == 0 else None
            carrying = loop.create_task(
                self._carry(node, body, dict(headers), target), context=self._context
            )
            self._carrying.add(carrying)
            carrying.add_done_callback(self._carrying.discard)
        try:
            async with asyncio.timeout(timeout):
                return await answer
        except TimeoutError:
            raise TimeoutError(f"no reply from {url} within {timeout:g} s") from None
        finally:
            if answer is not None and not answer.done():
                answer.cancel()

    async def _carry(
        self,
        node: Host,
        body: bytes,
        headers: dict[str, str],
        answer: asyncio.Future[tuple[int, bytes, str | None, str | None]] | None,
    ) -> None:
        what = _named(body)
        if self._chance(self.faults.loss):
            self.trace(f"lost POST {what} to {node.name}")
            return
        await asyncio.sleep(self._flight())
        incarnation = node.process
        if incarnation is None or not incarnation.serving:
            self.trace(f"refused POST {what}: {node.name} is down")
            if answer is not None and not answer.done():
                answer.set_exception(ConnectionRefusedError(f"{node.name} is down"))
            return
        answering = incarnation.spawn(incarnation.answer(body, CIMultiDict(headers)))
        try:
            stored = await asyncio.shield(answering)
        except asyncio.CancelledError:
            if not answering.cancelled():
                raise
            # The receiver died while answering: the connection is reset.
            self.trace(f"reset POST {what}: {node.name} died answering")
            if answer is not None and not answer.done():
                answer.set_exception(ConnectionResetError(f"{node.name} died"))
            return
        self.deliveries.append(Delivery(node.name, what, stored.status, incarnation.number))
        incarnation.answered(body, stored.status)
        self.trace(f"{node.name}#{incarnation.number} answered {what}: {stored.status}")
        if self._chance(self.faults.loss):
            self.trace(f"lost reply to {what}")
            return
        await asyncio.sleep(self._flight())
        if answer is not None and not answer.done():
            reply_headers = CIMultiDict(stored.headers)
            answer.set_result(
                (
                    stored.status,
                    stored.body,
                    reply_headers.get("Retry-After"),
                    reply_headers.get(SIGNATURE_HEADER),
                )
            )


def _named(body: bytes) -> str:
    """A POSTed envelope's type and `id`, for the trace."""
    try:
        value = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return "(not JSON)"
    if not isinstance(value, dict):
        return "(not an object)"
    kind = str(value.get("type", "?")).removeprefix("p2p:")
    return f"{kind} {value.get('id')}"


__all__ = ["CURRENT", "Delivery", "Host", "Network", "NetworkFaults", "Process"]
