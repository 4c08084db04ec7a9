"""Two real peers on 127.0.0.1 ephemeral ports, sharing a secret, for the end-to-end flows.

`pair` is parametrized over the requests' signing mode (header, body); replies are always
header-signed (specs/protocol.md, 'Signatures'). Every message either peer sees is recorded on one
timeline through
`protocol.listeners`, and every POST either server authenticates is recorded with how its
signature was checked, so that a test can assert which mode was really on the wire.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from flowkit import FAST, OLD_SECRET, SECRET, Authenticated, E, Pair, PairFactory, R, Seen

import synapse.transport.server as server_module
from synapse.demo.handler import DemoHandler
from synapse.p2p.config import P2PConfig
from synapse.runtime.handler import TaskHandler
from synapse.runtime.listener import OnMessage
from synapse.runtime.protocol import MessageEvent
from synapse.transport.client import SenderMode
from synapse.transport.inbound import Inbound
from synapse.transport.peer import Peer


@pytest.fixture
def spy_authenticate(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Authenticated]]:
    """Record how each server checked each POST's signature."""
    record: list[Authenticated] = []
    real = server_module.authenticate

    def spy(body: bytes, signature_header: str | None, **kw: Any) -> Inbound:
        inbound = real(body, signature_header, **kw)
        record.append(Authenticated(kw["agent_id"], inbound.head.type.value, inbound.signed_by))
        return inbound

    monkeypatch.setattr(server_module, "authenticate", spy)
    yield record


@pytest.fixture
def make_pair(spy_authenticate: list[Authenticated]) -> PairFactory:
    """`async with make_pair(mode, config=..., r_handler=..., e_handler=...) as pair:`."""

    @asynccontextmanager
    async def factory(
        mode: SenderMode = "header",
        *,
        config: P2PConfig = FAST,
        r_handler: TaskHandler | None = None,
        e_handler: TaskHandler | None = None,
    ) -> AsyncIterator[Pair]:
        timeline: list[Seen] = []
        counter = itertools.count()
        r = Peer(R, handler=r_handler or DemoHandler(), config=config, signing_mode=mode)
        e = Peer(E, handler=e_handler or DemoHandler(), config=config, signing_mode=mode)
        async with r, e:
            r.add_partner(E, e.endpoint, (SECRET, OLD_SECRET))
            e.add_partner(R, r.endpoint, (SECRET, OLD_SECRET))
            for peer in (r, e):
                name = peer.agent_id

                def observe(event: MessageEvent, name: str = name) -> None:
                    timeline.append(Seen(next(counter), name, event))

                peer.protocol.listeners.append(OnMessage(observe))
            yield Pair(r, e, mode, timeline, spy_authenticate)

    return factory


@pytest.fixture(params=["header", "body"])
async def pair(request: pytest.FixtureRequest, make_pair: PairFactory) -> AsyncIterator[Pair]:
    async with make_pair(request.param) as pair:
        yield pair
