"""A pool partner reached over A2A that is a Synapse peer speaking A2A (`enable_a2a`): its
INPUT_REQUIRED questions carry `missing_fields` and `synapseNeeds`, which the router turns
back into `task_need_info` and `task_need_human` for the client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from routerkit import FAST, WAIT, CountingHandler, records, until

from synapse.a2a import enable_a2a
from synapse.router.pool import A2APartnerConfig
from synapse.transport.peer import Peer
from synapse.types import ErrorCode, TaskState

HubFactory = Any


@pytest.fixture
async def a2a_demo() -> AsyncIterator[tuple[Peer, CountingHandler]]:
    handler = CountingHandler()
    peer = Peer("a2a-demo", handler=handler, config=FAST)
    enable_a2a(peer, default_task_type=None)
    async with peer:
        yield peer, handler


def base_url(peer: Peer) -> str:
    return peer.endpoint.removesuffix(peer.path)


async def test_need_info_from_a_synapse_agent_over_a2a_keeps_its_fields(
    make_hub: HubFactory, a2a_demo: tuple[Peer, CountingHandler]
) -> None:
    peer, handler = a2a_demo
    extra = (A2APartnerConfig(name="a2a-demo", url=base_url(peer)),)
    async with make_hub(extra_a2a=extra, pin={"text_generation": ["a2a-demo"]}) as hub:
        handle = await hub.submit("text_generation", {"prompt": "春天"})
        asked: list[list[str]] = []
        async with asyncio.timeout(WAIT):
            async for event in handle:
                if event.kind == "p2p:task_need_info":
                    fields = [f.field for f in event.message.payload.missing_fields]
                    asked.append(fields)
                    await handle.provide_info({"style": "现代"})
        outcome = await handle
        assert asked == [["style"]]
        assert outcome.ok, outcome
        assert outcome.result is not None and "现代" in outcome.result.output
        assert sum(handler.starts.values()) == 1


@pytest.mark.parametrize("approve", [True, False], ids=["approve", "reject"])
async def test_need_human_from_a_synapse_agent_over_a2a(
    make_hub: HubFactory, a2a_demo: tuple[Peer, CountingHandler], approve: bool
) -> None:
    peer, handler = a2a_demo
    extra = (A2APartnerConfig(name="a2a-demo", url=base_url(peer)),)
    async with make_hub(extra_a2a=extra, pin={"portrait": ["a2a-demo"]}) as hub:
        handle = await hub.submit("portrait", {"subject": "Ada"})
        kinds: list[str] = []
        async with asyncio.timeout(WAIT):
            async for event in handle:
                kinds.append(event.kind)
                if event.kind == "p2p:task_need_human":
                    if approve:
                        await handle.approve({"authorized": True})
                    else:
                        await handle.reject("no consent")
        outcome = await handle
        assert "p2p:task_need_human" in kinds
        if approve:
            assert outcome.ok, outcome
            assert outcome.result is not None and outcome.result.output == "portrait of Ada"
        else:
            assert outcome.state is TaskState.FAILED
            assert outcome.error is not None
            assert outcome.error.code == ErrorCode.PERMISSION_DENIED.value
            # The agent's own task ended rejected by the person, not merely cancelled.
            # Read again each time: a record is a value the engine replaces as the task moves.
            await until(lambda: records(peer)[0].is_final, "the agent's end")
            (rec,) = records(peer)
            assert rec.error is not None
            assert rec.error.code == ErrorCode.PERMISSION_DENIED.value
        assert sum(handler.starts.values()) == 1


async def test_a2a_clients_reach_the_router_too(make_hub: HubFactory) -> None:
    from synapse.a2a import A2AClient

    async with make_hub(hub_a2a=True, pin={"text_generation": ["busy"]}) as hub:
        base = hub.hub.endpoint.removesuffix(hub.hub.path)
        async with A2AClient(base, config=FAST) as client:
            assert client.card is not None
            assert "text_generation" in {s.id for s in client.card.skills}  # routed types
            handle = await client.send({"prompt": "春天"}, task_type="text_generation")
            async with asyncio.timeout(WAIT):
                async for event in handle:
                    if event.input_required:
                        await handle.provide_info({"style": "现代"})
            outcome = await handle
        assert outcome.ok, outcome
        assert outcome.result is not None and "现代" in outcome.result.output
        assert sum(hub.handlers["busy"].starts.values()) == 1
        # The A2A requester's context metadata (principal, push configuration) stayed at the
        # hub: the spoke's task carries none of it.
        (rec,) = [r for r in records(hub.spokes["busy"])]
        assert rec.context is not None and rec.context.metadata == {"route_hops": 1}
        assert rec.context.parent_task_id is not None


async def test_an_a2a_agent_at_capacity_fails_over_with_its_retry_after(
    make_hub: HubFactory,
) -> None:
    from synapse.a2a import A2AClient
    from synapse.p2p.config import P2PConfig

    handler = CountingHandler()
    full = Peer(
        "a2a-full",
        handler=handler,
        config=P2PConfig(max_concurrent_tasks=1, capacity_retry_after=7, heartbeat_interval=0.2),
    )
    enable_a2a(full, default_task_type=None)
    async with full:
        extra = (A2APartnerConfig(name="a2a-full", url=base_url(full)),)
        async with (
            make_hub(extra_a2a=extra, pin={"slow": ["a2a-full", "flaky"]}) as hub,
            A2AClient(base_url(full), config=FAST) as other,
        ):
            # Another A2A client fills its only slot.
            blocker = await other.send({"steps": 1000, "delay": 0.05}, task_type="slow")
            await until(lambda: sum(handler.starts.values()) == 1, "the blocker")
            handle = await hub.submit("slow", {"steps": 1, "delay": 0.01})
            assert (await handle.result(WAIT)).ok
            assert hub.starts(handle.task_id) == {"flaky": 1}
            member = hub.router.pool.members["a2a-full"]
            assert member.busy_until - hub.router.clock() > 5  # its retry_after (7 s) noted
            assert sum(handler.starts.values()) == 1  # only the blocker ever ran there
            await blocker.cancel()


async def test_the_router_passes_an_a2a_tasks_related_tasks_on_to_its_partner(
    make_hub: HubFactory,
) -> None:
    """An A2A requester's message references an earlier task of its context: the spoke the
    router picks reads the same related tasks (`related_tasks`) as a handler at the hub
    would, from its sub-task's context."""
    from synapse.a2a import A2AClient, RelatedTasks
    from synapse.a2a.server.related import RELATED_KEY

    async with make_hub(hub_a2a=True, pin={"echo": ["flaky"]}) as hub:
        base = hub.hub.endpoint.removesuffix(hub.hub.path)
        async with A2AClient(base, config=FAST) as client:
            first = await (await client.send({"text": "one"}, task_type="echo", context_id="c1"))
            assert first.task is not None
            handle = await client.send(
                {"text": "two"}, task_type="echo", context_id="c1", references=[first.task.id]
            )
            second = await handle
        assert first.ok and second.ok, (first, second)
        spoke_records = {
            r.key.task_id: r for r in records(hub.spokes["flaky"]) if r.context is not None
        }
        (routed,) = [
            r for r in spoke_records.values() if r.context and RELATED_KEY in r.context.metadata
        ]
        assert routed.context is not None
        related = RelatedTasks.from_builtins(routed.context.metadata[RELATED_KEY])
        assert [t.id for t in related.referenced] == [first.task.id]
        assert [t.id for t in related.context] == [first.task.id]
        assert related.referenced[0].status.state == "TASK_STATE_COMPLETED"
        assert related.missing == []
