"""`Router`: a host agent. It executes for its requesters by requesting from a pool of partners.

    peer = Peer("hub", partners=[Partner("client", url, (secret,))])
    router = Router(peer, PoolConfig.load("pool.toml"))
    async with router:          # starts the peer, discovers the pool, refreshes it
        ...                     # requesters' tasks now go to capable partners

A task of type T that reaches the router's peer goes to a pool partner that offers T, is
reachable and has room (least loaded per weight, or first in T's pin). If the partner refuses
it before confirming (`task_reject` with `alternatives.suggested_agent_id` or `retry_after`,
`rate_limited`, `capability_lacking`, a refused connection), the router tries the next
candidate, within the task's deadline. Once a partner has accepted the task, the router never
gives it to another one. Everything the partner asks (`task_need_info`, `task_need_human`)
is asked of the original requester and its answers go back; progress is relayed; a cancel
propagates; the final outcome is relayed once. See docs/routing.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import aiohttp

from synapse.logs import get_logger
from synapse.p2p.commands import Submit
from synapse.p2p.engine import TaskKey
from synapse.p2p.states import Role
from synapse.router.a2a_members import A2AMember, unless_settled
from synapse.router.a2a_routing import A2A_NOTE, A2ARouting
from synapse.router.fanout import FanOutPlan
from synapse.router.outcomes import FAILOVER_CODES, Commitments, Declined, Routed
from synapse.router.pool import Member, Pool, PoolConfig
from synapse.router.relay import Relay, RoutingHandler, task_error
from synapse.router.sender import IN_DOUBT, UNREACHABLE, RoutingSender
from synapse.router.trust import CardVerifier, ResultCheck, judge_card, load_callable, same_origin
from synapse.runtime.handler import TaskFailure
from synapse.runtime.listener import OnMessage
from synapse.runtime.protocol import MessageEvent, TaskHandle
from synapse.runtime.sender import DeliveryError
from synapse.transport.partners import Partner
from synapse.transport.peer import Peer
from synapse.types import (
    Capability,
    DecidedBy,
    DecisionAction,
    ErrorCode,
    Heartbeat,
    LocalProtocolError,
    MessageType,
    RemoteProtocolError,
    TaskState,
    new_task_id,
)

if TYPE_CHECKING:
    pass

log = get_logger("synapse.router")
T = TypeVar("T")

#: The note an original task keeps of its Synapse sub-task (partner, task id, part).
SYNAPSE_NOTE = "routed"
#: The kinds of a sub-task's events that ask the original task's requester a question.
NEED_INFO, NEED_HUMAN = MessageType.TASK_NEED_INFO.value, MessageType.TASK_NEED_HUMAN.value

#: Upper bound of one wait for a busy partner's `retry_after`, so a refresh is noticed.
_MAX_ROOM_WAIT = 5.0


# --- the router ---------------------------------------------------------------------------------


class Router(A2ARouting):
    """A host agent over `peer` and the pool `config` (see the module docstring)."""

    def __init__(
        self,
        peer: Peer,
        config: PoolConfig,
        *,
        card_verifier: CardVerifier | None = None,
        result_check: ResultCheck | None = None,
        plans: Mapping[str, FanOutPlan] | None = None,
        handler_class: type[RoutingHandler] = RoutingHandler,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.peer = peer
        self.config = config
        self.pool = Pool.of(config)
        self.clock = clock
        self.card_verifier = card_verifier or (
            load_callable(config.card_verifier, "card_verifier") if config.card_verifier else None
        )
        self.result_check = result_check or (
            load_callable(config.result_check, "result_check") if config.result_check else None
        )
        self.plans: dict[str, FanOutPlan] = dict(plans or {})
        self.commitments = Commitments()
        #: (requester, session id) → the partner of the session's last task (`sticky_sessions`).
        self.sessions: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._capabilities: dict[str, dict[str, Capability]] = {}
        self._a2a: dict[str, A2AMember] = {}
        for a in config.a2a:
            required = (
                a.require_signed_card
                if a.require_signed_card is not None
                else config.require_signed_cards
            )
            self._a2a[a.name] = A2AMember(a.url, a.token, required, a.allow_foreign_interface)
        for p in config.partner:
            if p.agent_id in peer.partners and peer.partners[p.agent_id].endpoint != p.endpoint:
                raise ValueError(f"{p.agent_id!r} is registered with another endpoint")
            peer.partners.add(Partner(p.agent_id, p.endpoint, tuple(p.secrets)))
        # A spoke knowing another's secret could sign as it (docs/security.md).
        peer.partners.check_distinct_secrets(allow_shared=peer.allow_shared_secrets)
        self.sender = RoutingSender(
            peer.client,
            peer.partners,
            mode=peer.signing_mode,
            is_pool_partner=lambda name: self.pool.get(name) is not None,
            request_retries=config.request_retries,
            in_doubt_for=config.in_doubt_for,
            on_unreachable=self._lost,
            abandoned=self._abandoned,
        )
        self.handler = handler_class(self)
        peer.handler = self.handler
        try:
            protocol = peer.protocol
        except LocalProtocolError:
            peer.protocol_hooks.append(self._bind)  # bound when the peer starts
        else:
            self._bind(protocol)  # the peer runs already
        self._session: aiohttp.ClientSession | None = None
        self._refresh_task: asyncio.Task[None] | None = None
        self._refresh_wanted = asyncio.Event()
        self._due: set[str] = set()
        #: Set whenever the pool's picture changes (a refresh, a sub-task ending).
        self._changed = asyncio.Event()
        #: Set once the pool was asked what it offers: resumed tasks wait for it.
        self._discovered = asyncio.Event()
        self._started_peer = False
        self.refreshes = 0
        #: Not ready for tasks until a refresh reaches a partner (`_ready_once_reached`).
        self._waiting_for_pool = True

    # --- lifecycle ----------------------------------------------------------------------------

    def _bind(self, protocol: Any) -> None:
        # Until the pool is first discovered the router knows no partner: new tasks get 503
        # `agent_not_ready` ("starting"), which requesters retry, not `capability_lacking`.
        protocol.ready = False
        protocol.set_task_handler(self.handler)
        protocol.set_callback_sender(self.sender)
        protocol.listeners.append(OnMessage(self._observe))
        self.sender.own = protocol.agent_endpoint()

    def _observe(self, event: MessageEvent) -> None:
        """Every heartbeat a pool partner sends or answers updates its load and status: the
        engine heartbeats partners while tasks are in flight, so the picture stays current
        between refreshes."""
        message = event.message
        if event.direction not in ("in", "reply_in") or not isinstance(message, Heartbeat):
            return
        member = self.pool.get(event.partner)
        if member is not None:
            member.status = message.payload.status
            member.remote_active = message.payload.active_tasks
            self._changed.set()  # it may have room now

    async def start(self) -> None:
        """Start the peer (unless it runs already), discover the pool, refresh it from now on."""
        try:
            self.peer.protocol  # noqa: B018 - started already?
        except LocalProtocolError:
            await self.peer.start()
            self._started_peer = True
        # A2A partners' cards are fetched with the peer's TLS (its CA, its client certificate).
        tls = self.peer.tls
        connector = aiohttp.TCPConnector(ssl=tls.client_context()) if tls is not None else None
        self._session = aiohttp.ClientSession(connector=connector)
        await self._cancel_orphans()
        await self.refresh()
        self._ready_once_reached()
        self._refresh_task = asyncio.create_task(self._refresh_loop(), name="synapse-router")
        log.info("router_started", agent_id=self.peer.agent_id, pool=self.status())

    def _ready_once_reached(self) -> None:
        """Take tasks once a refresh has reached a partner of the pool. Before, the router
        knows of no task type: it would refuse every task `capability_lacking`, a final
        answer, for what is only a pool it cannot reach yet (its partners starting, a network
        cut as it starts); it answers 503 `agent_not_ready` instead, which requesters retry."""
        if not self._waiting_for_pool:
            return  # once only: readiness is the peer's from then on (a drain ends it)
        members = self.pool.members.values()
        if not members or any(m.reachable for m in members) or self.plans:
            self._waiting_for_pool = False
            self.peer.protocol.ready = True
        else:  # asked again at the next refresh
            log.warning("router_pool_unreachable", pool=self.status())

    async def _cancel_orphans(self) -> None:
        """Cancel sub-tasks whose original task is over: after a restart with a durable store
        the engine failed the tasks this router was routing ("interrupted by restart"), and
        their partners must not go on with them for nobody."""
        protocol = self.peer.protocol
        records = protocol.view.records()
        live = {rec.task_id for rec in records if rec.role is Role.EXECUTOR and not rec.is_final}
        for rec in records:
            key = rec.key
            parent = rec.context.parent_task_id if rec.context is not None else None
            if (
                rec.role is Role.REQUESTER
                and not rec.is_final
                and rec.partner in self.pool
                and parent is not None
                and parent not in live
            ):
                handle = protocol.handle(key)
                if handle is not None:
                    log.info("route_orphan_cancelled", task_id=rec.task_id, partner=rec.partner)
                    await handle.cancel("the task it was part of has ended")

    async def close(self) -> None:
        if self._refresh_task is not None:
            self._refresh_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresh_task
            self._refresh_task = None
        if self._started_peer:
            await self.peer.close()
            self._started_peer = False
        await self.sender.close()
        for member in self._a2a.values():
            if member.client is not None:
                await member.client.close()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> Router:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # --- what the router offers -----------------------------------------------------------------

    def capabilities(self) -> list[Capability]:
        """Every task type a usable partner offers (their descriptions), and the fan-out plans."""
        now = self.clock()
        found: dict[str, Capability] = {}
        for task_type in sorted(self.pool.task_types(now)):
            for member in self.pool.capable(task_type, now):
                cap = self._capabilities.get(member.name, {}).get(task_type)
                if cap is not None:
                    found.setdefault(task_type, cap)
            found.setdefault(task_type, Capability(name=task_type))
        for task_type, plan in self.plans.items():
            found[task_type] = Capability(name=task_type, description=plan.description)
        return [found[name] for name in sorted(found)]

    def status(self) -> list[dict[str, Any]]:
        now = self.clock()
        return [m.view(now) for m in self.pool.members.values()]

    # --- discovery ----------------------------------------------------------------------------

    async def refresh(self, names: Sequence[str] | None = None) -> None:
        """Ask every partner (or those named) what it offers and how busy it is."""
        members = [m for m in self.pool.members.values() if names is None or m.name in set(names)]
        await asyncio.gather(*(self._refresh_one(m) for m in members))
        self.refreshes += 1
        self._discovered.set()
        self._changed.set()

    async def _refresh_loop(self) -> None:
        while True:
            try:
                await asyncio.wait_for(
                    self._refresh_wanted.wait(), timeout=self.config.refresh_interval
                )
            except TimeoutError:
                names: list[str] | None = None
            else:
                names = sorted(self._due)
            self._refresh_wanted.clear()
            self._due.clear()
            try:
                await self.refresh(names)
            except Exception as exc:  # one bad partner must not end the refreshes
                log.exception("route_refresh_failed", error=repr(exc))
            self._ready_once_reached()

    def _abandoned(self, task_id: str) -> bool:
        """A sub-task whose request we answered as unreachable (it ended `rejected`)."""
        rec = self.peer.protocol.view.get(TaskKey(self.peer.agent_id, task_id))
        return rec is None or rec.state is TaskState.REJECTED

    def _lost(self, name: str) -> None:
        """`name` failed: mark it unreachable and refresh it soon."""
        member = self.pool.get(name)
        if member is not None:
            member.reachable = False
            member.note = "unreachable"
        self._due.add(name)
        self._refresh_wanted.set()

    async def _refresh_one(self, member: Member) -> None:
        member.last_refresh = self.clock()
        try:
            if member.kind == "synapse":
                await self._refresh_synapse(member)
            else:
                await self._refresh_a2a(member)
        except Exception as exc:
            if member.reachable:
                log.warning("route_partner_lost", partner=member.name, error=str(exc))
            member.reachable = False
            member.note = f"refresh failed: {exc}"
            return
        if member.note:
            log.info("route_partner_back", partner=member.name)
        member.reachable = True
        member.note = ""

    async def _refresh_synapse(self, member: Member) -> None:
        protocol = self.peer.protocol
        try:
            caps = await protocol.query_capabilities(member.name)
            heartbeat, _ = await protocol.ping(member.name)
        except (DeliveryError, RemoteProtocolError) as exc:
            raise RuntimeError(str(exc)) from exc
        if caps.agent_id != member.name:
            raise RuntimeError(f"capability_response names {caps.agent_id!r}")
        self._capabilities[member.name] = {c.name: c for c in caps.capabilities}
        member.offers = frozenset(c.name for c in caps.capabilities)
        member.max_concurrent = caps.max_concurrent_tasks or None
        member.status = heartbeat.status
        member.remote_active = heartbeat.active_tasks

    async def _refresh_a2a(self, member: Member) -> None:
        from synapse.a2a import wire
        from synapse.a2a.client.core import A2AClient, parse_card

        spec = self._a2a[member.name]
        url = (
            spec.url if spec.url.endswith(".json") else spec.url.rstrip("/") + wire.AGENT_CARD_PATH
        )
        assert self._session is not None
        async with self._session.get(url, timeout=aiohttp.ClientTimeout(total=10)) as response:
            if response.status != 200:
                raise RuntimeError(f"no agent card at {url}: HTTP {response.status}")
            raw = await response.read()
        verdict = judge_card(raw, required=spec.require_signed, verifier=self.card_verifier)
        if not verdict.accepted:
            member.offers = frozenset()
            log.warning("route_card_refused", partner=member.name, reason=verdict.reason)
            raise RuntimeError(f"card refused: {verdict.reason}")
        card = parse_card(raw)
        interface = card.interface(wire.JSONRPC_BINDING)
        if interface is None:
            raise RuntimeError("the card offers no A2A 1.x JSON-RPC interface")
        if not spec.allow_foreign_interface and not same_origin(interface.url, spec.url):
            member.offers = frozenset()
            raise RuntimeError(f"card points to another origin: {interface.url}")
        if spec.client is None:
            spec.client = A2AClient(
                spec.url, token=spec.token, config=self.peer.config, tls=self.peer.tls
            )
        # The card just judged is the one used: never a second fetch that could differ.
        await spec.client.use_card(card, interface)
        self._capabilities[member.name] = {
            s.id: Capability(name=s.id, description=s.description) for s in card.skills
        }
        member.offers = frozenset(s.id for s in card.skills)

    # --- routing --------------------------------------------------------------------------------

    async def route(
        self,
        relay: Relay,
        task_type: str,
        payload: Mapping[str, Any],
        *,
        part: int = 0,
        prefer: str | None = None,
        avoid: Sequence[str] = (),
    ) -> Routed:
        """Run one task at one partner, failing over until one accepts it (see the module doc).

        `prefer` is tried first when it has room; `avoid` only when nothing else can (fan-out
        spreads its parts so). Returns how the task ended at the partner that accepted it, or
        a failed `Routed` (no partner, `partner` empty) when none did in time.
        """
        resumed = await self._resume(relay, task_type, part)
        if resumed is not None:
            return resumed
        deadline = relay.deadline
        give_up_at = (
            deadline.timestamp()
            if deadline is not None
            else self.clock() + self.config.failover_timeout
        )
        declined: list[Declined] = []
        # Never back to whoever asked (a pool partner may also be a requester).
        excluded: set[str] = {relay.ctx.requester}
        session = self._session_key(relay, part)
        suggested = prefer or (self.sessions.get(session) if session else None)
        while True:
            now = self.clock()
            member = self._pick(task_type, now, excluded, suggested, avoid)
            suggested = None
            if member is None:
                # Capable partners that are only full (or asked us to wait) get a chance until
                # the deadline: a task ending, a heartbeat or a refresh may make room.
                full = any(m.reachable for m in self.pool.capable(task_type, now, excluded))
                if now >= give_up_at or not full:
                    return self._nobody(task_type, declined, timed_out=now >= give_up_at)
                wake = self.pool.next_room(task_type, now, excluded)
                await self._wait_for_change(min(wake or give_up_at, give_up_at) - now)
                continue
            outcome = await self._attempt(member, relay, task_type, payload, part)
            if isinstance(outcome, Routed):
                return Routed(
                    outcome.partner,
                    outcome.state,
                    outcome.result,
                    outcome.error,
                    tuple(declined),
                    outcome.remote_task_id,
                )
            declined.append(outcome)
            log.info(
                "route_declined",
                task_id=relay.task_id,
                partner=member.name,
                code=outcome.code,
                retry_after=outcome.retry_after,
                suggested=outcome.suggested,
            )
            self._learn(member, task_type, outcome, now)
            if not outcome.retry_after or outcome.retry_after <= 0 or outcome.unreachable:
                excluded.add(member.name)  # (a `retry_after` of 0 would loop at once)
            if outcome.suggested is not None:
                if outcome.suggested in self.pool:
                    suggested = outcome.suggested
                else:
                    log.warning(
                        "route_suggestion_ignored",
                        task_id=relay.task_id,
                        suggested=outcome.suggested,
                        reason="not in the pool",
                    )
            if not outcome.fails_over:
                # The partner judged the task itself (invalid_params, a past deadline):
                # another one would too. Its reason is the outcome.
                return Routed(
                    "",
                    TaskState.FAILED,
                    error=task_error(outcome.code, outcome.message, recoverable=False),
                    declined=tuple(declined),
                )

    async def _resume(self, relay: Relay, task_type: str, part: int) -> Routed | None:
        """After a restart: the sub-task this part of the task had started (noted with the
        task), followed again to its end instead of routing the part anew."""
        notes = [
            n
            for n in relay.ctx.notes
            if n.action in (A2A_NOTE, SYNAPSE_NOTE) and n.detail.get("part") == part
        ]
        if not notes:
            return None
        with contextlib.suppress(TimeoutError):  # a restarted router asks its pool first
            await asyncio.wait_for(self._discovered.wait(), self.config.failover_timeout)
        note = notes[-1]
        member = self.pool.get(str(note.detail.get("partner")))
        task_id = str(note.detail.get("task_id"))
        if member is None:
            return None
        if note.action == A2A_NOTE:
            return await self._resume_a2a(member, relay, task_id, task_type, part)
        handle = self.peer.protocol.handle(TaskKey(self.peer.agent_id, task_id))
        if handle is None:
            return None
        log.info("route_resumed", task_id=relay.task_id, partner=member.name, remote=task_id)
        followed = await self._follow_synapse(member, relay, handle, part)
        return followed if isinstance(followed, Routed) else None

    def _pick(
        self,
        task_type: str,
        now: float,
        excluded: set[str],
        suggested: str | None,
        avoid: Sequence[str],
    ) -> Member | None:
        if suggested is not None:
            # Only a pool member that may take this type (pins included) and has room.
            for member in self.pool.capable(task_type, now, excluded):
                if member.name == suggested and member.has_room(now):
                    return member
        if avoid:
            choice = self.pool.choose(task_type, now, excluded | set(avoid))
            if choice is not None:
                return choice
        return self.pool.choose(task_type, now, excluded)

    def _learn(self, member: Member, task_type: str, declined: Declined, now: float) -> None:
        if declined.retry_after is not None:
            member.busy_until = max(member.busy_until, now + declined.retry_after)
        if declined.code == ErrorCode.CAPABILITY_LACKING.value:
            member.offers = member.offers - {task_type}  # its card or answer was stale
            self._due.add(member.name)
            self._refresh_wanted.set()
        if declined.unreachable:
            self._lost(member.name)

    def _nobody(self, task_type: str, declined: list[Declined], *, timed_out: bool) -> Routed:
        if timed_out:
            code, text = ErrorCode.EXECUTION_TIMEOUT.value, "no partner accepted it in time"
        elif declined:
            code, text = declined[-1].code, "every capable partner declined it"
        else:
            code, text = ErrorCode.CAPABILITY_LACKING.value, f"no usable partner offers {task_type}"
        tried = [{"partner": d.partner, "code": d.code} for d in declined]
        return Routed(
            "",
            TaskState.FAILED,
            error=task_error(code, text, recoverable=True, declined=tried),
            declined=tuple(declined),
        )

    async def _wait_for_change(self, timeout: float) -> None:
        """Until the pool changes (a refresh, a task ending) or `timeout` (a `retry_after`)."""
        self._changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), max(0.0, min(timeout, _MAX_ROOM_WAIT)))

    async def _attempt(
        self, member: Member, relay: Relay, task_type: str, payload: Mapping[str, Any], part: int
    ) -> Routed | Declined:
        member.in_flight += 1
        try:
            if member.kind == "synapse":
                return await self._attempt_synapse(member, relay, task_type, payload, part)
            return await self._attempt_a2a(member, relay, task_type, payload, part)
        finally:
            member.in_flight -= 1
            self._changed.set()

    def _session_key(self, relay: Relay, part: int) -> tuple[str, str] | None:
        """The session a task belongs to, for `sticky_sessions` (fan-out parts spread)."""
        context = relay.ctx.context
        if not self.config.sticky_sessions or part or context is None or not context.session_id:
            return None
        return (relay.ctx.requester, context.session_id)

    def _commit(self, member: Member, relay: Relay, part: int) -> None:
        self.commitments.commit((relay.ctx.requester, relay.task_id, part), member.name)
        session = self._session_key(relay, part)
        if session is not None:
            self.sessions[session] = member.name
            self.sessions.move_to_end(session)
            while len(self.sessions) > self.commitments.keep:
                self.sessions.popitem(last=False)
        member.confirmed += 1
        log.info("route_accepted", task_id=relay.task_id, part=part, partner=member.name)

    def _checked(self, member: Member, task_type: str, routed: Routed) -> Routed:
        """Apply the pool's result check; quarantine a partner that keeps failing it."""
        if self.result_check is None or not routed.ok or routed.result is None:
            return routed
        try:
            ok = bool(self.result_check(task_type, routed.result))
        except Exception as exc:
            log.warning("route_result_check_raised", partner=member.name, error=repr(exc))
            ok = False
        if ok:
            return routed
        member.failed_checks += 1
        if member.failed_checks >= self.config.quarantine_after:
            span = self.config.quarantine_for
            member.quarantined_until = self.clock() + span if span else float("inf")
            member.note = "quarantined: results failed the pool's check"
            log.warning("route_partner_quarantined", partner=member.name, task_type=task_type)
        error = task_error(
            ErrorCode.EXECUTION_FAILED,
            f"the result of {member.name} failed the router's check",
            partner=member.name,
        )
        return Routed(member.name, TaskState.FAILED, None, error, (), routed.remote_task_id)

    # --- Synapse partners -----------------------------------------------------------------------

    async def _attempt_synapse(
        self, member: Member, relay: Relay, task_type: str, payload: Mapping[str, Any], part: int
    ) -> Routed | Declined:
        sub_task_id = new_task_id()
        # Kept with the original task (a restarted router follows this sub-task again),
        # durable in the commit that makes the sub-task's request durable: no commit more.
        relay.ctx.note_soon(SYNAPSE_NOTE, partner=member.name, task_id=sub_task_id, part=part)
        handle = await self.peer.protocol.submit(
            Submit(
                member.name,
                task_type,
                payload,
                task_id=sub_task_id,
                priority=relay.priority,
                deadline=relay.deadline,
                context=relay.sub_context(),
            )
        )
        return await self._follow_synapse(member, relay, handle, part)

    async def _follow_synapse(
        self, member: Member, relay: Relay, handle: TaskHandle, part: int
    ) -> Routed | Declined:
        accepted = handle.state not in (TaskState.IDLE, TaskState.PENDING)
        if accepted:
            self._commit(member, relay, part)
        try:
            # Followed again after a restart: a question the partner asked before it is
            # relayed now (no event will bring it again).
            rec = handle.record
            if rec.state is TaskState.INFO_NEEDED and rec.need_info is not None:
                await self._relay_synapse(member, relay, handle, NEED_INFO, rec.need_info)
            elif rec.state is TaskState.NEED_HUMAN and rec.need_human is not None:
                await self._relay_synapse(member, relay, handle, NEED_HUMAN, rec.need_human)
            async for event in handle:
                kind, message = event.kind, event.message
                if not accepted:
                    if kind == "p2p:task_reject" and message is not None:
                        reject: Any = message.payload
                        alternatives = reject.alternatives
                        return Declined(
                            member.name,
                            reject.reason.code,
                            reject.reason.message,
                            retry_after=alternatives.retry_after if alternatives else None,
                            suggested=alternatives.suggested_agent_id if alternatives else None,
                        )
                    if kind == "refused" and handle.state.is_final:
                        nack = handle.record.refusal
                        details = (nack.details or {}) if nack else {}
                        if details.get("reason") == IN_DOUBT and nack is not None:
                            # It may be running the task: never run it elsewhere too.
                            raise TaskFailure(
                                task_error(
                                    ErrorCode.EXECUTION_FAILED, nack.message, partner=member.name
                                )
                            )
                        return Declined(
                            member.name,
                            nack.code if nack else "refused",
                            nack.message if nack else event.detail,
                            unreachable=details.get("reason") == UNREACHABLE,
                            refused=True,
                        )
                    if kind.startswith("p2p:"):
                        accepted = True
                        self._commit(member, relay, part)
                payload = message.payload if message is not None else None
                await self._relay_synapse(member, relay, handle, kind, payload)
            outcome = await handle
        except asyncio.CancelledError:
            await self._stop_synapse(handle, relay)
            raise
        routed = Routed(
            member.name, outcome.state, outcome.result, outcome.error, (), handle.task_id
        )
        if outcome.state is TaskState.CANCELLED and outcome.error is None:
            error = task_error(ErrorCode.EXECUTION_FAILED, f"{member.name} cancelled the task")
            routed = Routed(member.name, TaskState.FAILED, None, error, (), handle.task_id)
        return self._checked(member, handle.record.task.type, routed)

    async def _relay_synapse(
        self, member: Member, relay: Relay, handle: TaskHandle, kind: str, payload: Any
    ) -> None:
        if kind == "p2p:task_status_update":
            await relay.progress(payload.progress, payload.message, payload.intermediate_result)
        elif kind == NEED_INFO:
            fields = await unless_settled(
                handle,
                relay.need_info(
                    payload.missing_fields,
                    question=payload.question,
                    required_by=payload.required_by,
                ),
            )
            if fields is not None:
                await handle.provide_info(fields, front="router")
        elif kind == NEED_HUMAN:
            decision = await unless_settled(
                handle,
                relay.need_human(
                    payload.reason,
                    context=payload.context,
                    options=payload.options,
                    escalation_level=payload.escalation_level,
                    deadline=payload.deadline,
                ),
            )
            if decision is None:
                return
            await handle.decide(
                DecisionAction.APPROVE,
                approved_fields=decision.decision.approved_fields,
                notes=decision.notes,
                decided_by=decision.decided_by,
                front="router",
            )
        elif kind == "partner_unreachable" and handle.state is not TaskState.PENDING:
            # It accepted the task and went silent: it may still be running it, so the
            # task is not given to anyone else. Withdraw it and say so.
            self._lost(member.name)
            await handle.cancel("the partner became unreachable")
            raise TaskFailure(
                task_error(
                    ErrorCode.EXECUTION_FAILED,
                    f"{member.name} became unreachable after accepting the task; "
                    "it is not run elsewhere",
                    partner=member.name,
                )
            )

    async def _stop_synapse(self, handle: TaskHandle, relay: Relay) -> None:
        """The original task stopped: pass it on (a person's rejection, else a cancel)."""
        if handle.state.is_final:
            return
        rejected = relay.human_rejection()
        if rejected is not None and handle.record.need_human_id is not None:
            with contextlib.suppress(LocalProtocolError):
                await handle.decide(
                    DecisionAction.REJECT,
                    rejection_reason=rejected,
                    decided_by=DecidedBy(user_id=relay.ctx.requester),
                )
                return
        await handle.cancel("the original task was cancelled")


__all__ = ["FAILOVER_CODES", "Declined", "Relay", "Routed", "Router", "RoutingHandler"]
