"""What `synapse send` does whatever the protocol: the conversation with the person.

`Conversation` follows one task through a handle — a Synapse `TaskHandle`, or an
`A2ATaskHandle` for `send --a2a-agent`, which have the same answering methods — and does everything
a person sees and answers: `--json` events, Ctrl-C (cancel, then a second one gives up), the
questions of a `task_need_info` (each missing field) and of a `task_need_human` (approve or
reject, with notes), answered from flags, the terminal or stdin lines, and the end (the result
on stdout, or one line and the exit status). Its subclasses say where the events come from
(`send.SynapseFollower`, `send_a2a.A2AFollower`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, Literal, Protocol, TextIO, TypeVar

from synapse.cli.client import to_json
from synapse.cli.errors import CliError, Exit
from synapse.cli.terminal import LineReader, TerminalConsole, parse_value
from synapse.runtime.answers import Front
from synapse.types import (
    MissingField,
    Priority,
    TaskError,
    TaskNeedHumanPayload,
    TaskNeedInfoPayload,
    TaskResult,
    TaskState,
)
from synapse.types.errors import SynapseException

T = TypeVar("T")
E = TypeVar("E")

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
    #: `--timeout`: give up (cancel, exit 1) when the task has not ended by then.
    timeout: float | None = None
    #: `--deadline`: the task's `deadline`, sent with it (the executor fails it when it passes).
    deadline: datetime | None = None


class Answerable(Protocol):
    """What `Conversation` needs of a task handle (`TaskHandle` and `A2ATaskHandle` have it)."""

    @property
    def task_id(self) -> str: ...

    async def provide_info(
        self, fields: Mapping[str, Any], notes: str | None = None, *, front: Front = ...
    ) -> object: ...

    async def start_deciding(self) -> None: ...

    async def approve(
        self, approved_fields: Mapping[str, Any] | None = None, **kw: Any
    ) -> object: ...

    async def reject(self, reason: str = "", **kw: Any) -> object: ...

    async def cancel(self, reason: str | None = None) -> None: ...


H = TypeVar("H", bound=Answerable)


class NoAnswer(SynapseException):
    """stdin closed while an answer was needed."""


class Conversation(Generic[H]):
    """Follows one task: renders its events and answers its questions.

    Subclasses set `handle` once the task is sent and implement `ended` (an awaitable that
    completes when the task has ended) and `is_final`.
    """

    def __init__(
        self,
        options: SendOptions,
        *,
        who: str,
        out: TextIO,
        console: TerminalConsole,
        reader: LineReader,
        interactive: bool,
    ) -> None:
        #: The other side, as the person knows it (its agent id).
        self.who = who
        self.options = options
        self.out = out
        self.console = console
        self.reader = reader
        self.interactive = interactive
        self.interrupted = asyncio.Event()
        self.interrupts = 0
        self.handle: H | None = None
        self.cancel_sent = False
        #: An error to report once the task has ended (we cancelled it because of it).
        self.pending_error: CliError | None = None
        #: True once the outcome was emitted.
        self.ended = False

    # --- what a subclass says about its handle -----------------------------------------------

    def ended_future(self) -> Awaitable[Any] | None:
        """Completes when the task has ended (None before the task exists)."""
        raise NotImplementedError

    def is_final(self) -> bool:
        raise NotImplementedError

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
        ended = self.ended_future()
        if ended is not None:
            stops.append(asyncio.ensure_future(ended))
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
        if self.handle is None or self.cancel_sent or self.is_final():
            return
        self.cancel_sent = True
        self.console.note(f"cancelling {self.handle.task_id} …")
        self.emit("cancel_requested", task_id=self.handle.task_id, reason=reason)
        await self.handle.cancel(reason)

    # --- following the events ------------------------------------------------------------------

    async def follow(
        self,
        events: AsyncIterator[E],
        on_event: Callable[[E], Awaitable[bool]],
        *,
        wake: asyncio.Future[Any] | None = None,
        check: Callable[[], None] | None = None,
    ) -> None:
        """Feed `events` to `on_event` (True: it was the last) until they end, handling
        Ctrl-C: the first cancels the task and waits up to `CANCEL_WAIT` for its end, a
        second one gives up. `wake` also wakes the loop, after which `check` may raise."""
        assert self.handle is not None
        task_id = self.handle.task_id
        pending: asyncio.Future[E | None] | None = None
        giving_up_at: float | None = None
        loop = asyncio.get_running_loop()
        try:
            while True:
                if self.interrupted.is_set():
                    self.interrupted.clear()
                    if self.interrupts > 1:
                        raise CliError(
                            f"interrupted again: not waiting for the cancel of {task_id}",
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
                waiting: set[asyncio.Future[Any]] = {pending, stop}
                if wake is not None:
                    waiting.add(wake)
                done, _ = await asyncio.wait(
                    waiting, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                stop.cancel()
                if check is not None:
                    check()
                if pending not in done:
                    if not done:  # timed out waiting for the end after a cancel
                        raise CliError(
                            f"the cancel of {task_id} was not acknowledged within "
                            f"{CANCEL_WAIT:.0f} s",
                            Exit.TASK_UNSUCCESSFUL,
                        )
                    continue
                event, pending = pending.result(), None
                if event is None or await on_event(event):
                    break
        finally:
            if pending is not None:
                pending.cancel()

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
                f"? {self.who} needs information" + (f": {need.question}" if need.question else "")
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
        await self.handle.provide_info(fields, front="cli")

    async def _ask_field(self, missing: MissingField) -> tuple[Any] | None:
        if missing.reason:  # without one, the prompt below names the field: once is enough
            self.console.say(f"  {missing.field} — {missing.reason}")
        suggested = missing.suggested_value
        if missing.alternatives:
            shown = ", ".join(show(a) for a in missing.alternatives)
            self.console.say(f"    alternatives: {shown}")
        default = f" [{show(suggested)}]" if suggested is not None else ""
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
        say(f"? {self.who} asks a person to decide")
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
            say(f"  option: {option.field} = {show(option.value)}{text}{extra}")
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
            await self.handle.approve(approved, notes=notes, front="cli")
        else:
            await self.handle.reject(notes or "rejected by a person", notes=notes, front="cli")

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

    def conclude(
        self,
        state: TaskState,
        fields: Mapping[str, Any],
        *,
        result: TaskResult | None = None,
        error: TaskError | None = None,
        refusal: str | None = None,
    ) -> int:
        """Emit the outcome, print the result, or raise the one line that says how it ended.

        `error` is the failure (state failed) or the reason of a rejection (state rejected);
        `refusal`, the line of a refused request (exit 2).
        """
        self.console.close()
        self.emit("outcome", **fields)
        self.ended = True
        if self.pending_error is not None:
            raise self.pending_error
        if state is TaskState.COMPLETED:
            self.console.note("✓ completed")
            if not self.options.as_json and result is not None:
                self.out.write(render_output(result.output) + "\n")
            return Exit.OK
        if refusal is not None:
            raise CliError(refusal)
        if state is TaskState.FAILED and error is not None:
            retry = " (recoverable)" if error.recoverable else ""
            raise CliError(f"failed: {error.code}: {error.message}{retry}", Exit.TASK_UNSUCCESSFUL)
        if state is TaskState.REJECTED and error is not None:
            raise CliError(f"rejected: {error.code}: {error.message}", Exit.TASK_UNSUCCESSFUL)
        raise CliError(state.value, Exit.TASK_UNSUCCESSFUL)


@contextlib.contextmanager
def interruptible(conversation: Conversation[Any]) -> Iterator[None]:
    """Ctrl-C (SIGINT) and SIGTERM interrupt `conversation` instead of the program."""
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, conversation.interrupt)
    try:
        yield
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)


async def reported(conversation: Conversation[Any], run: Awaitable[int]) -> int:
    """`run`, with an error that ends it before the outcome also emitted (`--json`)."""
    try:
        return await run
    except CliError as exc:
        if not conversation.ended:  # an outcome already said how the task ended
            conversation.emit("error", message=exc.message, exit=int(exc.status))
        raise


def show(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def render_output(output: Any) -> str:
    """A task's `result.output` for a person: text as is, anything else as indented JSON."""
    if isinstance(output, str):
        return output
    return json.dumps(output, indent=2, ensure_ascii=False)


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


__all__ = [
    "CANCEL_WAIT",
    "Answerable",
    "Conversation",
    "NoAnswer",
    "SendOptions",
    "interruptible",
    "parse_payload",
    "render_output",
    "reported",
    "show",
]
