"""The executor's handler of the humans tests (also run by `synapse serve --handler`):
`portrait_review` asks a person to choose a width and a style; `profile` asks for an e-mail
address (suggesting the payload's `suggest`, if any); `two_steps` asks two questions in turn
(reason codes `first`, then `second`). Each ends with what it was given."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from synapse import ExecutionContext, TaskResult, Validation
from synapse.types import HumanContext, HumanOption, MissingField, Reason


class ApprovalHandler:
    def get_capabilities(self) -> list[str]:
        return ["portrait_review", "profile", "two_steps"]

    def validate_task(self, task_type: str, payload: dict[str, Any]) -> Validation:
        return Validation()

    async def execute_task(
        self, ctx: ExecutionContext, task_type: str, payload: dict[str, Any]
    ) -> TaskResult:
        seconds = payload.get("deadline_seconds")
        deadline = (
            datetime.now(UTC) + timedelta(seconds=float(seconds)) if seconds is not None else None
        )
        if task_type == "profile":
            fields = await ctx.need_info(
                [
                    MissingField(
                        field="email",
                        reason="where to send the result",
                        suggested_value=payload.get("suggest"),
                    )
                ],
                question="Which address?",
                required_by=deadline,
            )
            return TaskResult(output_type="json", output={"provided": dict(fields)})
        if task_type == "two_steps":
            deciders = {}
            for step in ("first", "second"):
                answer = await ctx.need_human(
                    Reason(code=step, message=f"the {step} step needs a person"),
                    options=[HumanOption(field="go", value=True, confidence=90)],
                )
                deciders[step] = answer.decided_by.user_id
            return TaskResult(output_type="json", output=deciders)
        decision = await ctx.need_human(
            Reason(
                code=str(payload.get("reason", "low_confidence")),
                message="two widths fit the brief",
            ),
            context=HumanContext(task_summary=f"Portrait of {payload.get('subject', 'someone')}"),
            options=[
                HumanOption(field="width", value=1024, pros_cons="sharper, slower", confidence=80),
                HumanOption(field="width", value=512, pros_cons="faster", confidence=40),
                HumanOption(field="style", value="oil", pros_cons="classic", confidence=70),
            ],
            escalation_level=int(payload.get("level", 1)),
            deadline=deadline,
        )
        return TaskResult(
            output_type="json",
            output={
                "approved": decision.decision.approved_fields,
                "by": decision.decided_by.user_id,
            },
        )
