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
import hashlib
import hmac
import random
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

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
#: A user one replica signed in and vouches for to another (`Replicas.answer_at_owner`).
VOUCHED_USER_HEADER = "X-Synapse-Vouched-User"
VOUCHED_AT_HEADER = "X-Synapse-Vouched-At"
VOUCHED_MAC_HEADER = "X-Synapse-Vouched-Mac"
_VOUCHING = frozenset(
    h.lower() for h in (VOUCHED_USER_HEADER, VOUCHED_AT_HEADER, VOUCHED_MAC_HEADER)
)
#: How old (seconds, either way: replicas' clocks differ) a vouching may be.
VOUCH_WINDOW = 30.0
#: Headers of one connection, not of the request (RFC 9110 §7.6.1), and those the client
#: and server recompute.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
    }
)

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
        #: A number in [0, 1) for each renewal's jitter (a seeded one in the simulation).
        self.jitter: Callable[[], float] = random.random
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
        # A task_request is usually a new task: claim its lease first (one statement, which
        # also reads the message's dedup entry), and look the lease up only when another
        # replica has it.
        if inbound.head.type is MessageType.TASK_REQUEST and await self.ownership.claim(
            key, inbound.key
        ):
            return None  # a new task, ours now: here
        owner = await self.locate(key)
        if isinstance(owner, str):
            return await self._forward(owner, inbound, headers)
        return owner

    async def locate(self, key: TaskKey) -> str | NackError | None:
        """Where `key`'s task is worked on: None for here (held here, held by no one, or
        taken over just now from a replica whose lease ran out), else the owner's URL, or a
        refusal when the owner cannot be named (nothing was applied: retry)."""
        own = self.ownership
        if key in own.held:
            return None
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
        return lease.url

    async def answer_at_owner(
        self, request: web.Request, key: TaskKey, *, user: str | None = None
    ) -> web.StreamResponse | NackError | None:
        """A request of the peer's own pages or API about `key` (a person's link, a console
        decision), answered by the replica that works on the task: None to answer it here,
        else the owner's response, passed back as is, or a refusal to retry. The request
        goes unchanged (method, path, body, credentials): the owner checks it as if it had
        come to it first. `user`: whom this replica signed in for the request (a session
        only it knows), vouched for with the replicas' shared key (`vouched`)."""
        if FORWARDED_HEADER in request.headers:
            return None  # forwarded to us: ours, or (the lease moved meanwhile) no one's
        owner = await self.locate(key)
        if not isinstance(owner, str):
            return owner
        parts = urlsplit(owner)
        url = f"{parts.scheme}://{parts.netloc}{request.path_qs}"
        sent = {
            k: v
            for k, v in request.headers.items()
            if k.lower() not in _HOP_BY_HOP and k.lower() not in _VOUCHING
        }
        sent[FORWARDED_HEADER] = self.ownership.replica_id
        body = await request.read()
        if user is not None:
            at = f"{self.ownership.clock():.3f}"
            sent[VOUCHED_USER_HEADER] = user
            sent[VOUCHED_AT_HEADER] = at
            sent[VOUCHED_MAC_HEADER] = self._vouch(request.method, request.path_qs, user, at, body)
        try:
            async with self._client().request(
                request.method, url, data=body, headers=sent, allow_redirects=False
            ) as response:
                answer = await response.read()
                headers = {
                    k: v for k, v in response.headers.items() if k.lower() not in _HOP_BY_HOP
                }
                self.forwarded += 1
                return web.Response(status=response.status, body=answer, headers=headers)
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.info("forward_failed", url=url, task_id=key.task_id, error=repr(exc))
            return _OWNER_UNREACHABLE

    async def vouched(self, request: web.Request) -> str | None:
        """The user another replica of this agent vouches for on `request` (see
        `answer_at_owner`), if the vouching holds: made with the shared key, for this
        method, path and body, within `VOUCH_WINDOW` seconds."""
        user = request.headers.get(VOUCHED_USER_HEADER)
        at = request.headers.get(VOUCHED_AT_HEADER, "")
        mac = request.headers.get(VOUCHED_MAC_HEADER, "")
        if user is None or FORWARDED_HEADER not in request.headers:
            return None
        try:
            age = abs(self.ownership.clock() - float(at))
        except ValueError:
            return None
        if not age <= VOUCH_WINDOW:
            return None
        expected = self._vouch(request.method, request.path_qs, user, at, await request.read())
        return user if hmac.compare_digest(expected, mac) else None

    def _vouch(self, method: str, path: str, user: str, at: str, body: bytes) -> str:
        key = self.ownership.replica_key
        if not key:
            raise NotReady("the replicas' shared key is not known yet")
        text = "\n".join((method, path, user, at, hashlib.sha256(body).hexdigest()))
        return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.request_timeout),
                # Passed on as they came: the owner reads the person's cookies itself.
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=False,
            )
        return self._session

    def _key(self, inbound: Inbound) -> TaskKey | None:
        try:
            message = decode_typed(inbound.body)
        except RemoteProtocolError:
            return None  # refused where it is handled, with the usual code
        return self.protocol.task_key_of(message)

    async def _forward(
        self, url: str, inbound: Inbound, headers: Mapping[str, str]
    ) -> StoredReply | NackError:
        out = {h: headers[h] for h in ("Content-Type", "X-Synapse-Signature") if h in headers}
        out[FORWARDED_HEADER] = self.ownership.replica_id
        try:
            async with self._client().post(url, data=inbound.body, headers=out) as response:
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
            await asyncio.sleep(own.ttl / 3 * (0.8 + 0.2 * self.jitter()))
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
        peer.task_owners = replicas

    peer.protocol_hooks.append(on_protocol)
    peer.server_hooks.append(on_server)
    return lambda: built[-1] if built else None
