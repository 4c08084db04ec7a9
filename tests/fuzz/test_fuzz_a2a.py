"""Hypothesis against the live A2A JSON-RPC endpoint, as `test_fuzz_http` does for Synapse.

A real `Peer` with the A2A binding (demo handler, SQLite store) runs in a thread; requests
are JSON-RPC templates of every method, structurally mutated, byte-mutated, given I-JSON
violations (lone surrogates, duplicate names, non-finite numbers, huge integers) and deep
nesting. Every answer must be JSON-RPC, and never `-32603` (an internal error) for bad input;
a refused request must leave no task behind, in the engine or in the binding. The number of
inputs tried is reported at the end of the session.
"""

from __future__ import annotations

import http.client
import json
import os
from pathlib import Path
from typing import Any

import pytest
from fuzzkit import COUNTS, PATH, SECRET, E, LivePeer, R, byte_mutated, encode, mutated
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from synapse.a2a import enable_a2a
from synapse.demo.handler import DemoHandler
from synapse.p2p.config import P2PConfig
from synapse.store import SqliteStore
from synapse.transport.partners import Partner
from synapse.transport.peer import Peer

pytestmark = pytest.mark.slow

SCALE = float(os.environ.get("SYNAPSE_FUZZ_SCALE", "1"))
RPC = settings(
    max_examples=int(300 * SCALE),
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
HEADERS = {"Content-Type": "application/json", "A2A-Version": "1.0"}


class LiveA2A(LivePeer):
    """`LivePeer` with the A2A binding on `/a2a`; tasks are the demo's (echo by default)."""

    async def _start(self) -> None:
        await super()._start()
        assert self.peer is not None
        await self.peer.close(drain_timeout=0)  # replaced by one with the binding
        self.peer = Peer(
            E,
            partners=[Partner(R, self.r_endpoint, (SECRET,))],
            handler=DemoHandler(),
            config=P2PConfig(max_concurrent_tasks=10_000),
            store=SqliteStore(Path(self._dir.name) / "a2a.sqlite"),
        )
        enable_a2a(self.peer, default_task_type="echo")
        await self.peer.start()
        self.port = self.peer.port

    def seed_tasks(self) -> None:
        pass

    def rpc(self, body: bytes) -> tuple[int, dict[str, Any]]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request("POST", "/a2a", body=body, headers=HEADERS)
            response = conn.getresponse()
            data = response.read()
        finally:
            conn.close()
        value = json.loads(data)
        assert isinstance(value, dict) and value.get("jsonrpc") == "2.0", data[:300]
        return response.status, value

    def footprint(self) -> tuple[frozenset[str], frozenset[str]]:
        async def read() -> tuple[frozenset[str], frozenset[str]]:
            assert self.peer is not None
            # Every task the peer knows, in memory or in the store: a finished task leaving
            # memory (its last callback answered) is no change.
            known = frozenset(self.peer.protocol.list_tasks())
            binding = self._binding()
            return known, frozenset(binding.tasks)

        return self.call(read())

    def _binding(self) -> Any:
        assert self.peer is not None
        sink = self.peer.protocol._local_senders
        return next(iter(sink.values())).server


@pytest.fixture(scope="module")
def live_a2a() -> Any:
    peer = LiveA2A()
    peer.start()
    yield peer
    peer.stop()


def message(parts: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"messageId": "m-1", "role": "ROLE_USER", "parts": parts, **extra}


TEMPLATES: list[dict[str, Any]] = [
    {
        "method": "SendMessage",
        "params": {
            "message": message([{"text": "hello"}]),
            "configuration": {"returnImmediately": True},
        },
    },
    {
        "method": "SendMessage",
        "params": {
            "message": message([{"data": {"text": "x"}}], metadata={"task_type": "echo"}),
            "configuration": {"returnImmediately": True, "historyLength": 2},
        },
    },
    {"method": "GetTask", "params": {"id": "no-such-task", "historyLength": 1}},
    {"method": "ListTasks", "params": {"pageSize": 5}},
    {"method": "CancelTask", "params": {"id": "no-such-task"}},
    {
        "method": "CreateTaskPushNotificationConfig",
        "params": {"taskId": "no-such-task", "url": "http://127.0.0.1:9/hooks/"},
    },
    {"method": "GetExtendedAgentCard", "params": {}},
]


def request(template: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": "req-1", **template}


def judged(live: LiveA2A, name: str, body: bytes) -> dict[str, Any]:
    COUNTS[f"live A2A: {name}"] += 1
    before = live.footprint()
    _, value = live.rpc(body)
    error = value.get("error")
    if error is None:
        event("result")
        return value
    event(f"error {error.get('code')}")
    assert error.get("code") != -32603, (error, body[:300])
    known, views = live.footprint()
    # No task and no view more: views only leave (a finished task's, with its task).
    assert known == before[0] and views <= before[1], (error, body[:300])
    return value


def _with(text: str, literal: str) -> bytes:
    return text.replace('"@@x@@"', literal, 1).encode()


@RPC
@given(template=st.sampled_from(TEMPLATES).flatmap(lambda t: mutated(request(t))))
def test_structurally_mutated_requests(live_a2a: LiveA2A, template: dict[str, Any]) -> None:
    judged(live_a2a, "structurally mutated", encode(template))


@RPC
@given(st.sampled_from(TEMPLATES).flatmap(lambda t: byte_mutated(encode(request(t)))))
def test_byte_mutated_requests(live_a2a: LiveA2A, body: bytes) -> None:
    judged(live_a2a, "byte mutated", body)


VIOLATIONS = st.sampled_from(
    [
        '"\\ud800"',
        '"a\\udfffb"',
        '"\\ud83d\\u0041"',
        "NaN",
        "Infinity",
        "-Infinity",
        "1e400",
        "9007199254740993",
        "-9007199254740993",
        "1" * 400,
    ]
)


@RPC
@given(
    template=st.sampled_from(TEMPLATES),
    violation=VIOLATIONS,
    where=st.sampled_from(["text", "metadata", "param"]),
)
def test_i_json_violations(
    live_a2a: LiveA2A, template: dict[str, Any], violation: str, where: str
) -> None:
    value = request(template)
    params = value["params"]
    if where == "text" and "message" in params:
        params["message"]["parts"] = [{"text": "@@x@@"}]
    elif where == "metadata" and "message" in params:
        params["message"]["metadata"] = {"v": "@@x@@"}
    else:
        params["extra"] = "@@x@@"
    answer = judged(live_a2a, "I-JSON violations", _with(json.dumps(value), violation))
    assert answer["error"]["code"] == -32700, answer


@RPC
@given(
    template=st.sampled_from(TEMPLATES),
    duplicate=st.sampled_from(['"method"', '"id"', '"params"', '"jsonrpc"']),
)
def test_duplicate_member_names(
    live_a2a: LiveA2A, template: dict[str, Any], duplicate: str
) -> None:
    text = json.dumps(request(template))
    body = text.replace(duplicate + ":", f"{duplicate}:null,{duplicate}:", 1).encode()
    answer = judged(live_a2a, "duplicate member names", body)
    assert answer["error"]["code"] == -32700, answer


@RPC
@given(
    template=st.sampled_from(TEMPLATES[:2]),
    depth=st.integers(100, 20_000),
    opener=st.sampled_from(["[", '{"a":']),
)
def test_deep_nesting(live_a2a: LiveA2A, template: dict[str, Any], depth: int, opener: str) -> None:
    value = request(template)
    value["params"]["message"]["metadata"] = {"deep": "@@x@@"}
    closer = "]" if opener == "[" else "}"
    body = _with(json.dumps(value), opener * depth + "1" + closer * depth)
    answer = judged(live_a2a, "deep nesting", body)
    if depth > 128:
        assert answer["error"]["code"] in (-32600, -32602), answer


def test_the_synapse_endpoint_answers_deep_nesting_with_400(live_a2a: LiveA2A) -> None:
    """Body-mode signatures canonicalize recursively: the parser's limit protects them too."""
    for depth in (129, 900, 1000, 50_000):
        nest = "[" * depth + "1" + "]" * depth
        body = (
            '{"version":"1.0","id":"msg-deep","type":"p2p:heartbeat","from":{"agent_id":"'
            + R
            + '","endpoint":"'
            + live_a2a.r_endpoint
            + '"},"to":{"agent_id":"'
            + E
            + '"},"timestamp":"2026-01-01T00:00:00Z","payload":{"status":"ok","active_tasks":0,'
            '"deep":' + nest + '},"signature":"sha256=00"}'
        ).encode()
        answer = live_a2a.post(body, {"Content-Type": "application/json"})
        assert answer.status == 400, answer
        assert json.loads(answer.body)["payload"]["code"] == "message_format_invalid"
    assert PATH == "/synapse/callback"
