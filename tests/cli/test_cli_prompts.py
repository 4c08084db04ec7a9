"""What `send` asks at the terminal for a `task_need_info`: each field once, its reason when it
has one, its alternatives and its suggested value as the default."""

from __future__ import annotations

import asyncio
import io
from datetime import datetime
from typing import Any

from synapse.cli.client import ClientSetup
from synapse.cli.conversation import Conversation, SendOptions
from synapse.cli.send import Follower
from synapse.cli.terminal import LineReader, TerminalConsole
from synapse.p2p.config import P2PConfig
from synapse.transport.partners import Partner
from synapse.types import MissingField


class Lines(LineReader):
    """Answers from a list, as a pipe would give them."""

    def __init__(self, *answers: str) -> None:
        super().__init__()
        self.answers = list(answers)

    async def readline(self) -> str | None:
        return self.answers.pop(0) if self.answers else None


class Asking(Conversation[Any]):
    """A conversation whose task never ends while it asks."""

    def ended_future(self) -> None:
        return None


def ask(missing: MissingField, *answers: str) -> tuple[Any, str]:
    err = io.StringIO()
    conversation = Asking(
        SendOptions(task_type="t", payload={}),
        who="agent-e",
        out=io.StringIO(),
        console=TerminalConsole(err, live=False),
        reader=Lines(*answers),
        interactive=True,
    )
    answered = asyncio.run(conversation._ask_field(missing))
    return answered, err.getvalue()


def test_a_field_without_a_reason_is_named_once() -> None:
    answered, shown = ask(MissingField(field="tone"), "calm")
    assert answered == ("calm",)
    assert shown.count("tone") == 1, shown
    assert shown == "  tone: "


def test_a_field_with_a_reason_shows_it_and_its_alternatives() -> None:
    missing = MissingField(
        field="style", reason="no style given", suggested_value="古典", alternatives=["现代"]
    )
    answered, shown = ask(missing, "")
    assert answered == ("古典",)  # an empty answer takes the suggested value
    assert shown.splitlines() == [
        "  style — no style given",
        "    alternatives: 现代",
        "  style [古典]: ",
    ]


def test_a_silent_executor_is_waited_for_until_a_time_the_person_is_told() -> None:
    """Not a silence of minutes: what `send` waits for, until when, and how to stop."""
    config = P2PConfig(task_timeout=300, heartbeat_interval=10, missed_heartbeat_limit=3)
    setup = ClientSetup(
        me="agent-r",
        target=Partner("agent-e", "http://127.0.0.1:9/synapse/callback", ("s" * 32,)),
        endpoint="http://127.0.0.1:8/synapse/callback",
        listen=None,
        signing="header",
        config=config,
    )
    err = io.StringIO()
    follower = Follower(
        setup,
        SendOptions(task_type="slow", payload={}, timeout=60.0),
        out=io.StringIO(),
        console=TerminalConsole(err, live=False),
        reader=Lines(),
        interactive=False,
    )
    follower._last_word = datetime(2026, 12, 6, 12, 0).timestamp()
    note = follower._waiting_note()
    assert note.startswith("! agent-e stopped answering heartbeats; waiting for word")
    assert "until 12:05:30" in note  # 300 s of task_timeout plus 3 missed beats of 10 s
    assert "--timeout 1m first" in note and "Ctrl-C cancels now" in note
