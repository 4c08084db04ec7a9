"""Error codes and their HTTP statuses (specs/protocol.md, 'Error codes')."""

from __future__ import annotations

from synapse.types import HTTP_STATUS, NACK_CODES, ErrorCode, SynapseError

#: specs/protocol.md, 'Error codes', the codes a nack carries, with their HTTP status.
CONTRACT_NACK_STATUS = {
    "message_format_invalid": 400,
    "invalid_params": 400,
    "permission_denied": 403,
    "task_not_found": 404,
    "task_already_completed": 409,
    "rate_limited": 429,
    "agent_not_ready": 503,
}

#: Task-level codes: only in task_reject.reason.code / task_failed.error.code, never in a nack.
TASK_LEVEL = {"capability_lacking", "execution_failed", "execution_timeout"}


def test_nack_codes_and_statuses_match_the_contract() -> None:
    assert {c.value for c in NACK_CODES} == set(CONTRACT_NACK_STATUS)
    for code in NACK_CODES:
        assert code.http_status == CONTRACT_NACK_STATUS[code.value]
        assert HTTP_STATUS[code] == CONTRACT_NACK_STATUS[code.value]


def test_every_seed_code_exists_and_has_a_status() -> None:
    assert {c.value for c in ErrorCode} == set(CONTRACT_NACK_STATUS) | TASK_LEVEL
    assert set(HTTP_STATUS) == set(ErrorCode)
    assert not NACK_CODES & {ErrorCode(c) for c in TASK_LEVEL}


def test_synapse_error_carries_code_status_and_details() -> None:
    error = SynapseError(ErrorCode.INVALID_PARAMS, "bad", {"path": "$.payload.task.id"})
    assert (error.code, error.http_status, error.details) == (
        ErrorCode.INVALID_PARAMS,
        400,
        {"path": "$.payload.task.id"},
    )
    assert "invalid_params" in str(error)
    too_large = SynapseError(ErrorCode.MESSAGE_FORMAT_INVALID, "body too large", http_status=413)
    assert too_large.http_status == 413
    assert too_large.code.http_status == 400
