"""Fan-out: one task split into sub-tasks on different partners, their results combined.

    def split(payload):                       # the parts of one task
        return [SubTask("echo", {"text": t}) for t in payload["texts"]]

    def combine(parts):                       # every part's outcome, in order
        return {"texts": [p.result.output for p in parts if p.ok]}

    router = Router(peer, pool, plans={"echo_many": FanOutPlan(split, combine)})

A task of type `echo_many` then runs as one sub-task per part, at the same time, each on its
own partner where the pool has enough of them (each sub-task still fails over on its own).
Each sub-task's `context.parent_task_id` is the original task's id. Partial failure is
explicit (`on_partial`):

- `"fail"` (default): the first part that fails cancels the others and fails the task with
  `execution_failed`, `details.parts` saying how each part ended;
- `"combine"`: every part runs to its end and `combine` gets them all, failed ones included
  (`SubResult.ok` false, `.error` set); it decides (it may raise `TaskFailure`).

`fan_out(router, relay, parts, combine)` is what a plan runs (for a `RoutingHandler`
subclass that decides more than `split` can).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar

from synapse.logs import get_logger
from synapse.router.outcomes import Routed
from synapse.router.pool import Pool
from synapse.runtime.handler import TaskFailure, as_result
from synapse.types import ErrorCode, TaskError, TaskResult, TaskState

log = get_logger("synapse.router")

PartialPolicy = Literal["fail", "combine"]


@dataclass(frozen=True, slots=True)
class SubTask:
    """One part of a fanned-out task."""

    task_type: str
    payload: Mapping[str, Any] = field(default_factory=dict)
    #: Try this pool partner first (it still fails over if that one declines).
    partner: str | None = None


@dataclass(frozen=True, slots=True)
class SubResult:
    """How one part ended."""

    index: int
    task: SubTask
    state: TaskState
    #: The partner that ran it ("" if none accepted it).
    partner: str = ""
    result: TaskResult | None = None
    error: TaskError | None = None

    @property
    def ok(self) -> bool:
        return self.state is TaskState.COMPLETED

    def summary(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "task_type": self.task.task_type,
            "partner": self.partner,
            "state": self.state.value,
            "error": self.error.code if self.error else None,
        }


Combine = Callable[[list[SubResult]], Any]


class RelayLike(Protocol):
    """The original task a fan-out runs for (`Relay`)."""

    @property
    def task_id(self) -> str: ...


RelayT = TypeVar("RelayT", bound=RelayLike, contravariant=True)


class PartRouter(Protocol[RelayT]):
    """What a fan-out asks of the router (`Router`): its pool, its clock, and one part routed
    with fail-over."""

    @property
    def pool(self) -> Pool: ...

    @property
    def clock(self) -> Callable[[], float]: ...

    async def route(
        self,
        relay: RelayT,
        task_type: str,
        payload: Mapping[str, Any],
        *,
        part: int = 0,
        prefer: str | None = None,
        avoid: Sequence[str] = (),
    ) -> Routed: ...


@dataclass(frozen=True, slots=True)
class FanOutPlan:
    """How a router runs a task type by fan-out: `split` the payload, `combine` the parts."""

    split: Callable[[dict[str, Any]], Sequence[SubTask]]
    combine: Combine
    on_partial: PartialPolicy = "fail"
    description: str = "fanned out to several partners"


async def fan_out(
    router: PartRouter[RelayT],
    relay: RelayT,
    parts: Sequence[SubTask],
    combine: Combine,
    *,
    on_partial: PartialPolicy = "fail",
) -> TaskResult:
    """Run `parts` at once on different partners and return `combine`'s result (module doc)."""
    if not parts:
        raise TaskFailure(
            TaskError(code=ErrorCode.INVALID_PARAMS.value, message="nothing to fan out")
        )
    # Spread the parts: each prefers a partner its earlier siblings do not use.
    now = router.clock()
    chosen: list[str] = []
    preferred: list[str | None] = []
    for part in parts:
        if part.partner is not None:
            preferred.append(part.partner)
            chosen.append(part.partner)
            continue
        member = router.pool.choose(part.task_type, now, exclude=chosen)
        preferred.append(member.name if member else None)
        if member is not None:
            chosen.append(member.name)

    async def run(index: int, part: SubTask) -> SubResult:
        siblings = [p for i, p in enumerate(preferred) if i != index and p is not None]
        try:
            routed = await router.route(
                relay,
                part.task_type,
                part.payload,
                part=index + 1,
                prefer=preferred[index],
                avoid=siblings,
            )
        except TaskFailure as failure:
            return SubResult(index, part, TaskState.FAILED, error=failure.error)
        return SubResult(index, part, routed.state, routed.partner, routed.result, routed.error)

    tasks = [asyncio.create_task(run(i, p), name=f"fan-out-{i}") for i, p in enumerate(parts)]
    results: list[SubResult | None] = [None] * len(parts)
    try:
        pending = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                sub = task.result()
                results[sub.index] = sub
                if not sub.ok and on_partial == "fail":
                    for other in pending:
                        other.cancel()
                    await asyncio.gather(*pending, return_exceptions=True)
                    pending = set()
                    break
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    finished = [r for r in results if r is not None]
    log.info(
        "route_fan_out",
        task_id=relay.task_id,
        parts=[r.summary() for r in finished],
    )
    failed = [r for r in finished if not r.ok]
    if failed and on_partial == "fail":
        first = failed[0]
        raise TaskFailure(
            TaskError(
                code=ErrorCode.EXECUTION_FAILED.value,
                message=f"part {first.index} ({first.task.task_type}) failed: "
                f"{first.error.message if first.error else first.state.value}",
                recoverable=True,
                details={"parts": [_summary(results, i) for i in range(len(parts))]},
            )
        )
    return as_result(combine(sorted(finished, key=lambda r: r.index)))


def _summary(results: Sequence[SubResult | None], index: int) -> dict[str, Any]:
    found = results[index]
    return found.summary() if found is not None else {"index": index, "state": "cancelled"}


async def run_plan(
    router: PartRouter[RelayT], relay: RelayT, plan: FanOutPlan, payload: dict[str, Any]
) -> TaskResult:
    """A router's task of a fan-out type: split, fan out, combine."""
    try:
        parts = list(plan.split(payload))
    except Exception as exc:
        raise TaskFailure(
            TaskError(code=ErrorCode.INVALID_PARAMS.value, message=f"cannot split it: {exc}")
        ) from exc
    return await fan_out(router, relay, parts, plan.combine, on_partial=plan.on_partial)


__all__ = ["Combine", "FanOutPlan", "PartialPolicy", "SubResult", "SubTask", "fan_out", "run_plan"]
