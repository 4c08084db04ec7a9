"""What the fuzz tests share: seed envelopes, mutations, a live peer, and the input counter.

`LivePeer` runs a real `Peer` ("agent-e", SQLite store) on 127.0.0.1 in a thread with its own
event loop, so that hypothesis (synchronous) can POST to it with a plain keep-alive
`http.client` connection. Its handler never finishes a task and never calls back on its own:
every change of task state comes synchronously from a message the peer answered 200, so a
refused message can be checked to have changed nothing. The registered partner "agent-r",
whose identity the tests borrow, has a small sink on the same loop that acknowledges the
peer's callbacks and heartbeats, signed.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import http.client
import json
import tempfile
import threading
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web
from hypothesis import strategies as st

from synapse.demo.handler import DemoHandler
from synapse.p2p.config import P2PConfig
from synapse.p2p.engine import TaskKey
from synapse.runtime.handler import ExecutionContext
from synapse.store import SqliteStore
from synapse.transport.partners import Partner
from synapse.transport.peer import Peer
from synapse.types import (
    HTTP_STATUS,
    NACK_CODES,
    SIGNATURE_HEADER,
    ErrorCode,
    format_timestamp,
    header_signature,
    new_message_id,
    utc_now,
    verify_header_signature,
)

#: Inputs tried, per test (reported at the end of the session by conftest.py).
COUNTS: Counter[str] = Counter()

E, R = "agent-e", "agent-r"
SECRET = "fuzz-secret-0123456789abcdefghij"
PATH = "/synapse/callback"
EXAMPLES = Path(__file__).resolve().parents[2] / "specs" / "examples"
#: Types a partner may POST (requests and callbacks); the others are only replies.
POSTABLE = (
    "task_request",
    "task_cancel",
    "task_info_provided",
    "human_decision",
    "heartbeat",
    "capability_query",
    "task_status_update",
    "task_need_info",
    "task_need_human",
    "task_complete",
    "task_failed",
)
ALL_TYPES = tuple(sorted(p.stem for p in EXAMPLES.glob("*.json")))
#: Tasks that exist at the live peer before fuzzing starts (see `LivePeer.seed_tasks`).
TASK_IDS = ("fz-exec", "fz-info", "fz-cancelled", "fz-new")

T = TypeVar("T")


def example(name: str) -> dict[str, Any]:
    value: dict[str, Any] = json.loads((EXAMPLES / f"{name}.json").read_text())
    return value


def encode(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def sign(body: bytes, secret: str = SECRET) -> dict[str, str]:
    return {"Content-Type": "application/json", SIGNATURE_HEADER: header_signature(secret, body)}


# --- strategies ---------------------------------------------------------------------------------

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)  # beyond ±(2**53 - 1) too
    | st.floats(allow_nan=True, allow_infinity=True)  # NaN and ±Infinity are not I-JSON
    | st.text(max_size=40)
    | st.sampled_from(
        ["", "1.0", "2.0", "p2p:ack", "p2p:nope", "executing", "2026-01-01T00:00:00Z"]
    )
)
#: Any JSON value (and some values JSON has no business carrying).
json_values = st.recursive(
    _scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=12,
)


def nested(depth: int, leaf: Any = 0) -> Any:
    value = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"a": value}
    return value


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into `value` (keys and indexes), the root excluded."""
    found: list[tuple[Any, ...]] = []
    if isinstance(value, dict):
        for key, child in value.items():
            found.append((*prefix, key))
            found += paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            found.append((*prefix, index))
            found += paths(child, (*prefix, index))
    return found


def _parent(value: Any, path: tuple[Any, ...]) -> Any:
    for step in path[:-1]:
        value = value[step]
    return value


@st.composite
def mutated(draw: st.DrawFn, value: dict[str, Any]) -> dict[str, Any]:
    """`value` with one to three structural changes: a value replaced by any JSON value, a
    member removed or added, a value's type changed, a deep nest put somewhere."""
    value = copy.deepcopy(value)
    for _ in range(draw(st.integers(1, 3))):
        where = paths(value)
        kind = draw(st.sampled_from(["replace", "delete", "add", "retype", "nest"]))
        if not where or kind == "add":
            target = value
            if where:
                path = draw(st.sampled_from(where))
                candidate = _parent(value, path)[path[-1]]
                target = candidate if isinstance(candidate, dict) else value
            target[draw(st.text(max_size=10))] = draw(json_values)
            continue
        path = draw(st.sampled_from(where))
        parent = _parent(value, path)
        if kind == "delete":
            del parent[path[-1]]
        elif kind == "replace":
            parent[path[-1]] = draw(json_values)
        elif kind == "nest":
            parent[path[-1]] = nested(draw(st.integers(2, 200)), parent[path[-1]])
        else:
            old = parent[path[-1]]
            parent[path[-1]] = (
                str(old)
                if not isinstance(old, str)
                else draw(st.sampled_from([0, -1, 2**53, 1.5, True, None, [], {}]))
            )
    return value


@st.composite
def byte_mutated(draw: st.DrawFn, body: bytes) -> bytes:
    """`body` truncated, with bytes flipped, inserted or deleted, or a member duplicated."""
    data = bytearray(body)
    kind = draw(st.sampled_from(["truncate", "flip", "insert", "delete", "duplicate"]))
    if kind == "truncate":
        return bytes(data[: draw(st.integers(0, max(0, len(data) - 1)))])
    if kind == "duplicate":
        return bytes(data).replace(b'"id":', b'"id":"dup","id":', 1)
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, max(0, len(data) - 1)))
        if kind == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=4))
        elif data:
            del data[at]
    return bytes(data)


def fresh_envelope(mtype: str, payload: Any, r_endpoint: str) -> dict[str, Any]:
    """A new envelope from agent-r (at `r_endpoint`) to agent-e, stamped now."""
    return {
        "version": "1.0",
        "id": new_message_id(),
        "type": mtype if ":" in mtype else f"p2p:{mtype}",
        "from": {"agent_id": R, "endpoint": r_endpoint},
        "to": {"agent_id": E},
        "timestamp": format_timestamp(utc_now()),
        "payload": payload,
    }


def addressed(name: str, task_id: str, r_endpoint: str) -> dict[str, Any]:
    """The spec's example of `name`, re-addressed from agent-r to agent-e, fresh, about
    `task_id` (a reply type keeps its `reply_to`: it must be refused as a request)."""
    value = example(name)
    value.update(fresh_envelope(value["type"], value["payload"], r_endpoint))
    if name in POSTABLE:
        value.pop("reply_to", None)
    payload = value["payload"]
    if name == "task_request":
        payload["task"]["id"] = task_id
        payload["task"].pop("deadline", None)  # no timer may change state behind our back
    elif isinstance(payload, dict) and "task_id" in payload:
        payload["task_id"] = task_id
    return value


# --- judging answers ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def value(self) -> dict[str, Any]:
        value = json.loads(self.body)
        assert isinstance(value, dict), self.body[:200]
        return value


def check_answer(answer: Answer, *, sent_id: str | None = None) -> dict[str, Any]:
    """Every answer is an envelope: 200 with a signed reply, or a nack with a 4xx status."""
    assert answer.status == 200 or 400 <= answer.status < 500, answer
    assert answer.headers.get("Content-Type", "").startswith("application/json"), answer.headers
    value = answer.value
    assert value.get("version") == "1.0" and value.get("from", {}).get("agent_id") == E
    if answer.status == 200:
        assert value["type"] != "p2p:nack", answer
        assert value.get("reply_to") is not None
        assert verify_header_signature((SECRET,), answer.body, answer.headers[SIGNATURE_HEADER])
        return value
    assert value["type"] == "p2p:nack", answer
    code = ErrorCode(value["payload"]["code"])
    assert code in NACK_CODES
    expected = 413 if value["payload"].get("details", {}).get("reason") == "too_large" else None
    assert answer.status == (expected or HTTP_STATUS[code]), answer
    if answer.status == 403:
        assert SIGNATURE_HEADER not in answer.headers  # specs/protocol.md, 'Signatures'
    if sent_id is not None and value.get("reply_to") is not None:
        assert value["reply_to"] == sent_id
    return value


# --- the live peer ------------------------------------------------------------------------------


class Idle(DemoHandler):
    """The demo's validation; execution waits forever (until cancelled)."""

    async def execute_task(
        self, ctx: ExecutionContext, task_type: str, payload: dict[str, Any]
    ) -> Any:
        await asyncio.Event().wait()


Snapshot = tuple[tuple[str, str, int], ...]


class LivePeer:
    """A running `Peer` in a thread; `post` and `snapshot` are called from the test thread."""

    def __init__(self) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="synapse-fuzz-")
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.peer: Peer | None = None
        self._sink: web.AppRunner | None = None
        self._conn: http.client.HTTPConnection | None = None
        self.port = 0
        self.sink_port = 0

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self) -> None:
        self._thread.start()
        self.call(self._start())
        self.seed_tasks()

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post(PATH, self._acknowledge)
        self._sink = web.AppRunner(app, access_log=None)
        await self._sink.setup()
        site = web.TCPSite(self._sink, "127.0.0.1", 0)
        await site.start()
        self.sink_port = int(self._sink.addresses[0][1])
        self.peer = Peer(
            E,
            partners=[Partner(R, self.r_endpoint, (SECRET,))],
            handler=Idle(),
            config=P2PConfig(max_concurrent_tasks=10_000),
            store=SqliteStore(Path(self._dir.name) / "e.sqlite"),
        )
        await self.peer.start()
        self.port = self.peer.port

    @property
    def r_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.sink_port}{PATH}"

    async def _acknowledge(self, request: web.Request) -> web.Response:
        message = json.loads(await request.read())
        mtype, payload = message["type"], message["payload"]
        if mtype == "p2p:heartbeat":
            rtype, rpayload = mtype, {"status": "ok", "active_tasks": 0}
        elif mtype in ("p2p:task_complete", "p2p:task_failed"):
            state = "completed" if mtype == "p2p:task_complete" else "failed"
            rtype, rpayload = "p2p:task_ack", {"task_id": payload["task_id"], "state": state}
        else:
            rtype, rpayload = "p2p:ack", {}
        reply = self.envelope(rtype, rpayload, sender=(R, self.r_endpoint), to=E)
        reply["reply_to"] = message["id"]
        body = encode(reply)
        return web.Response(body=body, headers=sign(body))

    def stop(self) -> None:
        if self._conn is not None:
            self._conn.close()

        async def stop() -> None:
            if self.peer is not None:
                await self.peer.close(drain_timeout=0)
            if self._sink is not None:
                await self._sink.cleanup()

        with contextlib.suppress(Exception):
            self.call(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()
        self._dir.cleanup()

    # --- speaking as agent-r ---------------------------------------------------------------

    def envelope(
        self,
        mtype: str,
        payload: Any,
        *,
        sender: tuple[str, str] | None = None,
        to: str = E,
    ) -> dict[str, Any]:
        agent_id, endpoint = sender or (R, self.r_endpoint)
        return {
            "version": "1.0",
            "id": new_message_id(),
            "type": mtype if ":" in mtype else f"p2p:{mtype}",
            "from": {"agent_id": agent_id, "endpoint": endpoint},
            "to": {"agent_id": to},
            "timestamp": format_timestamp(utc_now()),
            "payload": payload,
        }

    def template(self, name: str, task_id: str = "fz-exec") -> dict[str, Any]:
        return addressed(name, task_id, self.r_endpoint)

    def post(self, body: bytes, headers: dict[str, str] | None = None) -> Answer:
        """POST on the kept-alive connection. Only a stale kept-alive connection is retried
        (on a new one): a new connection that breaks means the peer did not answer."""
        headers = {"Content-Type": "application/json", **(headers or {})}
        while True:
            conn, fresh = self._conn, self._conn is None
            if conn is None:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            self._conn = conn
            try:
                conn.request("POST", PATH, body=body, headers=headers)
                response = conn.getresponse()
                data = response.read()
            except (http.client.HTTPException, ConnectionError, TimeoutError):
                conn.close()
                self._conn = None
                if fresh:
                    raise
                continue
            if response.getheader("Connection", "").lower() == "close":
                conn.close()
                self._conn = None
            return Answer(response.status, dict(response.headers.items()), data)

    def post_value(self, value: Any) -> Answer:
        body = encode(value)
        return self.post(body, sign(body))

    def snapshot(self) -> Snapshot:
        """Every task, its state and the length of its history (read on the peer's loop)."""

        async def read() -> Snapshot:
            assert self.peer is not None
            protocol = self.peer.protocol
            rows = []
            for name in protocol.list_tasks():  # in flight, and finished ones in the store
                requester, _, task_id = name.partition("/")
                rec = protocol.engine.get(TaskKey(requester, task_id))
                assert rec is not None
                rows.append((name, rec.state.value, len(rec.history)))
            return tuple(sorted(rows))

        return self.call(read())

    def seed_tasks(self) -> None:
        """Tasks in several states for the fuzzed messages to be about."""
        slow = {"type": "slow", "payload": {"steps": 3}}
        for task_id, spec in (
            ("fz-exec", slow),
            ("fz-info", {"type": "text_generation", "payload": {"prompt": "p"}}),
            ("fz-cancelled", slow),
        ):
            task = {"id": task_id, "priority": "normal", **spec}
            answer = self.post_value(self.envelope("task_request", {"task": task}))
            assert answer.status == 200, answer
        answer = self.post_value(self.envelope("task_cancel", {"task_id": "fz-cancelled"}))
        assert answer.status == 200, answer


def draw_template(live: LivePeer, names: Sequence[str]) -> Callable[[st.DrawFn], dict[str, Any]]:
    def draw(d: st.DrawFn) -> dict[str, Any]:
        return live.template(d(st.sampled_from(list(names))), d(st.sampled_from(TASK_IDS)))

    return draw
