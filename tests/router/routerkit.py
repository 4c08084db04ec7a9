"""A hub with four spokes on 127.0.0.1 (ephemeral ports), for the router's tests.

- `lacking`: a Synapse peer offering only `echo` and `fail` (its offer can be changed, to
  model a stale view: it then refuses with `capability_lacking`);
- `busy`: a Synapse peer with room for one task at a time (`max_concurrent_tasks = 1`);
  the `occupy` peer keeps it busy with a slow task of its own, so the hub's request gets
  `rate_limited` with `retry_after`;
- `flaky`: a Synapse peer the test stops mid-run;
- `sdk`: an A2A agent built with the official SDK's server classes (`sdk_spoke.py`).

Every spoke counts the handler starts per original task (the sub-task's
`context.parent_task_id`, or the A2A message's `metadata.parent_task_id`).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from synapse.demo.handler import CAPABILITIES, DemoHandler
from synapse.p2p.config import P2PConfig
from synapse.p2p.engine import TaskKey, TaskRecord, Validation
from synapse.router import PoolConfig, Router
from synapse.router.pool import A2APartnerConfig, SynapsePartnerConfig
from synapse.runtime.handler import ExecutionContext
from synapse.runtime.protocol import TaskHandle
from synapse.transport.partners import Partner
from synapse.transport.peer import Peer
from synapse.types import Capability, TaskResult

SECRET = "hub-and-spokes-secret-0123456789"
#: Retries and heartbeats in tens of milliseconds, so that outages are noticed within a test.
FAST = P2PConfig(
    max_retries=1,
    retry_base_delay=0.02,
    retry_max_delay=0.1,
    request_timeout=5.0,
    heartbeat_interval=0.2,
    missed_heartbeat_limit=2,
)
#: The bound of every wait.
WAIT = 15.0


class CountingHandler(DemoHandler):
    """The demo handler, counting starts per original task, with an offer that can change."""

    def __init__(self, offered: Sequence[str] | None = None) -> None:
        self.offered = set(offered) if offered is not None else {c.name for c in CAPABILITIES}
        self.starts: Counter[str] = Counter()
        self.parents: dict[str, str | None] = {}
        self.cancelled: set[str] = set()
        self.changed = asyncio.Event()

    def get_capabilities(self) -> Sequence[Capability]:
        return [c for c in CAPABILITIES if c.name in self.offered]

    def validate_task(self, task_type: str, payload: dict[str, Any]) -> Validation:
        return super().validate_task(task_type, payload)

    async def execute_task(
        self, ctx: ExecutionContext, task_type: str, payload: dict[str, Any]
    ) -> TaskResult:
        parent = ctx.context.parent_task_id if ctx.context else None
        self.starts[parent or ctx.task_id] += 1
        self.parents[ctx.task_id] = parent
        self.changed.set()
        try:
            return await super().execute_task(ctx, task_type, payload)
        except asyncio.CancelledError:
            self.cancelled.add(parent or ctx.task_id)
            self.changed.set()
            raise


def records(peer: Peer) -> list[TaskRecord]:
    """Every task `peer` keeps: in flight (in memory) and finished (in its store)."""
    found = []
    for name in peer.protocol.list_tasks():
        requester, _, task_id = name.partition("/")
        rec = peer.protocol.engine.get(TaskKey(requester, task_id))
        if rec is not None:
            found.append(rec)
    return found


async def until(condition: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    """Wait for `condition` (checked on every loop turn of the event loop's own work)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


async def next_event(handle: TaskHandle, wanted: Callable[[Any], bool]) -> Any:
    """The handle's next event `wanted` accepts (within WAIT)."""
    async with asyncio.timeout(WAIT):
        async for event in handle:
            if wanted(event):
                return event
    raise AssertionError("the task ended before the event came")


async def kinds_of(handle: TaskHandle) -> list[str]:
    """The kinds of every event of the handle, to its end (within WAIT)."""
    async with asyncio.timeout(WAIT):
        return [event.kind async for event in handle]


@dataclass
class Hub:
    client: Peer
    hub: Peer
    router: Router
    spokes: dict[str, Peer]
    handlers: dict[str, CountingHandler]
    sdk: Any  # SpokeExecutor
    occupy: Peer
    extra: dict[str, Any] = field(default_factory=dict)

    async def submit(self, task_type: str, payload: dict[str, Any], **kw: Any) -> TaskHandle:
        return await self.client.submit("hub", task_type, payload, **kw)

    def starts(self, task_id: str) -> dict[str, int]:
        """Handler starts for the client's task `task_id`, per spoke (zeros left out)."""
        found = {name: h.starts[task_id] for name, h in self.handlers.items()}
        with self.sdk.lock:
            found["sdk"] = self.sdk.starts[task_id]
        return {name: n for name, n in found.items() if n}

    def ran_at(self, task_id: str) -> str:
        (partner,) = [
            p for (_, t, _part), p in self.router.commitments.by_task.items() if t == task_id
        ]
        return partner


def pool_config(
    spokes: dict[str, Peer],
    sdk_url: str,
    extra_a2a: Sequence[A2APartnerConfig] = (),
    **overrides: Any,
) -> PoolConfig:
    partners = [
        SynapsePartnerConfig(agent_id=name, endpoint=peer.endpoint, secrets=[secret_of(name)])
        for name, peer in spokes.items()
    ]
    a2a = [A2APartnerConfig(name="sdk", url=sdk_url), *extra_a2a]
    values: dict[str, Any] = {"partner": partners, "a2a": a2a, "refresh_interval": 60.0}
    values.update(overrides)
    return PoolConfig(**values)


def secret_of(spoke: str) -> str:
    """The secret the hub shares with one spoke (each has its own: a shared one is refused)."""
    return f"{SECRET}:{spoke}"


def spoke_partner(hub: Peer, spoke: str) -> Partner:
    """The hub, as the spoke `spoke` knows it."""
    return Partner("hub", hub.endpoint, (secret_of(spoke),))
