"""`checkpoint` and `rollback`: a message whose commit failed leaves its task as the engine
had it, unless something else put the task in its place meanwhile, and says which it did
(the runtime lets a task go again only when the undo put the old copy back)."""

from __future__ import annotations

import copy

import pytest
from pairing import E_ID, R_ID, Pair

from synapse.p2p.engine import TaskKey
from synapse.types import NotReady, TaskState


def failed_by_the_executor(pair: Pair) -> tuple[TaskKey, object]:
    """A task executing at both ends, and the executor's task_failed about it, not sent."""
    key = pair.submit("echo", {"text": "hi"})
    pair.deliver(R_ID)  # task_request, confirmed: executing at the executor
    pair.report_status(key, progress=10)
    pair.deliver(E_ID)  # the requester hears it executes
    pair.fail(key)
    outgoing = pair.outbox[E_ID].pop()
    return key, outgoing.message


def test_an_undone_message_puts_its_task_back_as_it_was() -> None:
    pair = Pair()
    key, failed = failed_by_the_executor(pair)
    before = pair.r.tasks[key]
    checkpoint = pair.r.checkpoint(failed)  # type: ignore[arg-type]
    pair.r.receive(failed, pair.now)  # type: ignore[arg-type]
    after = pair.r.counted(checkpoint)
    assert pair.r.tasks[key].state is TaskState.FAILED
    assert pair.r.rollback(checkpoint, after) is True
    assert pair.r.tasks[key] is before
    assert before.state is TaskState.EXECUTING


def test_a_task_put_in_its_place_meanwhile_stays_and_the_undo_says_so() -> None:
    """A takeover restored the store's copy while the message's commit was awaited: the undo
    leaves that copy, and answers False (the runtime must not let the task go for it)."""
    pair = Pair()
    key, failed = failed_by_the_executor(pair)
    before = pair.r.tasks[key]
    stored = copy.deepcopy(before)  # the store's copy, read by a takeover
    checkpoint = pair.r.checkpoint(failed)  # type: ignore[arg-type]
    pair.r.receive(failed, pair.now)  # type: ignore[arg-type]
    after = pair.r.counted(checkpoint)
    pair.r.release(key)  # the lease found lost...
    pair.r.restore([stored], pair.now)  # ...and the task taken back from the store
    assert pair.r.rollback(checkpoint, after) is False
    assert pair.r.tasks[key] is stored
    assert stored.state is TaskState.EXECUTING


def test_a_live_task_only_the_store_has_is_not_moved_by_a_message_here() -> None:
    """A replica's engine does not hold the task, and the store says it is in flight:
    another process holds it. The message is refused as retryable, and nothing moves (a
    copy moved here would write a history beside a row that never moves)."""
    pair = Pair()
    key, failed = failed_by_the_executor(pair)
    stored = pair.r.tasks[key]
    history = list(stored.history)
    pair.r.release(key)
    pair.r.finished_lookup = {key: stored}.get
    with pytest.raises(NotReady) as refused:
        pair.r.receive(failed, pair.now)  # type: ignore[arg-type]
    assert refused.value.details == {"reason": "task_held_elsewhere"}
    assert key not in pair.r.tasks
    assert stored.state is TaskState.EXECUTING and stored.history == history


def test_a_finished_task_only_the_store_has_still_answers_its_messages() -> None:
    pair = Pair()
    key, failed = failed_by_the_executor(pair)
    pair.r.receive(failed, pair.now)  # type: ignore[arg-type]
    finished = pair.r.tasks[key]
    assert pair.r.forget(key)
    pair.r.finished_lookup = {key: finished}.get
    again = pair.r.receive(failed, pair.now)  # type: ignore[arg-type]  # a retry
    assert again.reply is not None and again.reply.payload.state is TaskState.FAILED  # type: ignore[union-attr]
    assert again.transitions == []
