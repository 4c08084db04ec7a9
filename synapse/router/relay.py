"""The router's side of the original task: `RoutingHandler`, the `TaskHandler` its peer runs
(it offers what the pool offers, and routes each task), and `Relay`, the original task as the
sub-tasks run for it talk back to it (progress, questions and decisions, one at a time)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from synapse.a2a.server.related import RELATED_KEY, related_tasks
from synapse.p2p.engine import Validation
from synapse.router.fanout import FanOutPlan, run_plan
from synapse.router.pool import PoolConfig
from synapse.runtime.handler import ExecutionContext, TaskFailure
from synapse.transport.peer import Peer
from synapse.types import (
    Capability,
    ErrorCode,
    LocalProtocolError,
    MissingField,
    Reason,
    TaskError,
    TaskResult,
)

if TYPE_CHECKING:
    pass

from datetime import datetime
from typing import Protocol

from synapse.router.fanout import PartRouter
from synapse.runtime.view import RuntimeView
from synapse.types import (
    HumanContext,
    HumanDecisionPayload,
    HumanOption,
    Priority,
    TaskContext,
)

#: `context.metadata` key of a sub-task: how many routers the task came through.
HOPS_KEY = "route_hops"


class Relay:
    """The original task, as a routed sub-task talks to it: progress, questions, decisions.

    Questions of concurrent sub-tasks (fan-out) are asked one at a time: the requester sees one
    `task_need_info` or `task_need_human` after another.
    """

    def __init__(self, ctx: ExecutionContext, view: RuntimeView) -> None:
        self.ctx = ctx
        #: The router's peer, as it reads its tasks.
        self.view = view
        self._ask = asyncio.Lock()

    @property
    def task_id(self) -> str:
        return self.ctx.task_id

    @property
    def deadline(self) -> datetime | None:
        return self.ctx.task.deadline

    @property
    def priority(self) -> Priority:
        return self.ctx.task.priority

    def sub_context(self) -> TaskContext:
        """The context of a sub-task: the requester's session and correlation, with
        `parent_task_id` = this task. Its `metadata` stays here — it may hold what only the
        router may see (an A2A requester's push tokens, say) — but for the hop count and
        the tasks the original is related to (`RELATED_KEY`)."""
        original = self.ctx.context
        metadata: dict[str, Any] = {HOPS_KEY: self.hops + 1}
        # The tasks an A2A requester's message relates this one to, as it may see them:
        # the partner picked reads them as this task's handler would (`related_tasks`).
        related = related_tasks(self.ctx)
        if related.referenced or related.missing or related.context:
            metadata[RELATED_KEY] = related.to_builtins()
        return TaskContext(
            session_id=original.session_id if original else None,
            parent_task_id=self.ctx.task_id,
            correlation_id=(original.correlation_id if original else None) or self.ctx.task_id,
            metadata=metadata,
        )

    @property
    def hops(self) -> int:
        """Routers the original task came through before this one."""
        original = self.ctx.context
        value = original.metadata.get(HOPS_KEY) if original is not None else None
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0

    async def progress(
        self, progress: float | None = None, message: str = "", intermediate_result: Any = None
    ) -> None:
        # The original may wait for an answer meanwhile (a sibling part asked): skip it.
        with contextlib.suppress(LocalProtocolError):
            await self.ctx.progress(progress, message, intermediate_result)

    async def need_info(
        self,
        missing_fields: Sequence[MissingField],
        *,
        question: str = "",
        required_by: datetime | None = None,
    ) -> dict[str, Any]:
        async with self._ask:
            return await self.ctx.need_info(
                missing_fields, question=question, required_by=required_by
            )

    async def need_human(
        self,
        reason: Reason,
        *,
        context: HumanContext | None = None,
        options: Sequence[HumanOption] = (),
        escalation_level: int = 1,
        deadline: datetime | None = None,
    ) -> HumanDecisionPayload:
        async with self._ask:
            return await self.ctx.need_human(
                reason,
                context=context,
                options=options,
                escalation_level=escalation_level,
                deadline=deadline,
            )

    def human_rejection(self) -> str | None:
        """Why the original requester's person rejected the task, if that is why it stopped."""
        rec = self.view.get(self.ctx.key)
        if rec is None or rec.error is None:
            return None
        if rec.error.code == ErrorCode.PERMISSION_DENIED.value and rec.need_human is not None:
            return rec.error.message
        return None


class RoutingHost(PartRouter[Relay], Protocol):
    """What the routing handler asks of its router (`Router`)."""

    @property
    def peer(self) -> Peer: ...

    @property
    def config(self) -> PoolConfig: ...

    @property
    def plans(self) -> Mapping[str, FanOutPlan]: ...

    def capabilities(self) -> list[Capability]: ...


class RoutingHandler:
    """The router's `TaskHandler`: it offers what its usable partners offer."""

    def __init__(self, router: RoutingHost) -> None:
        self.router = router

    def get_capabilities(self) -> Sequence[Capability]:
        return self.router.capabilities()

    def validate_task(self, task_type: str, payload: dict[str, Any]) -> Validation:
        # The engine has refused types nobody offers (`capability_lacking`); the partner
        # judges the payload, and its questions reach the requester.
        return Validation()

    def is_resumable(self, task_type: str) -> bool:
        """Every routed task goes on after a restart: its sub-tasks are noted with it
        (`ExecutionContext.note`), and followed again rather than started anew."""
        return True

    async def execute_task(
        self, ctx: ExecutionContext, task_type: str, payload: dict[str, Any]
    ) -> TaskResult:
        relay = Relay(ctx, self.router.peer.protocol.view)
        if relay.hops >= self.router.config.max_hops:
            raise TaskFailure(
                task_error(
                    ErrorCode.INVALID_PARAMS,
                    f"the task came through {relay.hops} routers (max_hops): a routing loop?",
                    recoverable=False,
                )
            )
        plan = self.router.plans.get(task_type)
        if plan is not None:
            return await run_plan(self.router, relay, plan, payload)
        routed = await self.router.route(relay, task_type, payload)
        if routed.ok and routed.result is not None:
            return routed.result
        raise TaskFailure(routed.error or task_error(ErrorCode.EXECUTION_FAILED, "no result"))


def task_error(
    code: ErrorCode | str, message: str, *, recoverable: bool = True, **details: Any
) -> TaskError:
    return TaskError(
        code=code.value if isinstance(code, ErrorCode) else code,
        message=message,
        recoverable=recoverable,
        details=details or None,
    )
