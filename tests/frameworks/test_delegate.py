"""The other direction: a framework's agent calls a Synapse partner as a tool
(`synapse.frameworks.delegate`), three real peers over loopback HTTP. The partner runs the
demo handler, whose `text_generation` asks for a style and `portrait` for a person's
decision; the calling agent is a Pydantic AI agent on an offline model."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from fwkit import BOUND, CONFIG, SECRET
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from synapse import Peer
from synapse.demo.handler import DemoHandler
from synapse.frameworks.delegate import DelegationFailed, delegate
from synapse.types import TaskState

#: Each pair of partners its own secret (a peer refuses partners that share one).
WRITER_SECRET = "frameworks-writer-secret-0123456789abcdef"


def _coordinator(task_type: str, payload: dict[str, Any]) -> FunctionModel:
    """A model that delegates once, then reports the partner's answer."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        done = [
            part.content
            for message in messages
            if isinstance(message, ModelRequest)
            for part in message.parts
            if isinstance(part, ToolReturnPart)
        ]
        if done:
            return ModelResponse(parts=[TextPart(f"got: {done[-1]}")])
        return ModelResponse(parts=[ToolCallPart(task_type, {"payload": payload})])

    return FunctionModel(model)


@asynccontextmanager
async def three(task_type: str, payload: dict[str, Any]) -> AsyncIterator[tuple[Peer, Peer]]:
    """agent-r asks agent-c (a Pydantic AI coordinator), which delegates `task_type` to
    agent-w (the demo handler)."""
    coordinator = Agent(_coordinator(task_type, payload), name="coordinator")
    peer_c = Peer("agent-c", handler=coordinator, config=CONFIG)
    coordinator.tool_plain(delegate(peer_c, "agent-w", task_type))
    writer = Peer("agent-w", handler=DemoHandler(), config=CONFIG)
    requester = Peer("agent-r", config=CONFIG)
    async with peer_c, writer, requester, asyncio.timeout(BOUND):
        peer_c.add_partner("agent-r", requester.endpoint, (SECRET,))
        peer_c.add_partner("agent-w", writer.endpoint, (WRITER_SECRET,))
        writer.add_partner("agent-c", peer_c.endpoint, (WRITER_SECRET,))
        requester.add_partner("agent-c", peer_c.endpoint, (SECRET,))
        yield requester, peer_c


async def test_the_partners_question_reaches_the_callers_requester_and_back() -> None:
    async with three("text_generation", {"prompt": "spring"}) as (requester, _):
        handle = await requester.submit("agent-c", "coordinator", {"prompt": "write"})
        asked: list[str] = []
        async for event in handle:
            if (info := event.need_info) is not None:
                asked += [f.field for f in info.missing_fields]
                await handle.provide_info({"style": "现代"})
        outcome = await handle
    assert asked == ["style"]
    assert outcome.state is TaskState.COMPLETED, outcome
    assert outcome.result is not None
    assert outcome.result.output == "got: “spring”, written in the 现代 style"


async def test_a_persons_decision_is_relayed_and_a_rejection_fails_both_tasks() -> None:
    async with three("portrait", {"subject": "Ada"}) as (requester, _):
        handle = await requester.submit("agent-c", "coordinator", {"prompt": "portrait"})
        reasons: list[str] = []
        async for event in handle:
            if (human := event.need_human) is not None:
                reasons.append(human.reason.code)
                await handle.reject("no consent")
        outcome = await handle
    assert reasons == ["ethical_decision"]  # the partner's own reason, relayed as it is
    assert outcome.state is TaskState.FAILED
    assert outcome.error is not None and outcome.error.code == "permission_denied"


async def test_outside_a_synapse_handler_a_question_cancels_the_sub_task() -> None:
    writer = Peer("agent-w", handler=DemoHandler(), config=CONFIG)
    caller = Peer("agent-c", config=CONFIG)
    async with writer, caller, asyncio.timeout(BOUND):
        caller.add_partner("agent-w", writer.endpoint, (SECRET,))
        writer.add_partner("agent-c", caller.endpoint, (SECRET,))
        tool = delegate(caller, "agent-w", "text_generation")
        assert tool.__name__ == "text_generation"
        with pytest.raises(DelegationFailed, match="nobody here can answer"):
            await tool({"prompt": "spring"})
        assert (
            await tool({"prompt": "spring", "style": "古典"})
            == "“spring”, written in the 古典 style"
        )
