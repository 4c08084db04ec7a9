"""Human decisions on replicas: two `synapse serve` replicas of the requester (`req`) on one
PostgreSQL database behind nginx, a webhook receiver for the people's notifications, and the
executor (`exec`) asking a person to approve each portrait. A person cannot choose the replica
the balancer sends a click to: a link, or a console decision, that reaches the replica that
does not hold the task is answered by the one that does, and once that one is killed, by the
replica that takes the task over."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from lbserver import Nginx

sys.path.insert(0, str(Path(__file__).parent.parent / "cli"))
sys.path.insert(0, str(Path(__file__).parent.parent / "humans"))

from clikit import Server, free_port, serve, url
from humanskit import HookReceiver, running_hooks

SECRET = "replica-humans-secret-0123456789"
LINK_KEY = "replica-link-key-0123456789abcdef"
TOKENS = {"alice": "alice-token-0123456789", "bob": "bob-token-0123456789ab"}
HANDLER_DIR = str(Path(__file__).parent.parent / "humans")
#: A killed replica's tasks are taken over about this long after its last renewal.
LEASE_TTL = 2.0


def replica_toml(nginx: Nginx, hooks: HookReceiver, executor_port: int) -> str:
    return f"""
agent_id = "req"
secret = "{SECRET}"

[p2p]
lease_ttl = {LEASE_TTL}

[[peer]]
agent_id = "exec"
endpoint = "{url(executor_port)}"

[humans]
link_secret = "{LINK_KEY}"
public_url = "{nginx.url}"

[[humans.reviewer]]
id = "alice"

[[humans.reviewer]]
id = "bob"

[[humans.channel]]
name = "hook"
kind = "webhook"
url = "{hooks.url}/generic"

[[notify]]
name = "urgent"
reason_codes = ["urgent"]
on_timeout = "reject"

[[notify.level]]
reviewers = ["alice"]
channels = ["hook"]

[[notify]]
name = "committee"
reason_codes = ["committee"]
quorum = 2

[[notify.level]]
reviewers = ["alice", "bob"]
channels = ["hook"]

[[notify]]
name = "portraits"
task_types = ["portrait_review"]

[[notify.level]]
reviewers = ["alice", "bob"]
channels = ["hook"]
"""


@dataclass
class Deployment:
    replicas: list[Server]
    nginx: Nginx
    hooks: HookReceiver

    def base(self, replica: int | None = None) -> str:
        """A replica's own address, or nginx's (None)."""
        if replica is None:
            return self.nginx.url
        return f"http://127.0.0.1:{self.replicas[replica].port}"

    async def submit(self, replica: int, **payload: Any) -> str:
        """A portrait to review, submitted at `replica` (which then holds its lease)."""
        async with httpx.AsyncClient(timeout=10) as http:
            response = await http.post(
                f"{self.base(replica)}/console/api/tasks",
                json={"partner": "exec", "task_type": "portrait_review", "payload": payload},
                headers=bearer("alice"),
            )
        assert response.status_code == 200, response.text
        task_id: str = response.json()["task_id"]
        return task_id

    async def links(self, task_id: str) -> dict[str, str]:
        (hook,) = await self.hooks.wait(1, "/generic", task_id=task_id)
        links: dict[str, str] = hook.body["links"]
        assert all(link.startswith(self.nginx.url) for link in links.values())
        return links

    async def task(self, task_id: str, replica: int | None = None) -> dict[str, Any]:
        """The task as the console shows it (asked again while its holder, killed, cannot be
        reached and its lease has not run out)."""
        async with httpx.AsyncClient(timeout=10) as http:
            for _ in range(100):
                response = await http.get(
                    f"{self.base(replica)}/console/api/tasks/req/{task_id}",
                    headers=bearer("alice"),
                )
                if response.status_code != 503:
                    break
                await asyncio.sleep(0.1)  # polling another process: no event to wait on
        assert response.status_code == 200, response.text
        task: dict[str, Any] = response.json()
        return task


def bearer(who: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[who]}"}


def at(link: str, base: str, nginx: Nginx) -> str:
    """`link` (which points at nginx) sent to `base` instead."""
    return base + link[len(nginx.url) :]


@pytest.fixture
async def hooks() -> AsyncIterator[HookReceiver]:
    async with running_hooks() as receiver:
        yield receiver


@pytest.fixture
def deployment(pg_url: str, tmp_path: Path, hooks: HookReceiver) -> Iterator[Deployment]:
    ports = [free_port(), free_port()]
    executor_port = free_port()
    nginx = Nginx([f"127.0.0.1:{p}" for p in ports], read_timeout=10)
    nginx.start()
    config = tmp_path / "req.toml"
    config.write_text(replica_toml(nginx, hooks, executor_port), encoding="utf-8")
    with ExitStack() as stack:
        stack.callback(nginx.stop)
        stack.enter_context(
            serve(
                "--agent-id", "exec", "--secret", SECRET,
                "--peer", f"req={nginx.url}/synapse/callback",
                "--handler", "approval_handler:ApprovalHandler",
                port=executor_port, cwd=HANDLER_DIR,
            )
        )  # fmt: skip
        tokens = [
            arg for who, token in TOKENS.items() for arg in ("--console-token", f"{token}={who}")
        ]
        replica_args = (
            "--config", str(config), "--store", pg_url,
            "--endpoint", f"{nginx.url}/synapse/callback", "--console", *tokens,
        )  # fmt: skip
        replicas = [stack.enter_context(serve(*replica_args, port=port)) for port in ports]
        yield Deployment(replicas, nginx, hooks)


async def test_a_link_and_a_console_decision_reach_the_replica_holding_the_task(
    deployment: Deployment,
) -> None:
    d = deployment
    # A link opened and used at the replica that does not hold the task (before: 404 "not
    # known here"), as a balancer may send it.
    first = await d.submit(0)
    links = await d.links(first)
    elsewhere = at(links["approve"], d.base(1), d.nginx)
    async with httpx.AsyncClient(timeout=10) as http:
        page = await http.get(elsewhere)
        assert page.status_code == 200 and "Approve this decision?" in page.text
        done = await http.post(elsewhere, data={"decision": "approve"})
    assert done.status_code == 200, done.text
    # The second click, through nginx to either replica, meets the used link.
    async with httpx.AsyncClient(timeout=10) as http:
        again = await http.post(links["approve"], data={"decision": "approve"})
    assert again.status_code == 409

    # A console decision, from a browser session signed in at the other replica: the
    # session is that replica's, which vouches for its reviewer to the holder.
    second = await d.submit(0)
    await d.links(second)
    async with httpx.AsyncClient(base_url=d.base(1), timeout=10) as browser:
        signed_in = await browser.post("/console/login", data={"token": TOKENS["bob"]})
        assert signed_in.status_code in (200, 303), signed_in.text
        csrf = (await browser.get("/console/api/session")).json()["csrf_token"]
        decided = await browser.post(
            f"/console/api/tasks/{second}/decision",
            json={"action": "approve", "approved_fields": {"width": 512}},
            headers={"X-CSRF-Token": csrf},
        )
        assert decided.status_code == 200, decided.text
        # Vouching made up outside the replicas is not believed: the holder signs no one in.
        forged = await browser.post(
            f"{d.base(0)}/console/api/tasks/{second}/cancel",
            headers={
                "X-Synapse-Forwarded-By": "replica-x",
                "X-Synapse-Vouched-User": '{"user_id": "bob", "user_name": "", "role": "admin"}',
                "X-Synapse-Vouched-At": "0",
                "X-Synapse-Vouched-Mac": "0" * 64,
            },
        )
        assert forged.status_code == 401
    ended = await until_final(d, second)
    assert ended["result"]["output"]["approved"]["width"] == 512
    (decision,) = [e for e in ended["audit"] if e["action"] == "approve"]
    assert decision["actor"] == "bob", ended["audit"]
    first_ended = await until_final(d, first)
    assert first_ended["state"] == "completed"


async def test_every_replicas_console_lists_the_questions_the_other_holds(
    deployment: Deployment,
) -> None:
    """A person signed in at either replica (the balancer chooses) sees every question
    waiting for them, not only those of the tasks that replica holds."""
    d = deployment
    task_id = await d.submit(0)
    await d.links(task_id)  # asked: the task waits for a person, held by replica 0
    async with httpx.AsyncClient(timeout=10) as http:
        for replica in (0, 1):
            listed = await http.get(f"{d.base(replica)}/console/api/tasks", headers=bearer("bob"))
            assert listed.status_code == 200, listed.text
            rows = {row["task_id"]: row for row in listed.json()["tasks"]}
            assert rows[task_id]["state"] == "need_human", (replica, rows)
            assert rows[task_id]["waiting_for_person"], rows[task_id]
            waiting = await http.get(
                f"{d.base(replica)}/console/api/tasks",
                params={"state": "need_human"},
                headers=bearer("bob"),
            )
            assert task_id in {row["task_id"] for row in waiting.json()["tasks"]}, replica


async def test_two_fronts_at_once_on_two_replicas_decide_once(deployment: Deployment) -> None:
    """The link (approve) at one replica and the console (reject) at the other, at the same
    moment: both reach the holder's one gate, one decides, the other is told it came too
    late, and the task ends as the one that decided said."""
    d = deployment
    task_id = await d.submit(0)
    links = await d.links(task_id)
    async with httpx.AsyncClient(timeout=10) as http:
        by_link, by_console = await asyncio.gather(
            http.post(at(links["approve"], d.base(1), d.nginx), data={"decision": "approve"}),
            http.post(
                f"{d.base(1)}/console/api/tasks/{task_id}/decision",
                json={"action": "reject", "rejection_reason": "not now"},
                headers=bearer("bob"),
            ),
        )
    assert sorted((by_link.status_code, by_console.status_code)) == [200, 409], (
        by_link.text,
        by_console.text,
    )
    ended = await until_final(d, task_id)
    decided = [e for e in ended["audit"] if e["action"] in ("approve", "reject")]
    assert len(decided) == 1, ended["audit"]
    approved = by_link.status_code == 200
    assert decided[0]["action"] == ("approve" if approved else "reject")
    assert ended["state"] == ("completed" if approved else "failed")


async def test_a_quorum_gathered_across_replicas_decides_once(deployment: Deployment) -> None:
    """Two approvals of a quorum-2 question, each at another replica (the console, alice by
    her token at one, bob at the other): one `human_decision`, naming both."""
    d = deployment
    task_id = await d.submit(0, reason="committee")
    await d.links(task_id)
    async with httpx.AsyncClient(timeout=10) as http:
        for replica, who in ((1, "alice"), (0, "bob")):
            answer = await http.post(
                f"{d.base(replica)}/console/api/tasks/{task_id}/decision",
                json={"action": "approve"},
                headers=bearer(who),
            )
            assert answer.status_code == 200, answer.text
        again = await http.post(
            f"{d.base(1)}/console/api/tasks/{task_id}/decision",
            json={"action": "approve"},
            headers=bearer("alice"),
        )
    assert again.status_code == 409  # decided already (each reviewer answers once, too)
    ended = await until_final(d, task_id)
    assert ended["state"] == "completed"
    approvals = [e["actor"] for e in ended["audit"] if e["action"] == "human.approval"]
    assert sorted(approvals) == ["alice", "bob"], ended["audit"]
    assert [e["action"] for e in ended["audit"]].count("approve") == 1


async def test_the_replica_taking_over_decides_once_the_holder_is_killed(
    deployment: Deployment,
) -> None:
    d = deployment
    task_id = await d.submit(0)
    links = await d.links(task_id)
    d.replicas[0].process.kill()  # between the notification and the click
    d.replicas[0].process.wait(10)
    # Through nginx, as the person clicks: refused with 503 (nothing decided) while the
    # killed holder's lease runs, then decided by the replica that takes the task over.
    statuses = []
    async with httpx.AsyncClient(timeout=10) as http:
        for _ in range(200):
            response = await http.post(links["approve"], data={"decision": "approve"})
            statuses.append(response.status_code)
            if response.status_code != 503:
                break
            await asyncio.sleep(0.1)  # the person tries again: polling another process
    assert statuses[-1] == 200, statuses
    ended = await until_final(d, task_id, replica=1)
    assert ended["state"] == "completed"
    assert ended["result"]["output"]["approved"] == {"width": 1024, "style": "oil"}
    used = [e for e in ended["audit"] if e["action"] == "human.link_used"]
    assert len(used) == 1


async def test_the_replica_taking_over_keeps_the_policy_of_a_waiting_question(
    deployment: Deployment,
) -> None:
    """Nobody clicks: the question's time-out (reject) falls due after its holder was
    killed, and is kept by the replica that took the task over."""
    d = deployment
    task_id = await d.submit(0, reason="urgent", deadline_seconds=6)
    await d.links(task_id)
    d.replicas[0].process.kill()
    d.replicas[0].process.wait(10)
    ended = await until_final(d, task_id, replica=1)
    timeouts = [e for e in ended["audit"] if e["action"] == "human.timeout"]
    assert len(timeouts) == 1, ended["audit"]
    assert [e["action"] for e in ended["audit"]].count("reject") == 1
    assert ended["state"] != "completed"


async def until_final(d: Deployment, task_id: str, replica: int = 1) -> dict[str, Any]:
    for _ in range(400):
        task = await d.task(task_id, replica)
        if task["final"]:
            return task
        await asyncio.sleep(0.05)  # polling a remote process: no event to wait on
    raise AssertionError(f"task {task_id} did not end: {task['state']}")
