"""Links and the console in real headless Chromium (Debian's `chromium`, through Playwright):
the link from the e-mail opens a confirmation page, the form link an editable one, and the
approval is confirmed by a click; in the console a reviewer sees only the questions routed to
them, and the task's page shows who was told, who opened what, and the chain's verdict.
Set SYNAPSE_HUMANS_SCREENSHOTS=DIR to keep the screenshots (docs/humans.md uses them)."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from approval_handler import ApprovalHandler
from humanskit import SmtpServer, links_of, mail_channel

sys.path.insert(0, str(Path(__file__).parent.parent / "ops"))

from opskit import chromium

from synapse.humans import HumansConfig, Level, NotifyRoute, Person, enable_humans
from synapse.ops.console import Reviewer as ConsoleUser
from synapse.ops.console import TokenAuth, enable_console
from synapse.p2p.config import P2PConfig
from synapse.transport.peer import Peer

#: Minutes of exploration or a real browser: left out of the quick loop (`pytest -m "not slow"`).
pytestmark = pytest.mark.slow

SECRET = "humans-browser-secret-0123456789"
TOKENS = {"alice-token-0123456789": "alice", "bob-token-0123456789": "bob"}
TIMEOUT_MS = 10_000


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    async with chromium() as launched:
        yield launched


def screenshots() -> Path | None:
    where = os.environ.get("SYNAPSE_HUMANS_SCREENSHOTS")
    if not where:
        return None
    path = Path(where)
    path.mkdir(parents=True, exist_ok=True)
    return path


async def test_a_reviewer_decides_from_the_link_and_the_console_shows_it(
    browser: Any, smtp: SmtpServer
) -> None:
    from playwright.async_api import expect

    mail = mail_channel(smtp)
    config = HumansConfig(
        link_secret=b"browser-link-key-0123456789abcdef",
        routes=(
            NotifyRoute(
                name="portraits", levels=(Level(reviewers=("alice",), channels=("mail",)),)
            ),
        ),
        reviewers={
            "alice": Person("alice", "Alice", "alice@example.com"),
            "bob": Person("bob", "Bob", "bob@example.com"),
        },
        channels={"mail": mail},
    )
    requester = Peer("agent-r", config=P2PConfig(heartbeat_interval=3600.0))
    humans = enable_humans(requester, config)
    console = enable_console(
        requester, TokenAuth({t: ConsoleUser(user_id=n) for t, n in TOKENS.items()})
    )
    humans.attach_console(console)
    executor = Peer("agent-e", handler=ApprovalHandler())
    shots = screenshots()
    async with requester, executor:
        requester.add_partner("agent-e", executor.endpoint, (SECRET,))
        executor.add_partner("agent-r", requester.endpoint, (SECRET,))
        await humans.start()
        try:
            handle = await requester.submit(
                "agent-e", "portrait_review", {"subject": "Ada Lovelace", "deadline_seconds": 900}
            )
            (message,) = await smtp.box.wait(1)
            links = links_of(message)
            base = f"http://127.0.0.1:{requester.port}"

            # Bob is a reviewer, but this question is routed to Alice only.
            async with httpx.AsyncClient(timeout=10) as http:
                for token, name in TOKENS.items():
                    headers = {"Authorization": f"Bearer {token}"}
                    listed = (await http.get(f"{base}/console/api/tasks", headers=headers)).json()
                    ids = [t["task_id"] for t in listed["tasks"]]
                    assert (handle.task_id in ids) is (name == "alice"), name
                    one = await http.get(
                        f"{base}/console/api/tasks/agent-r/{handle.task_id}", headers=headers
                    )
                    assert one.status_code == (200 if name == "alice" else 404)

            context = await browser.new_context(viewport={"width": 1100, "height": 900})
            page = await context.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            await page.goto(links["form"])
            await expect(page.locator("h1")).to_have_text("A decision waits for you")
            await expect(page.locator("input[name='field:width']")).to_have_value("1024")
            if shots:
                await page.screenshot(path=str(shots / "humans-form.png"), full_page=True)
            await page.goto(links["approve"])
            await expect(page.locator("h1")).to_have_text("Approve this decision?")
            await expect(page.locator("body")).to_contain_text("low_confidence")
            if shots:
                await page.screenshot(path=str(shots / "humans-confirm.png"), full_page=True)
            await page.click("button[value=approve]")
            await expect(page.locator("p.notice")).to_contain_text("the task was approved")
            outcome = await handle.result(timeout=10)
            assert outcome.result is not None and outcome.result.output["by"] == "alice"

            await page.goto(base + "/console")
            await page.fill("#token", "alice-token-0123456789")
            await page.click("button[type=submit]")
            await page.locator(f'tr[data-task-id="{handle.task_id}"]').click()
            panel = page.get_by_test_id("panel-humans")
            await expect(panel).to_contain_text("told level 1")
            await expect(panel).to_contain_text("alice opened the approve link")
            await expect(panel).to_contain_text("alice answered: approve")
            await expect(panel).to_contain_text("chain intact")
            if shots:
                await page.screenshot(path=str(shots / "humans-console.png"))
            await context.close()
        finally:
            await humans.close()
