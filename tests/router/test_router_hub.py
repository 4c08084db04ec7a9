"""A hub routing for a client over four spokes, on real loopback HTTP (see routerkit.py).

Tasks of each demo type reach a spoke that offers them; rejects (`rate_limited` with
`retry_after`, `capability_lacking`, a suggested agent) and outages fail over before
confirmation; need_info and need_human round-trip to the client; progress is relayed; a cancel
propagates; no task is started twice anywhere.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from routerkit import WAIT, kinds_of, next_event, records, until

from synapse.p2p.config import P2PConfig
from synapse.p2p.engine import Validation
from synapse.runtime.listener import OnMessage
from synapse.transport.partners import Partner
from synapse.types import (
    Alternatives,
    ErrorCode,
    Reason,
    TaskContext,
    TaskRejectPayload,
    TaskState,
)

HubFactory = Any


async def answer(
    handle: Any, fields: dict[str, Any] | None = None, approve: bool = True
) -> list[str]:
    """Follow a client handle to its end, answering questions; return the event kinds."""
    kinds: list[str] = []
    async for event in handle:
        kinds.append(event.kind)
        if event.kind == "p2p:task_need_info":
            asked = [f.field for f in event.message.payload.missing_fields]
            await handle.provide_info({f: (fields or {})[f] for f in asked})
        elif event.kind == "p2p:task_need_human":
            if approve:
                await handle.approve({"authorized": True})
            else:
                await handle.reject("no consent")
    return kinds


def spoke_progress(event: Any) -> bool:
    """A status update with a progress figure: the spoke's own, relayed (the hub sends none)."""
    return event.kind == "p2p:task_status_update" and bool(event.message.payload.progress)


def sdk_progress(event: Any) -> bool:
    """A status update relayed from the SDK agent (`step N`)."""
    return event.kind == "p2p:task_status_update" and event.message.payload.message.startswith(
        "step"
    )


# --- every demo type reaches a capable spoke -------------------------------------------------


@pytest.mark.parametrize(
    ("task_type", "payload", "fields", "expected"),
    [
        ("echo", {"text": "hi"}, None, TaskState.COMPLETED),
        ("slow", {"steps": 2, "delay": 0.01}, None, TaskState.COMPLETED),
        ("text_generation", {"prompt": "春天"}, {"style": "现代"}, TaskState.COMPLETED),
        ("portrait", {"subject": "Ada"}, None, TaskState.COMPLETED),
        ("fail", {}, None, TaskState.FAILED),
    ],
)
async def test_each_demo_type_reaches_a_capable_spoke_once(
    make_hub: HubFactory,
    task_type: str,
    payload: dict[str, Any],
    fields: dict[str, Any] | None,
    expected: TaskState,
) -> None:
    # The SDK spoke is left out here: its own tests below cover it.
    async with make_hub(pin={task_type: ["lacking", "busy", "flaky"]}) as hub:
        handle = await hub.submit(task_type, payload)
        kinds = await asyncio.wait_for(answer(handle, fields), WAIT)
        outcome = await handle
        assert outcome.state is expected, outcome
        ran = hub.ran_at(handle.task_id)
        assert task_type in hub.handlers[ran].offered
        assert hub.starts(handle.task_id) == {ran: 1}
        if task_type == "text_generation":
            assert "p2p:task_need_info" in kinds
            assert outcome.result is not None and "现代" in outcome.result.output
        if task_type == "portrait":
            assert "p2p:task_need_human" in kinds
        if task_type == "slow":
            assert kinds.count("p2p:task_status_update") >= 3  # hub's own, then the spoke's
        if task_type == "fail":
            assert outcome.error is not None
            assert outcome.error.code == ErrorCode.EXECUTION_FAILED.value
            assert "always fails" in outcome.error.message


async def test_a_type_only_one_spoke_lacks_never_goes_to_it(make_hub: HubFactory) -> None:
    async with make_hub(pin={"portrait": ["lacking", "flaky"]}) as hub:
        assert "portrait" not in hub.router.pool.members["lacking"].offers
        handle = await hub.submit("portrait", {"subject": "Ada"})
        await asyncio.wait_for(answer(handle), WAIT)
        assert (await handle).ok
        assert hub.starts(handle.task_id) == {"flaky": 1}


async def test_a_type_no_pool_partner_offers_is_rejected_capability_lacking(
    make_hub: HubFactory,
) -> None:
    async with make_hub() as hub:
        handle = await hub.submit("translate", {"text": "hi"})
        outcome = await handle.result(WAIT)
        assert outcome.state is TaskState.REJECTED
        assert outcome.reject is not None
        assert outcome.reject.reason.code == ErrorCode.CAPABILITY_LACKING.value


# --- failover before confirmation -------------------------------------------------------------


async def test_rate_limited_with_retry_after_fails_over_to_the_next_spoke(
    make_hub: HubFactory,
) -> None:
    async with make_hub(pin={"slow": ["busy", "flaky"]}) as hub:
        # Someone else fills the busy spoke's only slot; the hub's view of it is still "room".
        blocker = await hub.occupy.submit("busy", "slow", {"steps": 1000, "delay": 0.05})
        await until(lambda: hub.handlers["busy"].starts[blocker.task_id] == 1, "the blocker")
        assert hub.router.pool.members["busy"].has_room(hub.router.clock())
        handle = await hub.submit("slow", {"steps": 2, "delay": 0.01})
        outcome = await handle.result(WAIT)
        assert outcome.ok
        assert hub.starts(handle.task_id) == {"flaky": 1}
        busy = hub.router.pool.members["busy"]
        assert busy.busy_until > 0  # its retry_after was noted
        # The spoke really refused the hub's request (rate_limited, retry_after 1).
        refused = [rec for rec in records(hub.spokes["busy"]) if rec.partner == "hub"]
        assert [r.state for r in refused] == [TaskState.REJECTED]
        assert refused[0].reject is not None
        assert refused[0].reject.reason.code == ErrorCode.RATE_LIMITED.value
        assert refused[0].reject.alternatives is not None
        assert refused[0].reject.alternatives.retry_after == 1
        await blocker.cancel()


async def test_retry_after_is_waited_for_when_no_other_spoke_can(make_hub: HubFactory) -> None:
    async with make_hub(pin={"slow": ["busy"]}) as hub:
        blocker = await hub.occupy.submit("busy", "slow", {"steps": 1000, "delay": 0.05})
        await until(lambda: hub.handlers["busy"].starts[blocker.task_id] == 1, "the blocker")
        handle = await hub.submit("slow", {"steps": 1, "delay": 0.01})
        # The hub was told to come back in 1 s; free the slot meanwhile.
        await until(lambda: hub.router.pool.members["busy"].busy_until > 0, "the reject")
        assert not handle.state.is_final
        await blocker.cancel()
        outcome = await handle.result(WAIT)
        assert outcome.ok
        assert hub.starts(handle.task_id) == {"busy": 1}


async def test_capability_lacking_from_a_stale_view_fails_over(make_hub: HubFactory) -> None:
    async with make_hub(pin={"echo": ["lacking", "flaky"]}) as hub:
        hub.handlers["lacking"].offered.discard("echo")  # after the hub's refresh
        handle = await hub.submit("echo", {"text": "hi"})
        outcome = await handle.result(WAIT)
        assert outcome.ok
        assert hub.starts(handle.task_id) == {"flaky": 1}
        assert "echo" not in hub.router.pool.members["lacking"].offers  # learnt


def reject_suggesting(peer: Any, suggested: str) -> None:
    """Make `peer` refuse every task with `capability_lacking`, suggesting another agent."""

    def judge(spec: Any, now: float) -> TaskRejectPayload:
        return TaskRejectPayload(
            task_id=spec.id,
            reason=Reason(code=ErrorCode.CAPABILITY_LACKING.value, message="ask another"),
            alternatives=Alternatives(suggested_agent_id=suggested),
        )

    peer.protocol.engine._judge = judge


async def test_a_suggested_agent_in_the_pool_is_tried_next(make_hub: HubFactory) -> None:
    # Without the suggestion, `busy` would come after `lacking`; the suggestion wins.
    async with make_hub(pin={"echo": ["lacking", "busy", "flaky"]}) as hub:
        reject_suggesting(hub.spokes["lacking"], "flaky")
        handle = await hub.submit("echo", {"text": "hi"})
        assert (await handle.result(WAIT)).ok
        assert hub.starts(handle.task_id) == {"flaky": 1}


async def test_a_suggested_agent_outside_the_pool_is_never_used(make_hub: HubFactory) -> None:
    async with make_hub(pin={"echo": ["lacking", "busy"]}) as hub:
        # `occupy` is a real, reachable peer the hub even knows nothing of: not in the pool.
        reject_suggesting(hub.spokes["lacking"], "occupy")
        handle = await hub.submit("echo", {"text": "hi"})
        assert (await handle.result(WAIT)).ok
        assert hub.starts(handle.task_id) == {"busy": 1}
        assert "occupy" not in hub.hub.partners


async def test_a_spoke_that_is_down_fails_over_and_is_refreshed(make_hub: HubFactory) -> None:
    async with make_hub(pin={"echo": ["flaky", "busy"]}) as hub:
        await hub.spokes["flaky"].close(drain_timeout=0)
        assert hub.router.pool.members["flaky"].reachable  # the hub has not noticed yet
        handle = await hub.submit("echo", {"text": "hi"})
        assert (await handle.result(WAIT)).ok
        assert hub.starts(handle.task_id) == {"busy": 1}
        flaky = hub.router.pool.members["flaky"]
        assert not flaky.reachable
        # The failure triggered a refresh of that spoke (which still fails).
        await until(lambda: flaky.note.startswith("refresh failed"), "the refresh")
        # While it is down, its tasks go elsewhere at once.
        again = await hub.submit("echo", {"text": "again"})
        assert (await again.result(WAIT)).ok
        assert hub.starts(again.task_id) == {"busy": 1}


async def test_a_spoke_going_down_after_confirming_is_not_replaced(make_hub: HubFactory) -> None:
    async with make_hub(pin={"slow": ["flaky", "lacking", "busy"]}) as hub:
        handle = await hub.submit("slow", {"steps": 1000, "delay": 0.05})
        await next_event(handle, spoke_progress)  # the spoke's own progress reached the client
        assert hub.starts(handle.task_id) == {"flaky": 1}
        await hub.spokes["flaky"].close(drain_timeout=0)
        outcome = await handle.result(WAIT)
        assert outcome.state is TaskState.FAILED
        assert outcome.error is not None and "not run elsewhere" in outcome.error.message
        assert hub.starts(handle.task_id) == {"flaky": 1}  # never given to another spoke


# --- pass-through ---------------------------------------------------------------------------


async def test_need_human_rejected_by_the_client_rejects_at_the_spoke(
    make_hub: HubFactory,
) -> None:
    async with make_hub(pin={"portrait": ["flaky"]}) as hub:
        handle = await hub.submit("portrait", {"subject": "Ada"})
        kinds = await asyncio.wait_for(answer(handle, approve=False), WAIT)
        outcome = await handle
        assert "p2p:task_need_human" in kinds
        assert outcome.state is TaskState.FAILED
        assert outcome.error is not None
        assert outcome.error.code == ErrorCode.PERMISSION_DENIED.value
        spoke = hub.spokes["flaky"].protocol.engine

        def spoke_side() -> list[Any]:
            return [r for r in spoke.tasks.values() if r.partner == "hub"]

        await until(lambda: all(r.is_final for r in spoke_side()), "the spoke's end")
        (rec,) = spoke_side()
        assert rec.error is not None and rec.error.code == ErrorCode.PERMISSION_DENIED.value
        assert rec.error.message == "no consent"


async def test_progress_is_relayed_in_order(make_hub: HubFactory) -> None:
    async with make_hub(pin={"slow": ["flaky"]}) as hub:
        handle = await hub.submit("slow", {"steps": 4, "delay": 0.01})
        async with asyncio.timeout(WAIT):
            progress = [
                e.message.payload.progress
                async for e in handle
                if e.kind == "p2p:task_status_update" and e.message.payload.progress is not None
            ]
        assert progress == [25, 50, 75, 100]


async def test_cancel_propagates_to_the_spoke(make_hub: HubFactory) -> None:
    async with make_hub(pin={"slow": ["flaky"]}) as hub:
        handle = await hub.submit("slow", {"steps": 1000, "delay": 0.05})
        await next_event(handle, spoke_progress)
        await handle.cancel("changed my mind")
        outcome = await handle.result(WAIT)
        assert outcome.state is TaskState.CANCELLED
        handler = hub.handlers["flaky"]
        await until(lambda: handle.task_id in handler.cancelled, "the spoke's cancel")
        assert hub.starts(handle.task_id) == {"flaky": 1}


async def test_the_final_outcome_reaches_the_client_once(make_hub: HubFactory) -> None:
    async with make_hub(pin={"echo": ["busy"]}) as hub:
        handle = await hub.submit("echo", {"text": "once"})
        kinds = await kinds_of(handle)
        assert kinds.count("p2p:task_complete") == 1
        assert kinds[-1] == "p2p:task_complete"


# --- the A2A spoke (official SDK server) -----------------------------------------------------


async def test_echo_reaches_the_a2a_spoke(make_hub: HubFactory) -> None:
    async with make_hub(pin={"echo": ["sdk"]}) as hub:
        assert hub.router.pool.members["sdk"].offers == {"echo", "text_generation", "slow", "fail"}
        handle = await hub.submit("echo", {"text": "via a2a"})
        outcome = await handle.result(WAIT)
        assert outcome.ok, outcome
        assert outcome.result is not None and outcome.result.output == "via a2a"
        assert hub.starts(handle.task_id) == {"sdk": 1}


async def test_an_a2a_question_round_trips_to_the_client(make_hub: HubFactory) -> None:
    async with make_hub(pin={"text_generation": ["sdk"]}) as hub:
        handle = await hub.submit("text_generation", {"prompt": "spring"})
        asked: list[str] = []
        async with asyncio.timeout(WAIT):
            async for event in handle:
                if event.kind == "p2p:task_need_info":
                    need = event.message.payload
                    asked.append(need.question)
                    assert [f.field for f in need.missing_fields] == ["answer"]
                    await handle.provide_info({"answer": "haiku"})
        outcome = await handle
        assert asked == ["Which style?"]
        assert outcome.ok, outcome
        assert outcome.result is not None and outcome.result.output == "poem about spring in haiku"
        assert hub.starts(handle.task_id) == {"sdk": 1}


async def test_an_a2a_failure_is_relayed(make_hub: HubFactory) -> None:
    async with make_hub(pin={"fail": ["sdk"]}) as hub:
        handle = await hub.submit("fail", {})
        outcome = await handle.result(WAIT)
        assert outcome.state is TaskState.FAILED
        assert outcome.error is not None and "it broke" in outcome.error.message
        assert hub.starts(handle.task_id) == {"sdk": 1}


async def test_cancel_propagates_to_the_a2a_spoke(make_hub: HubFactory) -> None:
    async with make_hub(pin={"slow": ["sdk"]}) as hub:
        handle = await hub.submit("slow", {})
        await next_event(handle, sdk_progress)  # the SDK agent's own progress reached the client
        await handle.cancel()
        outcome = await handle.result(WAIT)
        assert outcome.state is TaskState.CANCELLED
        assert await asyncio.to_thread(hub.sdk.cancel_seen.wait, WAIT)
        assert hub.starts(handle.task_id) == {"sdk": 1}


async def test_an_unreachable_a2a_spoke_fails_over(make_hub: HubFactory) -> None:
    async with make_hub(pin={"echo": ["sdk", "busy"]}) as hub:
        client = hub.router._a2a["sdk"].client
        assert client is not None
        served = client.rpc_url
        client.rpc_url = "http://127.0.0.1:9/"  # nothing listens on the discard port
        refreshes = hub.router.refreshes
        handle = await hub.submit("echo", {"text": "hi"})
        assert (await handle.result(WAIT)).ok
        assert hub.starts(handle.task_id) == {"busy": 1}
        # The failure made the hub rediscover it at once: its card's interface is back.
        await until(lambda: hub.router.refreshes > refreshes, "the refresh on failure")
        assert client.rpc_url == served
        assert hub.router.pool.members["sdk"].reachable


async def test_tasks_spread_over_spokes_by_load(make_hub: HubFactory) -> None:
    async with make_hub(pin={"slow": ["lacking", "busy", "flaky", "sdk"]}) as hub:
        hub.handlers["lacking"].offered.add("slow")
        await hub.router.refresh()
        handles = [await hub.submit("slow", {"steps": 1000, "delay": 0.05}) for _ in range(4)]
        await until(lambda: len(hub.router.commitments.by_task) == 4, "four acceptances")
        where = sorted(hub.ran_at(h.task_id) for h in handles)
        assert where == ["busy", "flaky", "lacking", "sdk"]  # least loaded first, one each
        for handle in handles:
            await handle.cancel()
        for handle in handles:
            assert (await handle.result(WAIT)).state is TaskState.CANCELLED


# --- deadlines and refreshes ------------------------------------------------------------------


async def test_failover_stops_at_the_task_deadline(make_hub: HubFactory) -> None:
    async with make_hub(pin={"slow": ["busy"]}) as hub:
        blocker = await hub.occupy.submit("busy", "slow", {"steps": 1000, "delay": 0.05})
        await until(lambda: hub.handlers["busy"].starts[blocker.task_id] == 1, "the blocker")
        deadline = datetime.now(UTC) + timedelta(seconds=2.5)
        # busy keeps asking to come back in 1 s; nobody else may take it; the deadline ends it.
        handle = await hub.submit("slow", {"steps": 1, "delay": 0.01}, deadline=deadline)
        outcome = await handle.result(WAIT)
        assert outcome.state is TaskState.FAILED
        assert outcome.error is not None
        assert outcome.error.code in {
            ErrorCode.RATE_LIMITED.value,
            ErrorCode.EXECUTION_TIMEOUT.value,
        }
        assert hub.starts(handle.task_id) == {}
        await blocker.cancel()


async def test_the_pool_is_refreshed_periodically(make_hub: HubFactory) -> None:
    async with make_hub(refresh_interval=0.1) as hub:
        lacking = hub.router.pool.members["lacking"]
        assert "portrait" not in lacking.offers
        hub.handlers["lacking"].offered.add("portrait")
        refreshes = hub.router.refreshes
        # Nothing failed: only the period can bring the new offer in.
        await until(lambda: hub.router.refreshes >= refreshes + 2, "two more refreshes")
        assert "portrait" in lacking.offers


async def test_a_question_the_spoke_gives_up_on_is_withdrawn(make_hub: HubFactory) -> None:
    async with make_hub(pin={"text_generation": ["flaky"]}) as hub:
        engine = hub.spokes["flaky"].protocol.engine

        def impatient(task_type: str, payload: dict[str, Any]) -> Validation:
            return Validation(
                missing_fields=["style"],
                required_by=datetime.now(UTC) + timedelta(seconds=0.3),
            )

        engine.validator = impatient
        handle = await hub.submit("text_generation", {"prompt": "x"})
        kinds = await kinds_of(handle)  # the client never answers
        outcome = await handle
        assert "p2p:task_need_info" in kinds
        assert outcome.state is TaskState.FAILED
        assert outcome.error is not None
        assert outcome.error.code == ErrorCode.EXECUTION_TIMEOUT.value


async def test_a_request_the_spoke_refuses_outright_fails_over(make_hub: HubFactory) -> None:
    async with make_hub(pin={"echo": ["lacking", "busy"]}) as hub:
        # `lacking` no longer shares the hub's secret: it refuses the request (a nack).
        lacking = hub.spokes["lacking"]
        lacking.partners.add(Partner("hub", hub.hub.endpoint, ("another-secret",)))
        handle = await hub.submit("echo", {"text": "hi"})
        assert (await handle.result(WAIT)).ok
        assert hub.starts(handle.task_id) == {"busy": 1}


async def test_heartbeats_keep_the_load_picture_current(make_hub: HubFactory) -> None:
    async with make_hub(pin={"slow": ["flaky"]}) as hub:
        flaky = hub.router.pool.members["flaky"]
        assert flaky.remote_active == 0
        handle = await hub.submit("slow", {"steps": 1000, "delay": 0.05})
        # The engine heartbeats the spoke while the task is in flight; its answers say 1.
        await until(lambda: flaky.remote_active == 1, "a heartbeat with active_tasks 1")
        await handle.cancel()
        assert (await handle.result(WAIT)).state is TaskState.CANCELLED


SHORT_TIMEOUT = P2PConfig(
    max_retries=1,
    retry_base_delay=0.02,
    retry_max_delay=0.1,
    request_timeout=0.3,
    heartbeat_interval=0.2,
    missed_heartbeat_limit=2,
)


def answer_late(peer: Any, posts: list[int] | None = None) -> asyncio.Event:
    """Make `peer` handle each POST at once but answer it only once the event is set, or
    after 1 s (longer than SHORT_TIMEOUT's request_timeout): a reply lost in a timeout.
    `posts` counts the POSTs it was sent."""
    serve = peer.server.handle
    released = asyncio.Event()

    async def late(request: Any) -> Any:
        if posts is not None:
            posts.append(1)
        response = await serve(request)
        if not released.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(released.wait(), 1.0)
        return response

    peer.server.handle = late
    return released


async def test_a_request_lost_in_a_timeout_stays_with_its_partner(
    make_hub: HubFactory,
) -> None:
    """A request whose reply is lost in timeouts may have reached its partner: it is asked
    again (the same message, deduplicated there) rather than sent to another partner, and
    once the partner answers, the task runs there, once."""
    async with make_hub(
        hub_config=SHORT_TIMEOUT,
        request_retries=1,
        in_doubt_for=30.0,
        pin={"text_generation": ["flaky", "busy"]},
    ) as hub:
        flaky = hub.spokes["flaky"]
        posts: list[int] = []
        released = answer_late(flaky, posts)
        handle = await hub.submit("text_generation", {"prompt": "x"})
        # The first attempt, its retry, then the same request asked again in doubt.
        await until(lambda: len(posts) >= 3, "the request asked again in doubt")
        assert hub.starts(handle.task_id) == {}  # nobody else was given it
        released.set()
        await asyncio.wait_for(answer(handle, {"style": "s"}), WAIT)
        assert (await handle).ok
        assert hub.ran_at(handle.task_id) == "flaky"
        assert hub.starts(handle.task_id) == {"flaky": 1}
        assert not hub.router.sender.withdrawn


async def test_a_request_in_doubt_too_long_fails_and_is_withdrawn(make_hub: HubFactory) -> None:
    """Past `in_doubt_for` with no answer, the task fails (it may be running there: it is
    not run elsewhere); once the partner answers again, the request is withdrawn."""
    async with make_hub(
        hub_config=SHORT_TIMEOUT,
        request_retries=1,
        in_doubt_for=1.0,
        pin={"text_generation": ["flaky", "busy"]},
    ) as hub:
        flaky = hub.spokes["flaky"]
        released = answer_late(flaky)
        handle = await hub.submit("text_generation", {"prompt": "x"})
        outcome = await handle.result(WAIT)
        assert outcome.state is TaskState.FAILED, outcome
        assert outcome.error is not None and "not run elsewhere" in outcome.error.message
        assert hub.starts(handle.task_id) == {}  # busy was never given it
        released.set()
        await hub.router.refresh(["flaky"])

        def flaky_side() -> list[Any]:
            return [r for r in records(flaky) if r.partner == "hub"]

        await until(lambda: all(r.is_final for r in flaky_side()), "the withdrawal")
        (rec,) = flaky_side()
        assert rec.state is TaskState.CANCELLED
        assert rec.task_id in hub.router.sender.withdrawn


async def test_callbacks_overtaking_a_lost_reply_keep_the_task_there(
    make_hub: HubFactory,
) -> None:
    async with make_hub(
        hub_config=SHORT_TIMEOUT,
        request_retries=1,
        in_doubt_for=1.0,
        pin={"slow": ["flaky", "busy"]},
    ) as hub:
        flaky = hub.spokes["flaky"]
        released = answer_late(flaky)
        # flaky starts the task and reports progress before its reply arrives: the hub's
        # engine takes that as the confirmation, and the task stays at flaky (the request
        # given up on in doubt is then not withdrawn).
        handle = await hub.submit("slow", {"steps": 1000, "delay": 0.05})
        await next_event(handle, spoke_progress)
        assert hub.ran_at(handle.task_id) == "flaky"
        (sub,) = [r for r in records(flaky) if r.partner == "hub"]
        sender = hub.router.sender
        await until(lambda: "flaky" in sender.withdraw, "the lost reply given up on")
        released.set()
        await hub.router.refresh(["flaky"])
        await until(lambda: sub.task_id in sender.kept, "the withdrawal skipped")
        assert sub.task_id not in sender.withdrawn
        assert sub.state is TaskState.EXECUTING  # still running there, not cancelled
        assert hub.starts(handle.task_id) == {"flaky": 1}
        await handle.cancel()
        assert (await handle.result(WAIT)).state is TaskState.CANCELLED


@pytest.mark.parametrize("sticky", [True, False], ids=["sticky", "not-sticky"])
async def test_sticky_sessions_keep_a_session_on_its_partner(
    make_hub: HubFactory, sticky: bool
) -> None:
    async with make_hub(sticky_sessions=sticky, pin={"slow": ["flaky", "lacking"]}) as hub:
        hub.handlers["lacking"].offered.add("slow")
        await hub.router.refresh()
        long = {"steps": 1000, "delay": 0.05}
        first = await hub.submit("slow", long, context=TaskContext(session_id="s1"))
        await until(lambda: len(hub.router.commitments.by_task) == 1, "the first acceptance")
        assert hub.ran_at(first.task_id) == "flaky"
        # flaky is now busier than lacking; the session's next task still goes to flaky.
        second = await hub.submit("slow", long, context=TaskContext(session_id="s1"))
        other = await hub.submit("slow", long, context=TaskContext(session_id="s2"))
        await until(lambda: len(hub.router.commitments.by_task) == 3, "three acceptances")
        assert hub.ran_at(second.task_id) == ("flaky" if sticky else "lacking")
        assert hub.ran_at(other.task_id) == ("lacking" if sticky else "flaky")
        for handle in (first, second, other):
            await handle.cancel()
            assert (await handle.result(WAIT)).state is TaskState.CANCELLED


async def test_a_draining_spoke_fails_over_without_retries(make_hub: HubFactory) -> None:
    async with make_hub(pin={"echo": ["flaky", "busy"]}) as hub:
        flaky = hub.spokes["flaky"]
        flaky.protocol.engine.draining = True  # it answers 503 agent_not_ready
        seen: list[str] = []
        flaky.protocol.listeners.append(
            OnMessage(
                lambda e: seen.append(e.message.message_type.value) if e.direction == "in" else None
            )
        )
        handle = await hub.submit("echo", {"text": "hi"})
        assert (await handle.result(WAIT)).ok
        assert hub.starts(handle.task_id) == {"busy": 1}
        assert seen.count("p2p:task_request") == 1  # refused once, not retried


async def test_a_task_waits_for_a_full_spoke_to_have_room(make_hub: HubFactory) -> None:
    async with make_hub(pin={"slow": ["busy"]}) as hub:
        busy = hub.router.pool.members["busy"]
        assert busy.max_concurrent == 1  # from its capability_response
        first = await hub.submit("slow", {"steps": 1000, "delay": 0.05})
        await until(lambda: busy.in_flight == 1, "the first task at busy")
        second = await hub.submit("slow", {"steps": 1, "delay": 0.01})
        await next_event(second, lambda e: e.kind == "p2p:task_status_update")  # confirmed
        assert not busy.has_room(hub.router.clock())
        assert hub.starts(second.task_id) == {}  # waiting, not sent to be refused
        await first.cancel()
        assert (await second.result(WAIT)).ok
        assert hub.starts(second.task_id) == {"busy": 1}
        refused = [r for r in records(hub.spokes["busy"]) if r.state is TaskState.REJECTED]
        assert refused == []


async def test_a_payload_the_spoke_refuses_is_not_tried_elsewhere(make_hub: HubFactory) -> None:
    async with make_hub(pin={"echo": ["busy", "flaky"]}) as hub:
        handle = await hub.submit("echo", {"no_text": True})
        outcome = await handle.result(WAIT)
        assert outcome.state is TaskState.FAILED
        assert outcome.error is not None
        assert outcome.error.code == ErrorCode.INVALID_PARAMS.value
        assert "echo needs a string `text`" in outcome.error.message
        asked = [
            name
            for name, spoke in hub.spokes.items()
            if any(r.partner == "hub" for r in records(spoke))
        ]
        assert asked == ["busy"]  # another spoke would judge it the same way
