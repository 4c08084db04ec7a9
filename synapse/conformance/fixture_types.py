"""What the pytest plugin's factory fixtures are, for annotating a test that takes them
(`synapse_executor: ExecutorFactory`); importing this needs no pytest."""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Protocol

from synapse.conformance.checks import Timing
from synapse.conformance.report import Report
from synapse.p2p.config import P2PConfig
from synapse.runtime.handler import TaskHandler
from synapse.transport.client import SenderMode
from synapse.transport.peer import Peer


class ExecutorFactory(Protocol):
    """`synapse_executor`: starts a `Peer` around `handler`, paired with the requester."""

    def __call__(
        self,
        handler: TaskHandler,
        *,
        agent_id: str = ...,
        config: P2PConfig | None = ...,
        signing_mode: SenderMode = ...,
    ) -> Awaitable[Peer]: ...


class ConformanceRunner(Protocol):
    """`synapse_conformance`: runs the kit against a started `Peer`, or a URL."""

    def __call__(
        self,
        target: Peer | str,
        *,
        agent_id: str | None = ...,
        secret: str | None = ...,
        kit_id: str = ...,
        listen: str = ...,
        only: Sequence[str] = ...,
        timing: Timing | None = ...,
        concurrency: int = ...,
    ) -> Awaitable[Report]: ...


__all__ = ["ConformanceRunner", "ExecutorFactory"]
