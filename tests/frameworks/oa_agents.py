"""OpenAI Agents SDK agents on a scripted offline `Model`, for the framework tests, in process
and behind `synapse serve --handler oa_agents:payer`.

Every model call and tool run appends a line to the file named by `FRAMEWORK_TEST_LOG`, when
it is set. Tracing is off: nothing leaves the machine.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Callable
from typing import Any

from agents import Agent, ModelResponse, Usage, function_tool, set_tracing_disabled
from agents.models.interface import Model
from fwkit import Forever
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)
from pydantic import BaseModel

set_tracing_disabled(True)

Script = Callable[[dict[str, str]], list[Any]]


def log(line: str) -> None:
    path = os.environ.get("FRAMEWORK_TEST_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(line + "\n")


class ScriptedModel(Model):
    """A model whose every answer `script` decides from the tools' outputs so far (by the
    name of the tool that produced each)."""

    def __init__(self, script: Script) -> None:
        self.script = script

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        items = input if isinstance(input, list) else []
        names = {
            item["call_id"]: item["name"]
            for item in items
            if isinstance(item, dict) and item.get("type") == "function_call"
        }
        outputs = {
            names.get(item["call_id"], "?"): str(item["output"])
            for item in items
            if isinstance(item, dict) and item.get("type") == "function_call_output"
        }
        return ModelResponse(output=self.script(outputs), usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("the tests run without streaming")


def call(name: str, call_id: str, **arguments: Any) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        type="function_call",
        call_id=call_id,
        name=name,
        arguments=json.dumps(arguments),
        id=f"fc-{call_id}",
        status="completed",
    )


def say(text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        type="message",
        id="msg",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )


# --- echo ------------------------------------------------------------------------------------

echo = Agent(name="Echo", model=ScriptedModel(lambda outputs: [say("echo")]))


# --- forecast: structured output --------------------------------------------------------------


class Forecast(BaseModel):
    city: str
    celsius: int


forecast = Agent(
    name="forecast",
    model=ScriptedModel(lambda outputs: [say('{"city": "Oslo", "celsius": -3}')]),
    output_type=Forecast,
)


# --- payer: asks the requester, then a person, then pays --------------------------------------


def _payer(outputs: dict[str, str]) -> list[Any]:
    if "ask_requester" not in outputs:
        log("model: plan")
        return [call("ask_requester", "c1", field="iban", question="which account?")]
    if "send_payment" not in outputs:
        log("model: pay")
        return [call("send_payment", "c2", amount=40, to=outputs["ask_requester"])]
    if outputs["send_payment"].startswith("A person approved"):
        log("model: pay as approved")
        edited = json.loads(outputs["send_payment"].split(": ", 1)[1].split(". Call", 1)[0])
        return [call("send_payment", "c3", **edited)]
    log("model: report")
    return [say(f"done: {outputs['send_payment']}")]


@function_tool(needs_approval=True)
def send_payment(amount: int, to: str) -> str:
    """Send `amount` euros to the account `to`."""
    log(f"tool: send_payment {amount} {to}")
    return f"paid {amount} to {to}"


payer = Agent(name="payer", model=ScriptedModel(_payer), tools=[send_payment])


# --- slow and broken --------------------------------------------------------------------------

SLOW = Forever()


@function_tool
async def wait() -> str:
    """Wait for a long time."""
    await SLOW.run()
    return "never"


slow = Agent(
    name="slow",
    model=ScriptedModel(lambda outputs: [say("waited")] if outputs else [call("wait", "w1")]),
    tools=[wait],
)


def _broken(outputs: dict[str, str]) -> list[Any]:
    raise ConnectionError("the model is unreachable")


broken = Agent(name="broken", model=ScriptedModel(_broken))
