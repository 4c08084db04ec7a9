"""Setup, the basics and the flows: the target as a demo peer."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from synapse.conformance.checks.base import (
    DEMO_CAPABILITIES,
    NO_SUCH_TYPE,
    CheckContext,
    acked,
    check,
    same_task,
    text_of,
)
from synapse.conformance.listener import Callback, TaskTrace
from synapse.conformance.wire import CheckFailed, TargetUnreachable
from synapse.types import format_timestamp, utc_now

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
        raise TargetUnreachable(f"cannot reach the target at {me.target_url}: {exchange.error}")
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
    ctx.rejected(exchange, trace.task_id, "capability_lacking")


@check(
    "flow.invalid_task",
    "slow with steps 0 or delay 11 gets task_reject invalid_params",
    "specs/protocol.md, 'Error codes' and 'The demo handler'",
)
async def flow_invalid_task(ctx: CheckContext) -> None:
    for payload in ({"steps": 0}, {"steps": 2, "delay": 11}):
        exchange, trace = await ctx.request("invalid", "slow", payload)
        ctx.rejected(exchange, trace.task_id, "invalid_params", f"slow {payload}: ")


@check(
    "flow.deadline_passed",
    "a task whose deadline has already passed gets task_reject execution_timeout",
    "specs/protocol.md, 'Task states'",
)
async def flow_deadline_passed(ctx: CheckContext) -> None:
    value, trace = ctx.new_request("deadline", "echo", {"text": "too late"})
    value["payload"]["task"]["deadline"] = format_timestamp(utc_now() - timedelta(seconds=60))
    exchange = await ctx.post_request(trace, value, label="task_request(echo, deadline passed)")
    ctx.rejected(exchange, trace.task_id, "execution_timeout")
