"""specs/protocol.md names every message type, state and error code with the protocol's spelling."""

from __future__ import annotations

from pathlib import Path

import pytest

from synapse.types import ErrorCode, MessageType, TaskState

DOC = (Path(__file__).resolve().parents[2] / "specs" / "protocol.md").read_text("utf-8")


@pytest.mark.parametrize("message_type", list(MessageType), ids=lambda t: t.short)
def test_every_message_type_is_described(message_type: MessageType) -> None:
    assert f"`{message_type.value}`" in DOC


@pytest.mark.parametrize("state", list(TaskState))
def test_every_state_is_described(state: TaskState) -> None:
    assert f"| `{state.value}` |" in DOC


@pytest.mark.parametrize("code", list(ErrorCode))
def test_every_error_code_is_described(code: ErrorCode) -> None:
    assert f"| `{code.value}` |" in DOC


def test_links_to_the_generated_companions() -> None:
    for target in ("state-machine.md", "schema/", "examples/", "signature-vectors.json"):
        assert f"]({target})" in DOC
    assert "canceled" not in DOC  # the protocol spells it `cancelled`
