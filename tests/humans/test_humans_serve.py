"""Two real `synapse serve` processes: the requester configured with `[humans]` and
`[[notify]]` routes in its TOML file (a real SMTP server with STARTTLS and login, and a
webhook receiver, both on 127.0.0.1), the executor running the approval handler. A portrait's
`need_human` makes one e-mail and one webhook and the confirmed approve link completes it;
forged, replayed and expired links and an edit refused by the schema change nothing; an
unanswered question escalates, then times out by policy; two of three approvals send one
decision; a SIGKILL during notification loses and doubles nothing; `synapse audit` verifies
the chain and detects a changed entry."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from humanskit import (
    SMTP_PASSWORD,
    SMTP_USER,
    HookReceiver,
    SmtpServer,
    links_of,
)

sys.path.insert(0, str(Path(__file__).parent.parent / "cli"))

from clikit import Server, free_port, run, serve, url

from synapse.humans.links import LinkSigner
from synapse.p2p.audit import append_audit
from synapse.p2p.engine import TaskKey
from synapse.store import SqliteStore

SECRET = "humans-serve-secret-0123456789-0"
LINK_KEY = "serve-link-key-0123456789abcdef"
TOKEN = "operator-token-0123456789"
HANDLER_DIR = str(Path(__file__).parent)


def config_toml(smtp: SmtpServer, hooks: HookReceiver, executor_port: int) -> str:
    return f"""
agent_id = "req"
secret = "{SECRET}"

[[peer]]
agent_id = "exec"
endpoint = "{url(executor_port)}"

[humans]
link_secret = "{LINK_KEY}"

[[humans.reviewer]]
id = "alice"
email = "alice@example.com"

[[humans.reviewer]]
id = "bob"
email = "bob@example.com"

[[humans.reviewer]]
id = "carol"
email = "carol@example.com"

[[humans.channel]]
name = "mail"
kind = "email"
smtp_host = "{smtp.host}"
smtp_port = {smtp.port}
username = "{SMTP_USER}"
password = "{SMTP_PASSWORD}"
sender = "synapse@example.com"
ca_file = "{smtp.ca_file}"

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
channels = ["mail"]
within = "1s"

[[notify.level]]
reviewers = ["bob"]
channels = ["mail", "hook"]

[[notify]]
name = "committee"
reason_codes = ["committee"]
quorum = 2

[[notify.level]]
reviewers = ["alice", "bob", "carol"]
channels = ["mail"]

[[notify]]
name = "portraits"
task_types = ["portrait_review"]
schema = {{ type = "object", properties = {{ width = {{ type = "integer", maximum = 2048 }} }} }}

[[notify.level]]
reviewers = ["alice"]
channels = ["mail", "hook"]
"""


@dataclass
class Deployment:
    requester_port: int
    executor: Server
    config: Path
    store: Path
    smtp: SmtpServer
    hooks: HookReceiver

    def requester(self, *more: str) -> Any:
        return serve(
            "--config",
            str(self.config),
            "--store",
            str(self.store),
            "--console",
            "--console-token",
            f"{TOKEN}=operator",
            *more,
            port=self.requester_port,
        )

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.requester_port}"

    async def submit(self, payload: dict[str, Any], task_type: str = "portrait_review") -> str:
        async with httpx.AsyncClient(timeout=10) as http:
            response = await http.post(
                f"{self.base}/console/api/tasks",
                json={"partner": "exec", "task_type": task_type, "payload": payload},
                headers={"Authorization": f"Bearer {TOKEN}"},
            )
        assert response.status_code == 200, response.text
        task_id: str = response.json()["task_id"]
        return task_id

    async def task(self, task_id: str) -> dict[str, Any]:
        async with httpx.AsyncClient(timeout=10) as http:
            response = await http.get(
                f"{self.base}/console/api/tasks/req/{task_id}",
                headers={"Authorization": f"Bearer {TOKEN}"},
            )
        assert response.status_code == 200, response.text
        task: dict[str, Any] = response.json()
        return task

    async def until(self, task_id: str, check: Any, timeout: float = 20.0) -> dict[str, Any]:
        """The task, once `check(task)` holds (read from the console API as it changes)."""
        async with asyncio.timeout(timeout):
            while True:
                task = await self.task(task_id)
                if check(task):
                    return task
                await asyncio.sleep(0.05)  # polling a remote process: no event to wait on


@pytest.fixture
async def deployment(
    tmp_path: Path, smtp: SmtpServer, hooks: HookReceiver
) -> AsyncIterator[Deployment]:
    requester_port, executor_port = free_port(), free_port()
    config = tmp_path / "synapse.toml"
    config.write_text(config_toml(smtp, hooks, executor_port), encoding="utf-8")
    executor_args = [
        "--agent-id",
        "exec",
        "--secret",
        SECRET,
        "--peer",
        f"req={url(requester_port)}",
        "--handler",
        "approval_handler:ApprovalHandler",
    ]
    with serve(*executor_args, port=executor_port, cwd=HANDLER_DIR) as executor:
        yield Deployment(requester_port, executor, config, tmp_path / "req.db", smtp, hooks)


async def post(link: str, **form: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as http:
        return await http.post(link, data=form)


async def get(link: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as http:
        return await http.get(link)


def ended(task: dict[str, Any]) -> bool:
    return bool(task["final"])


def answers(task: dict[str, Any]) -> list[Any]:
    return [e for e in task["audit"] if e["action"] not in ("human.queued", "human.notified")]


async def test_a_portrait_is_told_once_per_channel_and_approved_from_its_link(
    deployment: Deployment,
) -> None:
    d = deployment
    with d.requester():
        task_id = await d.submit({"subject": "Ada", "deadline_seconds": 600})
        (mail,) = await d.smtp.box.wait(1, task_id)
        (hook,) = await d.hooks.wait(1, "/generic", task_id=task_id)
        assert hook.body["event"] == "synapse.human.notify" and hook.body["level"] == 1
        links = links_of(mail)
        token = links["approve"].rsplit("/", 1)[1]
        waiting = await d.until(task_id, lambda t: t["state"] == "need_human")
        before = answers(waiting)
        # Forged, expired: refused, nothing written.
        forged = links["approve"][:-4] + "AAAA"
        assert (await post(forged, decision="approve")).status_code == 403
        expired = LinkSigner(LINK_KEY.encode()).sign(task_id, "approve", "alice", time.time() - 5)
        assert (
            await post(links["approve"].replace(token, expired), decision="approve")
        ).status_code == 410
        # An edit its schema refuses: nothing written.
        refused = await post(links["form"], decision="approve", **{"field:width": "9999"})
        assert refused.status_code == 400 and "maximum" in refused.text
        assert answers(await d.task(task_id)) == before
        assert (await d.task(task_id))["state"] == "need_human"
        # The approve link: a confirmation page (no decision on GET), then the POST.
        page = await get(links["approve"])
        assert page.status_code == 200 and "Approve this decision?" in page.text
        assert (await d.task(task_id))["state"] == "need_human"
        assert (await post(links["approve"], decision="approve")).status_code == 200
        done = await d.until(task_id, ended)
        assert done["state"] == "completed"
        assert done["result"]["output"] == {
            "approved": {"width": 1024, "style": "oil"},
            "by": "alice",
        }
        replay = await post(links["approve"], decision="approve")
        assert replay.status_code == 409  # used (and answered) already
        assert len(d.smtp.box.of(task_id)) == 1 and len(d.hooks.hooks) == 1
    # `synapse audit` verifies the chain; a changed entry is detected where it is.
    verified = run("audit", task_id, "--store", str(d.store), "--export", str(d.store) + ".jsonl")
    assert verified.returncode == 0, verified.stderr
    assert "chain intact" in verified.stdout and "human.link_used" in verified.stdout
    # The head it prints is a head it accepts back.
    printed = verified.stdout.rsplit("head ", 1)[1].splitlines()[0].strip()
    assert len(printed) == 64
    for kept in (printed, printed[:16]):
        again = run("audit", task_id, "--store", str(d.store), "--head", kept)
        assert again.returncode == 0 and "chain intact" in again.stdout, again.stdout
    lines = (d.store.parent / (d.store.name + ".jsonl")).read_bytes().splitlines()
    exported = [json.loads(line) for line in lines]
    assert [e["prev"] for e in exported[1:]] == [e["digest"] for e in exported[:-1]]
    store = SqliteStore(str(d.store))
    rec = store.get_task(TaskKey("req", task_id))
    assert rec is not None
    index = next(i for i, e in enumerate(rec.audit) if e.action == "approve")
    changed = rec.audit[index]
    rec.audit[index] = type(changed)(
        changed.at,
        "mallory",
        changed.action,
        changed.message_id,
        changed.detail,
        changed.prev,
        changed.digest,
    )
    store.put_task(rec, [])
    await store.commit()
    await store.close()
    broken = run("audit", task_id, "--store", str(d.store))
    assert broken.returncode == 1
    assert f"chain BROKEN at entry {index}: its content was changed" in broken.stdout


async def test_an_unanswered_question_escalates_then_times_out(deployment: Deployment) -> None:
    d = deployment
    with d.requester():
        task_id = await d.submit({"reason": "urgent", "deadline_seconds": 4})
        mails = await d.smtp.box.wait(2, task_id)
        assert [m["To"] for m in mails] == ["alice@example.com", "bob@example.com"]
        (hook,) = await d.hooks.wait(1, "/generic", task_id=task_id)
        assert hook.body["event"] == "synapse.human.escalate" and hook.body["level"] == 2
        done = await d.until(task_id, ended)
        assert done["state"] == "failed" and done["error"]["code"] == "permission_denied"
        timeout = next(e for e in done["audit"] if e["action"] == "human.timeout")
        assert timeout["detail"]["action"] == "reject"
        assert next(e for e in done["audit"] if e["action"] == "reject")["actor"] == "policy:urgent"


async def test_two_of_three_approvals_send_one_decision(deployment: Deployment) -> None:
    d = deployment
    with d.requester():
        task_id = await d.submit({"reason": "committee", "deadline_seconds": 600})
        mails = await d.smtp.box.wait(3, task_id)
        link = {m["To"].split("@")[0]: links_of(m)["approve"] for m in mails}
        assert "1 of 2" in (await post(link["carol"], decision="approve")).text
        task = await d.task(task_id)
        assert task["state"] == "need_human"
        assert not any(h["event"].startswith("send human_decision") for h in task["history"])
        assert (await post(link["alice"], decision="approve")).status_code == 200
        done = await d.until(task_id, ended)
        assert done["state"] == "completed" and done["result"]["output"]["by"] == "alice"
        sent = [h for h in done["history"] if h["event"].startswith("send human_decision")]
        assert len(sent) == 1, done["history"]
        assert (await post(link["bob"], decision="approve")).status_code == 409


async def test_a_sigkill_during_notification_loses_and_doubles_nothing(
    deployment: Deployment,
) -> None:
    d = deployment
    release = asyncio.Event()
    d.hooks.hold.append(release)  # the first webhook is kept unanswered
    with d.requester() as first:
        task_id = await d.submit({"subject": "Kim", "deadline_seconds": 600})
        (mail,) = await d.smtp.box.wait(1, task_id)
        await d.hooks.wait(1, "/generic", task_id=task_id)  # sent, not answered
        await d.until(  # the e-mail recorded as delivered, the webhook still in flight
            task_id,
            lambda t: any(
                e["action"] == "human.notified" and e["detail"]["channel"] == "mail"
                for e in t["audit"]
            ),
        )
        first.process.send_signal(signal.SIGKILL)
        first.process.wait(10)
    release.set()
    with d.requester():
        hooks = await d.hooks.wait(2, "/generic", task_id=task_id)
        assert hooks[0].headers["Idempotency-Key"] == hooks[1].headers["Idempotency-Key"]
        task = await d.until(
            task_id,
            lambda t: sum(e["action"] == "human.notified" for e in t["audit"]) == 2,
        )
        queued = [e for e in task["audit"] if e["action"] == "human.queued"]
        assert len(queued) == 2  # one e-mail, one webhook: planned once, before the kill
        assert len(d.smtp.box.of(task_id)) == 1  # delivered before the kill: not sent again
        assert (await post(links_of(mail)["approve"], decision="approve")).status_code == 200
        assert (await d.until(task_id, ended))["state"] == "completed"
    assert len(d.smtp.box.of(task_id)) == 1 and len(d.hooks.hooks) == 2


async def test_a_keyed_trail_finds_a_rewrite_and_a_cut_without_a_kept_head(
    deployment: Deployment, tmp_path: Path
) -> None:
    """`serve --audit-key-file` keys the trail; `synapse audit --audit-key-file` verifies it
    and says what that shows. Someone with write access to the store who rewrites the chain
    (recomputing every digest) or cuts its last entries is found; without the key, the
    verdict says the trail cannot be checked."""
    d = deployment
    key_file = tmp_path / "audit.key"
    key_file.write_text("audit-key-kept-outside-the-store-0123")
    with d.requester("--audit-key-file", f"2026={key_file}"):
        task_id = await d.submit({"deadline_seconds": 600})
        [mail] = await d.smtp.box.wait(1)
        assert (await post(links_of(mail)["approve"], decision="approve")).status_code == 200
        await d.until(task_id, ended)
    keyed = ("--store", str(d.store), "--audit-key-file", f"2026={key_file}")
    verified = run("audit", task_id, *keyed)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "chain intact" in verified.stdout and "head k:2026:" in verified.stdout
    assert "checked with the audit key" in verified.stdout
    unkeyed = run("audit", task_id, "--store", str(d.store))
    assert unkeyed.returncode == 1 and "give that key" in unkeyed.stdout

    store = SqliteStore(str(d.store))
    rec = store.get_task(TaskKey("req", task_id))
    assert rec is not None and rec.audit_seal.startswith("k:2026:")
    original = list(rec.audit)
    # A rewrite: the approver changed, every digest recomputed (without the key).
    rec.audit = []
    for e in original:
        actor = "mallory" if e.action == "approve" else e.actor
        append_audit(rec.audit, e.at, actor, e.action, e.message_id, e.detail)
    store.put_task(rec, [])
    await store.commit()
    rewritten = run("audit", task_id, *keyed)
    assert rewritten.returncode == 1 and "not keyed" in rewritten.stdout, rewritten.stdout
    # A cut: the last entries removed, the chain before them untouched.
    rec.audit = original[:-2]
    store.put_task(rec, [])
    await store.commit()
    await store.close()
    cut = run("audit", task_id, *keyed)
    assert cut.returncode == 1 and "seal does not match" in cut.stdout, cut.stdout
