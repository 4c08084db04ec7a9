"""`synapse send`: request one task and follow it to its end, asking a person when it must.

The task's events drive the conversation: progress becomes a bar (or plain lines), a
`task_need_info` asks for each missing field, a `task_need_human` asks approve or reject.
Answers come from flags (`--field`, `--approve` / `--reject`, `--notes`) when given, else from
stdin: typed at a terminal, or read line by line from a pipe. Ctrl-C (or SIGTERM) sends
`task_cancel` and waits for the acknowledgement or the final outcome; a second one gives up.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import signal
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TextIO, TypeVar

from synapse.cli.client import ClientSetup, exchange_error, refusal_line, start_peer, to_json
from synapse.cli.errors import CliError, Exit
from synapse.cli.terminal import Console, LineReader, parse_value
from synapse.p2p.engine import TaskEvent
from synapse.p2p.protocol import Outcome, TaskHandle
from synapse.p2p.sender import DeliveryError
from synapse.transport.peer import HttpSender, Peer
from synapse.types import (
    Message,
    MissingField,
    Priority,
    TaskConfirm,
    TaskNeedHuman,
    TaskNeedHumanPayload,
    TaskNeedInfo,
    TaskNeedInfoPayload,
    TaskRequest,
    TaskState,
    TaskStatusUpdate,
)

T = TypeVar("T")

#: How long to wait for the end of a task once its cancel was sent.
CANCEL_WAIT = 15.0


@dataclass(frozen=True, slots=True)
class SendOptions:
    task_type: str
    payload: dict[str, Any]
    task_id: str | None = None
    priority: Priority = Priority.NORMAL
    fields: Mapping[str, Any] = field(default_factory=dict)
    decision: Literal["approve", "reject"] | None = None
    notes: str = ""
    as_json: bool = False


def parse_payload(text: str) -> dict[str, Any]:
    """PAYLOAD_JSON: a JSON object (I-JSON: no NaN or Infinity)."""

    def refuse_constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    try:
        value = json.loads(text, parse_constant=refuse_constant)
    except ValueError as exc:
        raise CliError(f"bad PAYLOAD_JSON {text!r}: {exc}") from exc
    if not isinstance(value, dict):
        raise CliError(f'bad PAYLOAD_JSON {text!r}: expected a JSON object like {{"text": "hi"}}')
    return value


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


class NoAnswer(Exception):
    """stdin closed while an answer was needed."""


class Follower:
    """Follows one task: renders its events and answers its questions."""

    def __init__(
        self,
        setup: ClientSetup,
        options: SendOptions,
        *,
        out: TextIO,
        console: Console,
        reader: LineReader,
        interactive: bool,
    ) -> None:
        self.setup = setup
        self.options = options
        self.out = out
        self.console = console
        self.reader = reader
        self.interactive = interactive
        self.interrupted = asyncio.Event()
        self.interrupts = 0
        self.handle: TaskHandle | None = None
        self.cancel_sent = False
        #: An error to report once the task has ended (we cancelled it because of it).
        self.pending_error: CliError | None = None
        #: True once the outcome was emitted.
        self.ended = False

    # --- output ----------------------------------------------------------------------------

    def emit(self, event: str, **fields: Any) -> None:
        if self.options.as_json:
            self.out.write(to_json({"event": event, **fields}) + "\n")
            self.out.flush()

    # --- signals ---------------------------------------------------------------------------

    def interrupt(self) -> None:
        self.interrupts += 1
        self.interrupted.set()

    async def _race(self, awaitable: Awaitable[T]) -> tuple[bool, T | None]:
        """(True, `awaitable`'s result), or (False, None) if, first, the person interrupts
        or the task ends (a deadline, the executor gave up): the answer is no longer needed."""
        task = asyncio.ensure_future(awaitable)
        stops: list[asyncio.Future[Any]] = [asyncio.ensure_future(self.interrupted.wait())]
        if self.handle is not None:
            stops.append(asyncio.ensure_future(self.handle.result()))
        try:
            await asyncio.wait({task, *stops}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for stop in stops:
                stop.cancel()
        if task.done():
            return True, task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return False, None

    async def cancel(self, reason: str) -> None:
        if self.handle is None or self.cancel_sent or self.handle.state.is_final:
            return
        self.cancel_sent = True
        self.console.note(f"cancelling {self.handle.task_id} …")
        self.emit("cancel_requested", task_id=self.handle.task_id, reason=reason)
        await self.handle.cancel(reason)

    # --- the task ----------------------------------------------------------------------------

    async def run(self, peer: Peer, watch: WatchingSender) -> int:
        opts = self.options
        handle = self.handle = await peer.submit(
            self.setup.target.agent_id,
            opts.task_type,
            opts.payload,
            task_id=opts.task_id,
            priority=opts.priority,
        )
        self.console.note(f"→ {opts.task_type} task {handle.task_id} sent to {self.setup.where}")
        self.emit(
            "submitted",
            task_id=handle.task_id,
            task_type=opts.task_type,
            target=self.setup.target.agent_id,
        )
        events = handle.events()
        pending: asyncio.Future[TaskEvent | None] | None = None
        giving_up_at: float | None = None
        loop = asyncio.get_running_loop()
        try:
            while True:
                if self.interrupted.is_set():
                    self.interrupted.clear()
                    if self.interrupts > 1:
                        raise CliError(
                            f"interrupted again: not waiting for the cancel of {handle.task_id}",
                            Exit.TASK_UNSUCCESSFUL,
                        )
                    await self.cancel("interrupted by the user")
                if self.cancel_sent and giving_up_at is None:
                    giving_up_at = loop.time() + CANCEL_WAIT
                timeout = None if giving_up_at is None else max(0.0, giving_up_at - loop.time())
                # One pending `anext` at a time, never cancelled mid-way: cancelling it would
                # close the handle's event generator.
                if pending is None:
                    pending = asyncio.ensure_future(anext(events, None))
                stop = asyncio.ensure_future(self.interrupted.wait())
                waiting: set[asyncio.Future[Any]] = {pending, stop, watch.failed}
                done, _ = await asyncio.wait(
                    waiting,
                    timeout=timeout,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                stop.cancel()
                if watch.failed.done() and not handle.state.is_final:
                    raise self._undeliverable(watch.failed.result())
                if pending not in done:
                    if not done:  # timed out waiting for the end after a cancel
                        raise CliError(
                            f"the cancel of {handle.task_id} was not acknowledged within "
                            f"{CANCEL_WAIT:.0f} s",
                            Exit.TASK_UNSUCCESSFUL,
                        )
                    continue
                event, pending = pending.result(), None
                if event is None:
                    break
                await self.on_event(event)
                if event.state.is_final:
                    break
        finally:
            if pending is not None:
                pending.cancel()
        return self.finish(await handle.result())

    def _undeliverable(self, exc: DeliveryError) -> CliError:
        return exchange_error(exc, self.setup)

    async def on_event(self, event: TaskEvent) -> None:
        message = event.message
        payload = msg_payload(message)
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
            self.console.note(f"! {self.setup.target.agent_id} refused a message: {event.detail}")
        elif event.kind == "partner_unreachable":
            self.console.note(f"! {self.setup.target.agent_id} stopped answering heartbeats")
        elif event.kind == "partner_reachable":
            self.console.note(f"{self.setup.target.agent_id} answers again")
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

    # --- questions ---------------------------------------------------------------------------

    async def _answer(self, prompt: str) -> str | None:
        """One line from the person; None if no longer needed. Raises NoAnswer at end of input."""
        self.console.ask(prompt)
        answered, line = await self._race(self.reader.readline())
        if not answered:
            self.console.say("")
            return None
        if line is None:
            self.console.say("")
            raise NoAnswer
        if not self.interactive:  # echo what the pipe answered, so the transcript reads well
            self.console.say(line)
        return line

    async def _ask_or_cancel(
        self, what: str, hint: str, ask: Callable[[], Awaitable[T]]
    ) -> T | None:
        try:
            return await ask()
        except NoAnswer:
            self.pending_error = CliError(f"no answer for {what}: stdin is closed ({hint})")
            await self.cancel(f"no answer for {what}")
            return None

    async def need_info(self, need: TaskNeedInfoPayload) -> None:
        assert self.handle is not None
        fields: dict[str, Any] = {}
        unanswered = [m for m in need.missing_fields if m.field not in self.options.fields]
        for missing in need.missing_fields:
            if missing.field in self.options.fields:
                fields[missing.field] = self.options.fields[missing.field]
        if unanswered:
            self.console.say(
                f"? {self.setup.target.agent_id} needs information"
                + (f": {need.question}" if need.question else "")
            )
        for missing in unanswered:
            value = await self._ask_or_cancel(
                f"`{missing.field}`",
                f"answer with --field {missing.field}=VALUE",
                functools.partial(self._ask_field, missing),
            )
            if value is None:
                return
            fields[missing.field] = value[0]
        self.emit("info_provided", task_id=need.task_id, fields=fields)
        self.console.note(
            "→ provided "
            + ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in fields.items())
        )
        await self.handle.provide_info(fields)

    async def _ask_field(self, missing: MissingField) -> tuple[Any] | None:
        self.console.say(f"  {missing.field}" + (f" — {missing.reason}" if missing.reason else ""))
        suggested = missing.suggested_value
        if missing.alternatives:
            shown = ", ".join(_show(a) for a in missing.alternatives)
            self.console.say(f"    alternatives: {shown}")
        default = f" [{_show(suggested)}]" if suggested is not None else ""
        while True:
            line = await self._answer(f"  {missing.field}{default}: ")
            if line is None:
                return None
            if line.strip() == "":
                if suggested is not None:
                    return (suggested,)
                self.console.say("    (an answer is needed)")
                continue
            return (parse_value(line.strip()),)

    async def need_human(self, need: TaskNeedHumanPayload) -> None:
        assert self.handle is not None
        say = self.console.say if self.options.decision is None else self.console.note
        say(f"? {self.setup.target.agent_id} asks a person to decide")
        say(f"  reason: [{need.reason.code}] {need.reason.message}".rstrip())
        if need.context is not None:
            ctx = need.context
            if ctx.task_summary:
                say(f"  task: {ctx.task_summary}")
            if ctx.current_progress is not None:
                say(f"  progress: {ctx.current_progress:g}%")
            if ctx.blocked_reason:
                say(f"  blocked: {ctx.blocked_reason}")
        for option in need.options:
            extra = "" if option.confidence is None else f" (confidence {option.confidence:g}%)"
            text = f" — {option.pros_cons}" if option.pros_cons else ""
            say(f"  option: {option.field} = {_show(option.value)}{text}{extra}")
        if need.deadline is not None:
            say(f"  decide before {need.deadline.isoformat()}")
        decision, notes = self.options.decision, self.options.notes
        if decision is None:
            await self.handle.start_deciding()
            answered = await self._ask_or_cancel(
                "the decision", "answer with --approve or --reject", self._ask_decision
            )
            if answered is None:
                return
            decision, notes = answered
        self.emit("human_decision", task_id=need.task_id, action=decision, notes=notes)
        self.console.note(f"→ {decision}" + (f" ({notes})" if notes else ""))
        if decision == "approve":
            approved = {option.field: option.value for option in need.options}
            await self.handle.approve(approved, notes=notes)
        else:
            await self.handle.reject(notes or "rejected by a person", notes=notes)

    async def _ask_decision(self) -> tuple[Literal["approve", "reject"], str] | None:
        while True:
            line = await self._answer("  approve or reject? [a/r]: ")
            if line is None:
                return None
            answer = line.strip().lower()
            if answer in ("a", "approve", "y", "yes"):
                decision: Literal["approve", "reject"] = "approve"
                break
            if answer in ("r", "reject", "n", "no"):
                decision = "reject"
                break
            self.console.say("    (type a to approve or r to reject)")
        try:
            notes = await self._answer("  notes (optional): ")
        except NoAnswer:
            notes = ""
        if notes is None:
            return None
        return decision, notes.strip()

    # --- the end -----------------------------------------------------------------------------

    def finish(self, outcome: Outcome) -> int:
        self.console.close()
        self.emit("outcome", **outcome_fields(outcome))
        self.ended = True
        if self.pending_error is not None:
            raise self.pending_error
        if outcome.state is TaskState.COMPLETED:
            self.console.note("✓ completed")
            if not self.options.as_json and outcome.result is not None:
                self.out.write(render_output(outcome.result.output) + "\n")
            return Exit.OK
        if outcome.refusal is not None:
            raise CliError(refusal_line(outcome.refusal.code, outcome.refusal.message))
        if outcome.state is TaskState.FAILED and outcome.error is not None:
            error = outcome.error
            retry = " (recoverable)" if error.recoverable else ""
            raise CliError(f"failed: {error.code}: {error.message}{retry}", Exit.TASK_UNSUCCESSFUL)
        if outcome.state is TaskState.REJECTED and outcome.reject is not None:
            reason = outcome.reject.reason
            raise CliError(f"rejected: {reason.code}: {reason.message}", Exit.TASK_UNSUCCESSFUL)
        raise CliError(outcome.state.value, Exit.TASK_UNSUCCESSFUL)


def _show(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def msg_payload(message: Message | None) -> Any:
    if message is None:
        return None
    return message.payload


def outcome_fields(outcome: Outcome) -> dict[str, Any]:
    fields: dict[str, Any] = {"state": outcome.state}
    for name in ("result", "error", "reject", "refusal"):
        value = getattr(outcome, name)
        if value is not None:
            fields[name] = value
    return fields


def render_output(output: Any) -> str:
    """A task's `result.output` for a person: text as is, anything else as indented JSON."""
    if isinstance(output, str):
        return output
    return json.dumps(output, indent=2, ensure_ascii=False)


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
    console = Console(err, quiet=options.as_json)
    follower = Follower(
        setup,
        options,
        out=out,
        console=console,
        reader=reader or LineReader(0),
        interactive=interactive,
    )
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, follower.interrupt)
    peer = setup.peer(serve=True)
    try:
        await start_peer(peer, setup.listen)
        watch = WatchingSender(HttpSender(peer.client, peer.partners, setup.signing))
        peer.protocol.set_callback_sender(watch)
        try:
            return await follower.run(peer, watch)
        except CliError as exc:
            if not follower.ended:  # an outcome already said how the task ended
                follower.emit("error", message=exc.message, exit=int(exc.status))
            raise
        finally:
            console.close()
            await peer.close(drain_timeout=0)  # at the end nothing is left worth waiting for
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)


__all__ = [
    "SendOptions",
    "WatchingSender",
    "parse_payload",
    "render_output",
    "run_send",
]
