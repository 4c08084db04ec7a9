"""A task let go to another replica: its handle here still learns the outcome, from the
store, and the bookkeeping of tasks let go stays bounded however many are let go."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from storekit import E_ID, E_URL, R_ID, R_URL

from synapse.p2p.commands import Submit
from synapse.p2p.config import P2PConfig
from synapse.p2p.engine import Engine, TaskKey
from synapse.p2p.records import Step
from synapse.runtime.protocol import P2PProtocol
from synapse.store import SqliteStore
from synapse.types import Message, NotReady, TaskState


class Executor:
    """`agent-e`, sans-IO: answers the requests it is sent (and does nothing more)."""

    def __init__(self) -> None:
        self.engine = Engine(agent_id=E_ID, endpoint=E_URL)

    async def send_callback(self, partner: str, message: Message, *, retry: bool = True) -> Message:
        reply = self.engine.receive(message, 0.0).reply
        assert reply is not None
        return reply


def requester(path: Path) -> P2PProtocol:
    # Followed every lease_ttl / 5: 10 ms here.
    return P2PProtocol(
        agent_id=R_ID,
        endpoint=R_URL,
        sender=Executor(),
        store=SqliteStore(path),
        config=P2PConfig(lease_ttl=0.05),
    )


async def test_a_handle_of_a_task_let_go_settles_with_the_outcome_the_store_keeps(
    tmp_path: Path,
) -> None:
    """A replica loses a task it requested (another one took the lease over, and finished
    the task there): the person awaiting the handle here is told the outcome the shared
    store holds, once it is final there, and not before."""
    path = tmp_path / "shared.sqlite"
    r = requester(path)
    other = SqliteStore(path)  # the replica that took the task over
    async with r:
        handle = await r.submit(Submit(E_ID, "work", {}, task_id="t1"))
        key = TaskKey(R_ID, "t1")
        stored = other.get_task(key)
        assert stored is not None and not stored.is_final
        r.release(key)  # its lease was found lost
        assert not handle.settled
        # The other replica moves it on, not to an end yet: the handle keeps waiting.
        other.put_task(dataclasses.replace(stored, state=TaskState.EXECUTING), [])
        await other.commit()
        with pytest.raises(TimeoutError):
            await handle.result(timeout=0.2)
        other.put_task(dataclasses.replace(stored, state=TaskState.COMPLETED), [])
        await other.commit()
        outcome = await handle.result(timeout=10)
    assert outcome.state is TaskState.COMPLETED
    await other.close()
    await r.store.close()


async def test_a_check_made_before_the_tasks_let_go_are_forgotten_fails_safely(
    tmp_path: Path,
) -> None:
    """The record of which tasks were let go is forgotten by the thousand (it would grow
    with every takeover for the life of the process). A change checked before a forgetting
    is refused as if its task had been let go (the sender retries); one checked after it
    goes through."""
    r = requester(tmp_path / "r.sqlite")
    async with r:
        await r.submit(Submit(E_ID, "work", {}, task_id="kept"))
        key = TaskKey(R_ID, "kept")
        before = r.held_here(key)
        for n in range(2_500):
            r.release(TaskKey(R_ID, f"gone-{n}"))
        with pytest.raises(NotReady):
            await r.apply_durably(Step(), before)
        await r.apply_durably(Step(), r.held_here(key))
        # Bounded: at most a thousand remembered, whatever number were let go.
        assert len(r._releases) <= 1_000
    await r.store.close()
