"""Replicas as one logical peer: N processes, one agent id, one PostgreSQL database.

Each replica serves the agent's endpoint behind a load balancer and accepts any message
about any task. A message about a task another live replica owns (holds the lease of, see
`synapse.store.leases`) is forwarded to that replica unchanged (body and signature), and its
reply returned as is: the owner is the only one that applies messages to the task, so the
task's state, history, timers and callbacks have one writer at a time. A `task_request` for a
new task is claimed (its lease inserted) before it is processed, so a duplicate arriving at
two replicas at once is processed by the one that claimed it, and the other forwards the
duplicate there, where it waits for the original's reply and returns the same bytes.

A replica whose owner is unreachable answers 503 `agent_not_ready` (nothing was applied):
the sender retries, and once the owner's lease has expired the next replica to see a message
about the task, or the periodic scan, takes it over (`Ownership.take_over`): resumed for a
resumable handler, else failed with a recoverable `execution_failed` ("interrupted").
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable, Mapping

import aiohttp

from synapse.logs import get_logger
from synapse.p2p.dedup import StoredReply
from synapse.p2p.engine import TaskKey
from synapse.runtime.listener import RuntimeListener
from synapse.runtime.liveness import SharedLiveness
from synapse.runtime.protocol import P2PProtocol
from synapse.store.leases import DEFAULT_LEASE_TTL, Ownership
from synapse.store.shared import SharedStore
from synapse.transport.inbound import Inbound
from synapse.transport.peer import Peer
from synapse.transport.server import SynapseServer
from synapse.types import (
    MessageType,
    NackError,
    NotReady,
    RemoteProtocolError,
    decode_typed,
)

log = get_logger("synapse.transport.replicas")

#: Marks a request one replica forwarded to another: handled where it arrives, never again
#: forwarded (fencing keeps a stale owner from writing).
FORWARDED_HEADER = "X-Synapse-Forwarded-By"
_PASSED_HEADERS = ("Content-Type", "X-Synapse-Signature", "Retry-After")

_OWNER_UNREACHABLE = NotReady(
    "the replica that owns this task is unreachable; retry",
    {"reason": "owner_unreachable"},
)


class _GiveBackFinished(RuntimeListener):
    """A finished task that leaves the runtime's memory gives its lease back at once."""

    def __init__(self, ownership: Ownership) -> None:
        self.ownership = ownership

    def on_evicted(self, key: TaskKey) -> None:
        self.ownership.let_go(key)


class Replicas:
    """Routes messages to their task's owner and keeps this replica's leases."""

    def __init__(
        self,
        protocol: P2PProtocol,
        server: SynapseServer,
        ownership: Ownership,
        *,
        request_timeout: float = 30.0,
    ) -> None:
        self.protocol = protocol
        self.server = server
        self.ownership = ownership
        self.request_timeout = request_timeout
        self._session: aiohttp.ClientSession | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self.forwarded = 0
        server.route = self.route
        # A lease found lost (a fenced-out write, a renewal, a refused claim): the task's
        # handler and deliveries stop here. Each POST of a callback claims its outbox row.
        ownership.on_lost = protocol.release
        protocol.delivery_gate = ownership.claim_delivery
        # Partner liveness on shared data; heartbeats from one replica at a time.
        self.liveness = SharedLiveness(
            ownership.store,
            ownership.replica_id,
            heartbeat_interval=protocol.config.heartbeat_interval,
            on_heard=protocol.partner_alive,
            clock=ownership.clock,
        )
        protocol.share_partner_liveness(self.liveness)
        protocol.listeners.append(self.liveness)
        protocol.listeners.append(_GiveBackFinished(ownership))

    # --- routing ----------------------------------------------------------------------------

    async def route(
        self, inbound: Inbound, headers: Mapping[str, str]
    ) -> StoredReply | NackError | None:
        if FORWARDED_HEADER in headers:
            return None
        key = self._key(inbound)
        if key is None or key in self.ownership.held:
            return None
        own = self.ownership
        # A task_request is usually a new task: claim its lease first (one statement, which
        # also reads the message's dedup entry), and look the lease up only when another
        # replica has it.
        if inbound.head.type is MessageType.TASK_REQUEST and await own.claim(key, inbound.key):
            return None  # a new task, ours now: here
        lease = await own.lookup(key)
        if lease is None:
            return None  # no replica owns it (or the task is over): here
        if lease.holder == own.replica_id and lease.expires_at >= own.clock():
            return None  # ours (being claimed right now, or let go and not run out yet)
        if lease.expires_at < own.clock():
            taken = await own.take_over(key)
            if taken is not None:
                self.protocol.restore(taken)
                return None
            lease = await own.lookup(key)  # someone else was quicker, or the task is over
            if lease is None or lease.expires_at < own.clock() or lease.url is None:
                return None
        if lease.url is None:
            return _OWNER_UNREACHABLE
        return await self._forward(lease.url, inbound, headers)

    def _key(self, inbound: Inbound) -> TaskKey | None:
        try:
            message = decode_typed(inbound.body)
        except RemoteProtocolError:
            return None  # refused where it is handled, with the usual code
        return self.protocol.task_key_of(message)

    async def _forward(
        self, url: str, inbound: Inbound, headers: Mapping[str, str]
    ) -> StoredReply | NackError:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.request_timeout)
            )
        out = {h: headers[h] for h in ("Content-Type", "X-Synapse-Signature") if h in headers}
        out[FORWARDED_HEADER] = self.ownership.replica_id
        try:
            async with self._session.post(url, data=inbound.body, headers=out) as response:
                body = await response.read()
                passed = {h: response.headers[h] for h in _PASSED_HEADERS if h in response.headers}
                self.forwarded += 1
                return StoredReply.of(response.status, body, passed)
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.info("forward_failed", url=url, message_id=inbound.head.id, error=repr(exc))
            return _OWNER_UNREACHABLE

    # --- leases -----------------------------------------------------------------------------

    def start(self) -> None:
        if self._loop_task is None:
            self._loop_task = asyncio.create_task(self._lease_loop(), name="synapse-leases")

    async def _lease_loop(self) -> None:
        own = self.ownership
        while True:
            # A third of the TTL between renewals (jittered so replicas do not march in step):
            # two renewals may fail before the leases run out.
            await asyncio.sleep(own.ttl / 3 * random.uniform(0.8, 1.0))
            try:
                keep = self.protocol.live_task_keys()
                await own.renew(keep)  # lost leases are let go through `on_lost`
                taken = await own.take_over_expired()
                if taken.tasks:
                    self.protocol.restore(taken)
            except Exception as exc:  # the database is down: try again next round
                log.warning("lease_renewal_failed", error=repr(exc))

    async def close(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
            self._loop_task = None
        if self._session is not None:
            await self._session.close()
            self._session = None
        with contextlib.suppress(Exception):
            await self.ownership.release_all()


def enable_replicas(
    peer: Peer, store: SharedStore, *, ttl: float = DEFAULT_LEASE_TTL
) -> Callable[[], Replicas | None]:
    """Make `peer` (before `start`) one replica of its agent on `store`: its direct URL,
    where other replicas forward to, is its listening address. Returns a getter of the
    `Replicas` (built when the peer starts)."""
    built: list[Replicas] = []
    ownership: list[Ownership] = []

    def on_protocol(protocol: P2PProtocol) -> None:
        # Before the store is loaded: recovery then takes over only orphaned tasks.
        url = f"http://{peer.host}:{peer.port}{peer.path}"
        ownership.append(Ownership(store, agent_id=peer.agent_id, url=url, ttl=ttl))

    def on_server(server: SynapseServer) -> None:
        replicas = Replicas(
            server.protocol, server, ownership[-1], request_timeout=peer.config.request_timeout
        )
        built.append(replicas)
        replicas.start()

    peer.protocol_hooks.append(on_protocol)
    peer.server_hooks.append(on_server)
    return lambda: built[-1] if built else None
