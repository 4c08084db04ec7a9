"""A person decides from a signed link (`synapse.humans`), not the script that asked.

The executor asks for a decision before it publishes (`p2p:task_need_human`). The requester
does not answer it itself: its `[[notify]]` route tells the team's channel (a webhook, here a
small receiver in this script standing in for Slack, Teams or mail), with signed links. A
person follows the approve link, sees the confirmation page, and approves from it; the
decision leaves for the executor, and the task's audit trail says who decided, from where.
Run it: `python examples/humans.py`.
"""

import asyncio
import re
from typing import Any

import aiohttp
from aiohttp import web

from synapse import ExecutionContext, HumanOption, Peer, Reason, Validation
from synapse.humans import Channel, HumansConfig, Level, NotifyRoute, Person, enable_humans

SECRET = "humans-example-secret-0123456789"
LINK_SECRET = b"humans-example-link-key-0123456789"


class Publisher:
    """Publishes a post, but only once a person said yes to its title."""

    def get_capabilities(self) -> list[str]:
        return ["publish"]

    def validate_task(self, task_type: str, payload: dict[str, Any]) -> Validation:
        return Validation()

    async def execute_task(
        self, ctx: ExecutionContext, task_type: str, payload: dict[str, Any]
    ) -> str:
        decision = await ctx.need_human(
            Reason(code="ethical_decision", message="a post goes out under your name"),
            options=[HumanOption(field="title", value=payload["title"], confidence=80)],
        )
        return f"published: {decision.decision.approved_fields['title']}"


async def team_channel(notices: asyncio.Queue[dict[str, Any]]) -> web.AppRunner:
    """What the team's chat would receive: the generic webhook's JSON, one POST a notice."""

    async def receive(request: web.Request) -> web.Response:
        await notices.put(await request.json())
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/hook", receive)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner


async def main() -> None:
    notices: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    runner = await team_channel(notices)
    port = runner.addresses[0][1]
    people = HumansConfig(
        link_secret=LINK_SECRET,
        reviewers={"alice": Person("alice", "Alice Martin", role="editor")},
        channels={"team": Channel("team", "webhook", url=f"http://127.0.0.1:{port}/hook")},
        routes=(
            NotifyRoute(name="posts", levels=(Level(reviewers=("alice",), channels=("team",)),)),
        ),
    )
    executor = Peer("agent-e", port=0, handler=Publisher())
    requester = Peer("agent-r", port=0)
    humans = enable_humans(requester, people)  # before the requester starts
    try:
        async with executor, requester, aiohttp.ClientSession() as browser:
            executor.add_partner("agent-r", requester.endpoint, (SECRET,))
            requester.add_partner("agent-e", executor.endpoint, (SECRET,))
            await humans.start()
            try:
                handle = await requester.submit("agent-e", "publish", {"title": "Spring is here"})
                notice = await notices.get()
                print("the team is told:", notice["event"], "-", notice["reason"]["message"])
                print("  proposed:", [(o["field"], o["value"]) for o in notice["options"]])
                approve = notice["links"]["approve"]
                async with browser.get(approve) as page:  # following the link decides nothing
                    title = re.search(r"<title>(.*?)</title>", await page.text())
                    print("  the link shows a page:", title.group(1) if title else page.status)
                async with browser.post(approve, data={"decision": "approve"}) as done:
                    print("  approved from the page:", done.status)
                outcome = await handle
                print(outcome.state, outcome.result.output if outcome.result else outcome.error)
                record = humans.record(handle.task_id)
                assert record is not None
                for entry in record.audit:
                    print("  audit:", entry.action, "by", entry.actor)
            finally:
                await humans.close()
    finally:
        await runner.cleanup()


if __name__ == "__main__":
    asyncio.run(main())
