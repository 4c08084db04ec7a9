"""Raw HTTP against a running `Peer`: every code of specs/protocol.md, 'Error codes' reachable over
HTTP.

The peer under test ("agent-e", the demo handler wrapped to count its calls) runs on 127.0.0.1;
the tests speak as its registered partners "agent-r" and "agent-x" with hand-made, hand-signed
envelopes, and receive its callbacks on small sinks. Each refusal is checked for its HTTP
status, nack `code`, the `details` the specification names, and whether the reply is signed
(specs/protocol.md, 'Signatures':
never before the request's signature verified, never on a 403; always after).
"""

from __future__ import annotations

import asyncio
import gzip
import json
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import pytest
from rawpost import Answer, CallbackSink, RawAgent, RawReply, check_nack, eventually, sign

from synapse.demo.handler import DemoHandler
from synapse.p2p.config import P2PConfig
from synapse.p2p.engine import TaskKey, Validation
from synapse.runtime.handler import ExecutionContext
from synapse.runtime.listener import OnMessage
from synapse.store.base import StoreUnavailable
from synapse.transport.partners import Partner
from synapse.transport.peer import Peer
from synapse.types import (
    SIGNATURE_HEADER,
    Capability,
    TaskState,
    format_timestamp,
    header_signature,
    utc_now,
)

E = "agent-e"
R, SECRET_R = "agent-r", "secret-shared-by-r-and-e"
X, SECRET_X = "agent-x", "secret-shared-by-x-and-e"
FAST = P2PConfig(max_retries=1, retry_base_delay=0.01, retry_max_delay=0.05, request_timeout=5)
MIB = 1024 * 1024


class CountingHandler:
    """The demo handler, counting what it is asked: a refused message must never reach it."""

    def __init__(self) -> None:
        self.inner = DemoHandler()
        self.validations: list[tuple[str, dict[str, Any]]] = []
        self.executions: list[tuple[str, str]] = []
        #: Makes `get_capabilities` raise: a bug in the handler.
        self.broken = False

    def get_capabilities(self) -> Sequence[Capability]:
        if self.broken:
            raise RuntimeError("a bug in the handler")
        return self.inner.get_capabilities()

    def validate_task(self, task_type: str, payload: dict[str, Any]) -> Validation:
        self.validations.append((task_type, payload))
        return self.inner.validate_task(task_type, payload)

    async def execute_task(
        self, ctx: ExecutionContext, task_type: str, payload: dict[str, Any]
    ) -> Any:
        self.executions.append((ctx.task_id, task_type))
        return await self.inner.execute_task(ctx, task_type, payload)

    @property
    def calls(self) -> tuple[int, int]:
        return len(self.validations), len(self.executions)


@dataclass
class World:
    peer: Peer
    handler: CountingHandler
    r: RawAgent
    x: RawAgent
    sink_r: CallbackSink
    sink_x: CallbackSink
    session: aiohttp.ClientSession
    other: dict[str, Any] = field(default_factory=dict)

    def state(self, task_id: str, requester: str = R) -> TaskState | None:
        rec = self.peer.protocol.engine.get(TaskKey(requester, task_id))
        return rec.state if rec else None

    def history(self, task_id: str, requester: str = R) -> int:
        rec = self.peer.protocol.engine.get(TaskKey(requester, task_id))
        return len(rec.history) if rec else 0

    async def confirmed(self, task_id: str, task_type: str, payload: dict[str, Any]) -> RawReply:
        reply = await self.r.post(self.r.task_request(task_id, task_type, payload))
        assert reply.status == 200, reply
        assert reply.type in ("p2p:task_confirm", "p2p:task_need_info"), reply
        return reply

    async def completed(self, task_id: str) -> None:
        """Run an echo task `task_id` to its end."""
        await self.confirmed(task_id, "echo", {"text": "done"})
        await self.sink_r.wait_for(
            lambda got: any(
                m["type"] == "p2p:task_complete" and m["payload"]["task_id"] == task_id for m in got
            )
        )
        await eventually(lambda: self.state(task_id) is TaskState.COMPLETED)


@asynccontextmanager
async def world(**peer_options: Any) -> AsyncIterator[World]:
    sink_r, sink_x = CallbackSink(R, SECRET_R), CallbackSink(X, SECRET_X)
    await sink_r.start()
    await sink_x.start()
    handler = CountingHandler()
    peer = Peer(
        E,
        partners=[
            Partner(R, sink_r.endpoint, (SECRET_R,)),
            Partner(X, sink_x.endpoint, (SECRET_X,)),
        ],
        handler=handler,
        config=FAST,
        **peer_options,
    )
    try:
        async with aiohttp.ClientSession() as session, peer:
            r = RawAgent(session, R, sink_r.endpoint, SECRET_R, peer.endpoint, E)
            x = RawAgent(session, X, sink_x.endpoint, SECRET_X, peer.endpoint, E)
            yield World(peer, handler, r, x, sink_r, sink_x, session)
            assert sink_r.forged == sink_x.forged == 0
    finally:
        await sink_r.close()
        await sink_x.close()


@pytest.fixture
async def w() -> AsyncIterator[World]:
    async with world() as w:
        yield w


def unsigned(
    reply: RawReply, status: int, code: str, reply_to: str | None = None
) -> dict[str, Any]:
    return check_nack(reply, status, code, signed=False, reply_to=reply_to)


def signed(reply: RawReply, status: int, code: str, reply_to: str | None = None) -> dict[str, Any]:
    return check_nack(reply, status, code, signed=True, secret=SECRET_R, reply_to=reply_to)


def heartbeat(agent: RawAgent, **changes: Any) -> dict[str, Any]:
    return agent.envelope("heartbeat", {"status": "ok", "active_tasks": 0}, **changes)


def stamp(delta: float) -> str:
    return format_timestamp(utc_now() + timedelta(seconds=delta))


# --- what is accepted -----------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["header", "body"])
async def test_heartbeat_and_capability_query_get_signed_replies(w: World, mode: Any) -> None:
    sent = heartbeat(w.r)
    reply = await w.r.post(sent, mode)
    assert reply.status == 200 and reply.type == "p2p:heartbeat", reply
    assert reply.signed_with(SECRET_R) and not reply.signed_with(SECRET_X)
    assert reply.value["reply_to"] == sent["id"]
    assert reply.value["to"] == {"agent_id": R}
    assert reply.value["from"] == {"agent_id": E, "endpoint": w.peer.endpoint}
    assert reply.payload == {"status": "ok", "active_tasks": 0}

    reply = await w.r.send("capability_query", {}, mode)
    assert reply.status == 200 and reply.type == "p2p:capability_response", reply
    assert reply.signed_with(SECRET_R)
    names = [c["name"] for c in reply.payload["capabilities"]]
    assert names == ["echo", "slow", "text_generation", "portrait", "fail"]
    reply = await w.x.send("capability_query", {"task_type": "portrait"}, mode)
    assert reply.signed_with(SECRET_X) and not reply.signed_with(SECRET_R)
    assert [c["name"] for c in reply.payload["capabilities"]] == ["portrait"]
    reply = await w.r.send("capability_query", {"task_type": "por"}, mode)
    assert reply.payload["capabilities"] == []


async def test_any_minor_version_and_unknown_members_are_accepted(w: World) -> None:
    value = heartbeat(w.r, version="1.7", extension={"new": [1, 2]})
    value["payload"]["future_field"] = "ignored"
    for mode in ("header", "body"):
        reply = await w.r.post({**value, "id": f"{value['id']}-{mode}"}, mode)  # type: ignore[arg-type]
        assert reply.status == 200 and reply.type == "p2p:heartbeat", reply


async def test_a_request_exactly_at_the_body_limit_is_accepted(w: World) -> None:
    value = heartbeat(w.r, padding="")
    size = len(sign(value, SECRET_R)[0])
    value["padding"] = "p" * (MIB - size)
    body, headers = sign(value, SECRET_R)
    assert len(body) == MIB
    reply = await w.r.post_bytes(body, headers)
    assert reply.status == 200 and reply.type == "p2p:heartbeat", reply


# --- refused before the signature is verified: never signed --------------------------------


@pytest.mark.parametrize("body", [b"", b"not json", b"{", b'{"a": 1} trailing', b"\xff\xfe{}"])
async def test_not_json_is_400_unsigned(w: World, body: bytes) -> None:
    unsigned(await w.r.post_bytes(body), 400, "message_format_invalid")


def _inject(body: bytes, old: bytes, new: bytes) -> bytes:
    assert body.count(old) == 1, body
    return body.replace(old, new)


@pytest.mark.parametrize(
    "case",
    ["duplicate_key", "int_2_53", "int_minus_2_53", "lone_surrogate", "nan", "huge_float"],
)
async def test_not_i_json_is_400_unsigned_even_when_well_signed(w: World, case: str) -> None:
    value = heartbeat(w.r)
    body = sign(value, None)[0]
    if case == "duplicate_key":
        body = _inject(body, b'"version":"1.0"', b'"version":"1.0","version":"1.0"')
    elif case == "int_2_53":
        body = _inject(body, b'"active_tasks":0', f'"active_tasks":{2**53}'.encode())
    elif case == "int_minus_2_53":
        body = _inject(body, b'"active_tasks":0', f'"active_tasks":{-(2**53)}'.encode())
    elif case == "lone_surrogate":
        body = _inject(body, b'"status":"ok"', b'"status":"ok","note":"\\ud800"')
    elif case == "nan":
        body = _inject(body, b'"active_tasks":0', b'"active_tasks":NaN')
    else:
        body = _inject(body, b'"active_tasks":0', b'"active_tasks":1e400')
    headers = {
        "Content-Type": "application/json",
        SIGNATURE_HEADER: header_signature(SECRET_R, body),
    }
    unsigned(await w.r.post_bytes(body, headers), 400, "message_format_invalid")


def _not_envelopes(w: World) -> list[Any]:
    good = heartbeat(w.r)
    without_from = {k: v for k, v in good.items() if k != "from"}
    return [
        [],
        "envelope",
        {},
        without_from,
        {**good, "id": ""},
        {**good, "id": "m" * 129},
        {**good, "payload": []},
        {**good, "to": "agent-e"},
        {**good, "type": "p2p:teleport"},
        {**good, "type": "heartbeat"},
        {**good, "timestamp": "yesterday"},
        {**good, "version": 1},
        {**good, "version": "one"},
        {**good, "signature": 1},
    ]


async def test_not_an_envelope_is_400_unsigned(w: World) -> None:
    for value in _not_envelopes(w):
        body = json.dumps(value).encode()
        headers = {
            "Content-Type": "application/json",
            SIGNATURE_HEADER: header_signature(SECRET_R, body),
        }
        reply = await w.r.post_bytes(body, headers)
        unsigned(reply, 400, "message_format_invalid")


@pytest.mark.parametrize("version", ["2.0", "0.9", "10.1"])
async def test_another_major_version_is_400_with_supported_versions(w: World, version: str) -> None:
    value = heartbeat(w.r, version=version)
    details = unsigned(await w.r.post(value), 400, "message_format_invalid", value["id"])
    assert details["supported_versions"] == ["1.x"]
    # Even when the rest of the envelope is one we cannot read.
    odd = {"version": version, "kind": "future", "id": "m-2"}
    details = unsigned(await w.r.post(odd), 400, "message_format_invalid")
    assert details["supported_versions"] == ["1.x"]


async def test_a_body_over_the_limit_is_413_unsigned(w: World) -> None:
    value = heartbeat(w.r, padding="")
    size = len(sign(value, SECRET_R)[0])
    value["padding"] = "p" * (MIB - size + 1)
    body, headers = sign(value, SECRET_R)
    assert len(body) == MIB + 1
    details = unsigned(await w.r.post_bytes(body, headers), 413, "message_format_invalid")
    assert details.get("max_body_size") == MIB

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted while read
        for start in range(0, len(body), 64 * 1024):
            yield body[start : start + 64 * 1024]

    unsigned(await w.r.post_bytes(chunks(), headers), 413, "message_format_invalid")


async def test_content_encoding_is_refused_400_unsigned(w: World) -> None:
    body, headers = w.r.sign(heartbeat(w.r))
    zipped = gzip.compress(body)
    headers = {
        **headers,
        "Content-Encoding": "gzip",
        SIGNATURE_HEADER: header_signature(SECRET_R, zipped),
    }
    unsigned(await w.r.post_bytes(zipped, headers), 400, "message_format_invalid")
    # Signed over the decoded bytes instead: still refused.
    headers[SIGNATURE_HEADER] = header_signature(SECRET_R, body)
    unsigned(await w.r.post_bytes(zipped, headers), 400, "message_format_invalid")


async def test_a_non_json_content_type_is_refused_400_unsigned(w: World) -> None:
    body, headers = w.r.sign(heartbeat(w.r))
    headers["Content-Type"] = "text/plain"
    unsigned(await w.r.post_bytes(body, headers), 400, "message_format_invalid")


async def test_unknown_partner_is_403_unsigned(w: World) -> None:
    stranger = RawAgent(w.session, "agent-z", "http://127.0.0.1:9/cb", SECRET_R, w.peer.endpoint, E)
    for mode in ("header", "body"):
        sent = heartbeat(stranger)
        details = unsigned(await stranger.post(sent, mode), 403, "permission_denied", sent["id"])
        assert details["reason"] == "unknown_partner"


def _forge(w: World, case: str) -> tuple[dict[str, Any], bytes, dict[str, str]]:
    value = heartbeat(w.r)
    if case == "unsigned":
        body, headers = sign(value, None)
    elif case == "header_wrong_secret":
        body, headers = sign(value, "not-the-secret")
    elif case == "header_other_partners_secret":
        body, headers = sign(value, SECRET_X)
    elif case == "header_tampered":
        body, headers = sign(value, SECRET_R)
        body = body.replace(b'"active_tasks":0', b'"active_tasks":1')
    elif case == "header_not_sha256":
        body, headers = sign(value, SECRET_R)
        headers[SIGNATURE_HEADER] = headers[SIGNATURE_HEADER].removeprefix("sha256=")
    elif case == "body_wrong_secret":
        body, headers = sign(value, "not-the-secret", "body")
    elif case == "body_tampered":
        signed_value = json.loads(sign(value, SECRET_R, "body")[0])
        signed_value["payload"]["active_tasks"] = 1
        body, headers = sign(signed_value, None)
    elif case == "bad_header_wins_over_good_body":
        body, _ = sign(value, SECRET_R, "body")
        headers = {"Content-Type": "application/json", SIGNATURE_HEADER: "sha256=" + "0" * 64}
    else:
        raise AssertionError(case)
    return value, body, headers


FORGERIES = [
    "unsigned",
    "header_wrong_secret",
    "header_other_partners_secret",
    "header_tampered",
    "header_not_sha256",
    "body_wrong_secret",
    "body_tampered",
    "bad_header_wins_over_good_body",
]


@pytest.mark.parametrize("case", FORGERIES)
async def test_bad_or_missing_signature_is_403_unsigned(w: World, case: str) -> None:
    value, body, headers = _forge(w, case)
    details = unsigned(await w.r.post_bytes(body, headers), 403, "permission_denied", value["id"])
    expected = "missing_signature" if case == "unsigned" else "bad_signature"
    assert details["reason"] == expected


async def test_signature_variants_that_verify(w: World) -> None:
    value = heartbeat(w.r)
    body, headers = sign(value, SECRET_R)
    # Several signatures in the header: one match is enough.
    headers[SIGNATURE_HEADER] = "sha256=" + "0" * 64 + " " + headers[SIGNATURE_HEADER]
    assert (await w.r.post_bytes(body, headers)).status == 200
    # A good header decides even when the body's `signature` is wrong.
    value = heartbeat(w.r, signature="sha256=" + "1" * 64)
    reply = await w.r.post(value)
    assert reply.status == 200 and reply.type == "p2p:heartbeat", reply


@pytest.mark.parametrize("delta", [-301.0, 301.0, -3600.0, 86400.0])
async def test_a_stale_timestamp_either_way_is_403_unsigned(w: World, delta: float) -> None:
    for mode in ("header", "body"):
        value = heartbeat(w.r, timestamp=stamp(delta))
        before = datetime.now(UTC)
        details = unsigned(await w.r.post(value, mode), 403, "permission_denied", value["id"])
        assert details["reason"] == "stale"
        server_time = datetime.fromisoformat(details["server_time"].replace("Z", "+00:00"))
        assert details["server_time"].endswith("Z")
        assert abs((server_time - before).total_seconds()) < 5


@pytest.mark.parametrize("delta", [-290.0, 290.0])
async def test_a_timestamp_inside_the_window_is_accepted(w: World, delta: float) -> None:
    reply = await w.r.post(heartbeat(w.r, timestamp=stamp(delta)))
    assert reply.status == 200 and reply.type == "p2p:heartbeat", reply


async def test_wrong_recipient_is_403_unsigned(w: World) -> None:
    value = heartbeat(w.r, to={"agent_id": "agent-q"})
    details = unsigned(await w.r.post(value), 403, "permission_denied", value["id"])
    assert details["reason"] == "wrong_recipient"


async def test_endpoint_mismatch_is_403_unsigned(w: World) -> None:
    port = w.sink_r.endpoint.split(":")[2].split("/")[0]
    for endpoint in (
        w.sink_x.endpoint,  # another partner's
        f"http://127.0.0.1:{port}/other/path",
        f"https://127.0.0.1:{port}/synapse/callback",
        "http://attacker.example/synapse/callback",
    ):
        value = heartbeat(w.r, **{"from": {"agent_id": R, "endpoint": endpoint}})
        details = unsigned(await w.r.post(value), 403, "permission_denied", value["id"])
        assert details["reason"] == "endpoint_mismatch"
    # Equal after RFC 3986 normalization: accepted.
    same = w.sink_r.endpoint.replace("http://", "HTTP://")
    reply = await w.r.post(heartbeat(w.r, **{"from": {"agent_id": R, "endpoint": same}}))
    assert reply.status == 200, reply


# --- refused after the signature verified: signed -------------------------------------------


REPLY_ONLY = {
    "task_confirm": {"task_id": "t-1", "confirmed": True},
    "task_reject": {"task_id": "t-1", "reason": {"code": "capability_lacking", "message": "no"}},
    "capability_response": {"agent_id": R, "capabilities": [], "max_concurrent_tasks": 1},
    "task_ack": {"task_id": "t-1", "state": "completed"},
    "ack": {},
    "nack": {"code": "invalid_params", "message": "no"},
}


@pytest.mark.parametrize("reply_type", list(REPLY_ONLY))
@pytest.mark.parametrize("mode", ["header", "body"])
async def test_a_reply_only_type_posted_is_400_invalid_params_signed(
    w: World, reply_type: str, mode: Any
) -> None:
    for with_reply_to in (False, True):
        extra = {"reply_to": "msg-captured"} if with_reply_to else {}
        value = w.r.envelope(reply_type, REPLY_ONLY[reply_type], **extra)
        details = signed(await w.r.post(value, mode), 400, "invalid_params", value["id"])
        assert details["reason"] == "reply_only_type"


@pytest.mark.parametrize("mode", ["header", "body"])
async def test_a_request_carrying_reply_to_is_400_invalid_params_signed(
    w: World, mode: Any
) -> None:
    value = heartbeat(w.r, reply_to="msg-captured")
    details = signed(await w.r.post(value, mode), 400, "invalid_params", value["id"])
    assert details["reason"] == "reply_to_on_request"
    request = w.r.task_request("t-replyto", "echo", {"text": "x"}, reply_to="msg-1")
    signed(await w.r.post(request, mode), 400, "invalid_params", request["id"])
    assert w.state("t-replyto") is None
    assert w.handler.calls == (0, 0)


# deduplication ---------------------------------------------------------------------------


async def test_the_same_bytes_twice_get_the_same_reply_and_run_once(w: World) -> None:
    body, headers = w.r.sign(w.r.task_request("t-dup", "echo", {"text": "once"}))
    first = await w.r.post_bytes(body, headers)
    second = await w.r.post_bytes(body, headers)
    assert first.status == second.status == 200 and first.type == "p2p:task_confirm"
    assert first.body == second.body
    assert first.signature == second.signature and first.signed_with(SECRET_R)
    await w.sink_r.wait_for(lambda got: any(m["type"] == "p2p:task_complete" for m in got))
    third = await w.r.post_bytes(body, headers)  # after completion: still the stored reply
    assert third.body == first.body and third.status == 200
    # A duplicate that ran the handler again would have started it by now; none is running.
    await eventually(lambda: not w.peer.protocol._running)
    assert w.handler.calls == (1, 1)
    completes = [m for m in w.sink_r.about("t-dup") if m["type"] == "p2p:task_complete"]
    assert len(completes) == 1


async def test_concurrent_duplicates_get_the_same_reply(w: World) -> None:
    body, headers = w.r.sign(w.r.task_request("t-conc", "slow", {"steps": 1, "delay": 0}))
    replies = await asyncio.gather(*(w.r.post_bytes(body, headers) for _ in range(5)))
    assert {r.body for r in replies} == {replies[0].body}
    assert {r.status for r in replies} == {200}
    assert w.handler.calls == (1, 1)


@pytest.mark.parametrize("first_mode", ["header", "body"])
@pytest.mark.parametrize("retry_mode", ["header", "body"])
async def test_a_retry_with_a_new_timestamp_and_signature_gets_the_same_bytes(
    w: World, first_mode: Any, retry_mode: Any
) -> None:
    original = w.r.task_request("t-retry", "echo", {"text": "retry"}, timestamp=stamp(-5))
    first = await w.r.post(original, first_mode)
    assert first.status == 200 and first.type == "p2p:task_confirm", first
    retry = {**original, "timestamp": stamp(0)}
    again = await w.r.post(retry, retry_mode)
    assert again.body == first.body and again.status == 200
    assert again.signature == first.signature
    assert w.handler.calls == (1, 1)


async def test_a_duplicate_of_a_refusal_gets_the_same_refusal(w: World) -> None:
    body, headers = w.r.sign(w.r.envelope("task_cancel", {"task_id": "t-nowhere"}))
    first = await w.r.post_bytes(body, headers)
    signed(first, 404, "task_not_found")
    again = await w.r.post_bytes(body, headers)
    assert again.body == first.body and again.status == 404


async def test_a_reused_id_with_other_content_is_400_id_reused(w: World) -> None:
    original = w.r.task_request("t-reuse", "slow", {"steps": 100, "delay": 0.05})
    first = await w.r.post(original)
    assert first.type == "p2p:task_confirm"
    tasks = w.peer.protocol.list_tasks()
    for other in (
        w.r.task_request("t-reuse-2", "echo", {"text": "other"}, message_id=original["id"]),
        {**original, "payload": {**original["payload"], "context": {"session_id": "s"}}},
        heartbeat(w.r, message_id=original["id"]),
    ):
        for mode in ("header", "body"):
            details = signed(await w.r.post(other, mode), 400, "invalid_params", original["id"])
            assert details["reason"] == "id_reused"
    assert w.peer.protocol.list_tasks() == tasks
    assert w.handler.calls == (1, 1)
    # The same id from another partner is another message altogether.
    from_x = w.x.task_request("t-reuse", "echo", {"text": "x"}, message_id=original["id"])
    reply = await w.x.post(from_x)
    assert reply.status == 200 and reply.type == "p2p:task_confirm", reply
    assert reply.signed_with(SECRET_X)


# payload shape ---------------------------------------------------------------------------


BAD_PAYLOADS = [
    ("heartbeat", {"status": "sleepy", "active_tasks": 0}, "$.payload.status"),
    ("heartbeat", {"status": "ok", "active_tasks": "1"}, "$.payload.active_tasks"),
    ("task_cancel", {}, "$.payload"),
    ("task_cancel", {"task_id": 7}, "$.payload.task_id"),
    ("task_request", {"task": {"type": "echo", "payload": {}}}, "$.payload.task"),
    ("task_request", {"task": {"id": "t", "type": "echo", "priority": "asap"}}, "$.payload.task"),
    ("capability_query", {"task_type": 3}, "$.payload.task_type"),
    ("task_info_provided", {"task_id": "t", "fields": []}, "$.payload.fields"),
]


@pytest.mark.parametrize(("type_", "payload", "path"), BAD_PAYLOADS)
async def test_a_payload_that_fails_its_shape_is_400_with_its_path(
    w: World, type_: str, payload: dict[str, Any], path: str
) -> None:
    value = w.r.envelope(type_, payload)
    details = signed(await w.r.post(value), 400, "invalid_params", value["id"])
    assert details["path"].startswith(path), details
    assert w.peer.protocol.list_tasks() == {}
    assert w.handler.calls == (0, 0)


# tasks ------------------------------------------------------------------------------------


def _about(task_id: str) -> list[tuple[str, dict[str, Any]]]:
    """Every message a requester may POST about a task, and the executor's callbacks."""
    return [
        ("task_cancel", {"task_id": task_id}),
        ("task_info_provided", {"task_id": task_id, "fields": {"style": "现代"}}),
        (
            "human_decision",
            {
                "task_id": task_id,
                "decision_id": "d-1",
                "reply_to": "msg-x",
                "decided_by": {"user_id": "u"},
                "decision": {"action": "approve"},
                "timestamp": format_timestamp(utc_now()),
            },
        ),
    ]


def _callbacks(task_id: str) -> list[tuple[str, dict[str, Any]]]:
    return [
        ("task_status_update", {"task_id": task_id, "status": "executing", "progress": 10}),
        ("task_complete", {"task_id": task_id, "result": {"output_type": "text", "output": "x"}}),
        ("task_failed", {"task_id": task_id, "error": {"code": "x", "message": "m"}}),
        ("task_need_info", {"task_id": task_id, "missing_fields": [{"field": "f"}]}),
        (
            "task_need_human",
            {"task_id": task_id, "reason": {"code": "ethical_decision", "message": "?"}},
        ),
    ]


async def test_a_message_about_an_unknown_task_is_404(w: World) -> None:
    for type_, payload in _about("t-unknown") + _callbacks("t-unknown"):
        value = w.r.envelope(type_, payload)
        details = signed(await w.r.post(value), 404, "task_not_found", value["id"])
        assert details.get("task_id") == "t-unknown"
    assert w.peer.protocol.list_tasks() == {}


async def test_a_message_from_a_non_party_or_against_the_direction_is_404(w: World) -> None:
    await w.confirmed("t-party", "portrait", {"subject": "me"})
    await eventually(lambda: w.state("t-party") is TaskState.NEED_HUMAN)
    history = w.history("t-party")
    # agent-x is not party to agent-r's task: for it, the task does not exist.
    for type_, payload in _about("t-party"):
        value = w.x.envelope(type_, payload)
        check_nack(await w.x.post(value), 404, "task_not_found", signed=True, secret=SECRET_X)
    # agent-r is its requester: an executor's callback from it travels the wrong way.
    for type_, payload in _callbacks("t-party"):
        value = w.r.envelope(type_, payload)
        signed(await w.r.post(value), 404, "task_not_found", value["id"])
    assert w.state("t-party") is TaskState.NEED_HUMAN
    assert w.history("t-party") == history
    assert w.peer.protocol.list_tasks() == {f"{R}/t-party": TaskState.NEED_HUMAN}


async def test_a_message_about_a_final_task_is_409(w: World) -> None:
    await w.completed("t-final")
    for type_, payload in _about("t-final"):
        value = w.r.envelope(type_, payload)
        details = signed(await w.r.post(value), 409, "task_already_completed", value["id"])
        assert details.get("state") == "completed"
    assert w.state("t-final") is TaskState.COMPLETED


async def test_a_message_not_allowed_in_the_state_is_400_with_state_and_allowed(
    w: World,
) -> None:
    await w.confirmed("t-busy", "slow", {"steps": 100, "delay": 0.05})
    await eventually(lambda: w.state("t-busy") is TaskState.EXECUTING)
    history = w.history("t-busy")
    for type_, payload in _about("t-busy")[1:]:  # info and a decision nobody asked for
        value = w.r.envelope(type_, payload)
        details = signed(await w.r.post(value), 400, "invalid_params", value["id"])
        assert details["state"] == "executing"
        assert "p2p:task_cancel" in details["allowed"]
        assert value["type"] not in details["allowed"]
    assert w.state("t-busy") is TaskState.EXECUTING
    assert w.history("t-busy") == history


async def test_a_decision_answering_another_need_human_is_400(w: World) -> None:
    await w.confirmed("t-human", "portrait", {"subject": "me"})
    await eventually(lambda: w.state("t-human") is TaskState.NEED_HUMAN)
    _, payload = _about("t-human")[2]
    value = w.r.envelope("human_decision", payload)
    signed(await w.r.post(value), 400, "invalid_params", value["id"])
    assert w.state("t-human") is TaskState.NEED_HUMAN


@pytest.mark.parametrize(
    ("task_type", "payload", "reply_type"),
    [
        ("echo", {"text": "a"}, "p2p:task_confirm"),
        ("text_generation", {"prompt": "月"}, "p2p:task_need_info"),
        ("teleport", {}, "p2p:task_reject"),
        ("slow", {"steps": 0}, "p2p:task_reject"),
    ],
)
async def test_a_task_request_resent_with_a_new_id_gets_the_original_decision(
    w: World, task_type: str, payload: dict[str, Any], reply_type: str
) -> None:
    first = await w.r.post(w.r.task_request("t-again", task_type, payload))
    assert first.status == 200 and first.type == reply_type, first
    # Let an echo run to its end (its decision is still the confirm): no handler left running.
    await eventually(lambda: not w.peer.protocol._running)
    again_value = w.r.task_request("t-again", task_type, payload)
    again = await w.r.post(again_value, "body")
    assert again.status == 200 and again.type == reply_type, again
    assert again.payload == first.payload
    assert again.value["reply_to"] == again_value["id"] and again.signed_with(SECRET_R)
    # Judged once: an offered type by the handler, an unknown one by the peer alone.
    assert len(w.handler.validations) == (0 if task_type == "teleport" else 1)
    assert len(w.handler.executions) == (1 if task_type == "echo" else 0)


async def test_a_different_task_under_a_task_id_in_use_is_400_or_409(w: World) -> None:
    await w.confirmed("t-used", "slow", {"steps": 100, "delay": 0.05})
    value = w.r.task_request("t-used", "echo", {"text": "another"})
    details = signed(await w.r.post(value), 400, "invalid_params", value["id"])
    assert details["reason"] == "task_id_in_use"
    await w.completed("t-done")
    value = w.r.task_request("t-done", "echo", {"text": "another"})
    signed(await w.r.post(value), 409, "task_already_completed", value["id"])
    assert w.handler.calls == (2, 2)
    # Another requester may use the same task id: it is another task.
    reply = await w.x.post(w.x.task_request("t-used", "echo", {"text": "x's own"}))
    assert reply.status == 200 and reply.type == "p2p:task_confirm", reply


async def test_draining_refuses_only_new_task_requests_503(w: World) -> None:
    await w.confirmed("t-running", "slow", {"steps": 100, "delay": 0.05})
    w.peer.protocol.engine.draining = True
    body, headers = w.r.sign(w.r.task_request("t-new", "echo", {"text": "late"}))
    reply = await w.r.post_bytes(body, headers)
    signed(reply, 503, "agent_not_ready")
    assert w.state("t-new") is None
    assert w.handler.calls == (1, 1)
    # Everything else is still served: a heartbeat (which says so) and a cancel.
    beat = await w.r.post(heartbeat(w.r))
    assert beat.status == 200 and beat.payload["status"] == "draining"
    cancel = await w.r.send("task_cancel", {"task_id": "t-running"})
    assert cancel.status == 200 and cancel.type == "p2p:task_ack", cancel
    assert cancel.payload == {"task_id": "t-running", "state": "cancelled"}
    # A 503 is not stored: the same bytes, once the peer is ready again, are processed anew.
    w.peer.protocol.engine.draining = False
    again = await w.r.post_bytes(body, headers)
    assert again.status == 200 and again.type == "p2p:task_confirm", again


async def test_too_many_requests_is_429_with_retry_after() -> None:
    async with world(rate_limit=5.0) as w:
        clock = [1000.0]  # the buckets' monotonic clock, moved by hand
        w.peer.server.rate_clock = lambda: clock[0]
        sent = [w.r.sign(heartbeat(w.r)) for _ in range(70)]
        replies = [await w.r.post_bytes(body, headers) for body, headers in sent]
        statuses = [r.status for r in replies]
        assert statuses == [200] * 50 + [429] * 20  # the burst, then nothing: time stood still
        limited = list(range(50, 70))
        for i in limited:
            details = signed(replies[i], 429, "rate_limited")
            assert int(replies[i].headers["Retry-After"]) >= 1
            assert details["retry_after"] == pytest.approx(0.2)  # one token at 5 per second
        # A 429 is not stored: the same bytes, once a token is back, are processed.
        clock[0] += 0.3
        body, headers = sent[limited[-1]]
        reply = await w.r.post_bytes(body, headers)
        assert reply.status == 200 and reply.type == "p2p:heartbeat", reply
        # Each partner has its own budget.
        assert (await w.x.post(heartbeat(w.x))).status == 200


# --- refusals change nothing ----------------------------------------------------------------


async def test_refused_messages_change_no_state_and_run_no_handler(w: World) -> None:
    await w.confirmed("t-kept", "portrait", {"subject": "me"})
    await eventually(lambda: w.state("t-kept") is TaskState.NEED_HUMAN)
    await w.completed("t-over")
    tasks = w.peer.protocol.list_tasks()
    calls = w.handler.calls
    running = dict(w.peer.protocol._running)
    histories = (w.history("t-kept"), w.history("t-over"))
    received = len(w.sink_r.received)
    need_human_id = next(
        m["id"] for m in w.sink_r.about("t-kept") if m["type"] == "p2p:task_need_human"
    )
    decision = {
        "task_id": "t-kept",
        "decision_id": "d-1",
        "reply_to": need_human_id,
        "decided_by": {"user_id": "u"},
        "decision": {"action": "approve"},
        "timestamp": format_timestamp(utc_now()),
    }
    cancel = w.r.envelope("task_cancel", {"task_id": "t-kept"})
    fresh = w.r.task_request("t-fresh", "echo", {"text": "never"})
    refused: list[tuple[bytes, dict[str, str], int]] = []

    def add(value: dict[str, Any], status: int, secret: str | None = SECRET_R) -> None:
        refused.append((*sign(value, secret), status))

    for value in (cancel, fresh, w.r.envelope("human_decision", decision)):
        add(value, 403, None)  # unsigned
        add(value, 403, "wrong")  # forged
        add({**value, "timestamp": stamp(-400)}, 403)  # stale
        add({**value, "to": {"agent_id": X}}, 403)  # not for us
        add({**value, "from": {"agent_id": R, "endpoint": w.sink_x.endpoint}}, 403)
        add({**value, "version": "2.0"}, 400)
        add({**value, "reply_to": "msg-1"}, 400)
        add({**value, "type": "p2p:task_ack"}, 400)
    add({**w.x.envelope("task_cancel", {"task_id": "t-kept"})}, 404, SECRET_X)
    add(w.r.envelope("task_info_provided", {"task_id": "t-kept", "fields": {}}), 400)
    add(w.r.envelope("human_decision", {**decision, "reply_to": "msg-other"}), 400)
    add(w.r.envelope("task_cancel", {"task_id": "t-over"}), 409)
    add(w.r.task_request("t-kept", "echo", {"text": "not the same task"}), 400)
    add(w.r.task_request("t-over", "echo", {"text": "not the same task"}), 409)
    add(w.r.envelope("task_request", {"task": {"id": "t-fresh", "payload": {}}}), 400)
    for body, headers, status in refused:
        reply = await w.r.post_bytes(body, headers)
        assert reply.status == status, (reply, body)
        assert reply.type == "p2p:nack"
    w.peer.protocol.engine.draining = True
    add(fresh, 503)
    reply = await w.r.post_bytes(*refused[-1][:2])
    assert reply.status == 503
    w.peer.protocol.engine.draining = False

    # Refusals apply nothing: a handler they started would be among the running ones already
    # (the runtime creates it as it applies the step, before the reply is sent).
    assert w.peer.protocol._running == running
    assert w.peer.protocol.list_tasks() == tasks
    assert w.handler.calls == calls
    assert (w.history("t-kept"), w.history("t-over")) == histories
    assert len(w.sink_r.received) == received
    # The task kept waiting is intact: the real decision completes it.
    reply = await w.r.send("human_decision", decision)
    assert reply.status == 200 and reply.type == "p2p:task_ack", reply
    assert reply.payload["state"] in ("human_approved", "executing")
    await eventually(lambda: w.state("t-kept") is TaskState.COMPLETED)


# --- more of authentication and robustness ---------------------------------------------------


async def test_a_refused_message_does_not_claim_its_id(w: World) -> None:
    """Deduplication records a key only once the message is authenticated."""
    genuine = w.r.task_request("t-claim", "echo", {"text": "real"})
    for forged in (
        sign({**genuine, "payload": {"task": {"id": "t-evil", "type": "fail"}}}, "wrong"),
        sign({**genuine, "timestamp": stamp(-1000)}, SECRET_R),
        sign({**genuine, "to": {"agent_id": X}}, SECRET_R),
    ):
        assert (await w.r.post_bytes(*forged)).status == 403
    reply = await w.r.post(genuine)
    assert reply.status == 200 and reply.type == "p2p:task_confirm", reply
    assert w.peer.protocol.list_tasks() == {f"{R}/t-claim": w.state("t-claim")}


async def test_body_mode_verifies_the_value_received_whatever_its_spelling(w: World) -> None:
    value = heartbeat(w.r, extension={"z": 1.5, "a": "é\u2028"})
    value["payload"]["later"] = [True, None]
    signature = json.loads(sign(value, SECRET_R, "body")[0])["signature"]
    # Reordered members, indentation, \\u escapes: the same JSON value, the same signature.
    respelled = {"signature": signature, **dict(reversed(list(value.items())))}
    body = json.dumps(respelled, indent=2, ensure_ascii=True).encode()
    reply = await w.r.post_bytes(body, {"Content-Type": "application/json"})
    assert reply.status == 200 and reply.type == "p2p:heartbeat", reply
    # An unknown member is covered by the signature too.
    tampered = {**respelled, "id": "msg-tampered", "extension": {"z": 1.5, "a": "e"}}
    reply = await w.r.post_bytes(
        json.dumps(tampered).encode(), {"Content-Type": "application/json"}
    )
    unsigned(reply, 403, "permission_denied")


async def test_not_ready_while_starting_is_503(w: World) -> None:
    w.peer.protocol.engine.ready = False
    try:
        value = w.r.task_request("t-early", "echo", {"text": "x"})
        details = signed(await w.r.post(value), 503, "agent_not_ready", value["id"])
        assert details["reason"] == "starting"
    finally:
        w.peer.protocol.engine.ready = True
    assert w.state("t-early") is None and w.handler.calls == (0, 0)


async def test_an_internal_failure_is_a_signed_503_and_not_stored(w: World) -> None:
    w.handler.broken = True
    body, headers = w.r.sign(w.r.task_request("t-bug", "echo", {"text": "x"}))
    reply = await w.r.post_bytes(body, headers)
    details = signed(reply, 503, "agent_not_ready", json.loads(body)["id"])
    assert details["reason"] == "internal"
    assert reply.value["to"] == {"agent_id": R}
    assert "Traceback" not in reply.body.decode()
    assert w.state("t-bug") is None
    # Not stored: once the bug is gone, the sender's retry is processed.
    w.handler.broken = False
    again = await w.r.post_bytes(body, headers)
    assert again.status == 200 and again.type == "p2p:task_confirm", again


async def test_a_store_that_cannot_be_read_is_a_signed_503_not_an_internal_error(
    w: World, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The database out of reach when a message needs a lookup (is its task stored?):
    the sender is told to retry, signed, nothing is applied, and no error is logged (the
    store's outage is not our bug)."""

    def away(*args: Any) -> None:
        raise StoreUnavailable("the database cannot be reached")

    # The engine's lookup of tasks it does not hold in memory (the store's `get_task`).
    monkeypatch.setattr(w.peer.protocol.engine, "finished_lookup", away)
    body, headers = w.r.sign(w.r.task_request("t-away", "echo", {"text": "x"}))
    reply = await w.r.post_bytes(body, headers)
    details = signed(reply, 503, "agent_not_ready", json.loads(body)["id"])
    assert details["reason"] == "store_unavailable"
    assert "internal_error" not in caplog.text
    monkeypatch.undo()
    assert w.state("t-away") is None
    again = await w.r.post_bytes(body, headers)  # not stored: the retry is processed
    assert again.status == 200 and again.type == "p2p:task_confirm", again


async def test_mangled_requests_never_get_a_500(w: World) -> None:
    rng = random.Random(20260101)
    replacements = [b'"', b"{", b"}", b"[", b"\\", b"0", b"-", b"\x00", b"\xff", b" ", b""]
    statuses: set[int] = set()
    for n in range(150):
        value = w.r.task_request(f"t-fuzz-{n}", rng.choice(["echo", "slow", "fail"]), {"text": "x"})
        body = sign(value, None)[0]
        at = rng.randrange(len(body))
        cut = b"" if n % 5 == 0 else rng.choice(replacements) + body[at + 1 :]
        body = body[:at] + cut
        headers = {
            "Content-Type": "application/json",
            SIGNATURE_HEADER: header_signature(SECRET_R, body),
        }
        reply = await w.r.post_bytes(body, headers)
        statuses.add(reply.status)
        assert reply.status in (200, 400, 403, 404, 409), reply
        assert reply.type == ("p2p:nack" if reply.status != 200 else reply.type), reply
        if reply.status == 403:
            assert reply.signature is None
    assert {200, 400} <= statuses
    assert (await w.r.post(heartbeat(w.r))).status == 200


# --- the peer as requester: callbacks from a raw executor -------------------------------------


@dataclass
class RequesterWorld:
    peer: Peer
    e: RawAgent
    x: RawAgent
    sink_e: CallbackSink
    #: Lets the raw executor answer `task_request`s.
    release: asyncio.Event
    #: The raw executor's answers by message type (what is not here gets the sink's default).
    answers: dict[str, Callable[[dict[str, Any]], Awaitable[Answer | None]]]
    replies_in: list[Any] = field(default_factory=list)


@asynccontextmanager
async def requester_world() -> AsyncIterator[RequesterWorld]:
    """The peer under test is "agent-r"; "agent-e" is a raw executor that holds its reply to a
    `task_request` until `release` is set, and acknowledges a `task_cancel` with `cancelled`."""
    release = asyncio.Event()

    async def confirm(message: dict[str, Any]) -> Answer:
        await asyncio.wait_for(release.wait(), 5)
        return "task_confirm", {"task_id": message["payload"]["task"]["id"], "confirmed": True}

    async def cancelled(message: dict[str, Any]) -> Answer:
        return "task_ack", {"task_id": message["payload"]["task_id"], "state": "cancelled"}

    answers: dict[str, Callable[[dict[str, Any]], Awaitable[Answer | None]]] = {
        "p2p:task_request": confirm,
        "p2p:task_cancel": cancelled,
    }

    async def answer(message: dict[str, Any]) -> Answer | None:
        chosen = answers.get(message["type"])
        return await chosen(message) if chosen is not None else None

    sink_e = CallbackSink(E, SECRET_R, answer=answer)
    sink_x = CallbackSink(X, SECRET_X)
    await sink_e.start()
    await sink_x.start()
    peer = Peer(
        R,
        partners=[
            Partner(E, sink_e.endpoint, (SECRET_R,)),
            Partner(X, sink_x.endpoint, (SECRET_X,)),
        ],
        handler=DemoHandler(),
        config=FAST,
    )
    try:
        async with aiohttp.ClientSession() as session, peer:
            e = RawAgent(session, E, sink_e.endpoint, SECRET_R, peer.endpoint, R)
            x = RawAgent(session, X, sink_x.endpoint, SECRET_X, peer.endpoint, R)
            rw = RequesterWorld(peer, e, x, sink_e, release, answers)
            peer.protocol.listeners.append(
                OnMessage(
                    lambda seen: (
                        rw.replies_in.append(seen.message) if seen.direction == "reply_in" else None
                    )
                )
            )
            yield rw
            release.set()
    finally:
        await sink_e.close()
        await sink_x.close()


async def test_a_callback_overtaking_the_confirm_counts_as_one() -> None:
    async with requester_world() as rw:
        handle = await rw.peer.submit(E, "echo", {"text": "x"}, task_id="t-race")
        await rw.sink_e.wait_for(lambda got: any(m["type"] == "p2p:task_request" for m in got))
        assert handle.state is TaskState.PENDING
        update = {"task_id": "t-race", "status": "executing", "progress": 50}
        reply = await rw.e.send("task_status_update", update)
        assert reply.status == 200 and reply.type == "p2p:ack" and reply.signed_with(SECRET_R)
        assert handle.state is TaskState.EXECUTING
        rw.release.set()
        await eventually(
            lambda: any(m.message_type.value == "p2p:task_confirm" for m in rw.replies_in)
        )
        assert handle.state is TaskState.EXECUTING  # never backwards to `confirmed`
        result = {"output_type": "text", "output": "x"}
        reply = await rw.e.send("task_complete", {"task_id": "t-race", "result": result})
        assert reply.status == 200 and reply.type == "p2p:task_ack", reply
        assert reply.payload == {"task_id": "t-race", "state": "completed"}
        outcome = await asyncio.wait_for(handle, 5)
        assert outcome.ok and outcome.result is not None and outcome.result.output == "x"


async def test_the_requester_refuses_callbacks_that_are_not_its_executors() -> None:
    async with requester_world() as rw:
        rw.release.set()
        handle = await rw.peer.submit(E, "echo", {"text": "x"}, task_id="t-mine")
        await eventually(lambda: handle.state is TaskState.CONFIRMED)
        update = {"task_id": "t-mine", "status": "executing"}
        cases = [
            (rw.e, "task_status_update", {**update, "task_id": "t-other"}, 404),  # unknown
            (rw.x, "task_status_update", update, 404),  # not party to it
            (rw.e, "task_cancel", {"task_id": "t-mine"}, 404),  # against the direction
            (rw.e, "task_info_provided", {"task_id": "t-mine", "fields": {}}, 404),
        ]
        for agent, type_, payload, status in cases:
            reply = await agent.send(type_, payload)
            check_nack(reply, status, "task_not_found", signed=True, secret=agent.secret)
        assert handle.state is TaskState.CONFIRMED
        result = {"output_type": "text", "output": "x"}
        done = await rw.e.send("task_complete", {"task_id": "t-mine", "result": result})
        assert done.status == 200 and done.type == "p2p:task_ack", done
        late = await rw.e.send("task_status_update", update)
        check_nack(late, 409, "task_already_completed", signed=True, secret=SECRET_R)
        assert (await asyncio.wait_for(handle, 5)).ok


async def test_the_requester_keeps_its_state_until_the_cancel_is_acknowledged() -> None:
    async with requester_world() as rw:
        rw.release.set()
        gate = asyncio.Event()

        async def held(message: dict[str, Any]) -> Answer:
            await asyncio.wait_for(gate.wait(), 5)
            return "task_ack", {"task_id": message["payload"]["task_id"], "state": "cancelled"}

        rw.answers["p2p:task_cancel"] = held
        handle = await rw.peer.submit(E, "slow", {}, task_id="t-held")
        await eventually(lambda: handle.state is TaskState.CONFIRMED)
        await handle.cancel("stop")
        await rw.sink_e.wait_for(lambda got: any(m["type"] == "p2p:task_cancel" for m in got))
        assert handle.state is TaskState.CONFIRMED
        gate.set()
        assert (await asyncio.wait_for(handle, 5)).state is TaskState.CANCELLED


async def test_a_cancel_answered_409_waits_for_the_final_callback_it_crossed() -> None:
    async with requester_world() as rw:
        rw.release.set()

        async def too_late(message: dict[str, Any]) -> Answer:
            nack = {
                "code": "task_already_completed",
                "message": "completed before the cancel arrived",
                "details": {"state": "completed"},
            }
            return "nack", nack, 409

        rw.answers["p2p:task_cancel"] = too_late
        handle = await rw.peer.submit(E, "slow", {}, task_id="t-crossed")
        update = {"task_id": "t-crossed", "status": "executing"}
        await eventually(lambda: handle.state is TaskState.CONFIRMED)
        assert (await rw.e.send("task_status_update", update)).status == 200
        await handle.cancel()
        await eventually(lambda: any(m.message_type.value == "p2p:nack" for m in rw.replies_in))
        assert handle.state is TaskState.EXECUTING  # not final yet: the result is on its way
        result = {"output_type": "text", "output": "finished anyway"}
        reply = await rw.e.send("task_complete", {"task_id": "t-crossed", "result": result})
        assert reply.status == 200 and reply.payload["state"] == "completed", reply
        outcome = await asyncio.wait_for(handle, 5)
        assert outcome.state is TaskState.COMPLETED and outcome.result is not None
        assert outcome.result.output == "finished anyway"
