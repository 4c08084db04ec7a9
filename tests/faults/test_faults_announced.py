"""Announced means durable: a peer SIGKILLed the instant it announces an outcome gives the same
outcome back after a restart, on every path that ends a task without a message arriving.

The peer under test runs with `--kill-on WHAT` (see `peer_proc.py`): a listener SIGKILLs the
process as soon as a task's move to WHAT (or a dead letter) is announced. Before the rule, the
outcome was announced when it was applied and committed by whichever commit came next, which an
idle peer never makes: a task announced `failed` after its undeliverable request came back
`pending` after a crash, its request was delivered and it ended `completed`.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from faultkit import PeerProcess, eventually, free_ports, url

pytestmark = pytest.mark.slow

E, R = "agent-e", "agent-r"
Spawn = Callable[..., PeerProcess]
KILLED = -9


async def killed_by_its_announcement(peer: PeerProcess) -> None:
    """Wait for `peer` to SIGKILL itself, then let it start again without `--kill-on`."""
    assert await peer.wait(timeout=20) == KILLED, peer.tail()
    peer.options = tuple(o for o in peer.options if not o.startswith("--kill-on"))


def two_peers(
    spawn: Spawn, *, r_options: tuple[str, ...], e_options: tuple[str, ...] = ("--fast",)
) -> tuple[PeerProcess, PeerProcess]:
    pe, pr = free_ports(2)
    e = spawn(E, pe, {R: url(pr)}, options=e_options)
    r = spawn(R, pr, {E: url(pe)}, options=r_options)
    return e, r


async def test_an_undeliverable_request_announced_failed_stays_failed(spawn: Spawn) -> None:
    # E is down: R's request is undeliverable after its retries, and the task fails.
    e, r = two_peers(spawn, r_options=("--fast", "--max-retries", "1", "--kill-on=failed"))
    await r.start()
    [task_id] = await r.submit(E, "echo", {"text": "hello"})
    await killed_by_its_announcement(r)

    await e.start()
    await r.start()
    tasks = await r.tasks()
    assert tasks[task_id]["state"] == "failed", tasks[task_id]
    assert tasks[task_id]["error"]["code"] == "undeliverable"
    # Nothing of it is left to send: the request is not delivered after the restart.
    assert (await r.stats())["pending_deliveries"] == 0
    await r.stop()
    assert e.executions() == {}
    assert await e.tasks() == {}


async def test_a_deadline_announced_failed_stays_failed(spawn: Spawn) -> None:
    # The deadline's timer fails the task while E works on it (a 4 s task, a 1 s deadline).
    e, r = two_peers(spawn, r_options=("--fast", "--kill-on=failed"))
    await asyncio.gather(e.start(), r.start())
    [task_id] = await r.submit(E, "slow", {"steps": 40, "delay": 0.1}, deadline_in=1.0)
    await killed_by_its_announcement(r)

    await r.start()
    tasks = await r.tasks()
    assert tasks[task_id]["state"] == "failed", tasks[task_id]
    # E is told (the cancel was in R's outbox with the failure) and stops: whatever E sends
    # meanwhile cannot revive the task at R.
    await e.wait_final([task_id], timeout=20)
    await eventually(lambda: _nothing_pending(r), timeout=20, what="R delivered its cancel")
    after = await r.tasks()
    assert after[task_id]["state"] == "failed"
    assert after[task_id]["history"] == tasks[task_id]["history"], "R's history moved on"


async def test_a_cancel_announced_stays_cancelled(spawn: Spawn) -> None:
    e, r = two_peers(spawn, r_options=("--fast", "--kill-on=cancelled"))
    await asyncio.gather(e.start(), r.start())
    [task_id] = await r.submit(E, "slow", {"steps": 40, "delay": 0.1})
    await r.wait_states([task_id], lambda s: s == "executing", timeout=10)
    await r.cancel(task_id, "no longer needed")
    await killed_by_its_announcement(r)

    await r.start()
    tasks = await r.tasks()
    assert tasks[task_id]["state"] == "cancelled", tasks[task_id]
    assert (await e.wait_final([task_id], timeout=20))[task_id] == "cancelled"


async def test_a_dead_letter_announced_is_not_sent_again(spawn: Spawn) -> None:
    # R requests, then dies; E finishes and its callbacks cannot reach R: past
    # `dead_letter_after` the first becomes a dead letter, and E is killed as it announces it.
    e, r = two_peers(
        spawn,
        r_options=("--fast",),
        e_options=("--fast", "--dead-letter-after", "0.5", "--kill-on=dead_letter"),
    )
    await asyncio.gather(e.start(), r.start())
    [task_id] = await r.submit(E, "slow", {"steps": 3, "delay": 0.2})
    await r.wait_states([task_id], lambda s: s == "executing", timeout=10)
    await r.crash()
    await killed_by_its_announcement(e)

    await e.start()
    stats = await e.stats()
    assert stats["dead_letters"] >= 1, e.tail()
    # The dead letter stays one (listed until a person retries it), not queued again.
    tasks = await e.tasks()
    assert tasks[task_id]["dead_letters"], tasks[task_id]


async def test_a_silent_executor_given_up_stays_given_up(spawn: Spawn) -> None:
    # E dies mid-task; R's patience (task_timeout 1 s plus three lost heartbeats) runs out and
    # R fails the task: killed as it announces that, R must keep it failed.
    e, r = two_peers(spawn, r_options=("--fast", "--task-timeout", "1", "--kill-on=failed"))
    await asyncio.gather(e.start(), r.start())
    [task_id] = await r.submit(E, "slow", {"steps": 200, "delay": 0.1})
    await r.wait_states([task_id], lambda s: s == "executing", timeout=10)
    await e.crash()
    await killed_by_its_announcement(r)

    await r.start()
    tasks = await r.tasks()
    assert tasks[task_id]["state"] == "failed", tasks[task_id]
    assert tasks[task_id]["error"]["code"] == "execution_timeout"


async def test_an_unanswered_question_announced_failed_stays_failed(spawn: Spawn) -> None:
    # E asks for the style (task_need_info in its reply) and nobody answers: past its
    # input_timeout E fails the task, and is killed as it announces that.
    e, r = two_peers(
        spawn,
        r_options=("--fast",),
        e_options=("--fast", "--input-timeout", "1", "--kill-on=failed"),
    )
    await asyncio.gather(e.start(), r.start())
    [task_id] = await r.submit(E, "text_generation", {"prompt": "spring"})
    await killed_by_its_announcement(e)

    await e.start()
    tasks = await e.tasks()
    assert tasks[task_id]["state"] == "failed", tasks[task_id]
    assert tasks[task_id]["error"]["code"] == "execution_timeout"
    # Its task_failed was durable with the failure: R is told after the restart.
    assert (await r.wait_final([task_id], timeout=20))[task_id] == "failed"


async def test_a_question_past_its_required_by_announced_failed_stays_failed(
    spawn: Spawn,
) -> None:
    # E asks for the style with required_by one second away (its input_timeout an hour):
    # nobody answers, E fails the task when required_by passes, and is killed as it
    # announces that.
    e, r = two_peers(
        spawn,
        r_options=("--fast",),
        e_options=("--fast", "--required-by", "1", "--kill-on=failed"),
    )
    await asyncio.gather(e.start(), r.start())
    [task_id] = await r.submit(E, "text_generation", {"prompt": "spring"})
    await killed_by_its_announcement(e)

    await e.start()
    tasks = await e.tasks()
    assert tasks[task_id]["state"] == "failed", tasks[task_id]
    assert tasks[task_id]["error"]["code"] == "execution_timeout"
    assert "required_by" in tasks[task_id]["error"]["message"], tasks[task_id]["error"]
    assert (await r.wait_final([task_id], timeout=20))[task_id] == "failed"


PEOPLE = """
[humans]
link_secret = "announced-link-secret-0123456789"

[[humans.reviewer]]
id = "alice"

[[humans.channel]]
name = "hook"
kind = "webhook"
url = "http://127.0.0.1:9/nobody-listens"

[[notify]]
name = "quiet"
task_types = ["portrait"]
decide_within = "3s"
timeout_margin = "1s"
on_timeout = "{on_timeout}"

[[notify.level]]
reviewers = ["alice"]
channels = ["hook"]
"""


@pytest.mark.parametrize(
    ("on_timeout", "announced", "final"),
    [("reject", "human_rejected", "failed"), ("approve_default", "human_approved", "completed")],
)
async def test_a_policy_decision_announced_is_sent_once_and_kept(
    spawn: Spawn, tmp_path: Path, on_timeout: str, announced: str, final: str
) -> None:
    # E asks R's people about a portrait; nobody answers, and R's policy decides for them two
    # seconds in (three to decide, one of margin). R is killed as it announces the decision:
    # after the restart the decision stands, is sent once, and the audit names the policy once.
    people = tmp_path / "people.toml"
    people.write_text(PEOPLE.format(on_timeout=on_timeout))
    e, r = two_peers(spawn, r_options=("--fast", "--humans", str(people), f"--kill-on={announced}"))
    await asyncio.gather(e.start(), r.start())
    [task_id] = await r.submit(E, "portrait", {"subject": "a stranger"})
    await killed_by_its_announcement(r)

    await r.start()
    # The decision stands: the task is past its question, never back at it. (After an
    # approval the executor may have resumed already: the requester then reads `executing`.)
    past_the_question = {announced, final} | ({"executing"} if final == "completed" else set())
    assert (await r.tasks())[task_id]["state"] in past_the_question
    assert (await r.wait_final([task_id], timeout=20))[task_id] == final
    assert (await e.wait_final([task_id], timeout=20))[task_id] == final
    decision = f"recv human_decision({'reject' if on_timeout == 'reject' else 'approve'})"
    received = [step for step in (await e.tasks())[task_id]["history"] if step[2] == decision]
    assert len(received) == 1, (await e.tasks())[task_id]["history"]
    await r.stop()
    audit = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "synapse.cli.main", "audit", "--store", r.store, task_id),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    printed = (await asyncio.wait_for(audit.communicate(), 60))[0].decode()
    by_policy = [line for line in printed.splitlines() if "policy:quiet" in line]
    timed_out = [line for line in by_policy if "human.timeout" in line]
    decided = [line for line in by_policy if '"front": "policy"' in line]
    assert len(timed_out) == len(decided) == 1, printed
    assert "chain intact" in printed


async def _nothing_pending(peer: PeerProcess) -> bool:
    return bool((await peer.stats())["pending_deliveries"] == 0)
