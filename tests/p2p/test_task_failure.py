"""`TaskFailure`: a handler fails its task with exactly the `task_failed.error` it raises."""

from __future__ import annotations

from typing import Any

from synapse.p2p.engine import Validation
from synapse.runtime.handler import ExecutionContext, TaskFailure
from synapse.transport.peer import Peer
from synapse.types import TaskError, TaskState

ERROR = TaskError(
    code="permission_denied", message="not yours", recoverable=False, details={"a": 1}
)


class Refusing:
    def get_capabilities(self) -> list[str]:
        return ["guarded", "broken"]

    def validate_task(self, task_type: str, payload: dict[str, Any]) -> Validation:
        return Validation()

    async def execute_task(
        self, ctx: ExecutionContext, task_type: str, payload: dict[str, Any]
    ) -> Any:
        if task_type == "guarded":
            raise TaskFailure(ERROR)
        raise RuntimeError("boom")


async def test_task_failure_carries_its_error_and_other_exceptions_do_not() -> None:
    executor = Peer("e", handler=Refusing())
    requester = Peer("r")
    async with executor, requester:
        executor.add_partner("r", requester.endpoint, ("s",))
        requester.add_partner("e", executor.endpoint, ("s",))
        guarded = await (await requester.submit("e", "guarded", {})).result(10)
        assert guarded.state is TaskState.FAILED
        assert guarded.error == ERROR
        broken = await (await requester.submit("e", "broken", {})).result(10)
        assert broken.error is not None
        assert (broken.error.code, broken.error.recoverable) == ("execution_failed", True)
        assert broken.error.message == "RuntimeError: boom"  # its type and message, no more
