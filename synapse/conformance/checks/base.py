"""The kit's check registry, the context a check works with, and small judgements."""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from synapse.conformance.listener import Callback, CallbackListener, TaskTrace
from synapse.conformance.rules import DECISION_STATES
from synapse.conformance.wire import (
    CheckFailed,
    Exchange,
    Identity,
    Mode,
    RawClient,
)

Phase = Literal["setup", "main", "final"]

#: The demo capabilities the target must offer (specs/protocol.md, 'The demo handler').
DEMO_CAPABILITIES = ("echo", "slow", "text_generation", "portrait", "fail")
#: A task type nobody offers.
NO_SUCH_TYPE = "conformance.no_such_type"
#: A secret the target certainly does not share with the kit.
WRONG_SECRET = "conformance-kit-wrong-secret"
#: Timestamps this far off are stale for any peer keeping near the default 300 s window; those
#: `SKEW` off must be accepted (clocks drift).
STALE_OFFSET = 600.0
SKEW = 120.0


@dataclass(frozen=True)
class Timing:
    """Every wait of the kit is bounded by one of these (seconds)."""

    #: For one callback (the demo's come within 2 s plus any `delay`, specs/protocol.md,
    #: 'The demo handler').
    callback_timeout: float = 5.0
    #: For one whole check.
    check_timeout: float = 30.0
    #: Quiet time after a final state or a cancel before concluding nothing more comes.
    settle: float = 1.0
    #: For one HTTP exchange.
    http_timeout: float = 10.0
    #: The listener holds each acknowledgement this long, so that a callback POSTed before the
    #: previous one was acknowledged is caught in the act (specs/protocol.md, 'Transport').
    ack_delay: float = 0.02


class CheckContext:
    """What a check works with: the raw client, the listener, the identities and the timing."""

    def __init__(self, client: RawClient, listener: CallbackListener, timing: Timing) -> None:
        self.client = client
        self.listener = listener
        self.timing = timing

    @property
    def me(self) -> Identity:
        return self.client.identity

    def new_task_id(self, label: str) -> str:
        return f"conf-{label}-{uuid.uuid4().hex[:12]}"

    # --- tasks ------------------------------------------------------------------------------

    async def request(
        self,
        label: str,
        task_type: str,
        payload: dict[str, Any] | None = None,
        *,
        mode: Mode = "header",
        task_id: str | None = None,
        **changes: Any,
    ) -> tuple[Exchange, TaskTrace]:
        """POST a new `task_request`; its decision is observed on the task's trace."""
        value, trace = self.new_request(label, task_type, payload, task_id=task_id, **changes)
        exchange = await self.post_request(trace, value, mode, f"task_request({task_type})")
        return exchange, trace

    def new_request(
        self,
        label: str,
        task_type: str,
        payload: dict[str, Any] | None = None,
        *,
        task_id: str | None = None,
        **changes: Any,
    ) -> tuple[dict[str, Any], TaskTrace]:
        """A new `task_request` (not sent yet) and the trace its callbacks go to."""
        task_id = task_id or self.new_task_id(label)
        trace = self.listener.trace(task_id)
        return self.client.task_request(task_id, task_type, payload, **changes), trace

    async def post_request(
        self, trace: TaskTrace, value: dict[str, Any], mode: Mode = "header", label: str = ""
    ) -> Exchange:
        """POST the `task_request` `value` of `trace`'s task; its decision is observed."""
        exchange = await self.client.post(value, mode, label=label or "task_request")
        self.observe_decision(trace, exchange)
        return exchange

    def rejected(self, exchange: Exchange, task_id: str, code: str, what: str = "") -> None:
        """`exchange` is a `task_reject` of task `task_id` for the reason `code` (`what`
        names the request in the failure's text)."""
        self.client.expect(exchange, "task_reject")
        same_task(exchange, task_id)
        reason = exchange.payload.get("reason") or {}
        if reason.get("code") != code:
            raise CheckFailed(f"{what}task_reject reason {reason!r}, expected {code}")

    def observe_decision(self, trace: TaskTrace, exchange: Exchange) -> None:
        state = DECISION_STATES.get(exchange.type or "")
        if state is None or exchange.status != 200:
            return
        trace.observe(state, exchange.sent_at, exchange.received_at, exchange.label)
        if state == "rejected":
            trace.finalize(exchange.received_at)

    async def confirmed(
        self, label: str, task_type: str, payload: dict[str, Any] | None = None, **kw: Any
    ) -> TaskTrace:
        """Request a task that must be confirmed, and see its first callback (specs/protocol.md,
        'The demo handler':
        `task_status_update{status: executing}`)."""
        exchange, trace = await self.request(label, task_type, payload, **kw)
        self.client.expect(exchange, "task_confirm")
        same_task(exchange, trace.task_id)
        await trace.expect("task_status_update", self.timing.callback_timeout, status="executing")
        return trace

    async def tell(
        self,
        trace: TaskTrace,
        type_: str,
        payload: dict[str, Any],
        *,
        mode: Mode = "header",
    ) -> Exchange:
        """POST a message about an existing task (cancel, info, decision); its `task_ack`
        state is observed on the trace."""
        value = self.client.envelope(type_, {"task_id": trace.task_id, **payload})
        exchange = await self.client.post(value, mode)
        if exchange.type == "p2p:task_ack" and exchange.status == 200:
            state = exchange.payload.get("state")
            if isinstance(state, str):
                trace.observe(
                    state,
                    exchange.sent_at,
                    exchange.received_at,
                    f"task_ack to {exchange.label}",
                    by_requester=True,
                )
                if state == "cancelled":
                    trace.finalize(exchange.received_at)
        return exchange

    async def cancel(self, trace: TaskTrace) -> Exchange:
        """Cancel the task: it must be acknowledged `cancelled`."""
        exchange = await self.tell(trace, "task_cancel", {"reason": "conformance kit"})
        acked(self.client.expect(exchange, "task_ack"), "cancelled")
        return exchange

    async def finish(self, trace: TaskTrace, final: str = "task_complete") -> Callback:
        """Skip status updates up to the final callback `final`."""
        return await trace.until(final, self.timing.callback_timeout, skip=("task_status_update",))

    async def prove_no_effect(self, message_id: str, task_id: str) -> None:
        """After a refused `task_request` (message `message_id`, task `task_id`): a genuine one
        reusing both, with other content, must be taken as new and run once — so the refused
        one created no task and no deduplication entry."""
        text = f"genuine {uuid.uuid4().hex[:8]}"
        exchange, trace = await self.request(
            "genuine", "echo", {"text": text}, task_id=task_id, message_id=message_id
        )
        if exchange.status != 200 or exchange.type != "p2p:task_confirm":
            raise CheckFailed(
                "the refused task_request had an effect: a genuine one reusing its message id "
                f"and task id got {exchange.describe()}, not task_confirm"
            )
        self.client.expect(exchange, "task_confirm")
        complete = await self.finish(trace)
        output = complete.payload.get("result", {}).get("output")
        if output != text:
            raise CheckFailed(
                f"the refused task_request had an effect: task {task_id} completed with "
                f"{output!r}, not the genuine request's {text!r}"
            )


# --- small judgements ---------------------------------------------------------------------------


def same_task(exchange: Exchange, task_id: str) -> None:
    got = exchange.payload.get("task_id")
    if got != task_id:
        raise CheckFailed(f"{exchange.label}: {exchange.type} names task {got!r}, not {task_id!r}")


def acked(exchange: Exchange, *states: str) -> str:
    state = exchange.payload.get("state")
    if state not in states:
        raise CheckFailed(
            f"{exchange.label}: task_ack state is {state!r}, expected " + " or ".join(states)
        )
    assert isinstance(state, str)
    return state


def text_of(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def is_rfc3339(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return False
    return parsed.tzinfo is not None


# --- registry -----------------------------------------------------------------------------------

CheckFn = Callable[[CheckContext], Awaitable[None]]


@dataclass(frozen=True)
class Check:
    id: str
    title: str
    section: str
    run: CheckFn
    phase: Phase = "main"


CHECKS: list[Check] = []


def check(
    check_id: str, title: str, section: str, phase: Phase = "main"
) -> Callable[[CheckFn], CheckFn]:
    def register(fn: CheckFn) -> CheckFn:
        CHECKS.append(Check(check_id, title, section, fn, phase))
        return fn

    return register
