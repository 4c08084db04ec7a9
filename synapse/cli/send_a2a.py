"""`synapse send --a2a-agent URL`: the same conversation as `send`, with an A2A v1.0 agent.

`A2AClient` discovers the agent by its card, sends the payload as a data part with
`metadata.taskType`, and follows the task (streamed, or polled for an agent that does not
stream). The shared `Conversation` renders its events and answers INPUT_REQUIRED: a Synapse
agent's status message says what it needs (`metadata.synapseNeeds`: the missing fields, or a
person's decision, docs/a2a.md), so the questions are the same as with `send`; any other
agent's question is shown as text and answered with one line (or `--field`s, as a data part).
Ctrl-C sends `CancelTask`.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Mapping
from typing import Any, TextIO

from synapse.a2a import (
    A2AClient,
    A2ACode,
    A2AError,
    A2AEvent,
    A2AOutcome,
    A2ATaskHandle,
    mapping,
    wire,
)
from synapse.a2a.client.core import describe_failure
from synapse.cli.conversation import Conversation, SendOptions, interruptible, reported
from synapse.cli.errors import CliError
from synapse.cli.terminal import LineReader, TerminalConsole, parse_value
from synapse.p2p.config import P2PConfig
from synapse.types import TaskNeedInfoPayload


def a2a_error(exc: A2AError, where: str) -> CliError:
    """An A2A error as one line: `-32106 UNAUTHENTICATED: …`, `cannot reach …`."""
    known = exc.known
    reason = known.reason if known is not None else str(exc.metadata.get("reason", "")) or "ERROR"
    if exc.message.startswith(("no agent card at", "agent card is not")):
        # A 404 page or a Synapse peer served without --a2a: say what is missing.
        return CliError(
            f"{where} has no A2A agent card ({exc.message}); is it an A2A agent? "
            "A Synapse peer answers A2A only when served with --a2a; without --a2a, "
            "send speaks Synapse"
        )
    if exc.http_status == 401 or exc.code == A2ACode.AUTHENTICATION_FAILED:
        hint = " (give --a2a-token)" if "token" not in exc.message.lower() else ""
        return CliError(f"{exc.code} {reason}: {exc.message}{hint}")
    if exc.__cause__ is not None and (
        "cannot fetch" in exc.message or "cannot reach" in exc.message
    ):
        if isinstance(exc.__cause__, TimeoutError):  # say which call, and how long we waited
            return CliError(f"the A2A agent at {where} did not answer in time: {exc.message}")
        return CliError(
            f"cannot reach the A2A agent at {where}: {describe_failure(exc.__cause__, None)}"
        )
    return CliError(f"{exc.code} {reason}: {exc.message}")


class A2AFollower(Conversation[A2ATaskHandle]):
    """Follows one A2A task: its events, through the shared conversation."""

    def __init__(
        self,
        url: str,
        options: SendOptions,
        *,
        out: TextIO,
        console: TerminalConsole,
        reader: LineReader,
        interactive: bool,
    ) -> None:
        super().__init__(
            options,
            who=url,
            out=out,
            console=console,
            reader=reader,
            interactive=interactive,
        )
        self.url = url
        #: The status messages already answered (a resumed stream repeats the current one).
        self.answered: set[str] = set()

    def ended_future(self) -> Awaitable[Any] | None:
        return self.handle.result() if self.handle is not None else None

    def is_final(self) -> bool:
        return self.handle is not None and wire.is_terminal(self.handle.state)

    # --- the task ----------------------------------------------------------------------------

    async def run(self, client: A2AClient) -> int:
        opts = self.options
        try:
            card = await client.discover()
            self.who = card.name or self.url
            handle = self.handle = await client.send(opts.payload, task_type=opts.task_type)
        except A2AError as exc:
            raise a2a_error(exc, self.url) from exc
        self.console.note(
            f"→ {opts.task_type} task {handle.task_id} sent to {self.who} at {self.url} "
            f"(A2A, {client.binding})"
        )
        self.emit(
            "submitted",
            task_id=handle.task_id,
            task_type=opts.task_type,
            target=self.url,
            agent=self.who,
            binding=client.binding,
        )
        try:
            await self.follow(handle.events(), self.on_event)
            outcome = await handle.result()
        except A2AError as exc:
            raise a2a_error(exc, self.url) from exc
        finally:
            await handle.close()
        return self.finish(outcome)

    async def on_event(self, event: A2AEvent) -> bool:
        fields: dict[str, Any] = {"task_id": event.task_id, "state": event.state}
        if event.text:
            fields["text"] = event.text
        if event.data is not None:
            fields["data"] = event.data
        self.emit(event.kind, **fields)
        if event.kind == "reconnected":
            self.console.note("! the stream broke; resumed it")
        elif event.kind == "artifact_update":
            pass  # the result is printed at the end
        elif event.state == wire.SUBMITTED:
            self.console.note("✓ submitted")
        elif event.state == wire.WORKING:
            progress = event.data.get("progress") if isinstance(event.data, dict) else None
            if isinstance(progress, int | float) and not isinstance(progress, bool):
                shown = event.text if event.text != f"{progress:g}%" else ""
                self.console.progress(progress, shown)
            elif event.text:  # a task snapshot after our answer has none: nothing new
                self.console.note(event.text)
        elif event.interrupted and not self.cancel_sent:
            await self.input_required()
        return event.final or event.kind == "message"

    async def input_required(self) -> None:
        """Answer what the agent asks for, once per status message."""
        assert self.handle is not None
        message = self.handle.status_message
        if message is None or message.message_id in self.answered:
            return
        self.answered.add(message.message_id)
        needs = mapping.meta_value(message.metadata, mapping.NEEDS_KEY, mapping.LEGACY_NEEDS_KEY)
        missing = mapping.missing_fields_of(message)
        task_id = self.handle.task_id
        if missing:
            question = mapping.message_text(message, " ")
            await self.need_info(
                TaskNeedInfoPayload(task_id=task_id, missing_fields=missing, question=question)
            )
            return
        if needs == mapping.NEEDS_HUMAN:
            need = mapping.need_human_of(message, task_id)
            if need is not None:
                await self.need_human(need)
                return
        await self.need_text(mapping.message_text(message, " "))

    async def need_text(self, question: str) -> None:
        """Another agent's INPUT_REQUIRED: its text, answered with `--field`s (a data part),
        `--approve` / `--reject` (that word and the notes), or one line."""
        assert self.handle is not None
        self.console.say(f"? {self.who} asks" + (f": {question}" if question else " for input"))
        answer: dict[str, Any] | str
        if self.options.fields:
            answer = dict(self.options.fields)
        elif self.options.decision is not None:
            answer = " ".join(filter(None, (self.options.decision, self.options.notes)))
        else:
            line = await self._ask_or_cancel(
                "the agent's question",
                "answer with --field NAME=VALUE",
                lambda: self._answer("  answer: "),
            )
            if line is None:
                return
            value = parse_value(line.strip())
            answer = value if isinstance(value, dict) else line.strip()
        self.emit("input_provided", task_id=self.handle.task_id, answer=answer)
        self.console.note(f"→ answered {answer if isinstance(answer, str) else 'with data'}")
        await self.handle.reply(answer)

    # --- the end -----------------------------------------------------------------------------

    def finish(self, outcome: A2AOutcome) -> int:
        fields: dict[str, Any] = {"state": outcome.state, "a2a_state": outcome.a2a_state}
        if outcome.result is not None:
            fields["result"] = outcome.result
        if outcome.error is not None:
            fields["error"] = outcome.error
        return self.conclude(outcome.state, fields, result=outcome.result, error=outcome.error)


async def run_send_a2a(
    url: str,
    token: str | None,
    options: SendOptions,
    *,
    config: P2PConfig,
    out: TextIO,
    err: TextIO,
    reader: LineReader | None = None,
    stdin_is_tty: bool | None = None,
    bindings: tuple[str, ...] | None = None,
    client_options: Mapping[str, Any] | None = None,
) -> int:
    interactive = os.isatty(0) if stdin_is_tty is None else stdin_is_tty
    console = TerminalConsole(err, quiet=options.as_json)
    line_reader = reader or LineReader(0)
    follower = A2AFollower(
        url,
        options,
        out=out,
        console=console,
        reader=line_reader,
        interactive=interactive,
    )
    client = A2AClient(
        url,
        token=token,
        config=config,
        timeout=config.request_timeout,
        bindings=bindings,
        **(client_options or {}),
    )
    with interruptible(follower):
        try:
            return await reported(follower, follower.run(client))
        finally:
            console.close()
            await client.close()
            if reader is None:
                line_reader.close()  # its thread ends before stdin could be reused


__all__ = ["A2AFollower", "a2a_error", "run_send_a2a"]
