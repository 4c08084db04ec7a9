"""Trust, over loopback: only pool partners are used, A2A cards are judged before use, and a
partner whose results fail the pool's check is quarantined."""

from __future__ import annotations

import json
from typing import Any

from routerkit import SECRET, WAIT, records

from synapse.types import ErrorCode, TaskContext, TaskResult, TaskState

HubFactory = Any


def verifier_accepting(signature: str) -> Any:
    """A stand-in card verifier: accepts a card whose first signature is `signature`."""
    seen: list[bytes] = []

    def verify(raw: bytes) -> bool:
        seen.append(raw)
        signatures = json.loads(raw).get("signatures") or []
        return bool(signatures) and signatures[0].get("signature") == signature

    verify.seen = seen  # type: ignore[attr-defined]
    return verify


async def test_an_unsigned_card_is_refused_when_the_pool_requires_signatures(
    make_hub: HubFactory,
) -> None:
    verify = verifier_accepting("good")
    async with make_hub(
        router_kw={"card_verifier": verify}, require_signed_cards=True, pin={"echo": ["sdk"]}
    ) as hub:
        sdk = hub.router.pool.members["sdk"]
        assert not sdk.reachable
        assert "not signed" in sdk.note
        assert verify.seen == []  # nothing to verify: refused by the policy alone
        handle = await hub.submit("echo", {"text": "hi"})
        outcome = await handle.result(WAIT)
        # The only partner pinned for echo is refused: the hub does not offer echo.
        assert outcome.state is TaskState.REJECTED
        assert outcome.reject is not None
        assert outcome.reject.reason.code == ErrorCode.CAPABILITY_LACKING.value
        assert hub.starts(handle.task_id) == {}


async def test_a_card_whose_signature_verifies_is_used(make_hub: HubFactory) -> None:
    verify = verifier_accepting("good")
    async with make_hub(
        router_kw={"card_verifier": verify},
        sdk_signature="good",
        require_signed_cards=True,
        pin={"echo": ["sdk"]},
    ) as hub:
        assert hub.router.pool.members["sdk"].reachable
        assert len(verify.seen) >= 1
        assert json.loads(verify.seen[0])["name"] == "sdk-spoke"  # the raw card JSON
        handle = await hub.submit("echo", {"text": "signed"})
        outcome = await handle.result(WAIT)
        assert outcome.ok, outcome
        assert hub.starts(handle.task_id) == {"sdk": 1}


async def test_a_card_whose_signature_fails_is_refused_even_if_not_required(
    make_hub: HubFactory,
) -> None:
    verify = verifier_accepting("good")
    async with make_hub(
        router_kw={"card_verifier": verify}, sdk_signature="forged", pin={"echo": ["sdk", "busy"]}
    ) as hub:
        sdk = hub.router.pool.members["sdk"]
        assert not sdk.reachable and "does not verify" in sdk.note
        handle = await hub.submit("echo", {"text": "hi"})
        assert (await handle.result(WAIT)).ok
        assert hub.starts(handle.task_id) == {"busy": 1}


async def test_the_requester_is_never_a_routing_target(make_hub: HubFactory) -> None:
    async with make_hub() as hub:
        # The client is a registered partner of the hub (it must be, to be served) but not in
        # the pool: nothing is ever requested of it.
        assert "client" in hub.hub.partners
        assert "client" not in hub.router.pool
        handle = await hub.submit("echo", {"text": "hi"})
        assert (await handle.result(WAIT)).ok
        assert not [r for r in records(hub.client) if r.partner != "hub"]


async def test_a_partner_whose_result_fails_the_check_is_quarantined(
    make_hub: HubFactory,
) -> None:
    checked: list[tuple[str, Any]] = []

    def check(task_type: str, result: TaskResult) -> bool:
        checked.append((task_type, result.output))
        return "poison" not in str(result.output)

    async with make_hub(router_kw={"result_check": check}, pin={"echo": ["busy", "flaky"]}) as hub:
        bad = await hub.submit("echo", {"text": "poison"})
        outcome = await bad.result(WAIT)
        assert outcome.state is TaskState.FAILED
        assert outcome.error is not None and "failed the router's check" in outcome.error.message
        assert hub.starts(bad.task_id) == {"busy": 1}  # not run again elsewhere
        busy = hub.router.pool.members["busy"]
        assert busy.quarantined(hub.router.clock())
        good = await hub.submit("echo", {"text": "fine"})
        assert (await good.result(WAIT)).ok
        assert hub.starts(good.task_id) == {"flaky": 1}  # the quarantined one is skipped
        assert checked == [("echo", "poison"), ("echo", "fine")]


async def test_a_card_pointing_to_another_origin_is_refused(make_hub: HubFactory) -> None:
    # The pool names the agent by `localhost`; its card sends JSON-RPC to 127.0.0.1: another
    # origin, as a poisoned card redirecting tasks would.
    async with make_hub(sdk_host="localhost", pin={"echo": ["sdk", "busy"]}) as hub:
        sdk = hub.router.pool.members["sdk"]
        assert not sdk.reachable
        assert "another origin" in sdk.note
        handle = await hub.submit("echo", {"text": "hi"})
        assert (await handle.result(WAIT)).ok
        assert hub.starts(handle.task_id) == {"busy": 1}


async def test_allow_foreign_interface_lets_such_a_card_through(make_hub: HubFactory) -> None:
    async with make_hub(sdk_host="localhost", pin={"echo": ["sdk"]}) as hub:
        assert not hub.router.pool.members["sdk"].reachable
        hub.router._a2a["sdk"].allow_foreign_interface = True  # as `allow_foreign_interface`
        await hub.router.refresh(["sdk"])
        assert hub.router.pool.members["sdk"].reachable
        handle = await hub.submit("echo", {"text": "allowed"})
        assert (await handle.result(WAIT)).ok
        assert hub.starts(handle.task_id) == {"sdk": 1}


async def test_a_task_is_never_routed_back_to_its_requester(make_hub: HubFactory) -> None:
    async with make_hub(pin={"portrait": ["flaky"]}) as hub:
        flaky = hub.spokes["flaky"]  # a pool partner, and here a requester of the hub too
        flaky.add_partner("hub", hub.hub.endpoint, (SECRET,))
        handle = await flaky.submit("hub", "portrait", {"subject": "Ada"})
        outcome = await handle.result(WAIT)
        assert outcome.state is TaskState.FAILED
        assert outcome.error is not None
        assert outcome.error.code == ErrorCode.CAPABILITY_LACKING.value
        assert sum(hub.handlers["flaky"].starts.values()) == 0


async def test_a_task_that_came_through_too_many_routers_is_refused(
    make_hub: HubFactory,
) -> None:
    async with make_hub(max_hops=3) as hub:
        looped = TaskContext(metadata={"route_hops": 3})
        handle = await hub.submit("echo", {"text": "hi"}, context=looped)
        outcome = await handle.result(WAIT)
        assert outcome.state is TaskState.FAILED
        assert outcome.error is not None
        assert outcome.error.code == ErrorCode.INVALID_PARAMS.value
        assert "routing loop" in outcome.error.message
        assert hub.starts(handle.task_id) == {}
        fine = await hub.submit(
            "echo", {"text": "hi"}, context=TaskContext(metadata={"route_hops": 2})
        )
        assert (await fine.result(WAIT)).ok
