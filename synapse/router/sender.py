"""The router's `CallbackSender`: the peer's HTTP sender, with a routing policy for the
messages whose failure should move a task to another partner rather than wait.

A peer's outbox keeps an undeliverable `task_request` until the partner answers again; a
router must instead try the next partner, and must be sure the first one will never run the
task. So, for a `task_request` to a pool partner:

- a refused connection (nothing was delivered) is answered at once, locally, with a `nack`
  `agent_not_ready` marked `details.reason = "unreachable"`: the engine ends that sub-task
  (`rejected`) and the router fails over;
- a `nack` the partner sent (429 `rate_limited`, 503 `agent_not_ready`) is returned at once,
  without the transport's retries;
- a failure that leaves it unknown whether the partner got the request (a timeout, a 502) is
  retried with the same message id (the partner's deduplication makes that safe) up to
  `request_retries` times, then, the request still in doubt, again and again (backing off)
  for up to `in_doubt_for` seconds: the task is never sent to another partner while this
  one may be running it. The partner's first answer (it was frozen, say, or overloaded)
  settles it: the task is there. If none comes in time, the request is answered with a
  `nack` marked `details.reason = "in_doubt"`: the router fails the task without trying
  another partner, and a `task_cancel` for it is sent to the partner as soon as it answers
  again, so that a request it did receive is withdrawn (unless its callbacks reached us
  meanwhile: then the engine took them as its confirmation, and nothing is withdrawn).

Capability queries and heartbeats (the router's refreshes) get one attempt: the next refresh
comes anyway. Everything else goes through the peer's sender unchanged.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any

import aiohttp

from synapse.logs import get_logger
from synapse.runtime.sender import DeliveryError
from synapse.transport.client import HttpClient, SenderMode
from synapse.transport.http1 import ConnectFailed
from synapse.transport.partners import PartnerRegistry
from synapse.types import (
    CapabilityQuery,
    ErrorCode,
    Heartbeat,
    LocalProtocolError,
    Message,
    Nack,
    NackPayload,
    Sender,
    TaskCancel,
    TaskCancelPayload,
    TaskRequest,
    build_message,
    build_reply_now,
)
from synapse.types.codec import utc_now
from synapse.types.errors import DeliveryError as HttpDeliveryError

log = get_logger("synapse.router")

#: `nack.details.reason` of a request the router answered itself: the partner is unreachable.
UNREACHABLE = "unreachable"
#: `nack.details.reason` of a request that may have reached its partner, which never said:
#: the task is not sent to another partner.
IN_DOUBT = "in_doubt"


def _refused_connection(exc: BaseException) -> bool:
    """True if the failure is a connection that was never made (nothing was delivered)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, aiohttp.ClientConnectorError | ConnectFailed | ConnectionRefusedError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class RoutingSender:
    """`CallbackSender` of a router's peer (see the module docstring)."""

    def __init__(
        self,
        client: HttpClient,
        partners: PartnerRegistry,
        *,
        mode: SenderMode = "header",
        is_pool_partner: Callable[[str], bool],
        request_retries: int = 2,
        in_doubt_for: float = 60.0,
        on_unreachable: Callable[[str], None] = lambda _name: None,
        abandoned: Callable[[str], bool] = lambda _task_id: True,
    ) -> None:
        self.client = client
        self.partners = partners
        self.mode = mode
        self.is_pool_partner = is_pool_partner
        self.request_retries = request_retries
        #: Seconds a request that may have been delivered is asked again before giving up.
        self.in_doubt_for = in_doubt_for
        self.on_unreachable = on_unreachable
        #: Whether a task we requested is still given up on when its withdrawal is due: a
        #: partner whose callbacks overtook the lost reply has it, and keeps it.
        self.abandoned = abandoned
        #: Partner → task ids whose request may have reached it and must be withdrawn.
        self.withdraw: dict[str, set[str]] = {}
        #: Task ids withdrawn, and those kept because their partner turned out to have them
        #: (the last few hundred, for inspection).
        self.withdrawn: deque[str] = deque(maxlen=500)
        self.kept: deque[str] = deque(maxlen=500)
        self._background: set[asyncio.Task[Any]] = set()

    async def send_callback(self, partner: str, message: Message, *, retry: bool = True) -> Message:
        registered = self.partners.get(partner)
        if registered is None:
            raise LocalProtocolError(f"{partner!r} is not a registered partner")
        if isinstance(message, TaskRequest) and self.is_pool_partner(partner):
            return await self._request(partner, message)
        once = not retry or isinstance(message, CapabilityQuery | Heartbeat)
        try:
            reply = await self.client.exchange(
                registered, message, sender_mode=self.mode, retries=0 if once else None
            )
        except HttpDeliveryError as exc:
            raise DeliveryError(str(exc), retryable=exc.retryable, status=exc.status) from exc
        if partner in self.withdraw and not reply.is_nack:  # it answers again
            self._spawn(self._withdraw(partner))
        return reply.message

    async def _request(self, partner: str, message: TaskRequest) -> Message:
        registered = self.partners[partner]
        try:
            reply = await self.client.exchange(
                registered, message, sender_mode=self.mode, retries=0
            )
            return reply.message
        except HttpDeliveryError as exc:
            if exc.reply is not None and exc.reply.is_nack:
                return exc.reply.message  # refused (429, 503): the partner holds nothing
            if not exc.retryable:
                raise DeliveryError(str(exc), retryable=False, status=exc.status) from exc
            if _refused_connection(exc):
                return self._unreachable(partner, message, str(exc), delivered=False)
            first = exc
        # It may have the request now: the same request again (its deduplication answers a
        # copy as it answered the first), until it answers or `in_doubt_for` runs out.
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + self.in_doubt_for
        retries, pause, last = self.request_retries, 0.0, first
        while True:
            try:
                reply = await self.client.exchange(
                    registered, message, sender_mode=self.mode, retries=retries
                )
                return reply.message
            except HttpDeliveryError as exc:
                if exc.reply is not None and exc.reply.is_nack:
                    return exc.reply.message
                if not exc.retryable:
                    raise DeliveryError(str(exc), retryable=False, status=exc.status) from exc
                last = exc
            left = give_up_at - loop.time()
            if left <= 0:
                return self._in_doubt(partner, message, f"{first}; last {last}")
            if retries:
                log.warning(
                    "route_request_in_doubt",
                    partner=partner,
                    task_id=message.payload.task.id,
                    asking_again_for=round(left, 1),
                )
            pause = min(max(pause * 2, 0.1), 2.0, left)
            await asyncio.sleep(pause)  # a pause between attempts, not a synchronisation
            retries = 0

    def _in_doubt(self, partner: str, message: TaskRequest, error: str) -> Message:
        """Give up on a request `partner` may have received: not to be run anywhere else."""
        log.warning(
            "route_request_given_up_in_doubt",
            partner=partner,
            task_id=message.payload.task.id,
            error=error,
        )
        self.withdraw.setdefault(partner, set()).add(message.payload.task.id)
        self.on_unreachable(partner)
        return self._nack(
            partner,
            message,
            f"{partner} did not answer for {self.in_doubt_for:g} s and may have the task: "
            f"it is not run elsewhere ({error})",
            IN_DOUBT,
        )

    def _nack(self, partner: str, message: TaskRequest, text: str, reason: str) -> Message:
        nack: Nack = build_reply_now(
            Nack,
            NackPayload(
                code=ErrorCode.AGENT_NOT_READY.value,
                message=text,
                details={"reason": reason, "partner": partner},
            ),
            request=message,
            sender=Sender(agent_id=partner, endpoint=self.partners[partner].endpoint),
        )
        return nack

    def _unreachable(
        self, partner: str, message: TaskRequest, error: str, *, delivered: bool
    ) -> Message:
        """Answer `message` locally, as if `partner` had refused it (see the module doc)."""
        log.warning(
            "route_partner_unreachable",
            partner=partner,
            task_id=message.payload.task.id,
            error=error,
            maybe_delivered=delivered,
        )
        if delivered:
            self.withdraw.setdefault(partner, set()).add(message.payload.task.id)
        self.on_unreachable(partner)
        return self._nack(partner, message, f"{partner} is unreachable: {error}", UNREACHABLE)

    async def _withdraw(self, partner: str) -> None:
        """Cancel requests the partner may have received after we gave up on them."""
        task_ids = self.withdraw.pop(partner, set())
        registered = self.partners.get(partner)
        if registered is None:
            return
        for task_id in sorted(task_ids):
            if not self.abandoned(task_id):
                self.kept.append(task_id)
                log.info("route_withdraw_skipped", partner=partner, task_id=task_id)
                continue
            cancel: TaskCancel = build_message(
                TaskCancel,
                TaskCancelPayload(task_id=task_id, reason="withdrawn: the router failed over"),
                sender=Sender(agent_id=self._own_id(), endpoint=self._own_endpoint()),
                to=partner,
                timestamp=utc_now(),
            )
            try:
                reply = await self.client.exchange(registered, cancel, sender_mode=self.mode)
            except HttpDeliveryError as exc:
                log.warning(
                    "route_withdraw_failed", partner=partner, task_id=task_id, error=str(exc)
                )
                self.withdraw.setdefault(partner, set()).add(task_id)
                continue
            self.withdrawn.append(task_id)
            log.info(
                "route_withdrawn",
                partner=partner,
                task_id=task_id,
                reply=reply.message.message_type.value,
            )

    #: Set by the router once its peer is built (the `from` of a withdrawal).
    own: Sender | None = None

    def _own_id(self) -> str:
        assert self.own is not None
        return self.own.agent_id

    def _own_endpoint(self) -> str:
        assert self.own is not None
        return self.own.endpoint

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def close(self) -> None:
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)


__all__ = ["UNREACHABLE", "RoutingSender"]
