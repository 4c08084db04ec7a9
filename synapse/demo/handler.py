"""`DemoHandler`: the capabilities of specs/protocol.md, 'The demo handler', so every flow of
specs/protocol.md, 'Flows' can be shown.

| type | behaviour |
| --- | --- |
| `echo` | completes with `text` |
| `slow` | `steps` status updates `delay` s apart, then completes; cancellable |
| `text_generation` | asks for `style` (`task_need_info`) when missing, then completes |
| `portrait` | asks a person (`task_need_human`); approve completes, reject fails |
| `fail` | fails with `execution_failed` (recoverable) |
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from synapse.p2p.engine import Validation
from synapse.runtime.handler import ExecutionContext, TaskFailure
from synapse.types import (
    Capability,
    ErrorCode,
    HumanContext,
    HumanOption,
    MissingField,
    Reason,
    TaskError,
    TaskResult,
)

_STRING = {"type": "string"}

CAPABILITIES: tuple[Capability, ...] = (
    Capability(
        name="echo",
        description="Completes with the text it was given.",
        version="1.0",
        input_schema={"type": "object", "properties": {"text": _STRING}, "required": ["text"]},
    ),
    Capability(
        name="slow",
        description="Reports progress `steps` times, `delay` seconds apart, then completes.",
        version="1.0",
        input_schema={
            "type": "object",
            "properties": {
                "steps": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 5},
                "delay": {"type": "number", "minimum": 0, "maximum": 10, "default": 0.2},
            },
        },
    ),
    Capability(
        name="text_generation",
        description="Writes text from a prompt; asks for the style when it is missing.",
        version="1.0",
        input_schema={
            "type": "object",
            "properties": {"prompt": _STRING, "style": _STRING},
            "required": ["prompt"],
        },
    ),
    Capability(
        name="portrait",
        description="Asks a person to authorize the portrait before it completes.",
        version="1.0",
        input_schema={
            "type": "object",
            "properties": {"subject": _STRING},
            "required": ["subject"],
        },
    ),
    Capability(name="fail", description="Always fails (execution_failed).", version="1.0"),
)


def _invalid(message: str) -> Validation:
    return Validation(ok=False, reason=Reason(code=ErrorCode.INVALID_PARAMS.value, message=message))


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class DemoHandler:
    """The reference peer's handler (specs/protocol.md, 'The demo handler')."""

    def get_capabilities(self) -> Sequence[Capability]:
        return CAPABILITIES

    def validate_task(self, task_type: str, payload: dict[str, Any]) -> Validation:
        if task_type == "echo" and not isinstance(payload.get("text"), str):
            return _invalid("echo needs a string `text`")
        if task_type == "slow":
            steps, delay = payload.get("steps", 5), payload.get("delay", 0.2)
            if not (isinstance(steps, int) and not isinstance(steps, bool) and 1 <= steps <= 1000):
                return _invalid("`steps` must be an integer from 1 to 1000")
            if not (_is_number(delay) and 0 <= delay <= 10):
                return _invalid("`delay` must be a number of seconds from 0 to 10")
        if task_type == "text_generation":
            if not isinstance(payload.get("prompt"), str):
                return _invalid("text_generation needs a string `prompt`")
            if "style" in payload and not isinstance(payload["style"], str):
                return _invalid("`style` must be a string")
            if "style" not in payload:
                return Validation(
                    missing_fields=[
                        MissingField(
                            field="style",
                            reason="no style given",
                            # The values the specification's demo handler names (its
                            # conformance checks read them): they stay as specified.
                            suggested_value="古典",
                            alternatives=["现代", "浪漫"],
                        )
                    ],
                    question="Which style should the text be written in?",
                )
        if task_type == "portrait" and not isinstance(payload.get("subject"), str):
            return _invalid("portrait needs a string `subject`")
        return Validation()

    async def execute_task(
        self, ctx: ExecutionContext, task_type: str, payload: dict[str, Any]
    ) -> TaskResult:
        if task_type == "echo":
            return TaskResult(output_type="text", output=payload["text"])
        if task_type == "slow":
            steps, delay = int(payload.get("steps", 5)), float(payload.get("delay", 0.2))
            for i in range(1, steps + 1):
                await asyncio.sleep(delay)
                await ctx.progress(100 * i // steps, f"step {i}/{steps}")
            return TaskResult(output_type="text", output=f"done after {steps} steps")
        if task_type == "text_generation":
            prompt, style = payload["prompt"], payload["style"]
            text = f"“{prompt}”, written in the {style} style"
            return TaskResult(
                output_type="text",
                output=text,
                metadata={"prompt": prompt, "style": style},
            )
        if task_type == "portrait":
            subject = payload["subject"]
            decision = await ctx.need_human(
                Reason(
                    code="ethical_decision", message="An ethical decision needs a person's review"
                ),
                context=HumanContext(
                    task_summary=f"Paint a portrait of {subject}",
                    current_progress=30,
                    blocked_reason="The right to paint this person must be confirmed",
                ),
                options=[
                    HumanOption(
                        field="authorized",
                        value=True,
                        pros_cons="Go on, assuming the painting is authorized",
                        confidence=70,
                    )
                ],
            )
            return TaskResult(
                output_type="text",
                output=f"portrait of {subject}",
                metadata={"approved_fields": decision.decision.approved_fields},
            )
        if task_type == "fail":
            # A failure by design, not a bug: no traceback in the executor's log.
            raise TaskFailure(
                TaskError(
                    code=ErrorCode.EXECUTION_FAILED.value,
                    message="the demo task `fail` always fails",
                    recoverable=True,
                )
            )
        raise ValueError(f"unknown task type {task_type!r}")  # validate_task refuses it first
