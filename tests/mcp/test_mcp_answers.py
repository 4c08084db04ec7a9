"""`answer_task`'s arguments read as the question's own values: text a client sends for a
boolean or a number option becomes that boolean or number (never the text), a value that
cannot be one is refused, and a field the decision does not have is refused, not dropped."""

from __future__ import annotations

import pytest

from synapse.mcp.questions import BadAnswer, Question, answer_from_arguments
from synapse.types import (
    DecisionAction,
    HumanOption,
    MissingField,
    Reason,
    TaskNeedHumanPayload,
    TaskNeedInfoPayload,
)

HUMAN = Question(
    human=TaskNeedHumanPayload(
        task_id="t-1",
        reason=Reason(code="ethical_decision", message="confirm"),
        options=[
            HumanOption(field="authorized", value=True),
            HumanOption(field="width", value=1024),
            HumanOption(field="scale", value=0.5),
        ],
    )
)


def approve(**fields: object) -> dict[str, object]:
    answer = answer_from_arguments(
        HUMAN, fields=fields, decision="approve", rejection_reason="", notes=""
    )
    assert answer.action is DecisionAction.APPROVE
    return answer.fields


@pytest.mark.parametrize(("text", "value"), [("yes", True), ("True", True), ("no", False)])
def test_text_for_a_boolean_option_is_the_boolean(text: str, value: bool) -> None:
    assert approve(authorized=text) == {"authorized": value}


def test_text_for_numbers_is_the_number() -> None:
    assert approve(width="512", scale="0.25") == {"width": 512, "scale": 0.25}


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"authorized": "perhaps"}, "true or false"),
        ({"width": "big"}, "an integer"),
        ({"height": 10}, "not a field"),
    ],
)
def test_what_cannot_be_read_is_refused(fields: dict[str, object], why: str) -> None:
    with pytest.raises(BadAnswer, match=why):
        approve(**fields)


def test_information_keeps_text_its_suggestion_does_not_bind() -> None:
    info = Question(
        info=TaskNeedInfoPayload(
            task_id="t-1",
            missing_fields=[MissingField(field="count", reason="how many", suggested_value=3)],
        )
    )
    read = answer_from_arguments(
        info, fields={"count": "a few"}, decision=None, rejection_reason="", notes=""
    )
    assert read.fields == {"count": "a few"}
    read = answer_from_arguments(
        info, fields={"count": "4"}, decision=None, rejection_reason="", notes=""
    )
    assert read.fields == {"count": 4}
