"""The console end to end in real headless Chromium (Debian's `chromium`, driven by Playwright).

A person signs in, sees a `portrait` task waiting for a decision, approves it and the
executor's task completes; another is rejected with a reason; a `text_generation` task's
question is answered from the generated form; an answer without signing in is refused.
Set SYNAPSE_CONSOLE_SCREENSHOTS=DIR to keep the screenshots (docs/operations.md uses them).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from opskit import WAIT, E, R, base_url, chromium, eventually, peer_pair

from synapse.ops.console import Reviewer, TokenAuth, enable_console
from synapse.p2p.engine import TaskKey
from synapse.transport.peer import Peer
from synapse.types import TaskState

#: Minutes of exploration or a real browser: left out of the quick loop (`pytest -m "not slow"`).
pytestmark = pytest.mark.slow

TOKEN = "alice-browser-token-0123456789"
TIMEOUT_MS = WAIT * 1000


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    async with chromium() as launched:
        yield launched


def setup_console(peer: Peer) -> None:
    enable_console(peer, TokenAuth({TOKEN: Reviewer("alice", "Alice Example")}))


def screenshots() -> Path | None:
    where = os.environ.get("SYNAPSE_CONSOLE_SCREENSHOTS")
    if not where:
        return None
    path = Path(where)
    path.mkdir(parents=True, exist_ok=True)
    return path


async def test_console_end_to_end_in_chromium(browser: Any, tmp_path: Path) -> None:
    from playwright.async_api import expect

    shots = screenshots()
    async with peer_pair(setup_r=setup_console) as pair:
        url = base_url(pair.r) + "/console"
        context = await browser.new_context(viewport={"width": 1440, "height": 860})
        page = await context.new_page()
        page.set_default_timeout(TIMEOUT_MS)

        # --- sign in (a wrong token first) ---------------------------------------------------
        await page.goto(url)
        await expect(page.get_by_test_id("signin-form")).to_be_visible()
        await page.fill("#token", "not-the-token-at-all-000")
        await page.click("button[type=submit]")
        await expect(page.get_by_test_id("signin-error")).to_have_text("That did not sign you in.")
        if shots:
            await page.screenshot(path=str(shots / "console-signin.png"))
        await page.fill("#token", TOKEN)
        await page.click("button[type=submit]")
        await expect(page.get_by_test_id("reviewer")).to_have_text("Alice Example")
        await expect(page.get_by_test_id("live")).to_have_text("live")

        # --- a portrait requested from the console, approved ---------------------------------
        await page.click("[data-testid=new-task] summary")
        await page.fill("input[name=task_type]", "portrait")
        await page.fill("textarea[name=payload]", '{"subject": "Ada Lovelace"}')
        await page.click("#submit-form button[type=submit]")
        approved_id = await page.get_by_test_id("detail-task-id").text_content()
        assert approved_id
        row = page.locator(f'tr[data-task-id="{approved_id}"]')
        # Shown to a person, the request moves to human_deciding (the requester's own state).
        await expect(row).to_have_attribute("data-state", "human_deciding")
        panel = page.get_by_test_id("human-panel")
        await expect(panel).to_contain_text("An ethical decision needs a person's review")
        await expect(panel).to_contain_text("The right to paint this person must be confirmed")
        await expect(panel).to_contain_text("Go on, assuming the painting is authorized")
        await expect(panel).to_contain_text("70 %")
        if shots:
            await page.screenshot(path=str(shots / "console-need-human.png"))
        await panel.get_by_role("button", name="Approve").click()
        await expect(page.get_by_test_id("detail-state")).to_have_text("completed")
        await expect(page.get_by_test_id("audit")).to_contain_text("alice")
        await expect(page.get_by_test_id("audit")).to_contain_text("approve")
        executor = pair.e.protocol.engine.get(TaskKey(R, approved_id))
        assert executor is not None and executor.state is TaskState.COMPLETED
        assert executor.result is not None
        assert executor.result.metadata["approved_fields"] == {"authorized": True}

        # --- a portrait requested by a program appears live, and is rejected ---------------
        rejected = await pair.r.submit(E, "portrait", {"subject": "Charles Babbage"})
        row = page.locator(f'tr[data-task-id="{rejected.task_id}"]')
        await expect(row).to_have_attribute("data-state", "need_human")
        await page.select_option("[data-testid=filter]", "@waiting")
        await expect(page.locator("#task-rows tr")).to_have_count(1)
        await row.click()
        await expect(row).to_have_attribute("data-state", "human_deciding")
        panel = page.get_by_test_id("human-panel")
        if shots:
            await page.evaluate("window.scrollTo(0, 0)")
            await page.screenshot(path=str(shots / "console-tasks-waiting.png"))
        await panel.get_by_label("rejection reason").fill("no consent from the subject")
        await panel.get_by_role("button", name="Reject").click()
        await expect(page.get_by_test_id("detail-state")).to_have_text("failed")
        await expect(page.get_by_test_id("audit")).to_contain_text("no consent from the subject")
        outcome = await rejected.result(timeout=WAIT)
        assert outcome.state is TaskState.FAILED
        executor = pair.e.protocol.engine.get(rejected.key)
        assert executor is not None and executor.state is TaskState.FAILED
        assert executor.error is not None
        assert executor.error.message == "no consent from the subject"
        await page.select_option("[data-testid=filter]", "")

        # --- text_generation: the question's form, an alternative chosen --------------------
        writing = await pair.r.submit(E, "text_generation", {"prompt": "秋夜"})
        row = page.locator(f'tr[data-task-id="{writing.task_id}"]')
        await expect(row).to_have_attribute("data-state", "info_needed")
        await row.click()
        form = page.get_by_test_id("info-form")
        await expect(form).to_contain_text("Which style should the text be written in?")
        await expect(form).to_contain_text("no style given")
        await expect(form.locator("input[data-field=style]")).to_have_value("古典")
        if shots:
            await page.evaluate("window.scrollTo(0, 0)")
            await page.screenshot(path=str(shots / "console-need-info.png"))
        await form.get_by_role("button", name="浪漫").click()
        await expect(form.locator("input[data-field=style]")).to_have_value("浪漫")
        await form.get_by_role("button", name="Provide information").click()
        await expect(page.get_by_test_id("detail-state")).to_have_text("completed")
        await expect(page.get_by_test_id("result")).to_contain_text(
            "“秋夜”, written in the 浪漫 style"
        )
        await expect(row).to_have_attribute("data-state", "completed")  # the list, live
        if shots:
            await page.get_by_test_id("audit").scroll_into_view_if_needed()
            await page.screenshot(path=str(shots / "console-completed.png"))

        # --- a POST from the signed-in page without the CSRF token is refused ---------------
        waiting = await pair.r.submit(E, "portrait", {"subject": "Hopper"})
        await eventually(lambda: waiting.state is TaskState.NEED_HUMAN)
        decision = f"{url}/api/tasks/{waiting.task_id}/decision"
        status = await page.evaluate(
            """async (url) => (await fetch(url, {method: "POST",
                headers: {"Content-Type": "application/json"},
                body: JSON.stringify({action: "approve"})})).status""",
            decision,
        )
        assert status == 403

        # --- without signing in: the sign-in page, and an answer refused -------------------
        stranger = await browser.new_context()
        other = await stranger.new_page()
        await other.goto(url)
        await expect(other.get_by_test_id("signin-form")).to_be_visible()
        status = await other.evaluate(
            """async (url) => (await fetch(url, {method: "POST",
                headers: {"Content-Type": "application/json"},
                body: JSON.stringify({action: "approve", approved_fields: {}})})).status""",
            decision,
        )
        assert status == 401
        assert waiting.state is TaskState.NEED_HUMAN
        await stranger.close()
        await waiting.cancel()
        await context.close()


class EchoOnly:
    """An executor offering two task types only: the form must offer those, not the demo's."""

    def get_capabilities(self) -> list[str]:
        return ["echo", "slow"]

    def validate_task(self, task_type: str, payload: dict[str, Any]) -> Any:
        from synapse import Validation

        return Validation()

    async def execute_task(self, ctx: Any, task_type: str, payload: dict[str, Any]) -> str:
        import asyncio

        await asyncio.Event().wait()  # it runs until cancelled
        return ""


async def test_the_console_at_1280_px_offers_what_the_partner_offers_and_nothing_covers_a_button(
    browser: Any,
) -> None:
    from playwright.async_api import expect

    from synapse import Peer

    async with peer_pair(setup_r=setup_console) as pair:
        slow = Peer("agent-slow", port=0, handler=EchoOnly())
        async with slow:
            slow.add_partner(R, pair.r.endpoint, ("slow-secret",))
            pair.r.add_partner("agent-slow", slow.endpoint, ("slow-secret",))
            context = await browser.new_context(viewport={"width": 1280, "height": 800})
            page = await context.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            icon = await page.request.get(base_url(pair.r) + "/favicon.ico")
            assert icon.status == 200 and icon.headers["content-type"] == "image/x-icon"
            await page.goto(base_url(pair.r) + "/console")
            await page.fill("#token", TOKEN)
            await page.click("button[type=submit]")
            await expect(page.get_by_test_id("live")).to_have_text("live")

            # The form asks the chosen partner what it offers.
            await page.click("[data-testid=new-task] summary")
            await page.select_option("#partner", "agent-slow")
            await expect(page.get_by_test_id("offered")).to_have_text(
                "agent-slow offers: echo, slow"
            )
            options = page.locator("#task-types option")
            assert await options.evaluate_all("os => os.map(o => o.value)") == ["echo", "slow"]
            await expect(page.get_by_test_id("task-type")).to_have_value("echo")
            await page.select_option("#partner", E)
            await expect(page.get_by_test_id("offered")).to_contain_text(f"{E} offers: echo")
            await expect(page.locator("#task-types option")).to_have_count(5)

            # Request a task: the note it flashes covers nothing anyone needs to click.
            await page.select_option("#partner", "agent-slow")
            await expect(page.get_by_test_id("offered")).to_contain_text("agent-slow offers")
            await page.fill("input[name=task_type]", "echo")
            await page.fill("textarea[name=payload]", "{}")
            await page.click("#submit-form button[type=submit]")
            flash = page.get_by_test_id("flash")
            await expect(flash).to_contain_text("Requested ")
            cancel = page.get_by_role("button", name="Cancel task")
            await expect(cancel).to_be_visible()
            note, button = await flash.bounding_box(), await cancel.bounding_box()
            assert note is not None and button is not None
            apart = (
                note["x"] + note["width"] <= button["x"]
                or button["x"] + button["width"] <= note["x"]
                or note["y"] + note["height"] <= button["y"]
                or button["y"] + button["height"] <= note["y"]
            )
            assert apart, (note, button)
            await cancel.click()  # Playwright fails the click if anything intercepts it
            await expect(page.get_by_test_id("detail-state")).to_have_text("cancelled")

            # A task id takes one line in the list, whatever its length.
            cell = page.locator("tr[data-task-id] td.task-id code").first
            await expect(cell).to_be_visible()
            # The live list redraws its rows: measured in one synchronous script, so the cell
            # measured is the one in the document (a row replaced between two calls has no
            # computed style). `line-height: normal` computes to the keyword, not a length:
            # about 1.2 em then.
            height, line = await page.evaluate(
                "() => { const c = document.querySelector('tr[data-task-id] td.task-id code');"
                " const s = getComputedStyle(c); const h = parseFloat(s.lineHeight);"
                " return [c.getBoundingClientRect().height,"
                " Number.isNaN(h) ? 1.2 * parseFloat(s.fontSize) : h]; }"
            )
            assert height < 1.5 * line, (height, line)
            await context.close()


@pytest.mark.parametrize("width", [1024, 1152, 1280, 1366, 1410, 1920])
async def test_the_task_table_fits_its_panel_at_common_widths(browser: Any, width: int) -> None:
    """Every column of the task list (Progress and Age included) inside its panel, and a
    partner's id on one line, from a small laptop's width up."""
    from playwright.async_api import expect

    async with peer_pair(setup_r=setup_console) as pair:
        await pair.r.submit(E, "text_generation", {"prompt": "spring"})  # waits: info_needed
        context = await browser.new_context(viewport={"width": width, "height": 800})
        page = await context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        await page.goto(base_url(pair.r) + "/console")
        await page.fill("#token", TOKEN)
        await page.click("button[type=submit]")
        await expect(page.locator("tr[data-task-id]").first).to_be_visible()
        fit = await page.evaluate(
            """() => {
                const table = document.querySelector("table.tasks");
                const panel = table.closest(".panel");
                const style = getComputedStyle(panel);
                const right = panel.getBoundingClientRect().right
                    - parseFloat(style.paddingRight) - parseFloat(style.borderRightWidth);
                const heads = [...table.querySelectorAll("thead th")];
                const partner = [...table.querySelectorAll("tbody td")].find(
                    (td) => td.textContent.trim() === "agent-e");
                const text = document.createRange();
                text.selectNodeContents(partner);
                return {
                    overflow: table.getBoundingClientRect().right - right,
                    cut: heads.filter((th) => th.getBoundingClientRect().right > right + 0.5)
                        .map((th) => th.textContent),
                    partnerLines: text.getClientRects().length,
                };
            }"""
        )
        await context.close()
    assert fit["cut"] == [], fit
    assert fit["overflow"] <= 0, fit
    assert fit["partnerLines"] == 1, fit


async def test_an_a2a_tasks_page_shows_its_push_deliveries(browser: Any) -> None:
    """`serve --a2a --console`: the page of an A2A task has a table of its push
    configurations, the failing one with its reason."""
    import httpx
    from aiohttp import web
    from playwright.async_api import expect

    from synapse.a2a import enable_a2a
    from synapse.cli.ops import push_panel
    from synapse.demo.handler import DemoHandler
    from synapse.p2p.config import P2PConfig

    async def refuse(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=503)

    hooks = web.Application()
    hooks.router.add_post("/hooks/a2a", refuse)
    runner = web.AppRunner(hooks, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    hook_port = runner.addresses[0][1]
    peer = Peer("agent-push", handler=DemoHandler(), config=P2PConfig(max_retries=0))
    server = enable_a2a(
        peer, push_allowlist=[f"http://127.0.0.1:{hook_port}/hooks/"], push_secret="s" * 32
    )
    console = enable_console(peer, TokenAuth({TOKEN: Reviewer("alice", "Alice Example")}))
    console.add_panel("push", "Push deliveries", push_panel(server))
    await peer.start()
    try:
        base = f"http://127.0.0.1:{peer.port}"
        message = {
            "messageId": "m-console-push",
            "role": "ROLE_USER",
            "parts": [{"data": {"steps": 400, "delay": 0.05}}],
            "metadata": {"taskType": "slow"},
        }
        async with httpx.AsyncClient(timeout=10) as http:

            async def call(method: str, params: Any) -> Any:
                body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
                answer = await http.post(f"{base}/a2a", json=body, headers={"A2A-Version": "1.0"})
                return answer.json()

            sent = await call(
                "SendMessage", {"message": message, "configuration": {"returnImmediately": True}}
            )
            task_id = sent["result"]["task"]["id"]
            hook = f"http://127.0.0.1:{hook_port}/hooks/a2a"
            await call(
                "CreateTaskPushNotificationConfig", {"taskId": task_id, "id": "ops", "url": hook}
            )
            await eventually(
                lambda: bool(server.push_status(task_id).get("ops", {}).get("failed_attempts"))
            )

            context = await browser.new_context(viewport={"width": 1360, "height": 860})
            page = await context.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            await page.goto(base + "/console")
            await page.fill("#token", TOKEN)
            await page.click("button[type=submit]")
            await page.locator(f'tr[data-task-id="{task_id}"]').click()
            panel = page.get_by_test_id("panel-push")
            await expect(panel).to_contain_text("Push deliveries")
            await expect(panel.locator('td[data-column="config"]')).to_have_text("ops")
            await expect(panel.locator('td[data-column="last_failure_reason"]')).to_have_text(
                "HTTP 503"
            )
            await context.close()
            await call("CancelTask", {"id": task_id})
    finally:
        await peer.close(drain_timeout=0.2)
        await runner.cleanup()
