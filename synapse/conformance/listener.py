"""The kit's callback endpoint: receives what the target POSTs back, judges it, answers it.

It plays a well-behaved requester: a callback about one of the kit's tasks is acknowledged
(`ack`, or `task_ack` with the kit's state for `task_complete` / `task_failed`), signed in
header mode; a retry gets the stored reply again. It is lenient where a real peer would refuse
(a badly signed callback is still recorded and acknowledged) so that one fault shows up in the
check about it rather than as time-outs everywhere, but every problem is recorded for the
`callbacks.*` and `rules.*` checks: bad or missing signatures, stale timestamps, wrong sender,
recipient or endpoint, malformed envelopes, callbacks for tasks the kit never asked for,
callbacks after a final state, and two callbacks of one task in flight at once.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from synapse.conformance.rules import CALLBACK_STATES, Observation
from synapse.conformance.wire import (
    CheckFailed,
    Clock,
    Identity,
    fingerprint,
    is_target_endpoint,
    short,
    verify_callback,
)
from synapse.logs import get_logger
from synapse.types import (
    EXECUTOR_TO_REQUESTER,
    SIGNATURE_HEADER,
    Ack,
    AckPayload,
    CapabilityQuery,
    CapabilityResponse,
    CapabilityResponsePayload,
    Heartbeat,
    HeartbeatPayload,
    Message,
    Nack,
    NackPayload,
    RemoteProtocolError,
    Sender,
    TaskAck,
    TaskAckPayload,
    TaskState,
    build_message_now,
    decode_message,
    encode_message,
    header_signature,
    parse_i_json,
)

log = get_logger("synapse.conformance")

CALLBACK_PATH = "/synapse/callback"
#: Largest callback body accepted (the default limit of specs/protocol.md, 'Transport').
MAX_BODY = 1024 * 1024


@dataclass(frozen=True)
class Callback:
    """One callback the target POSTed about one of the kit's tasks (retries not repeated)."""

    at: int
    message: Message
    value: dict[str, Any]
    #: "header" or "body"; None when the signature did not verify.
    signed_by: str | None

    @property
    def type(self) -> str:
        return self.message.message_type.value

    @property
    def payload(self) -> dict[str, Any]:
        payload = self.value.get("payload")
        return payload if isinstance(payload, dict) else {}

    @property
    def state(self) -> str | None:
        """The executor's state this callback tells."""
        if self.type == "p2p:task_status_update":
            status = self.payload.get("status")
            return status if isinstance(status, str) else None
        return CALLBACK_STATES.get(self.type)

    def describe(self) -> str:
        text = self.type.removeprefix("p2p:")
        if self.type == "p2p:task_status_update":
            text += f"{{status={self.payload.get('status')}"
            if self.payload.get("progress") is not None:
                text += f", progress={self.payload.get('progress')}"
            text += "}"
        elif self.type == "p2p:task_failed":
            error = self.payload.get("error")
            if isinstance(error, dict):
                text += f"{{{error.get('code')}}}"
        return text


@dataclass
class TaskTrace:
    """Everything the kit saw about one of its tasks."""

    task_id: str
    callbacks: list[Callback] = field(default_factory=list)
    observations: list[Observation] = field(default_factory=list)
    #: Callbacks that arrived once the task was final at the kit, as (arrived_at, description).
    late: list[tuple[int, str]] = field(default_factory=list)
    #: When the kit learnt the task is final (event clock), if it did.
    final_at: int | None = None
    cursor: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def observe(
        self, state: str, start: int, end: int, source: str, *, by_requester: bool = False
    ) -> None:
        self.observations.append(Observation(state, start, end, source, by_requester))

    def finalize(self, at: int) -> None:
        if self.final_at is None:
            self.final_at = at

    def describe(self) -> str:
        seen = ", ".join(cb.describe() for cb in self.callbacks) or "none"
        return f"callbacks so far: {seen}"

    async def next(self, timeout: float, expecting: str = "a callback") -> Callback:
        """The next callback after the cursor (waiting up to `timeout` s for it)."""
        deadline = time.monotonic() + timeout
        while self.cursor >= len(self.callbacks):
            self.changed.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CheckFailed(
                    f"task {self.task_id}: no {expecting} within {timeout:g} s ({self.describe()})"
                )
            try:
                await asyncio.wait_for(self.changed.wait(), remaining)
            except TimeoutError:
                continue
        callback = self.callbacks[self.cursor]
        self.cursor += 1
        return callback

    async def expect(self, type_: str, timeout: float, *, status: str | None = None) -> Callback:
        """The next callback, which must be `type_` (and, for a status update, `status`)."""
        want = type_ if ":" in type_ else f"p2p:{type_}"
        expecting = want.removeprefix("p2p:") + (f"{{status={status}}}" if status else "")
        callback = await self.next(timeout, expecting)
        if callback.type != want or (status is not None and callback.state != status):
            raise CheckFailed(
                f"task {self.task_id}: expected {expecting}, got {callback.describe()} "
                f"({self.describe()})"
            )
        return callback

    async def until(self, type_: str, timeout: float, *, skip: tuple[str, ...]) -> Callback:
        """Skip callbacks of the `skip` types up to one of `type_`; anything else fails."""
        want = type_ if ":" in type_ else f"p2p:{type_}"
        skipped = {s if ":" in s else f"p2p:{s}" for s in skip}
        deadline = time.monotonic() + timeout
        while True:
            remaining = max(0.0, deadline - time.monotonic())
            callback = await self.next(remaining, want.removeprefix("p2p:"))
            if callback.type == want:
                return callback
            if callback.type not in skipped:
                raise CheckFailed(
                    f"task {self.task_id}: expected {want.removeprefix('p2p:')}, got "
                    f"{callback.describe()} ({self.describe()})"
                )

    async def quiet(self, seconds: float) -> None:
        """Wait `seconds`, then fail if a callback came once the task was final at the kit
        (after its final callback, its `task_reject` or its cancel's `task_ack`)."""
        await asyncio.sleep(seconds)
        if self.late:
            late = ", ".join(what for _, what in self.late)
            raise CheckFailed(f"task {self.task_id}: callbacks after its final state: {late}")

    def count(self, type_: str) -> int:
        want = type_ if ":" in type_ else f"p2p:{type_}"
        late = sum(1 for _, what in self.late if what.startswith(want.removeprefix("p2p:")))
        return sum(1 for cb in self.callbacks if cb.type == want) + late


@dataclass(frozen=True)
class _Stored:
    fingerprint: str
    status: int
    body: bytes
    headers: dict[str, str]


class CallbackListener:
    """An aiohttp server on `host:port` receiving the target's callbacks for the kit."""

    def __init__(
        self,
        identity: Identity,
        clock: Clock,
        *,
        replay_window: float = 300.0,
        ack_delay: float = 0.0,
    ) -> None:
        self.identity = identity
        self.clock = clock
        self.replay_window = replay_window
        self.ack_delay = ack_delay
        self.traces: dict[str, TaskTrace] = {}
        #: Problems with callbacks' envelopes and authentication (specs/protocol.md, 'Signatures'
        #: and 'Transport').
        self.problems: list[str] = []
        #: Callbacks about tasks the kit never requested.
        self.strays: list[str] = []
        #: Two callbacks of one task in flight at once (specs/protocol.md, 'Transport': one at a
        #: time).
        self.overlaps: list[str] = []
        #: Every POST received, retries included.
        self.posts = 0
        self._in_flight: dict[str, tuple[str, str]] = {}
        self._replies: dict[str, _Stored] = {}
        self._runner: web.AppRunner | None = None

    @property
    def sender(self) -> Sender:
        return Sender(agent_id=self.identity.kit_id, endpoint=self.identity.kit_endpoint)

    def trace(self, task_id: str) -> TaskTrace:
        """The trace of a task the kit is about to request (callbacks for it are expected)."""
        trace = self.traces.get(task_id)
        if trace is None:
            trace = self.traces[task_id] = TaskTrace(task_id)
        return trace

    async def start(self, host: str, port: int) -> int:
        """Listen on `host:port`; return the port (useful when `port` is 0)."""
        app = web.Application(client_max_size=MAX_BODY + 1024)
        app.router.add_post(CALLBACK_PATH, self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, reuse_address=True)
        await site.start()
        addresses = self._runner.addresses
        return int(addresses[0][1]) if addresses else port

    async def close(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    # --- one callback -------------------------------------------------------------------------

    def _reply(
        self, message: Message, status: int = 200, *, signed: bool = True
    ) -> tuple[int, bytes, dict[str, str]]:
        body = encode_message(message)
        headers = {"Content-Type": "application/json"}
        if signed:
            headers[SIGNATURE_HEADER] = header_signature(self.identity.secret, body)
        return status, body, headers

    def _nack(
        self,
        status: int,
        code: str,
        text: str,
        *,
        reply_to: str | None,
        signed: bool,
        details: dict[str, Any] | None = None,
    ) -> tuple[int, bytes, dict[str, str]]:
        nack = build_message_now(
            Nack,
            NackPayload(code=code, message=text, details=details),
            sender=self.sender,
            to=self.identity.target_id,
            reply_to=reply_to,
        )
        return self._reply(nack, status, signed=signed)

    def _refuse(
        self, status: int, code: str, text: str, message: Message, details: dict[str, Any]
    ) -> tuple[int, bytes, dict[str, str]]:
        """A signed nack answering `message` (the kit has verified who sent it)."""
        return self._nack(status, code, text, reply_to=message.id, signed=True, details=details)

    async def _handle(self, request: web.Request) -> web.Response:
        self.posts += 1
        at = self.clock.tick()
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            self.problems.append("a callback body exceeds 1 MiB")
            status, reply, headers = self._nack(
                413, "message_format_invalid", "too large", reply_to=None, signed=False
            )
            return web.Response(status=status, body=reply, headers=headers)
        status, reply, headers = await self._answer(body, request.headers.get(SIGNATURE_HEADER), at)
        return web.Response(status=status, body=reply, headers=headers)

    async def _answer(
        self, body: bytes, header: str | None, at: int
    ) -> tuple[int, bytes, dict[str, str]]:
        me = self.identity
        try:
            value = parse_i_json(body)
            message = decode_message(body)
        except RemoteProtocolError as exc:
            self.problems.append(
                f"a callback is not a valid envelope: {exc.message} ({short(body)})"
            )
            code = exc.code.value
            return self._nack(400, code, exc.message, reply_to=None, signed=False)
        assert isinstance(value, dict)
        label = f"{message.message_type.value.removeprefix('p2p:')} {message.id}"
        if message.from_.agent_id != me.target_id:
            self.problems.append(f"{label}: from unknown agent {message.from_.agent_id!r}")
            return self._nack(
                403, "permission_denied", "unknown partner", reply_to=message.id, signed=False
            )
        # Judged like a peer would, but recorded rather than refused (see the module doc).
        signed_by = verify_callback(me, body, value, header)
        if signed_by is None:
            how = (
                "bad header signature"
                if header
                else ("bad body signature" if value.get("signature") is not None else "unsigned")
            )
            self.problems.append(f"{label}: {how}")
        age = (datetime.now(UTC) - message.timestamp).total_seconds()
        if abs(age) > self.replay_window:
            self.problems.append(f"{label}: timestamp {age:+.0f} s off the kit's clock")
        if message.to.agent_id != me.kit_id:
            self.problems.append(f"{label}: addressed to {message.to.agent_id!r}")
        if not is_target_endpoint(me, message.from_.endpoint):
            self.problems.append(
                f"{label}: from.endpoint {message.from_.endpoint!r} is not the target's "
                f"{me.target_url!r}"
            )
        if message.reply_to is not None:
            self.problems.append(f"{label}: a POSTed message carries reply_to")
        stored = self._replies.get(message.id)
        print_ = fingerprint(value)
        if stored is not None:
            if stored.fingerprint == print_:
                return stored.status, stored.body, stored.headers
            self.problems.append(f"{label}: message id reused for another message")
            return self._refuse(
                400, "invalid_params", "message id reused", message, {"reason": "id_reused"}
            )
        status, reply, headers = await self._dispatch(message, value, signed_by, at, label)
        if status < 500 and status != 429:
            self._replies[message.id] = _Stored(print_, status, reply, headers)
        return status, reply, headers

    async def _dispatch(
        self, message: Message, value: dict[str, Any], signed_by: str | None, at: int, label: str
    ) -> tuple[int, bytes, dict[str, str]]:
        if isinstance(message, Heartbeat):
            beat = build_message_now(
                Heartbeat,
                HeartbeatPayload(active_tasks=0),
                sender=self.sender,
                to=self.identity.target_id,
                reply_to=message.id,
            )
            return self._reply(beat)
        if isinstance(message, CapabilityQuery):
            response = build_message_now(
                CapabilityResponse,
                CapabilityResponsePayload(agent_id=self.identity.kit_id),
                sender=self.sender,
                to=self.identity.target_id,
                reply_to=message.id,
            )
            return self._reply(response)
        if message.message_type not in EXECUTOR_TO_REQUESTER:
            self.problems.append(f"{label}: not a callback an executor sends")
            reason = "reply_only_type" if message.reply_to is None else "reply_to_on_request"
            return self._refuse(
                400,
                "invalid_params",
                f"{message.message_type.value} is not a callback",
                message,
                {"reason": reason},
            )
        task_id = getattr(message.payload, "task_id", "")
        trace = self.traces.get(task_id)
        if trace is None:
            self.strays.append(f"{label} for task {task_id!r}, which the kit never requested")
            return self._refuse(
                404, "task_not_found", f"unknown task {task_id!r}", message, {"task_id": task_id}
            )
        callback = Callback(at, message, value, signed_by)
        if trace.final_at is not None and at > trace.final_at:
            trace.late.append((at, callback.describe()))
            trace.changed.set()
            return self._refuse(
                409,
                "task_already_completed",
                f"task {task_id!r} is already final",
                message,
                {"task_id": task_id},
            )
        other = self._in_flight.get(task_id)
        if other is not None:
            self.overlaps.append(
                f"task {task_id}: {callback.describe()} arrived while {other[1]} was still "
                "unacknowledged"
            )
        self._in_flight[task_id] = (message.id, callback.describe())
        try:
            trace.callbacks.append(callback)
            state = callback.state
            if state is not None:
                trace.observe(state, at, at, callback.describe())
            reply: Message
            if message.message_type.value in ("p2p:task_complete", "p2p:task_failed"):
                trace.finalize(at)
                kit_state = (
                    TaskState.COMPLETED
                    if message.message_type.value == "p2p:task_complete"
                    else TaskState.FAILED
                )
                reply = build_message_now(
                    TaskAck,
                    TaskAckPayload(task_id=task_id, state=kit_state),
                    sender=self.sender,
                    to=self.identity.target_id,
                    reply_to=message.id,
                )
            else:
                reply = build_message_now(
                    Ack,
                    AckPayload(),
                    sender=self.sender,
                    to=self.identity.target_id,
                    reply_to=message.id,
                )
            trace.changed.set()
            if self.ack_delay:
                await asyncio.sleep(self.ack_delay)
            return self._reply(reply)
        finally:
            if self._in_flight.get(task_id, ("", ""))[0] == message.id:
                del self._in_flight[task_id]


__all__ = ["CALLBACK_PATH", "Callback", "CallbackListener", "TaskTrace"]
