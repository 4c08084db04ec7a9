"""Pydantic AI agents on offline models (`FunctionModel`, `TestModel`), for the framework
tests, in process and behind `synapse serve --handler pai_agents:payer`.

Every model call and tool run appends a line to the file named by `FRAMEWORK_TEST_LOG`, when
it is set: a test counts them across a SIGKILL and a restart.
"""

from __future__ import annotations

import os

from fwkit import Forever
from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel


def log(line: str) -> None:
    path = os.environ.get("FRAMEWORK_TEST_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(line + "\n")


def _returns(messages: list[ModelMessage]) -> dict[str, object]:
    """The content of each tool's last return so far, by tool name."""
    return {
        part.tool_name: part.content
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    }


def _prompt(messages: list[ModelMessage]) -> str:
    for message in messages:
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, UserPromptPart) and isinstance(part.content, str):
                    return part.content
    return ""


# --- echo: a prompt in, text out ------------------------------------------------------------


def _echo(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    return ModelResponse(parts=[TextPart(f"echo: {_prompt(messages)}")])


echo = Agent(FunctionModel(_echo), name="Echo Agent")


# --- weather: structured output -------------------------------------------------------------


class Forecast(BaseModel):
    city: str
    celsius: int


weather = Agent(
    TestModel(call_tools=[], custom_output_args={"city": "Paris", "celsius": 21}),
    name="weather",
    output_type=Forecast,
)


# --- payer: asks the requester, then a person, then pays ------------------------------------


def _payer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    done = _returns(messages)
    if "ask_requester" not in done:
        log("model: plan")
        question = "which account should the money go to?"
        return ModelResponse(
            parts=[ToolCallPart("ask_requester", {"field": "iban", "question": question})]
        )
    if "send_payment" not in done:
        log("model: pay")
        arguments = {"amount": 40, "to": str(done["ask_requester"])}
        return ModelResponse(parts=[ToolCallPart("send_payment", arguments)])
    log("model: report")
    return ModelResponse(parts=[TextPart(f"done: {done['send_payment']}")])


payer = Agent(FunctionModel(_payer), name="payer")


@payer.tool_plain(requires_approval=True)
def send_payment(amount: int, to: str) -> str:
    """Send `amount` euros to the account `to`."""
    log(f"tool: send_payment {amount} {to}")
    return f"paid {amount} to {to}"


# --- slow: a tool that runs until cancelled -------------------------------------------------

SLOW = Forever()


def _slow(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    if "wait" in _returns(messages):
        return ModelResponse(parts=[TextPart("waited")])
    return ModelResponse(parts=[ToolCallPart("wait", {})])


slow = Agent(FunctionModel(_slow), name="slow")


@slow.tool_plain
async def wait() -> str:
    """Wait for a long time."""
    await SLOW.run()
    return "never"


# --- broken: a tool that raises -------------------------------------------------------------


def _broken(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    return ModelResponse(parts=[ToolCallPart("lookup", {"account": "nobody"})])


broken = Agent(FunctionModel(_broken), name="broken")


@broken.tool_plain
def lookup(account: str) -> str:
    """Look an account up."""
    raise LookupError(f"no such account: {account}")
