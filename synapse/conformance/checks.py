"""The checks: each one exercises the target from outside and raises `CheckFailed` on a fault.

A check is an async function of a `CheckContext`, registered with an id, a title and the section of
the spec it covers. `setup` runs first (if it fails nothing else can work); the `main` checks run
concurrently, each on task ids of its own; the `final` ones judge, once everything settled, what
the listener saw across all of them (specs/protocol.md: 'Signatures', the
one-at-a-time delivery of 'Transport', the rules of 'Task states').
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from synapse.conformance.listener import Callback, CallbackListener, TaskTrace
from synapse.conformance.rules import DECISION_STATES, backwards
from synapse.conformance.wire import (
    CheckFailed,
    Exchange,
    Identity,
    Mode,
    RawClient,
    Skip,
    encode,
    sign,
)
from synapse.types import SIGNATURE_HEADER, format_timestamp, header_signature, utc_now

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
        task_id = task_id or self.new_task_id(label)
        trace = self.listener.trace(task_id)
        value = self.client.task_request(task_id, task_type, payload, **changes)
        exchange = await self.client.post(value, mode, label=f"task_request({task_type})")
        self.observe_decision(trace, exchange)
        return exchange, trace

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


# --- setup --------------------------------------------------------------------------------------

_SETUP_HINTS = {
    "unknown_partner": "the target does not know the kit's agent id {kit}: register it as a "
    "partner with callback URL {endpoint} and the shared secret",
    "bad_signature": "the target does not share the secret given to the kit",
    "missing_signature": "the target does not share the secret given to the kit",
    "endpoint_mismatch": "the target registered another callback URL for {kit}; it must be "
    "{endpoint}",
    "wrong_recipient": "the target's agent id is not {target}",
    "stale": "the clocks of the kit and the target disagree by more than the replay window",
}


@check(
    "setup",
    "the target answers a signed heartbeat from the kit",
    "specs/protocol.md, 'Transport'",
    "setup",
)
async def setup(ctx: CheckContext) -> None:
    exchange = await ctx.client.send("heartbeat", {"status": "ok", "active_tasks": 0})
    me = ctx.me
    if exchange.error is not None:
        raise CheckFailed(f"cannot reach the target at {me.target_url}: {exchange.error}")
    if exchange.status == 403 and exchange.code == "permission_denied":
        hint = _SETUP_HINTS.get(str(exchange.details.get("reason")))
        if hint:
            raise CheckFailed(
                hint.format(kit=me.kit_id, endpoint=me.kit_endpoint, target=me.target_id)
                + f" ({exchange.describe()})"
            )
    if exchange.message is not None and exchange.message.from_.agent_id != me.target_id:
        raise CheckFailed(
            f"the target answers as {exchange.message.from_.agent_id!r}, not {me.target_id!r}"
        )
    ctx.client.expect(exchange, "heartbeat")


# --- basics -------------------------------------------------------------------------------------


@check(
    "heartbeat",
    "heartbeat is answered by the target's own heartbeat",
    "specs/protocol.md, 'Payloads' and 'Transport'",
)
async def heartbeat(ctx: CheckContext) -> None:
    exchange = ctx.client.expect(
        await ctx.client.send("heartbeat", {"status": "ok", "active_tasks": 0}), "heartbeat"
    )
    payload = exchange.payload
    if payload.get("status") not in ("ok", "busy", "draining"):
        raise CheckFailed(f"heartbeat status {payload.get('status')!r}")
    active = payload.get("active_tasks")
    if not isinstance(active, int) or isinstance(active, bool) or active < 0:
        raise CheckFailed(f"heartbeat active_tasks {active!r} is not a count")


@check(
    "capability.query",
    "capability_query lists the demo capabilities",
    "specs/protocol.md, 'Payloads' and 'The demo handler'",
)
async def capability_query(ctx: CheckContext) -> None:
    exchange = ctx.client.expect(
        await ctx.client.send("capability_query", {}), "capability_response"
    )
    payload = exchange.payload
    if payload.get("agent_id") != ctx.me.target_id:
        raise CheckFailed(f"capability_response agent_id {payload.get('agent_id')!r}")
    names = [c.get("name") for c in payload.get("capabilities", []) if isinstance(c, dict)]
    missing = [name for name in DEMO_CAPABILITIES if name not in names]
    if missing:
        raise CheckFailed(f"demo capabilities missing: {', '.join(missing)} (offered: {names})")
    if len(names) != len(set(names)):
        raise CheckFailed(f"a capability is listed twice: {names}")


@check(
    "capability.filter",
    "capability_query.task_type filters by exact name",
    "specs/protocol.md, 'Payloads' and 'The demo handler'",
)
async def capability_filter(ctx: CheckContext) -> None:
    for wanted, expected in (("portrait", ["portrait"]), ("port", []), ("PORTRAIT", [])):
        exchange = ctx.client.expect(
            await ctx.client.send("capability_query", {"task_type": wanted}),
            "capability_response",
        )
        capabilities = exchange.payload.get("capabilities", [])
        names = [c.get("name") for c in capabilities if isinstance(c, dict)]
        if names != expected:
            raise CheckFailed(f"task_type {wanted!r} gave {names}, expected {expected}")


@check(
    "envelope.extensions",
    "a minor version and unknown members are accepted, in both signing modes",
    "specs/protocol.md, 'Envelope'",
)
async def envelope_extensions(ctx: CheckContext) -> None:
    value = ctx.client.envelope(
        "capability_query", {"task_type": "echo", "x_hint": 1}, version="1.9", x_extension="x"
    )
    for mode in ("header", "body"):
        value = {**value, "id": f"msg-ext-{mode}-{uuid.uuid4().hex[:8]}"}
        exchange = await ctx.client.post(value, mode, label=f"capability_query 1.9 ({mode})")
        ctx.client.expect(exchange, "capability_response")


# --- flows (specs/protocol.md, 'Flows')
# ----------------------------------------------------------------------------


@check(
    "flow.echo",
    "echo: confirm, status executing, task_complete with the text",
    "specs/protocol.md, 'Normal task'",
)
async def flow_echo(ctx: CheckContext) -> None:
    text = f"hello {uuid.uuid4().hex[:6]} 你好"
    trace = await ctx.confirmed("echo", "echo", {"text": text})
    complete = await ctx.finish(trace)
    result = complete.payload.get("result") or {}
    if result.get("output_type") != "text" or result.get("output") != text:
        raise CheckFailed(f"echo result {result!r}, expected output_type text, output {text!r}")
    await trace.quiet(ctx.timing.settle)


@check(
    "flow.progress",
    "slow: status updates with progress floor(100·i/steps), then task_complete",
    "specs/protocol.md, 'Normal task'",
)
async def flow_progress(ctx: CheckContext) -> None:
    steps = 3
    trace = await ctx.confirmed("slow", "slow", {"steps": steps, "delay": 0.05})
    progress: list[Any] = []
    timeout = ctx.timing.callback_timeout
    while True:
        callback = await trace.next(timeout, "task_status_update or task_complete")
        if callback.type == "p2p:task_complete":
            break
        if callback.type != "p2p:task_status_update" or callback.state != "executing":
            raise CheckFailed(f"unexpected {callback.describe()} ({trace.describe()})")
        progress.append(callback.payload.get("progress"))
    expected = [100 * i // steps for i in range(1, steps + 1)]
    if progress != expected:
        raise CheckFailed(f"progress {progress}, expected {expected} ({trace.describe()})")


@check(
    "flow.need_info",
    "text_generation: task_need_info, task_info_provided, executing, complete",
    "specs/protocol.md, 'Missing information'",
)
async def flow_need_info(ctx: CheckContext) -> None:
    prompt = f"春天 {uuid.uuid4().hex[:4]}"
    exchange, trace = await ctx.request("need-info", "text_generation", {"prompt": prompt})
    ctx.client.expect(exchange, "task_need_info")
    same_task(exchange, trace.task_id)
    fields = [f for f in exchange.payload.get("missing_fields", []) if isinstance(f, dict)]
    style = next((f for f in fields if f.get("field") == "style"), None)
    if style is None:
        raise CheckFailed(f"task_need_info does not ask for `style`: {fields}")
    if style.get("suggested_value") != "古典" or style.get("alternatives") != ["现代", "浪漫"]:
        raise CheckFailed(
            f"`style` suggests {style.get('suggested_value')!r} with alternatives "
            f"{style.get('alternatives')!r}, expected '古典' and ['现代', '浪漫']"
        )
    provided = await ctx.tell(trace, "task_info_provided", {"fields": {"style": "浪漫"}})
    acked(ctx.client.expect(provided, "task_ack"), "info_provided", "executing")
    await trace.expect("task_status_update", ctx.timing.callback_timeout, status="executing")
    complete = await ctx.finish(trace)
    output = text_of((complete.payload.get("result") or {}).get("output"))
    if prompt not in output or "浪漫" not in output:
        raise CheckFailed(f"output {output!r} does not contain both the prompt and the style")


def _decision(trace: TaskTrace, need_human: Callback, action: str) -> dict[str, Any]:
    decision: dict[str, Any] = {"action": action}
    if action == "approve":
        decision["approved_fields"] = {"authorized": True}
    else:
        decision["rejection_reason"] = "not authorized (conformance kit)"
    return {
        "decision_id": f"dec-{uuid.uuid4().hex[:12]}",
        "reply_to": need_human.message.id,
        "decided_by": {"user_id": "conformance-kit", "user_name": "Conformance Kit"},
        "decision": decision,
        "timestamp": format_timestamp(utc_now()),
    }


async def _portrait(ctx: CheckContext, label: str) -> tuple[TaskTrace, Callback]:
    trace = await ctx.confirmed(label, "portrait", {"subject": "conformance"})
    need_human = await ctx.finish(trace, "task_need_human")
    payload = need_human.payload
    reason = payload.get("reason") or {}
    if reason.get("code") != "ethical_decision":
        raise CheckFailed(f"task_need_human reason {reason!r}, expected code ethical_decision")
    options = [o for o in payload.get("options", []) if isinstance(o, dict)]
    if [o.get("field") for o in options] != ["authorized"]:
        raise CheckFailed(f"task_need_human options {options!r}: expected one, `authorized`")
    return trace, need_human


@check(
    "flow.need_human.approve",
    "portrait: task_need_human, human_decision approve, task_complete",
    "specs/protocol.md, 'Human decision'",
)
async def flow_need_human_approve(ctx: CheckContext) -> None:
    trace, need_human = await _portrait(ctx, "approve")
    decided = await ctx.tell(trace, "human_decision", _decision(trace, need_human, "approve"))
    acked(ctx.client.expect(decided, "task_ack"), "human_approved", "executing")
    await ctx.finish(trace)


@check(
    "flow.need_human.reject",
    "portrait: human_decision reject, task_failed permission_denied, not recoverable",
    "specs/protocol.md, 'Human decision' and 'Task states'",
)
async def flow_need_human_reject(ctx: CheckContext) -> None:
    trace, need_human = await _portrait(ctx, "reject")
    decided = await ctx.tell(trace, "human_decision", _decision(trace, need_human, "reject"))
    acked(ctx.client.expect(decided, "task_ack"), "human_rejected", "failed")
    failed = await trace.expect("task_failed", ctx.timing.callback_timeout)
    error = failed.payload.get("error") or {}
    if error.get("code") != "permission_denied" or error.get("recoverable") is not False:
        raise CheckFailed(
            f"task_failed error {error!r}, expected code permission_denied, recoverable false"
        )


@check(
    "flow.cancel",
    "slow: task_cancel is acknowledged cancelled, and nothing follows",
    "specs/protocol.md, 'Cancellation' and 'Task states'",
)
async def flow_cancel(ctx: CheckContext) -> None:
    steps, delay = 2, 0.5
    trace = await ctx.confirmed("cancel", "slow", {"steps": steps, "delay": delay})
    await ctx.cancel(trace)
    # Long enough for the whole task to have run had it not been cancelled.
    await trace.quiet(max(ctx.timing.settle, steps * delay + 0.3))


@check(
    "flow.fail",
    "fail: confirm, then task_failed execution_failed, recoverable",
    "specs/protocol.md, 'Error codes' and 'The demo handler'",
)
async def flow_fail(ctx: CheckContext) -> None:
    trace = await ctx.confirmed("fail", "fail", {})
    failed = await ctx.finish(trace, "task_failed")
    error = failed.payload.get("error") or {}
    if error.get("code") != "execution_failed" or error.get("recoverable") is not True:
        raise CheckFailed(
            f"task_failed error {error!r}, expected code execution_failed, recoverable true"
        )


@check(
    "flow.capability_lacking",
    "a task type not offered gets task_reject capability_lacking (HTTP 200)",
    "specs/protocol.md, 'Transport' and 'Error codes'",
)
async def flow_capability_lacking(ctx: CheckContext) -> None:
    exchange, trace = await ctx.request("lacking", NO_SUCH_TYPE, {})
    ctx.client.expect(exchange, "task_reject")
    same_task(exchange, trace.task_id)
    reason = exchange.payload.get("reason") or {}
    if reason.get("code") != "capability_lacking":
        raise CheckFailed(f"task_reject reason {reason!r}, expected capability_lacking")


@check(
    "flow.invalid_task",
    "slow with steps 0 or delay 11 gets task_reject invalid_params",
    "specs/protocol.md, 'Error codes' and 'The demo handler'",
)
async def flow_invalid_task(ctx: CheckContext) -> None:
    for payload in ({"steps": 0}, {"steps": 2, "delay": 11}):
        exchange, trace = await ctx.request("invalid", "slow", payload)
        ctx.client.expect(exchange, "task_reject")
        same_task(exchange, trace.task_id)
        reason = exchange.payload.get("reason") or {}
        if reason.get("code") != "invalid_params":
            raise CheckFailed(f"slow {payload}: task_reject {reason!r}, expected invalid_params")


@check(
    "flow.deadline_passed",
    "a task whose deadline has already passed gets task_reject execution_timeout",
    "specs/protocol.md, 'Task states'",
)
async def flow_deadline_passed(ctx: CheckContext) -> None:
    task_id = ctx.new_task_id("deadline")
    trace = ctx.listener.trace(task_id)
    value = ctx.client.task_request(task_id, "echo", {"text": "too late"})
    value["payload"]["task"]["deadline"] = format_timestamp(utc_now() - timedelta(seconds=60))
    exchange = await ctx.client.post(value, label="task_request(echo, deadline passed)")
    ctx.observe_decision(trace, exchange)
    ctx.client.expect(exchange, "task_reject")
    reason = exchange.payload.get("reason") or {}
    if reason.get("code") != "execution_timeout":
        raise CheckFailed(f"task_reject reason {reason!r}, expected execution_timeout")


# --- signatures and authentication (specs/protocol.md, 'Signatures' and 'Transport')
# --------------------------------------------


@check(
    "sig.body_mode",
    "a task signed in body mode (JCS) runs to completion; replies are header-signed",
    "specs/protocol.md, 'Signatures'",
)
async def sig_body_mode(ctx: CheckContext) -> None:
    text = f"body mode {uuid.uuid4().hex[:6]}"
    exchange, trace = await ctx.request(
        "body-mode", "echo", {"text": text, "x_note": 1.5}, mode="body", x_extension=[1, "二"]
    )
    ctx.client.expect(exchange, "task_confirm")
    complete = await ctx.finish(trace)
    if (complete.payload.get("result") or {}).get("output") != text:
        raise CheckFailed(f"body-mode echo completed with {complete.payload.get('result')!r}")


@check(
    "sig.several",
    "one good signature among several in the header is enough",
    "specs/protocol.md, 'Signatures'",
)
async def sig_several(ctx: CheckContext) -> None:
    value = ctx.client.envelope("capability_query", {})
    body = encode(value)
    good = header_signature(ctx.me.secret, body)
    bad = header_signature(WRONG_SECRET, body)
    headers = {"Content-Type": "application/json", SIGNATURE_HEADER: f"{bad} {good}"}
    exchange = await ctx.client.post_bytes(body, headers, sent=value, label="two signatures")
    ctx.client.expect(exchange, "capability_response")


@check(
    "sig.header_decides",
    "when both are present the header signature decides",
    "specs/protocol.md, 'Signatures'",
)
async def sig_header_decides(ctx: CheckContext) -> None:
    for header_good in (True, False):
        value = ctx.client.envelope("capability_query", {})
        secret_body = WRONG_SECRET if header_good else ctx.me.secret
        body, _ = sign(value, secret_body, "body")
        secret_header = ctx.me.secret if header_good else WRONG_SECRET
        headers = {
            "Content-Type": "application/json",
            SIGNATURE_HEADER: header_signature(secret_header, body),
        }
        label = "good header, bad body signature" if header_good else "bad header, good body"
        exchange = await ctx.client.post_bytes(body, headers, sent=value, label=label)
        if header_good:
            ctx.client.expect(exchange, "capability_response")
        else:
            ctx.client.expect_nack(exchange, 403, "permission_denied", signed=False)


async def _refused_request(
    ctx: CheckContext, label: str, mutate: Callable[[dict[str, Any]], tuple[bytes, dict[str, str]]]
) -> tuple[Exchange, str, str]:
    task_id = ctx.new_task_id(label)
    # Should the target wrongly accept it, its callbacks are that check's fault, not strays.
    ctx.listener.trace(task_id)
    value = ctx.client.task_request(task_id, "echo", {"text": f"forged {label}"})
    body, headers = mutate(value)
    exchange = await ctx.client.post_bytes(body, headers, sent=value, label=f"{label} task_request")
    return exchange, value["id"], task_id


@check(
    "sig.bad",
    "a bad signature (header or body) is refused 403, unsigned, with no effect",
    "specs/protocol.md, 'Signatures'",
)
async def sig_bad(ctx: CheckContext) -> None:
    def bad_header(value: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
        return sign(value, WRONG_SECRET, "header")

    def bad_body(value: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
        return sign(value, WRONG_SECRET, "body")

    def tampered(value: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
        body, headers = sign(value, ctx.me.secret, "header")
        return body.replace(b"forged", b"FORGED"), headers

    for label, mutate in (
        ("bad-header", bad_header),
        ("bad-body", bad_body),
        ("tampered", tampered),
    ):
        exchange, message_id, task_id = await _refused_request(ctx, label, mutate)
        ctx.client.expect_nack(exchange, 403, "permission_denied", signed=False)
        await ctx.prove_no_effect(message_id, task_id)


@check(
    "sig.missing",
    "an unsigned request is refused 403, unsigned, with no effect",
    "specs/protocol.md, 'Signatures'",
)
async def sig_missing(ctx: CheckContext) -> None:
    def unsigned(value: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
        return sign(value, ctx.me.secret, "none")

    exchange, message_id, task_id = await _refused_request(ctx, "unsigned", unsigned)
    ctx.client.expect_nack(exchange, 403, "permission_denied", signed=False)
    await ctx.prove_no_effect(message_id, task_id)


@check(
    "sig.stale",
    f"timestamps ±{STALE_OFFSET:g} s off are refused 403 stale with server_time, no effect; "
    f"±{SKEW:g} s are accepted",
    "specs/protocol.md, 'Signatures'",
)
async def sig_stale(ctx: CheckContext) -> None:
    for age in (STALE_OFFSET, -STALE_OFFSET):
        stamp = format_timestamp(utc_now() - timedelta(seconds=age))

        def stale(value: dict[str, Any], stamp: str = stamp) -> tuple[bytes, dict[str, str]]:
            return sign({**value, "timestamp": stamp}, ctx.me.secret, "header")

        label = "stale" if age > 0 else "future"
        exchange, message_id, task_id = await _refused_request(ctx, label, stale)
        details = ctx.client.expect_nack(
            exchange, 403, "permission_denied", signed=False, reason="stale"
        )
        if not is_rfc3339(details.get("server_time")):
            raise CheckFailed(
                f"stale nack details.server_time {details.get('server_time')!r} is not RFC 3339"
            )
        await ctx.prove_no_effect(message_id, task_id)
    for age in (SKEW, -SKEW):
        exchange = await ctx.client.send("capability_query", {}, age=age)
        exchange.label = f"capability_query {age:+g} s off"
        ctx.client.expect(exchange, "capability_response")


@check(
    "auth.unknown_partner",
    "a message from an unknown agent id is refused 403, unsigned",
    "specs/protocol.md, 'Signatures' and 'Transport'",
)
async def auth_unknown_partner(ctx: CheckContext) -> None:
    stranger = {
        "agent_id": f"conformance-stranger-{uuid.uuid4().hex[:6]}",
        "endpoint": "http://127.0.0.1:9/x",
    }
    value = ctx.client.task_request(ctx.new_task_id("stranger"), "echo", {"text": "x"})
    value["from"] = stranger
    exchange = await ctx.client.post(value, label="task_request from a stranger")
    ctx.client.expect_nack(exchange, 403, "permission_denied", signed=False)


@check(
    "auth.wrong_recipient",
    "a message addressed to another agent is refused 403, unsigned, with no effect",
    "specs/protocol.md, 'Signatures' and 'Transport'",
)
async def auth_wrong_recipient(ctx: CheckContext) -> None:
    def elsewhere(value: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
        return sign({**value, "to": {"agent_id": "conformance-nobody"}}, ctx.me.secret, "header")

    exchange, message_id, task_id = await _refused_request(ctx, "wrong-to", elsewhere)
    ctx.client.expect_nack(exchange, 403, "permission_denied", signed=False)
    await ctx.prove_no_effect(message_id, task_id)


@check(
    "auth.endpoint_mismatch",
    "a from.endpoint other than the registered one is refused 403, unsigned, no effect",
    "specs/protocol.md, 'Signatures' and 'Transport'",
)
async def auth_endpoint_mismatch(ctx: CheckContext) -> None:
    def moved(value: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
        sender = {**value["from"], "endpoint": "http://attacker.invalid:8080/synapse/callback"}
        return sign({**value, "from": sender}, ctx.me.secret, "header")

    exchange, message_id, task_id = await _refused_request(ctx, "moved", moved)
    ctx.client.expect_nack(exchange, 403, "permission_denied", signed=False)
    await ctx.prove_no_effect(message_id, task_id)


# --- errors of specs/protocol.md, 'Error codes'
# ----------------------------------------------------------------------


@check(
    "error.not_json",
    "a body that is not JSON gets 400 message_format_invalid",
    "specs/protocol.md, 'Error codes'",
)
async def error_not_json(ctx: CheckContext) -> None:
    for body in (b'{"version": "1.0", "id": ', b"\xff\xfe not utf-8", b"hello"):
        headers = {
            "Content-Type": "application/json",
            SIGNATURE_HEADER: header_signature(ctx.me.secret, body),
        }
        exchange = await ctx.client.post_bytes(body, headers, label=f"body {body[:12]!r}")
        ctx.client.expect_nack(exchange, 400, "message_format_invalid", signed=False)


@check(
    "error.not_ijson",
    "duplicate names, big integers, lone surrogates: 400 message_format_invalid",
    "specs/protocol.md, 'Signatures' and 'Error codes'",
)
async def error_not_ijson(ctx: CheckContext) -> None:
    base = encode(ctx.client.envelope("heartbeat", {"status": "ok", "active_tasks": 0}))
    variants = {
        "duplicate member": base.replace(b'"status":"ok"', b'"status":"ok","status":"busy"'),
        "integer beyond 2^53": base.replace(
            b'"active_tasks":0', b'"active_tasks":9007199254740993'
        ),
        "lone surrogate": base.replace(b'"status":"ok"', b'"status":"ok","x":"\\ud800"'),
    }
    for label, body in variants.items():
        assert body != base
        headers = {
            "Content-Type": "application/json",
            SIGNATURE_HEADER: header_signature(ctx.me.secret, body),
        }
        exchange = await ctx.client.post_bytes(body, headers, label=label)
        ctx.client.expect_nack(exchange, 400, "message_format_invalid", signed=False)


@check(
    "error.not_envelope",
    "JSON that is no envelope gets 400 message_format_invalid",
    "specs/protocol.md, 'Envelope' and 'Error codes'",
)
async def error_not_envelope(ctx: CheckContext) -> None:
    full = ctx.client.envelope("heartbeat", {})
    no_from = {k: v for k, v in full.items() if k != "from"}
    values: dict[str, Any] = {
        "array": [full],
        "no from": no_from,
        "payload not an object": {**full, "payload": "x"},
    }
    for label, value in values.items():
        body = encode(value)
        headers = {
            "Content-Type": "application/json",
            SIGNATURE_HEADER: header_signature(ctx.me.secret, body),
        }
        exchange = await ctx.client.post_bytes(body, headers, sent=value, label=label)
        ctx.client.expect_nack(exchange, 400, "message_format_invalid", signed=False)


@check(
    "error.unknown_type",
    "an unknown type gets 400 message_format_invalid, unsigned",
    "specs/protocol.md, 'Envelope' and 'Error codes'",
)
async def error_unknown_type(ctx: CheckContext) -> None:
    exchange = await ctx.client.send("p2p:task_teleport", {"task_id": "x"})
    ctx.client.expect_nack(exchange, 400, "message_format_invalid", signed=False)


@check(
    "error.version",
    "version 2.0 gets 400 message_format_invalid with details.supported_versions",
    "specs/protocol.md, 'Envelope' and 'Error codes'",
)
async def error_version(ctx: CheckContext) -> None:
    exchange = await ctx.client.send("heartbeat", {"status": "ok"}, version="2.0")
    details = ctx.client.expect_nack(exchange, 400, "message_format_invalid", signed=False)
    versions = details.get("supported_versions")
    if not isinstance(versions, list) or not versions:
        raise CheckFailed(f"details.supported_versions is {versions!r}, expected a list")


@check(
    "error.too_large",
    "a body over 1 MiB gets 413 message_format_invalid",
    "specs/protocol.md, 'Transport' and 'Error codes'",
)
async def error_too_large(ctx: CheckContext) -> None:
    value = ctx.client.envelope("heartbeat", {"status": "ok", "padding": "x" * (1024 * 1024 + 64)})
    exchange = await ctx.client.post(value, label="1 MiB heartbeat")
    ctx.client.expect_nack(exchange, 413, "message_format_invalid", signed=False)


@check(
    "error.task_not_found",
    "a message about an unknown task gets 404 task_not_found, signed",
    "specs/protocol.md, 'Payloads' and 'Error codes'",
)
async def error_task_not_found(ctx: CheckContext) -> None:
    task_id = ctx.new_task_id("unknown")
    for type_, payload in (
        ("task_cancel", {"task_id": task_id}),
        ("task_info_provided", {"task_id": task_id, "fields": {"style": "x"}}),
    ):
        exchange = await ctx.client.send(type_, payload)
        ctx.client.expect_nack(exchange, 404, "task_not_found", signed=True)


@check(
    "error.task_final",
    "a message about a completed task gets 409 task_already_completed, signed",
    "specs/protocol.md, 'Error codes' and 'Task states'",
)
async def error_task_final(ctx: CheckContext) -> None:
    trace = await ctx.confirmed("final", "echo", {"text": "done"})
    await ctx.finish(trace)
    for type_, payload in (
        ("task_cancel", {}),
        ("task_info_provided", {"fields": {"style": "x"}}),
    ):
        exchange = await ctx.tell(trace, type_, payload)
        ctx.client.expect_nack(exchange, 409, "task_already_completed", signed=True)


@check(
    "error.payload_shape",
    "a payload of the wrong shape gets 400 invalid_params, signed",
    "specs/protocol.md, 'Payloads' and 'Error codes'",
)
async def error_payload_shape(ctx: CheckContext) -> None:
    task_id = ctx.new_task_id("shape")
    whenever = ctx.client.task_request(task_id, "echo", {"text": "x"})
    whenever["payload"]["task"]["priority"] = "whenever"
    cases = {
        "task without type": ctx.client.envelope(
            "task_request", {"task": {"id": task_id, "payload": {}}}
        ),
        "task_id not a string": ctx.client.envelope("task_cancel", {"task_id": 42}),
        "unknown priority": whenever,
    }
    for label, value in cases.items():
        exchange = await ctx.client.post(value, label=label)
        ctx.client.expect_nack(exchange, 400, "invalid_params", signed=True)


@check(
    "error.state",
    "a message its task's state does not allow gets 400 invalid_params with state, allowed",
    "specs/protocol.md, 'Error codes' and 'Task states'",
)
async def error_state(ctx: CheckContext) -> None:
    trace = await ctx.confirmed("state", "slow", {"steps": 4, "delay": 0.5})
    exchange = await ctx.tell(trace, "task_info_provided", {"fields": {"style": "x"}})
    details = ctx.client.expect_nack(exchange, 400, "invalid_params", signed=True)
    if details.get("state") not in ("confirmed", "executing"):
        raise CheckFailed(f"details.state is {details.get('state')!r}, expected executing")
    allowed = details.get("allowed")
    if not isinstance(allowed, list):
        raise CheckFailed(f"details.allowed is {allowed!r}, expected a list")
    # The refusal changed nothing: the task is still running, so it can still be cancelled.
    await ctx.cancel(trace)


@check(
    "error.reply_only",
    "a POSTed reply-only type gets 400 invalid_params, signed",
    "specs/protocol.md, 'Signatures' and 'Error codes'",
)
async def error_reply_only(ctx: CheckContext) -> None:
    task_id = ctx.new_task_id("reply-only")
    payloads: dict[str, dict[str, Any]] = {
        "task_confirm": {"task_id": task_id, "confirmed": True},
        "task_reject": {"task_id": task_id, "reason": {"code": "capability_lacking"}},
        "capability_response": {"agent_id": ctx.me.kit_id, "capabilities": []},
        "task_ack": {"task_id": task_id, "state": "completed"},
        "ack": {},
        "nack": {"code": "invalid_params", "message": "x"},
    }
    for type_, payload in payloads.items():
        exchange = await ctx.client.send(type_, payload)
        ctx.client.expect_nack(exchange, 400, "invalid_params", signed=True)


@check(
    "error.reply_to",
    "a POSTed request carrying reply_to gets 400 invalid_params, signed",
    "specs/protocol.md, 'Signatures' and 'Error codes'",
)
async def error_reply_to(ctx: CheckContext) -> None:
    exchange = await ctx.client.send(
        "heartbeat", {"status": "ok", "active_tasks": 0}, reply_to="msg-captured-reply"
    )
    ctx.client.expect_nack(exchange, 400, "invalid_params", signed=True)


# --- deduplication (specs/protocol.md, 'Deduplication')
# ----------------------------------------------------------------


async def _one_execution(ctx: CheckContext, trace: TaskTrace) -> None:
    """The task completes, and nothing follows: a second execution would send a second set
    of callbacks (specs/protocol.md, 'Deduplication': a retry gets the stored reply and is not
    executed again)."""
    await ctx.finish(trace)
    await asyncio.sleep(ctx.timing.settle)
    completes = trace.count("task_complete")
    if completes != 1 or trace.late:
        raise CheckFailed(
            f"the task ran more than once: {completes} task_complete; callbacks after the "
            f"first one: {[what for _, what in trace.late]} ({trace.describe()})"
        )


def _same_reply(first: Exchange, again: Exchange) -> None:
    if (again.status, again.reply_body) != (first.status, first.reply_body):
        raise CheckFailed(
            f"{again.label}: reply differs from the original's: {again.describe()} "
            f"(id {getattr(again.message, 'id', None)!r}) vs {first.describe()} "
            f"(id {getattr(first.message, 'id', None)!r})"
        )


@check(
    "dedup.same_bytes",
    "the same bytes POSTed again (also concurrently) get the same reply; one execution",
    "specs/protocol.md, 'Deduplication'",
)
async def dedup_same_bytes(ctx: CheckContext) -> None:
    task_id = ctx.new_task_id("same-bytes")
    trace = ctx.listener.trace(task_id)
    value = ctx.client.task_request(task_id, "echo", {"text": "once"})
    body, headers = sign(value, ctx.me.secret, "header")
    first, concurrent = await asyncio.gather(
        ctx.client.post_bytes(body, headers, sent=value, label="task_request"),
        ctx.client.post_bytes(body, headers, sent=value, label="concurrent copy"),
    )
    ctx.observe_decision(trace, first)
    ctx.client.expect(first, "task_confirm")
    _same_reply(first, concurrent)
    again = await ctx.client.post_bytes(body, headers, sent=value, label="later copy")
    _same_reply(first, again)
    await _one_execution(ctx, trace)


@check(
    "dedup.refreshed",
    "a retry with a refreshed timestamp, re-signed in the other mode, gets the same reply",
    "specs/protocol.md, 'Deduplication'",
)
async def dedup_refreshed(ctx: CheckContext) -> None:
    task_id = ctx.new_task_id("retry")
    trace = ctx.listener.trace(task_id)
    value = ctx.client.task_request(task_id, "echo", {"text": "once"}, age=2.0)
    first = await ctx.client.post(value, "header", label="task_request")
    ctx.observe_decision(trace, first)
    ctx.client.expect(first, "task_confirm")
    retry = await ctx.client.post(ctx.client.refreshed(value), "body", label="retry (body mode)")
    _same_reply(first, retry)
    await _one_execution(ctx, trace)


@check(
    "dedup.id_reused",
    "a message id reused for other content gets 400 invalid_params id_reused, signed",
    "specs/protocol.md, 'Deduplication' and 'Error codes'",
)
async def dedup_id_reused(ctx: CheckContext) -> None:
    first = await ctx.client.send("heartbeat", {"status": "ok", "active_tasks": 0})
    ctx.client.expect(first, "heartbeat")
    assert first.sent_id is not None
    exchange = await ctx.client.send("capability_query", {}, message_id=first.sent_id)
    ctx.client.expect_nack(exchange, 400, "invalid_params", signed=True, reason="id_reused")


@check(
    "dedup.task_id",
    "a new request for an existing task id: same task → original decision, other → "
    "task_id_in_use (live) or 409 (final)",
    "specs/protocol.md, 'Deduplication' and 'Error codes'",
)
async def dedup_task_id(ctx: CheckContext) -> None:
    payload = {"steps": 5, "delay": 0.5}
    trace = await ctx.confirmed("task-id", "slow", payload)
    task_id = trace.task_id

    async def again(task_payload: dict[str, Any], label: str) -> Exchange:
        value = ctx.client.task_request(task_id, "slow", task_payload)
        return await ctx.client.post(value, label=label)

    same = await again(payload, "same task, new message id")
    ctx.client.expect(same, "task_confirm")
    other = await again({"steps": 6, "delay": 0.5}, "other task, same task id")
    ctx.client.expect_nack(other, 400, "invalid_params", signed=True, reason="task_id_in_use")
    await ctx.cancel(trace)
    final_other = await again({"steps": 7, "delay": 0.5}, "other task, cancelled task id")
    ctx.client.expect_nack(final_other, 409, "task_already_completed", signed=True)
    final_same = await again(payload, "same task after cancel")
    ctx.client.expect(final_same, "task_confirm")


# --- what the listener saw, once everything settled --------------------------------------------


@check(
    "callbacks.authenticated",
    "every callback is an envelope signed with the shared secret, fresh, from the target's "
    "registered endpoint, to the kit, about a task of the kit",
    "specs/protocol.md, 'Signatures' and 'Transport'",
    "final",
)
async def callbacks_authenticated(ctx: CheckContext) -> None:
    problems = ctx.listener.problems + ctx.listener.strays
    if problems:
        raise CheckFailed(_listing(problems))
    if not ctx.listener.traces:
        raise Skip("no check requested a task: there were no callbacks to judge")
    if not any(trace.callbacks for trace in ctx.listener.traces.values()):
        raise CheckFailed("no callback was received at all")


@check(
    "replies.signed",
    "every reply is an envelope answering the kit; header-signed unless a pre-auth nack or 403",
    "specs/protocol.md, 'Signatures' and 'Transport'",
    "final",
)
async def replies_signed(ctx: CheckContext) -> None:
    problems = [p for ex in ctx.client.exchanges for p in ctx.client.reply_problems(ex)]
    if problems:
        raise CheckFailed(_listing(problems))


@check(
    "callbacks.one_at_a_time",
    "a task's next callback is POSTed only after the previous one was acknowledged",
    "specs/protocol.md, 'Transport'",
    "final",
)
async def callbacks_one_at_a_time(ctx: CheckContext) -> None:
    if ctx.listener.overlaps:
        raise CheckFailed(_listing(ctx.listener.overlaps))


@check(
    "rules.no_backwards",
    "the states the target reports never go backwards",
    "specs/protocol.md, 'Task states'",
    "final",
)
async def rules_no_backwards(ctx: CheckContext) -> None:
    problems = [
        f"task {trace.task_id}: {problem}"
        for trace in ctx.listener.traces.values()
        for problem in backwards(trace.observations)
    ]
    if problems:
        raise CheckFailed(_listing(problems))


@check(
    "rules.nothing_after_final",
    "no callback for a task after its final callback, its task_reject or its cancel's task_ack",
    "specs/protocol.md, 'Task states'",
    "final",
)
async def rules_nothing_after_final(ctx: CheckContext) -> None:
    problems = [
        f"task {trace.task_id}: {what}"
        for trace in ctx.listener.traces.values()
        for _, what in trace.late
    ]
    if problems:
        raise CheckFailed(_listing(problems))


def _listing(problems: list[str], limit: int = 6) -> str:
    shown = "; ".join(problems[:limit])
    return shown + (f"; and {len(problems) - limit} more" if len(problems) > limit else "")


__all__ = ["CHECKS", "Check", "CheckContext", "CheckFn", "Timing", "check"]
