"""Hypothesis against one lean-server connection, on a clock the test turns.

Any bytes, in any chunks (valid callback POSTs, fragments of heads, pipelined runs, random
bytes, a half-close, a client that stops reading its replies), go to a `CallbackConnection`
whose timers run on a fake clock. Whatever comes: no exception escapes (none from the
parser, none from a task it starts), the bytes it holds stay within its bound, and once
every timer has fired the connection has ended, closed or handed to aiohttp: no state
outlives its timeout.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import json
import os
from collections.abc import Callable
from typing import Any, cast

import pytest
from fuzzkit import COUNTS
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict

from synapse.p2p.dedup import StoredReply
from synapse.transport.guard import ConnectionGuard, HttpLimits
from synapse.transport.http1_server import MAX_HEAD, CallbackConnection, CallbackRoute

SCALE = float(os.environ.get("SYNAPSE_FUZZ_SCALE", "1"))
PATH = "/synapse/callback"
MAX_BODY = 256
LIMITS = HttpLimits(header_timeout=10.0, body_timeout=30.0, keepalive_timeout=75.0)


class FakeTimer:
    def __init__(self, when: float, callback: Callable[..., None], args: tuple[Any, ...]) -> None:
        self.when, self.callback, self.args = when, callback, args
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeClock:
    """The loop as the connection sees it: timers on a clock the test turns, tasks real."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.now = 0.0
        self._timers: list[tuple[float, int, FakeTimer]] = []
        self._seq = itertools.count()

    def time(self) -> float:
        return self.now

    def call_later(self, delay: float, callback: Callable[..., None], *args: Any) -> FakeTimer:
        timer = FakeTimer(self.now + delay, callback, args)
        heapq.heappush(self._timers, (timer.when, next(self._seq), timer))
        return timer

    def create_task(self, coro: Any) -> asyncio.Task[Any]:
        return self.loop.create_task(coro)

    def fire_next(self) -> bool:
        """Move the clock to the next live timer and run it; False if there is none."""
        while self._timers:
            when, _, timer = heapq.heappop(self._timers)
            if timer.cancelled:
                continue
            self.now = max(self.now, when)
            timer.callback(*timer.args)
            return True
        return False


class Transport:
    def __init__(self) -> None:
        self.written = bytearray()
        self.closed = False
        self.reading = True
        self.eof_written = False
        self.protocol: Any = None

    def write(self, data: bytes) -> None:
        assert not self.closed and not self.eof_written, "written after close"
        self.written += data

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof_written = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def set_protocol(self, protocol: Any) -> None:
        self.protocol = protocol

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


class Fallback(asyncio.Protocol):
    def data_received(self, data: bytes) -> None:
        pass


def post(body: bytes, *extra: bytes) -> bytes:
    head = b"POST " + PATH.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n" % len(body)
    return head + b"".join(h + b"\r\n" for h in extra) + b"\r\n" + body


FRAGMENTS = [
    post(b"{}"),
    post(b'{"a":1}', b"Connection: close"),
    post(b"{}") * 40,
    post(b"{}") * 400,  # past what one connection may hold
    post(b"x" * MAX_BODY),
    post(b"{}")[:20],
    post(b"{}")[:-1],
    b"POST " + PATH.encode() + b" HTTP/1.1\r\n",
    b"Host: x\r\n",
    b"Content-Length: 2\r\n",
    b"Content-Length: " + b"9" * 5000 + b"\r\n",
    b"Transfer-Encoding: chunked\r\n",
    b"Expect: 100-continue\r\n",
    b"Connection: upgrade\r\nUpgrade: h2c\r\n",
    b"X-Long: " + b"v" * 9000 + b"\r\n",
    b"\r\n",
    b"\r\n\r\n",
    b"\n",
    b"\r",
    b"{}",
    b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n",
    b"\x16\x03\x01\x00\xa5\x01",
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
]

#: What a client does next: send bytes, half-close, stop or start reading its replies.
steps = st.one_of(
    st.sampled_from([*FRAGMENTS, "eof", "pause writing", "resume writing"]),
    st.binary(max_size=64),
)


def refusal(status: int, message: str, details: dict[str, Any]) -> bytes:
    return json.dumps({"status": status, **details}).encode()


@pytest.mark.slow
@settings(
    max_examples=int(400 * SCALE),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(st.lists(steps, max_size=12), st.integers(min_value=1, max_value=4097))
# What an attack run found: a head behind a request, a Content-Length of 5,000 digits
# behind one, pipelining past the bound while the replies are not read.
@example([post(b"{}"), post(b"{}")[:20]], 97)
@example([post(b"{}"), FRAGMENTS[1][:60], b"Content-Length: " + b"9" * 5000 + b"\r\n\r\n"], 4097)
@example(["pause writing", post(b"{}") * 400], 4097)
@example([post(b"{}") * 400], 4097)
def test_no_exception_escapes_and_no_connection_outlives_its_timeouts(
    script: list[bytes | str], chunk: int
) -> None:
    COUNTS["lean connection: scripted clients"] += 1

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        errors: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda _loop, context: errors.append(context))
        clock = FakeClock(loop)
        served: list[bytes] = []

        async def answer(body: bytes, headers: CIMultiDict[str], transport: Any) -> StoredReply:
            served.append(body)
            return StoredReply.of(200, b'{"ok":true}', {"Content-Type": "application/json"})

        route = CallbackRoute(
            PATH,
            answer,
            max_body=MAX_BODY,
            limits=LIMITS,
            timeout_reply=lambda: StoredReply.of(408, b"{}", {}),
        )
        guard = ConnectionGuard(LIMITS, refusal)
        transport = Transport()
        conn = CallbackConnection(route, guard, Fallback, cast(Any, clock))
        conn.connection_made(cast(asyncio.Transport, transport))

        async def settle() -> None:
            for _ in range(20):
                await asyncio.sleep(0)

        def gone() -> bool:
            return transport.closed or transport.protocol is not None

        for step in script:
            if gone():
                break
            if step == "eof":
                if not conn.eof_received():
                    transport.close()
            elif step == "pause writing":
                conn.pause_writing()
            elif step == "resume writing":
                conn.resume_writing()
            else:
                assert isinstance(step, bytes)
                for start in range(0, len(step), chunk):
                    if gone():
                        break
                    if transport.reading:
                        conn.data_received(step[start : start + chunk])
                    await settle()
                    assert conn.held <= MAX_BODY + MAX_HEAD + chunk
            await settle()
        # The client does nothing more: every timer fires, in order.
        for _ in range(100):
            if gone():
                break
            if not clock.fire_next():
                await settle()
                if not clock.fire_next():
                    break
            await settle()
        assert gone(), "the connection outlived every timer"
        assert not errors, errors
        if transport.protocol is None:
            conn.connection_lost(None)
        assert guard.held == 0 and not guard.open

    asyncio.run(scenario())
