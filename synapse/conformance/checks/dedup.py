"""Deduplication, and what the listener saw across all checks once everything settled."""

from __future__ import annotations

import asyncio
from typing import Any

from synapse.conformance.checks.base import (
    CheckContext,
    check,
)
from synapse.conformance.listener import TaskTrace
from synapse.conformance.rules import backwards
from synapse.conformance.wire import (
    CheckFailed,
    Exchange,
    Skip,
    sign,
)

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
    value, trace = ctx.new_request("same-bytes", "echo", {"text": "once"})
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
    value, trace = ctx.new_request("retry", "echo", {"text": "once"}, age=2.0)
    first = await ctx.post_request(trace, value, "header", "task_request")
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
