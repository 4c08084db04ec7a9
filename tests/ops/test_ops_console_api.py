"""The console's HTTP API without a browser: sign-in, CSRF, answers, audit trail."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from opskit import WAIT, E, R, base_url, eventually, peer_pair

from synapse.ops.console import Reviewer, TokenAuth, enable_console
from synapse.runtime.listener import OnMessage
from synapse.transport.peer import Peer
from synapse.types import TaskState

TOKEN = "alice-console-token-0123456789"
BOB = "bob-console-token-0123456789ab"


def setup_console(peer: Peer) -> None:
    enable_console(
        peer,
        TokenAuth({TOKEN: Reviewer("alice", "Alice Example"), BOB: Reviewer("bob", "Bob")}),
    )


async def sign_in(session: aiohttp.ClientSession, url: str, token: str = TOKEN) -> str:
    async with session.post(url + "/console/login", data={"token": token}) as response:
        assert response.status == 200  # followed the 303 to the page
        assert "console.js" in await response.text()
    async with session.get(url + "/console/api/session") as response:
        assert response.status == 200
        body = await response.json()
    return str(body["csrf_token"])


def jar_session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))


async def test_nothing_works_without_sign_in() -> None:
    async with peer_pair(setup_r=setup_console) as pair, aiohttp.ClientSession() as http:
        url = base_url(pair.r)
        handle = await pair.r.submit(E, "portrait", {"subject": "Ada"})
        await eventually(lambda: handle.state is TaskState.NEED_HUMAN)
        async with http.get(url + "/console") as response:
            page = await response.text()
            assert response.status == 200 and "signin-form" in page and "console.js" not in page
            assert "script-src 'self'" in response.headers["Content-Security-Policy"]
        for method, path in [
            ("GET", "/console/api/tasks"),
            ("GET", "/console/api/session"),
            ("GET", "/console/api/events"),
            ("GET", "/console/static/console.js"),
            ("GET", f"/console/api/tasks/{R}/{handle.task_id}"),
            ("POST", f"/console/api/tasks/{handle.task_id}/decision"),
            ("POST", f"/console/api/tasks/{handle.task_id}/info"),
            ("POST", "/console/api/tasks"),
        ]:
            async with http.request(method, url + path, json={"action": "approve"}) as response:
                assert response.status == 401, (method, path)
        async with http.post(url + "/console/login", data={"token": "wrong" * 6}) as response:
            assert response.status == 401
        async with http.get(
            url + "/console/api/tasks", headers={"Authorization": "Bearer " + "x" * 30}
        ) as response:
            assert response.status == 401
        assert handle.state is TaskState.NEED_HUMAN  # nothing was decided
        await handle.cancel()


async def test_state_changes_need_the_csrf_token_and_same_origin() -> None:
    async with peer_pair(setup_r=setup_console) as pair, jar_session() as http:
        url = base_url(pair.r)
        csrf = await sign_in(http, url)
        handle = await pair.r.submit(E, "portrait", {"subject": "Ada"})
        await eventually(lambda: handle.state is TaskState.NEED_HUMAN)
        decision = f"{url}/console/api/tasks/{handle.task_id}/decision"
        body = {"action": "approve", "approved_fields": {"authorized": True}}
        async with http.post(decision, json=body) as response:
            assert response.status == 403  # no CSRF token
        async with http.post(decision, json=body, headers={"X-CSRF-Token": "forged"}) as r2:
            assert r2.status == 403
        headers = {"X-CSRF-Token": csrf, "Origin": "http://evil.example"}
        async with http.post(decision, json=body, headers=headers) as response:
            assert response.status == 403
        assert handle.state is TaskState.NEED_HUMAN
        async with http.post(decision, json=body, headers={"X-CSRF-Token": csrf}) as response:
            assert response.status == 200, await response.text()
        outcome = await handle.result(timeout=WAIT)
        assert outcome.state is TaskState.COMPLETED
        assert outcome.result is not None
        assert outcome.result.metadata["approved_fields"] == {"authorized": True}


async def test_decision_is_sent_with_decided_by_and_audited() -> None:
    seen: list[Any] = []

    def setup_e(peer: Peer) -> None:
        peer.protocol_hooks.append(lambda p: p.listeners.append(OnMessage(seen.append)))

    async with peer_pair(setup_r=setup_console, setup_e=setup_e) as pair, jar_session() as http:
        url = base_url(pair.r)
        csrf = await sign_in(http, url, BOB)
        handle = await pair.r.submit(E, "portrait", {"subject": "Grace"})
        await eventually(lambda: handle.state is TaskState.NEED_HUMAN)
        headers = {"X-CSRF-Token": csrf}
        decision = f"{url}/console/api/tasks/{handle.task_id}/decision"
        async with http.post(decision, json={"action": "reject"}, headers=headers) as response:
            assert response.status == 400  # a rejection needs a reason
        body = {"action": "reject", "rejection_reason": "no consent on file"}
        async with http.post(decision, json=body, headers=headers) as response:
            assert response.status == 200
            view = await response.json()
        assert [(a["actor"], a["action"]) for a in view["audit"]] == [("bob", "reject")]
        assert view["audit"][0]["detail"]["rejection_reason"] == "no consent on file"
        async with http.post(decision, json=body, headers=headers) as response:
            assert response.status == 409  # already answered
        outcome = await handle.result(timeout=WAIT)
        assert outcome.state is TaskState.FAILED
        assert outcome.error is not None and outcome.error.message == "no consent on file"
    decisions = [
        e.message
        for e in seen
        if e.direction == "in" and e.message.message_type.value == "p2p:human_decision"
    ]
    assert len(decisions) == 1
    by = decisions[0].payload.decided_by
    assert (by.user_id, by.user_name, by.role) == ("bob", "Bob", "reviewer")


async def test_need_info_answered_through_the_api() -> None:
    async with peer_pair(setup_r=setup_console) as pair, jar_session() as http:
        url = base_url(pair.r)
        csrf = await sign_in(http, url)
        headers = {"X-CSRF-Token": csrf}
        async with http.post(
            url + "/console/api/tasks",
            json={"partner": E, "task_type": "text_generation", "payload": {"prompt": "秋"}},
            headers=headers,
        ) as response:
            assert response.status == 200
            task_id = (await response.json())["task_id"]
        handle = pair.r.protocol.handle(next(k for k in pair.r.protocol.engine.tasks))
        assert handle is not None and handle.task_id == task_id
        await eventually(lambda: handle.state is TaskState.INFO_NEEDED)
        async with http.get(url + "/console/api/tasks?state=info_needed") as response:
            listed = (await response.json())["tasks"]
        assert [t["task_id"] for t in listed] == [task_id]
        assert listed[0]["waiting_for_person"] is True
        info = f"{url}/console/api/tasks/{task_id}/info"
        async with http.post(info, json={"fields": {}}, headers=headers) as response:
            assert response.status == 400
            assert (await response.json())["missing"] == ["style"]
        async with http.post(info, json={"fields": {"style": "现代"}}, headers=headers) as response:
            assert response.status == 200
        outcome = await handle.result(timeout=WAIT)
        assert outcome.state is TaskState.COMPLETED
        assert (
            outcome.result is not None
            and outcome.result.output == "“秋”, written in the 现代 style"
        )
        async with http.get(f"{url}/console/api/tasks/{R}/{task_id}") as response:
            detail = await response.json()
        assert [(a["actor"], a["action"]) for a in detail["audit"]] == [("alice", "info_provided")]
        assert detail["audit"][0]["detail"]["fields"] == {"style": "现代"}


@pytest.mark.parametrize("token", ["short"])
def test_token_auth_refuses_short_tokens(token: str) -> None:
    with pytest.raises(ValueError, match="16 characters"):
        TokenAuth({token: "alice"})


async def test_audit_trail_survives_a_restart(tmp_path: Any) -> None:
    """The audit entry is stored with the task: a durable store brings it back."""
    from synapse.store import SqliteStore
    from synapse.types import DecidedBy

    path = tmp_path / "r.db"
    async with peer_pair(r_store=SqliteStore(path)) as pair:
        handle = await pair.r.submit(E, "portrait", {"subject": "Ada"})
        await eventually(lambda: handle.state is TaskState.NEED_HUMAN)
        await handle.approve({"authorized": True}, decided_by=DecidedBy(user_id="carol"))
        await handle.result(timeout=WAIT)
        key = handle.key
    again = Peer(R, store=SqliteStore(path))
    async with again:
        rec = again.protocol.engine.get(key)
        assert rec is not None and rec.state is TaskState.COMPLETED
        assert [(a.actor, a.action) for a in rec.audit] == [("carol", "approve")]
        assert rec.audit[0].detail["approved_fields"] == {"authorized": True}
        assert rec.audit[0].message_id is not None


async def test_opening_a_decision_marks_it_human_deciding() -> None:
    async with peer_pair(setup_r=setup_console) as pair, jar_session() as http:
        url = base_url(pair.r)
        csrf = await sign_in(http, url)
        handle = await pair.r.submit(E, "portrait", {"subject": "Ada"})
        await eventually(lambda: handle.state is TaskState.NEED_HUMAN)
        deciding = f"{url}/console/api/tasks/{handle.task_id}/deciding"
        headers = {"X-CSRF-Token": csrf}
        async with http.post(deciding, json={}, headers=headers) as response:
            assert response.status == 200
            assert (await response.json())["state"] == "human_deciding"
        async with http.post(deciding, json={}, headers=headers) as response:
            assert response.status == 409
        decision = f"{url}/console/api/tasks/{handle.task_id}/decision"
        body = {"action": "approve", "approved_fields": {"authorized": True}}
        async with http.post(decision, json=body, headers=headers) as response:
            assert response.status == 200
        assert (await handle.result(timeout=WAIT)).state is TaskState.COMPLETED


async def test_console_of_an_attached_peer_before_start_is_503() -> None:
    from aiohttp import web

    peer = Peer("agent-a")
    setup_console(peer)
    app = web.Application()
    peer.attach(app, "http://127.0.0.1:1/synapse/callback")
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        async with (
            aiohttp.ClientSession() as http,
            http.get(
                url + "/console/api/tasks", headers={"Authorization": f"Bearer {TOKEN}"}
            ) as response,
        ):
            assert response.status == 503
    finally:
        await runner.cleanup()


async def test_event_stream_sends_the_list_then_changes_and_ends_at_close() -> None:
    import asyncio
    import json as jsonlib

    peer = Peer(R)
    setup_console(peer)
    await peer.start()
    peer.add_partner(E, "http://127.0.0.1:9/synapse/callback", ("s",))
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession() as http:
        response = await http.get(f"{base_url(peer)}/console/api/events", headers=headers)
        assert response.status == 200
        assert response.headers["Content-Type"] == "text/event-stream"

        async def next_event() -> tuple[str, Any]:
            name, data = "", None
            async for raw in response.content:
                line = raw.decode().rstrip("\n")
                if line.startswith("event: "):
                    name = line[7:]
                elif line.startswith("data: "):
                    data = jsonlib.loads(line[6:])
                elif line == "" and name:
                    return name, data
            raise AssertionError("the stream ended")

        assert await asyncio.wait_for(next_event(), WAIT) == ("tasks", {"tasks": []})
        handle = await peer.submit(E, "echo", {"text": "x"})
        name, data = await asyncio.wait_for(next_event(), WAIT)
        assert name == "tasks"
        assert [t["task_id"] for t in data["tasks"]] == [handle.task_id]
        # Closing the peer ends the stream instead of waiting for the client to leave.
        await asyncio.wait_for(peer.close(drain_timeout=0.1), WAIT)
        rest = await asyncio.wait_for(response.content.read(), WAIT)
        assert b"event: tasks" not in rest
        response.release()


async def test_sign_out_ends_the_session() -> None:
    async with peer_pair(setup_r=setup_console) as pair, jar_session() as http:
        url = base_url(pair.r)
        csrf = await sign_in(http, url)
        async with http.post(url + "/console/logout") as response:
            assert response.status == 403  # a change: it needs the CSRF token too
        async with http.post(url + "/console/logout", headers={"X-CSRF-Token": csrf}) as r2:
            assert r2.status == 200
        async with http.get(url + "/console/api/tasks") as response:
            assert response.status == 401
        async with http.get(url + "/console") as response:
            assert "signin-form" in await response.text()


def test_sessions_expire() -> None:
    from synapse.ops.console.auth import Sessions

    sessions = Sessions(lifetime=0.0)
    session_id, _ = sessions.create(Reviewer("alice"))
    assert sessions.get(session_id) is None
    assert sessions.get(None) is None
    long_lived = Sessions()
    session_id, session = long_lived.create(Reviewer("alice"))
    assert long_lived.get(session_id) is session
    assert long_lived.get(session_id + "x") is None
