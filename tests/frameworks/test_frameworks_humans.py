"""A framework's pause reaches people like any other question: a Pydantic AI tool approval,
served by one peer, is routed by the requester's `[[notify]]` route to a webhook channel and
approved from the signed link's page, through the one decision gate (the audit names who)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pai_agents
from aiohttp import web
from fwkit import BOUND, CONFIG, SECRET

from synapse import Peer
from synapse.humans import Channel, HumansConfig, Level, NotifyRoute, Person, enable_humans
from synapse.types import TaskState

LINK_SECRET = b"frameworks-humans-link-key-0123456789"


async def test_a_tool_approval_is_decided_from_a_signed_link() -> None:
    notices: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def receive(request: web.Request) -> web.Response:
        await notices.put(await request.json())
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/hook", receive)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    people = HumansConfig(
        link_secret=LINK_SECRET,
        reviewers={"alice": Person("alice", "Alice", role="finance")},
        channels={"team": Channel("team", "webhook", url=f"http://127.0.0.1:{port}/hook")},
        routes=(
            NotifyRoute(
                name="payments",
                questions=frozenset({"need_human"}),
                levels=(Level(reviewers=("alice",), channels=("team",)),),
            ),
        ),
    )
    executor = Peer("agent-e", handler=pai_agents.payer, config=CONFIG)
    requester = Peer("agent-r", config=CONFIG)
    humans = enable_humans(requester, people)
    try:
        async with executor, requester, aiohttp.ClientSession() as browser:
            executor.add_partner("agent-r", requester.endpoint, (SECRET,))
            requester.add_partner("agent-e", executor.endpoint, (SECRET,))
            await humans.start()
            try:
                async with asyncio.timeout(BOUND):
                    handle = await requester.submit("agent-e", "payer", {"prompt": "pay"})
                    async for event in handle:
                        if event.need_info is not None:  # the requester answers this one
                            await handle.provide_info({"iban": "DE8937040044"})
                            break
                    notice = await notices.get()
                    assert notice["reason"]["code"] == "approval_required"
                    assert {o["field"]: o["value"] for o in notice["options"]} == {
                        "amount": 40,
                        "to": "DE8937040044",
                    }
                    form = notice["links"]["form"]
                    data = {"decision": "approve", "field:amount": "20", "field:to": "DE8937040044"}
                    async with browser.post(form, data=data) as done:
                        assert done.status == 200, await done.text()
                    outcome = await handle
                record = humans.record(handle.task_id)
            finally:
                await humans.close()
    finally:
        await runner.cleanup()
    assert outcome.state is TaskState.COMPLETED, outcome
    assert outcome.result is not None
    assert outcome.result.output == "done: paid 20 to DE8937040044"
    assert record is not None
    assert [e.actor for e in record.audit if e.action == "approve"] == ["channel:team"]
