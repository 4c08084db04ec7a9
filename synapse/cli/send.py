"""`synapse send`: request one task and follow it to its end, asking a person when it must.

The task's events drive the conversation: progress becomes a bar (or plain lines), a
`task_need_info` asks for each missing field, a `task_need_human` asks approve or reject.
Answers come from flags (`--field`, `--approve` / `--reject`, `--notes`) when given, else from
stdin: typed at a terminal, or read line by line from a pipe. Ctrl-C (or SIGTERM) sends
`task_cancel` and waits for the acknowledgement or the final outcome; a second one gives up.

The conversation itself (questions, answers, Ctrl-C, the end) is `conversation.Conversation`,
shared with `send --a2a-agent` (`send_a2a.py`); this module feeds it a Synapse task's events.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable
from datetime import datetime
from typing import Any, TextIO

from synapse.cli.client import ClientSetup, exchange_error, refusal_line, start_peer
from synapse.cli.conversation import (
    CANCEL_WAIT,
    Conversation,
    SendOptions,
    interruptible,
    parse_payload,
    render_output,
    reported,
)
from synapse.cli.errors import CliError, Exit
from synapse.cli.terminal import LineReader, TerminalConsole
from synapse.p2p.durations import format_duration
from synapse.p2p.engine import TaskEvent
from synapse.runtime.protocol import Outcome, TaskAbandoned, TaskHandle, TaskUndeliverable
from synapse.runtime.sender import DeliveryError
from synapse.transport.peer import HttpSender, Peer
from synapse.types import (
    Message,
    TaskConfirm,
    TaskError,
    TaskNeedHuman,
    TaskNeedInfo,
    TaskRequest,
    TaskStatusUpdate,
)


class WatchingSender:
    """The peer's sender, noting when the `task_request` cannot be delivered at all."""

    def __init__(self, inner: HttpSender) -> None:
        self.inner = inner
        self.failed: asyncio.Future[DeliveryError] = asyncio.get_running_loop().create_future()

    async def send_callback(self, partner: str, message: Message, *, retry: bool = True) -> Message:
        try:
            return await self.inner.send_callback(partner, message, retry=retry)
        except DeliveryError as exc:
            if isinstance(message, TaskRequest) and not self.failed.done():
                self.failed.set_result(exc)
            raise


#: Events that do not mean the target took the request.
_NOT_ACCEPTED = frozenset({"undeliverable", "refused", "partner_unreachable", "partner_reachable"})


class Follower(Conversation[TaskHandle]):
    """Follows one Synapse task: its events, through the shared conversation."""

    def __init__(
        self,
        setup: ClientSetup,
        options: SendOptions,
        *,
        out: TextIO,
        console: TerminalConsole,
        reader: LineReader,
        interactive: bool,
    ) -> None:
        super().__init__(
            options,
            who=setup.target.agent_id,
            out=out,
            console=console,
            reader=reader,
            interactive=interactive,
        )
        self.setup = setup
        #: Said once the target accepted the request, not when it is queued.
        self._sent_note = ""
        #: When we last heard about the task (the requester's patience runs from there).
        self._last_word = time.time()

    def ended_future(self) -> Awaitable[Any] | None:
        return self._ended(self.handle) if self.handle is not None else None

    @staticmethod
    async def _ended(handle: TaskHandle) -> Outcome:
        try:
            return await handle.result()
        except (TaskAbandoned, TaskUndeliverable) as exc:  # the end too: `run` reports it
            return exc.outcome

    def is_final(self) -> bool:
        return self.handle is not None and self.handle.state.is_final

    # --- the task ----------------------------------------------------------------------------

    async def run(self, peer: Peer, watch: WatchingSender) -> int:
        opts = self.options
        handle = self.handle = await peer.submit(
            self.setup.target.agent_id,
            opts.task_type,
            opts.payload,
            task_id=opts.task_id,
            priority=opts.priority,
            deadline=opts.deadline,
        )
        self._sent_note = f"→ {opts.task_type} task {handle.task_id} sent to {self.setup.where}"
        self.emit(
            "submitted",
            task_id=handle.task_id,
            task_type=opts.task_type,
            target=self.setup.target.agent_id,
        )

        def check() -> None:
            if watch.failed.done() and not handle.state.is_final:
                raise exchange_error(watch.failed.result(), self.setup)

        following = self.follow(handle.events(), self.on_event, wake=watch.failed, check=check)
        if opts.timeout is None:
            await following
        else:
            try:
                await asyncio.wait_for(following, opts.timeout)
            except TimeoutError:
                await self.gave_up_waiting(handle, opts.timeout)
        try:
            return self.finish(await handle.result())
        except TaskAbandoned as exc:  # we gave up on a silent executor, or it lost the task
            return self.finish(exc.outcome)
        except TaskUndeliverable as exc:  # the request never reached the target
            failure: Exception = watch.failed.result() if watch.failed.done() else exc
            raise exchange_error(failure, self.setup) from exc

    async def gave_up_waiting(self, handle: TaskHandle, timeout: float) -> None:
        """`--timeout` passed: cancel the task, wait a moment for the answer, say so."""
        waited = format_duration(timeout)
        await self.cancel(f"no outcome within {waited} (--timeout)")
        with contextlib.suppress(TimeoutError, TaskAbandoned):
            await handle.result(min(CANCEL_WAIT, 5.0))
        self.console.close()
        state = handle.state.value
        raise CliError(
            f"timed out after {waited} waiting for task {handle.task_id}: cancel sent "
            f"(now {state})",
            Exit.TASK_UNSUCCESSFUL,
        )

    def _waiting_note(self) -> str:
        """What `send` waits for once the executor is silent, and until when."""
        cfg = self.setup.config
        patience = cfg.task_timeout + cfg.missed_heartbeat_limit * cfg.heartbeat_interval
        until = datetime.fromtimestamp(self._last_word + patience).strftime("%H:%M:%S")
        bound = (
            f"--timeout {format_duration(self.options.timeout)} first, "
            if self.options.timeout is not None
            else ""
        )
        return (
            f"! {self.who} stopped answering heartbeats; waiting for word about the task "
            f"until {until} (its task_timeout {format_duration(cfg.task_timeout)} plus the "
            f"heartbeat-loss time), then giving up ({bound}Ctrl-C cancels now)"
        )

    async def on_event(self, event: TaskEvent) -> bool:
        message = event.message
        payload = message.payload if message is not None else None
        if message is not None:
            self._last_word = time.time()
        if self._sent_note and message is not None and event.kind not in _NOT_ACCEPTED:
            # Sent means the target took it: its reply (or a callback that overtook it).
            self.console.note(self._sent_note)
            self._sent_note = ""
        self.emit(
            event.kind.removeprefix("p2p:"),
            task_id=event.key.task_id,
            state=event.state,
            **({"payload": payload} if payload is not None else {}),
            **({"detail": event.detail} if event.detail else {}),
        )
        if event.kind == "undeliverable":
            if isinstance(message, TaskRequest):
                raise CliError(f"cannot reach {self.setup.where}: {event.detail}")
            self.console.note(f"! cannot reach {self.setup.where} for now; still trying")
        elif event.kind == "refused" and not event.state.is_final:
            self.console.note(f"! {self.who} refused a message: {event.detail}")
        elif event.kind == "partner_unreachable":
            self.console.note(self._waiting_note())
        elif event.kind == "partner_reachable":
            self.console.note(f"{self.who} answers again")
        elif isinstance(message, TaskConfirm):
            eta = message.payload.estimated_duration
            self.console.note("✓ confirmed" + (f" (about {eta} s)" if eta else ""))
        elif isinstance(message, TaskStatusUpdate):
            status = message.payload
            if status.progress is None:
                self.console.note(status.message or status.status.value)
            else:
                self.console.progress(status.progress, status.message)
        elif isinstance(message, TaskNeedInfo) and not self.cancel_sent:
            await self.need_info(message.payload)
        elif isinstance(message, TaskNeedHuman) and not self.cancel_sent:
            await self.need_human(message.payload)
        return event.state.is_final

    # --- the end -----------------------------------------------------------------------------

    def finish(self, outcome: Outcome) -> int:
        error = outcome.error
        if outcome.reject is not None:
            reason = outcome.reject.reason
            error = TaskError(code=reason.code, message=reason.message)
        refusal = outcome.refusal
        return self.conclude(
            outcome.state,
            outcome_fields(outcome),
            result=outcome.result,
            error=error,
            refusal=refusal_line(refusal.code, refusal.message) if refusal is not None else None,
        )


def outcome_fields(outcome: Outcome) -> dict[str, Any]:
    fields: dict[str, Any] = {"state": outcome.state}
    for name in ("result", "error", "reject", "refusal"):
        value = getattr(outcome, name)
        if value is not None:
            fields[name] = value
    return fields


async def run_send(
    setup: ClientSetup,
    options: SendOptions,
    *,
    out: TextIO,
    err: TextIO,
    reader: LineReader | None = None,
    stdin_is_tty: bool | None = None,
) -> int:
    interactive = os.isatty(0) if stdin_is_tty is None else stdin_is_tty
    console = TerminalConsole(err, quiet=options.as_json)
    line_reader = reader or LineReader(0)
    follower = Follower(
        setup,
        options,
        out=out,
        console=console,
        reader=line_reader,
        interactive=interactive,
    )
    with interruptible(follower):
        peer = setup.peer(serve=True)
        await start_peer(peer, setup.listen)
        watch = WatchingSender(HttpSender(peer.client, peer.partners, setup.signing))
        peer.protocol.set_callback_sender(watch)
        try:
            return await reported(follower, follower.run(peer, watch))
        finally:
            console.close()
            await peer.close(drain_timeout=0)  # at the end nothing is left worth waiting for
            if reader is None:
                line_reader.close()  # its thread ends before stdin could be reused


__all__ = [
    "CANCEL_WAIT",
    "Follower",
    "SendOptions",
    "WatchingSender",
    "parse_payload",
    "render_output",
    "run_send",
]
