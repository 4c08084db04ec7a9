"""Fan-out over loopback: one task split into parts on different spokes, combined; partial
failure explicit; a cancel reaches every part."""

from __future__ import annotations

import asyncio
from typing import Any

from routerkit import WAIT, until

from synapse.router import FanOutPlan, SubResult, SubTask
from synapse.types import ErrorCode, TaskState

HubFactory = Any


def split_texts(payload: dict[str, Any]) -> list[SubTask]:
    return [SubTask("echo", {"text": t}) for t in payload["texts"]]


def join_texts(parts: list[SubResult]) -> dict[str, Any]:
    return {
        "texts": [p.result.output if p.result else None for p in parts],
        "partners": [p.partner for p in parts],
        "failed": [p.index for p in parts if not p.ok],
    }


def split_mixed(payload: dict[str, Any]) -> list[SubTask]:
    return [SubTask("echo", {"text": "a"}), SubTask("fail", {}), SubTask("echo", {"text": "c"})]


def split_slow(payload: dict[str, Any]) -> list[SubTask]:
    return [SubTask("slow", {"steps": 1000, "delay": 0.05}) for _ in range(3)]


PLANS = {
    "echo_many": FanOutPlan(split_texts, join_texts),
    "mixed_strict": FanOutPlan(split_mixed, join_texts, on_partial="fail"),
    "mixed_lenient": FanOutPlan(split_mixed, join_texts, on_partial="combine"),
    "slow_many": FanOutPlan(split_slow, join_texts),
}
SPOKES = ["lacking", "busy", "flaky"]


async def test_parts_run_on_different_spokes_and_are_combined(make_hub: HubFactory) -> None:
    async with make_hub(router_kw={"plans": PLANS}, pin={"echo": SPOKES}) as hub:
        caps = await hub.client.capabilities("hub")
        assert "echo_many" in {c.name for c in caps.capabilities}
        handle = await hub.submit("echo_many", {"texts": ["x", "y", "z"]})
        outcome = await handle.result(WAIT)
        assert outcome.ok, outcome
        assert outcome.result is not None
        combined = outcome.result.output
        assert combined["texts"] == ["x", "y", "z"]
        assert sorted(combined["partners"]) == sorted(SPOKES)  # one part each
        for name in SPOKES:
            handler = hub.handlers[name]
            assert handler.starts[handle.task_id] == 1
            # Each part's context names the original task.
            assert list(handler.parents.values()) == [handle.task_id]


async def test_a_failed_part_fails_the_task_when_the_plan_is_strict(
    make_hub: HubFactory,
) -> None:
    async with make_hub(router_kw={"plans": PLANS}, pin={"echo": SPOKES, "fail": SPOKES}) as hub:
        handle = await hub.submit("mixed_strict", {})
        outcome = await handle.result(WAIT)
        assert outcome.state is TaskState.FAILED
        assert outcome.error is not None
        assert outcome.error.code == ErrorCode.EXECUTION_FAILED.value
        assert "part 1 (fail) failed" in outcome.error.message
        parts = outcome.error.details["parts"]
        assert [p["index"] for p in parts] == [0, 1, 2]
        assert parts[1]["state"] == "failed"
        assert sum(hub.starts(handle.task_id).values()) <= 3


async def test_a_lenient_plan_combines_what_succeeded(make_hub: HubFactory) -> None:
    async with make_hub(router_kw={"plans": PLANS}, pin={"echo": SPOKES, "fail": SPOKES}) as hub:
        handle = await hub.submit("mixed_lenient", {})
        outcome = await handle.result(WAIT)
        assert outcome.ok, outcome
        assert outcome.result is not None
        assert outcome.result.output["texts"] == ["a", None, "c"]
        assert outcome.result.output["failed"] == [1]
        assert sum(hub.starts(handle.task_id).values()) == 3  # one start per part


async def test_cancelling_a_fanned_out_task_cancels_every_part(make_hub: HubFactory) -> None:
    async with make_hub(
        router_kw={"plans": PLANS}, pin={"slow": ["lacking", "flaky", "sdk"]}
    ) as hub:
        hub.handlers["lacking"].offered.add("slow")
        await hub.router.refresh()
        handle = await hub.submit("slow_many", {})
        await until(lambda: len(hub.router.commitments.by_task) == 3, "three parts accepted")
        await handle.cancel()
        assert (await handle.result(WAIT)).state is TaskState.CANCELLED
        for name in ("lacking", "flaky"):
            handler = hub.handlers[name]
            await until(lambda h=handler: handle.task_id in h.cancelled, f"{name}'s cancel")
        assert await asyncio.to_thread(hub.sdk.cancel_seen.wait, WAIT)
        assert hub.starts(handle.task_id) == {"lacking": 1, "flaky": 1, "sdk": 1}


async def test_a_routing_handler_subclass_can_fan_out_its_own_way(make_hub: HubFactory) -> None:
    from synapse.router import Relay, RoutingHandler, fan_out

    class Shouting(RoutingHandler):
        async def execute_task(self, ctx: Any, task_type: str, payload: dict[str, Any]) -> Any:
            if task_type != "echo" or "words" not in payload:
                return await super().execute_task(ctx, task_type, payload)
            parts = [SubTask("echo", {"text": w.upper()}) for w in payload["words"]]
            return await fan_out(self.router, Relay(ctx, self.router), parts, join_texts)

    async with make_hub(router_kw={"handler_class": Shouting}, pin={"echo": SPOKES}) as hub:
        handle = await hub.submit("echo", {"text": "-", "words": ["a", "b"]})
        outcome = await handle.result(WAIT)
        assert outcome.ok, outcome
        assert outcome.result is not None and outcome.result.output["texts"] == ["A", "B"]
        plain = await hub.submit("echo", {"text": "plain"})
        outcome = await plain.result(WAIT)
        assert outcome.result is not None and outcome.result.output == "plain"
