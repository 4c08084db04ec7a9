"""Signatures, authentication and every refusal: what the target must refuse, and how.

Most refusals are alike: send something wrong, expect a `nack` with a given HTTP status and
code, signed or not (specs/protocol.md, 'Signatures': nothing refused before the signature
verified, and no 403, is ever signed), sometimes with a `details.reason`, and for a forged
`task_request`, proof that it had no effect. Those are rows of `REFUSALS`, each a list of
cases; the few that need more (a task first, or an accepted case beside the refused ones) are
written out below them.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, NamedTuple

from synapse.conformance.checks.base import (
    SKEW,
    STALE_OFFSET,
    WRONG_SECRET,
    CheckContext,
    check,
    is_rfc3339,
)
from synapse.conformance.wire import CheckFailed, encode, sign
from synapse.types import SIGNATURE_HEADER, format_timestamp, header_signature, utc_now

SIGNATURES = "specs/protocol.md, 'Signatures'"
SIG_TRANSPORT = "specs/protocol.md, 'Signatures' and 'Transport'"
SIG_ERRORS = "specs/protocol.md, 'Signatures' and 'Error codes'"
ENVELOPE_ERRORS = "specs/protocol.md, 'Envelope' and 'Error codes'"
PAYLOAD_ERRORS = "specs/protocol.md, 'Payloads' and 'Error codes'"
TRANSPORT_ERRORS = "specs/protocol.md, 'Transport' and 'Error codes'"
ERRORS = "specs/protocol.md, 'Error codes'"


@dataclass(frozen=True)
class Case:
    """One thing to POST: an envelope the kit signs (`value`), or exact `body` bytes and
    `headers`; `task_id` when it is a forged `task_request` whose lack of effect is proved."""

    label: str
    value: dict[str, Any] | None = None
    body: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    task_id: str | None = None


class Answer(NamedTuple):
    """The refusal expected: a nack with this HTTP status and code, signed or not."""

    status: int
    code: str
    signed: bool


@dataclass(frozen=True)
class RefusalCheck:
    """A check that every one of its cases is refused the same way."""

    id: str
    title: str
    section: str
    answer: Answer
    cases: Callable[[CheckContext], list[Case]]
    #: The `details.reason` the nack must carry.
    reason: str | None = None
    #: More to require of the nack's `details`.
    details: Callable[[dict[str, Any]], None] | None = None

    async def run(self, ctx: CheckContext) -> None:
        for case in self.cases(ctx):
            if case.body is not None:
                exchange = await ctx.client.post_bytes(
                    case.body, case.headers, sent=case.value, label=case.label
                )
            else:
                assert case.value is not None
                exchange = await ctx.client.post(case.value, label=case.label)
            status, code, signed = self.answer
            details = ctx.client.expect_nack(
                exchange, status, code, signed=signed, reason=self.reason
            )
            if self.details is not None:
                self.details(details)
            if case.task_id is not None and case.value is not None:
                await ctx.prove_no_effect(case.value["id"], case.task_id)


# --- how the cases are made ---------------------------------------------------------------------


def signed_raw(ctx: CheckContext, label: str, body: bytes, value: Any = None) -> Case:
    """Exact bytes, header-signed with the shared secret (refused before the signature)."""
    headers = {
        "Content-Type": "application/json",
        SIGNATURE_HEADER: header_signature(ctx.me.secret, body),
    }
    return Case(label, value=value if isinstance(value, dict) else None, body=body, headers=headers)


def forged_request(
    ctx: CheckContext, label: str, forge: Callable[[dict[str, Any]], tuple[bytes, dict[str, str]]]
) -> Case:
    """A `task_request` made wrong by `forge` (which signs it, or not); should the target wrongly
    accept it, its callbacks are this check's fault, not strays."""
    task_id = ctx.new_task_id(label)
    ctx.listener.trace(task_id)
    value = ctx.client.task_request(task_id, "echo", {"text": f"forged {label}"})
    body, headers = forge(value)
    return Case(f"{label} task_request", value=value, body=body, headers=headers, task_id=task_id)


def bad_signatures(ctx: CheckContext) -> list[Case]:
    def tampered(value: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
        body, headers = sign(value, ctx.me.secret, "header")
        return body.replace(b"forged", b"FORGED"), headers

    return [
        forged_request(ctx, "bad-header", lambda v: sign(v, WRONG_SECRET, "header")),
        forged_request(ctx, "bad-body", lambda v: sign(v, WRONG_SECRET, "body")),
        forged_request(ctx, "tampered", tampered),
    ]


def unsigned(ctx: CheckContext) -> list[Case]:
    return [forged_request(ctx, "unsigned", lambda v: sign(v, ctx.me.secret, "none"))]


def from_a_stranger(ctx: CheckContext) -> list[Case]:
    value = ctx.client.task_request(ctx.new_task_id("stranger"), "echo", {"text": "x"})
    value["from"] = {
        "agent_id": f"conformance-stranger-{uuid.uuid4().hex[:6]}",
        "endpoint": "http://127.0.0.1:9/x",
    }
    return [Case("task_request from a stranger", value=value)]


def to_someone_else(ctx: CheckContext) -> list[Case]:
    def elsewhere(value: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
        return sign({**value, "to": {"agent_id": "conformance-nobody"}}, ctx.me.secret, "header")

    return [forged_request(ctx, "wrong-to", elsewhere)]


def from_another_endpoint(ctx: CheckContext) -> list[Case]:
    def moved(value: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
        sender = {**value["from"], "endpoint": "http://attacker.invalid:8080/synapse/callback"}
        return sign({**value, "from": sender}, ctx.me.secret, "header")

    return [forged_request(ctx, "moved", moved)]


def not_json(ctx: CheckContext) -> list[Case]:
    bodies = (b'{"version": "1.0", "id": ', b"\xff\xfe not utf-8", b"hello")
    return [signed_raw(ctx, f"body {body[:12]!r}", body) for body in bodies]


def not_i_json(ctx: CheckContext) -> list[Case]:
    base = encode(ctx.client.envelope("heartbeat", {"status": "ok", "active_tasks": 0}))
    variants = {
        "duplicate member": base.replace(b'"status":"ok"', b'"status":"ok","status":"busy"'),
        "integer beyond 2^53": base.replace(
            b'"active_tasks":0', b'"active_tasks":9007199254740993'
        ),
        "lone surrogate": base.replace(b'"status":"ok"', b'"status":"ok","x":"\\ud800"'),
    }
    assert all(body != base for body in variants.values())
    return [signed_raw(ctx, label, body) for label, body in variants.items()]


def not_envelopes(ctx: CheckContext) -> list[Case]:
    full = ctx.client.envelope("heartbeat", {})
    values: dict[str, Any] = {
        "array": [full],
        "no from": {k: v for k, v in full.items() if k != "from"},
        "payload not an object": {**full, "payload": "x"},
    }
    return [signed_raw(ctx, label, encode(value), value) for label, value in values.items()]


def unknown_type(ctx: CheckContext) -> list[Case]:
    return [Case("task_teleport", value=ctx.client.envelope("p2p:task_teleport", {"task_id": "x"}))]


def version_2(ctx: CheckContext) -> list[Case]:
    value = ctx.client.envelope("heartbeat", {"status": "ok"}, version="2.0")
    return [Case("heartbeat version 2.0", value=value)]


def supported_versions_listed(details: dict[str, Any]) -> None:
    versions = details.get("supported_versions")
    if not isinstance(versions, list) or not versions:
        raise CheckFailed(f"details.supported_versions is {versions!r}, expected a list")


def too_large(ctx: CheckContext) -> list[Case]:
    value = ctx.client.envelope("heartbeat", {"status": "ok", "padding": "x" * (1024 * 1024 + 64)})
    return [Case("1 MiB heartbeat", value=value)]


def about_unknown_tasks(ctx: CheckContext) -> list[Case]:
    task_id = ctx.new_task_id("unknown")
    return [
        Case("task_cancel", value=ctx.client.envelope("task_cancel", {"task_id": task_id})),
        Case(
            "task_info_provided",
            value=ctx.client.envelope(
                "task_info_provided", {"task_id": task_id, "fields": {"style": "x"}}
            ),
        ),
    ]


def wrong_shapes(ctx: CheckContext) -> list[Case]:
    task_id = ctx.new_task_id("shape")
    whenever = ctx.client.task_request(task_id, "echo", {"text": "x"})
    whenever["payload"]["task"]["priority"] = "whenever"
    return [
        Case(
            "task without type",
            value=ctx.client.envelope("task_request", {"task": {"id": task_id, "payload": {}}}),
        ),
        Case("task_id not a string", value=ctx.client.envelope("task_cancel", {"task_id": 42})),
        Case("unknown priority", value=whenever),
    ]


def reply_only_types(ctx: CheckContext) -> list[Case]:
    task_id = ctx.new_task_id("reply-only")
    payloads: dict[str, dict[str, Any]] = {
        "task_confirm": {"task_id": task_id, "confirmed": True},
        "task_reject": {"task_id": task_id, "reason": {"code": "capability_lacking"}},
        "capability_response": {"agent_id": ctx.me.kit_id, "capabilities": []},
        "task_ack": {"task_id": task_id, "state": "completed"},
        "ack": {},
        "nack": {"code": "invalid_params", "message": "x"},
    }
    return [Case(t, value=ctx.client.envelope(t, p)) for t, p in payloads.items()]


def carrying_reply_to(ctx: CheckContext) -> list[Case]:
    value = ctx.client.envelope(
        "heartbeat", {"status": "ok", "active_tasks": 0}, reply_to="msg-captured-reply"
    )
    return [Case("heartbeat with reply_to", value=value)]


def stale_requests(ctx: CheckContext) -> list[Case]:
    cases = []
    for age in (STALE_OFFSET, -STALE_OFFSET):
        stamp = format_timestamp(utc_now() - timedelta(seconds=age))

        def stale(value: dict[str, Any], stamp: str = stamp) -> tuple[bytes, dict[str, str]]:
            return sign({**value, "timestamp": stamp}, ctx.me.secret, "header")

        cases.append(forged_request(ctx, "stale" if age > 0 else "future", stale))
    return cases


def server_time_is_rfc3339(details: dict[str, Any]) -> None:
    if not is_rfc3339(details.get("server_time")):
        raise CheckFailed(
            f"stale nack details.server_time {details.get('server_time')!r} is not RFC 3339"
        )


# --- the table ------------------------------------------------------------------------------

DENIED = Answer(403, "permission_denied", signed=False)
MALFORMED = Answer(400, "message_format_invalid", signed=False)
INVALID = Answer(400, "invalid_params", signed=True)

REFUSALS: list[RefusalCheck] = [
    RefusalCheck(
        "sig.bad",
        "a bad signature (header or body) is refused 403, unsigned, with no effect",
        SIGNATURES,
        cases=bad_signatures,
        answer=DENIED,
    ),
    RefusalCheck(
        "sig.missing",
        "an unsigned request is refused 403, unsigned, with no effect",
        SIGNATURES,
        cases=unsigned,
        answer=DENIED,
    ),
    RefusalCheck(
        "auth.unknown_partner",
        "a message from an unknown agent id is refused 403, unsigned",
        SIG_TRANSPORT,
        cases=from_a_stranger,
        answer=DENIED,
    ),
    RefusalCheck(
        "auth.wrong_recipient",
        "a message addressed to another agent is refused 403, unsigned, with no effect",
        SIG_TRANSPORT,
        cases=to_someone_else,
        answer=DENIED,
    ),
    RefusalCheck(
        "auth.endpoint_mismatch",
        "a from.endpoint other than the registered one is refused 403, unsigned, no effect",
        SIG_TRANSPORT,
        cases=from_another_endpoint,
        answer=DENIED,
    ),
    RefusalCheck(
        "error.not_json",
        "a body that is not JSON gets 400 message_format_invalid",
        ERRORS,
        cases=not_json,
        answer=MALFORMED,
    ),
    RefusalCheck(
        "error.not_ijson",
        "duplicate names, big integers, lone surrogates: 400 message_format_invalid",
        SIG_ERRORS,
        cases=not_i_json,
        answer=MALFORMED,
    ),
    RefusalCheck(
        "error.not_envelope",
        "JSON that is no envelope gets 400 message_format_invalid",
        ENVELOPE_ERRORS,
        cases=not_envelopes,
        answer=MALFORMED,
    ),
    RefusalCheck(
        "error.unknown_type",
        "an unknown type gets 400 message_format_invalid, unsigned",
        ENVELOPE_ERRORS,
        cases=unknown_type,
        answer=MALFORMED,
    ),
    RefusalCheck(
        "error.version",
        "version 2.0 gets 400 message_format_invalid with details.supported_versions",
        ENVELOPE_ERRORS,
        cases=version_2,
        details=supported_versions_listed,
        answer=MALFORMED,
    ),
    RefusalCheck(
        "error.too_large",
        "a body over 1 MiB gets 413 message_format_invalid",
        TRANSPORT_ERRORS,
        answer=Answer(413, "message_format_invalid", signed=False),
        cases=too_large,
    ),
    RefusalCheck(
        "error.task_not_found",
        "a message about an unknown task gets 404 task_not_found, signed",
        PAYLOAD_ERRORS,
        answer=Answer(404, "task_not_found", signed=True),
        cases=about_unknown_tasks,
    ),
    RefusalCheck(
        "error.payload_shape",
        "a payload of the wrong shape gets 400 invalid_params, signed",
        PAYLOAD_ERRORS,
        cases=wrong_shapes,
        answer=INVALID,
    ),
    RefusalCheck(
        "error.reply_only",
        "a POSTed reply-only type gets 400 invalid_params, signed",
        SIG_ERRORS,
        cases=reply_only_types,
        answer=INVALID,
    ),
    RefusalCheck(
        "error.reply_to",
        "a POSTed request carrying reply_to gets 400 invalid_params, signed",
        SIG_ERRORS,
        cases=carrying_reply_to,
        answer=INVALID,
    ),
]


#: The refused half of `sig.stale` (whose other half checks that a small skew is accepted).
STALE = RefusalCheck(
    "sig.stale",
    "",
    SIGNATURES,
    cases=stale_requests,
    reason="stale",
    details=server_time_is_rfc3339,
    answer=DENIED,
)


# --- written out: more than one kind of answer, or a task first ------------------------------


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


@check(
    "sig.stale",
    f"timestamps ±{STALE_OFFSET:g} s off are refused 403 stale with server_time, no effect; "
    f"±{SKEW:g} s are accepted",
    "specs/protocol.md, 'Signatures'",
)
async def sig_stale(ctx: CheckContext) -> None:
    await STALE.run(ctx)  # the refused half is a row of its own
    for age in (SKEW, -SKEW):
        exchange = await ctx.client.send("capability_query", {}, age=age)
        exchange.label = f"capability_query {age:+g} s off"
        ctx.client.expect(exchange, "capability_response")


# The table's checks, registered here, in its order.
for _refusal in REFUSALS:
    check(_refusal.id, _refusal.title, _refusal.section)(_refusal.run)


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
