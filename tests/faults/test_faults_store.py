"""A peer whose store cannot write: it acknowledges nothing it did not store (issue 12 §1).

`agent-e` runs in its own process on an SQLite file; the test is its partner `agent-r`
(raw envelopes, a callback sink). While the store cannot write (another connection holds the
write lock; the tmpfs holding the file is full) every new task is answered 503
`agent_not_ready` however often it is retried, and leaves no trace; a task confirmed before
the fault finishes meanwhile and its callbacks wait. Once the store writes again, the task
is confirmed, the waiting callbacks go out, and after a SIGKILL and a restart every task the
peer ever confirmed is still known and reaches a final callback.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from diskfaults import fill, set_immutable, small_tmpfs, write_lock
from faultkit import SECRET, PeerProcess, RawPartner, Sink, eventually, free_ports
from rawpost import check_nack

pytestmark = pytest.mark.slow

E, R = "agent-e", "agent-r"
Spawn = Callable[..., PeerProcess]
FINAL_CALLBACKS = ("p2p:task_complete", "p2p:task_failed")


@contextlib.contextmanager
def fault(kind: str, db: Path) -> Iterator[None]:
    if kind == "lock":
        with write_lock(db):
            yield
    else:
        filler = fill(db.parent)
        try:
            yield
        finally:
            filler.unlink()


def files_of(db: Path) -> list[Path]:
    return sorted(db.parent.glob(db.name + "*"))


def finals(sink: Sink, task_id: str) -> list[dict[str, Any]]:
    return [
        m
        for m in sink.received
        if m["type"] in FINAL_CALLBACKS and m["payload"]["task_id"] == task_id
    ]


@pytest.mark.parametrize("kind", ["lock", "full"])
async def test_store_that_cannot_write_acknowledges_nothing_and_loses_nothing(
    spawn: Spawn, tmp_path: Path, kind: str
) -> None:
    with contextlib.ExitStack() as stack:
        disk = tmp_path
        if kind == "full":
            disk = stack.enter_context(small_tmpfs(tmp_path / "disk", size_kib=8192))
        db = disk / "e.sqlite"
        pe, ps = free_ports(2)
        sink = Sink(R, ps)
        await sink.start()
        peer = spawn(
            E, pe, {R: sink.endpoint}, store=str(db), options=("--fast", "--busy-timeout", "0.1")
        )
        await peer.start()
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as session:
                raw = RawPartner(R, sink.endpoint, E, peer.endpoint, session)
                await run_scenario(kind, db, peer, raw, sink)
        finally:
            await peer.close()
            await sink.close()


async def run_scenario(kind: str, db: Path, peer: PeerProcess, raw: RawPartner, sink: Sink) -> None:
    before = await raw.post(raw.task_request("before", "slow", {"steps": 4, "delay": 0.1}))
    assert (before.status, before.type) == (200, "p2p:task_confirm"), before
    during = raw.task_request("during", "slow", {"steps": 2, "delay": 0.1})

    with fault(kind, db):
        for _ in range(4):  # the sender's retries: never a task_confirm while nothing is stored
            reply = await raw.post(raw.restamped(during))
            details = check_nack(reply, 503, "agent_not_ready", signed=True, secret=SECRET)
            assert details.get("reason") == "store_unavailable", reply
        assert "during" not in await peer.tasks(history=False)
        assert f"{R}/during" not in peer.executions()  # its handler never started
        # The task confirmed before finishes; its callbacks wait for the store.
        await peer.wait_final(["before"], timeout=15)
        assert not finals(sink, "before")
        assert len(peer.log_events("store_unavailable")) == 1, peer.tail()

    # The store writes again: the waiting callbacks go out, the retried request is confirmed.
    async def before_delivered() -> bool:
        return bool(finals(sink, "before"))

    await eventually(before_delivered, timeout=15, what="the waiting final callback")
    reply = await raw.post(raw.restamped(during))
    assert (reply.status, reply.type) == (200, "p2p:task_confirm"), reply
    assert peer.log_events("store_recovered"), peer.tail()

    await peer.crash()  # SIGKILL right after the confirmation
    await peer.start()
    tasks = await peer.tasks(history=False)
    assert {"before", "during"} <= set(tasks), tasks

    async def during_finished() -> bool:
        return bool(finals(sink, "during"))

    await eventually(during_finished, timeout=20, what="a final callback for the confirmed task")
    # One final callback for it; a SIGKILL just after its reply may resend it (the crash
    # window of docs/durability.md), but only as the same message, which dedup absorbs.
    assert len({m["id"] for m in finals(sink, "before")}) == 1


async def test_a_peer_started_on_unwritable_files_refuses_until_they_are_fixed(
    spawn: Spawn, tmp_path: Path
) -> None:
    """Files even root cannot open for writing (`chattr +i`): SQLite opens them read-only,
    every task is refused 503 and leaves nothing; fixed, the next retry is confirmed."""
    db = tmp_path / "e.sqlite"
    pe, ps = free_ports(2)
    sink = Sink(R, ps)
    await sink.start()
    peer = spawn(E, pe, {R: sink.endpoint}, store=str(db))
    await peer.start()
    await peer.stop()  # a clean stop: the WAL is folded into the file
    files = files_of(db)
    set_immutable(files, True)
    try:
        await peer.start()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as session:
            raw = RawPartner(R, sink.endpoint, E, peer.endpoint, session)
            request = raw.task_request("ro", "echo", {"text": "x"})
            for _ in range(3):
                reply = await raw.post(raw.restamped(request))
                details = check_nack(reply, 503, "agent_not_ready", signed=True, secret=SECRET)
                assert details.get("reason") == "store_unavailable", reply
            assert "ro" not in await peer.tasks(history=False)
            assert len(peer.log_events("store_unavailable")) == 1, peer.tail()
            set_immutable(files, False)
            reply = await raw.post(raw.restamped(request))
            assert (reply.status, reply.type) == (200, "p2p:task_confirm"), reply

            async def finished() -> bool:
                return bool(finals(sink, "ro"))

            await eventually(finished, timeout=15, what="the confirmed task's final callback")
    finally:
        set_immutable(files, False)
        await peer.close()
        await sink.close()
