"""What must hold at the end of every simulated run, each rule a named function.

The model checker's rules about a task's two records (`synapse.model.invariants`:
`records_agree`, `applied_once`, `history_in_the_table`) hold here too, over the records the
peers keep; and rules only whole peers can break:

- `submitted_tasks_are_kept`: a task whose `submit` returned is in its requester's store;
- `acknowledged_messages_are_kept`: a message a peer acknowledged (HTTP 200) after applying
  it to a task is in that task's stored history, whatever restarts came after;
- `callbacks_in_order`: the requester applied the executor's callbacks in the order they
  were sent;
- `side_effects_once`: a handler's side effect ran once per task (a resumable handler's,
  once per run of the process that started it again), and a completed task's ran;
- `announced_outcomes_are_kept`: an outcome a peer told anyone of (its listeners, hence its
  handles and its log) is the state its store keeps, whatever restarts came after;
- `answers_kept_once`: a question gets at most one answer, and an answer a person was told
  was taken is the one the requester keeps;
- `held_only_while_committing`: once the run is quiet, no peer holds a task for a message's
  commit (`held_while_quiet`);
- `every_task_ends`: checked by the run itself (`synapse.simulation.run`).
"""

from __future__ import annotations

import re
import sqlite3
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from synapse.model.invariants import applied_once, history_in_the_table, records_agree
from synapse.p2p.engine import TaskKey, TaskRecord
from synapse.p2p.states import Event
from synapse.simulation.peers import Node, TakenAnswer, TaskPlan
from synapse.store.sqlite import read_task
from synapse.types import TaskState

#: The ids `synapse.simulation.peers` gives messages: node, incarnation, count.
_MINTED = re.compile(r"msg-([a-z]+)([0-9]+)-([0-9]+)")


#: What the requester applies of the executor's callbacks.
_CALLBACKS = frozenset(
    {
        Event.RECV_TASK_STATUS_UPDATE,
        Event.RECV_TASK_NEED_INFO,
        Event.RECV_TASK_NEED_HUMAN,
        Event.RECV_TASK_COMPLETE,
        Event.RECV_TASK_FAILED,
    }
)


def minted(message_id: str | None) -> tuple[str, int, int] | None:
    """Who minted `message_id`, in which incarnation, as its how-manieth message."""
    found = _MINTED.fullmatch(message_id or "")
    return (found[1], int(found[2]), int(found[3])) if found else None


def stored_record(node: Node, key: TaskKey, *, from_file: bool = False) -> TaskRecord | None:
    """`node`'s record of `key`: its live process's (engine, then store), or, `from_file`,
    what its SQLite file holds (a memory store's node: its store)."""
    if from_file and node.path is not None:
        conn = sqlite3.connect(str(node.path))
        try:
            return read_task(conn, key)
        finally:
            conn.close()
    if node.incarnation is not None:
        return node.incarnation.record(key)
    return node.store.get_task(key) if node.store is not None else None


def submitted_tasks_are_kept(
    plan: TaskPlan, r: TaskRecord | None, nodes: Mapping[str, Node]
) -> str | None:
    """A task whose `submit` returned is in its requester's store."""
    if plan.key in nodes[plan.requester].submitted and r is None:
        return f"{plan.task_id} was submitted, and its requester has no record of it"
    return None


def acknowledged_messages_are_kept(node: Node, key: TaskKey, rec: TaskRecord | None) -> str | None:
    """A message `node` acknowledged after applying it to task `key` is in its history."""
    have = {t.message_id for t in rec.history} if rec is not None else set()
    lost = sorted(mid for k, mid in node.applied if k == key and mid not in have)
    if lost:
        return f"{node.name} acknowledged {', '.join(lost)} of {key.task_id}, and lost them"
    return None


def callbacks_in_order(r: TaskRecord | None, executor: str) -> str | None:
    """The requester applied the executor's callbacks in the order the executor made them
    (its ids say when: incarnation, then count). Some are never applied (dropped by a
    cancel, refused after a give-up): the others keep their order."""
    if r is None:
        return None
    applied = [
        (t.message_id, minted(t.message_id))
        for t in r.history
        if t.event in _CALLBACKS
        # The first need_info is the request's reply, not a callback.
        and not (t.event is Event.RECV_TASK_NEED_INFO and t.from_state is TaskState.PENDING)
    ]
    unknown = [mid for mid, when in applied if when is None or when[0] != executor]
    if unknown:
        return f"R applied {unknown[0]} as {executor}'s callback, which {executor} never made"
    order = [when[1:] for _, when in applied if when is not None]
    if order != sorted(order):
        return f"R applied {executor}'s callbacks in the order {[mid for mid, _ in applied]}"
    return None


def announced_outcomes_are_kept(node: Node, key: TaskKey, rec: TaskRecord | None) -> str | None:
    """What a peer announced as a task's outcome is what it keeps: announced means durable."""
    announced = node.announced.get(key)
    if announced is None:
        return None
    kept = "nothing" if rec is None else rec.state.value
    if rec is None or rec.state is not announced:
        return f"{node.name} announced {key.task_id} {announced.value}, and keeps {kept}"
    return None


_QUESTIONS = frozenset({Event.RECV_TASK_NEED_INFO, Event.RECV_TASK_NEED_HUMAN})
_ANSWERS = frozenset(
    {Event.SEND_TASK_INFO_PROVIDED, Event.SEND_HUMAN_APPROVE, Event.SEND_HUMAN_REJECT}
)


def answers_kept_once(
    answers: Iterable[TakenAnswer], key: TaskKey, r: TaskRecord | None
) -> str | None:
    """A question of the executor's gets at most one answer, and an answer a person was told
    was taken (however many fronts they used at once) is the one the requester keeps."""
    history = r.history if r is not None else []
    taken: dict[str, list[Event]] = {}
    question: str | None = None
    for t in history:
        if t.event in _QUESTIONS:
            question = t.message_id or ""
            taken[question] = []
        elif t.event in _ANSWERS and question is not None:
            taken[question].append(t.event)
    for asked, given in taken.items():
        if len(given) > 1:
            return f"question {asked} of {key.task_id} was answered {len(given)} times: {given}"
    for answer in answers:
        if answer.task != key:
            continue
        kept = taken.get(answer.question)
        if kept is None:
            return f"a person answered question {answer.question} of {key.task_id}, which is gone"
        if kept != [answer.event]:
            shown = kept[0].value if kept else "no answer"
            return (
                f"a person was told {answer.event.value} was taken for {key.task_id}, "
                f"and its requester keeps {shown}"
            )
    return None


def side_effects_once(
    plan: TaskPlan, r: TaskRecord | None, effects: Iterable[tuple[TaskKey, int, bool]]
) -> str | None:
    """A handler's side effect runs once per task (a resumable handler's: at most once per
    incarnation of its process), and a task completed at the requester ran it."""
    runs = Counter(incarnation for key, incarnation, _ in effects if key == plan.key)
    total = sum(runs.values())
    resumable = plan.task_type.startswith("resumable")
    if not resumable and total > 1:
        return f"{plan.task_id}'s side effect ran {total} times"
    if resumable and any(n > 1 for n in runs.values()):
        return f"{plan.task_id}'s side effect ran twice in one process"
    if r is not None and r.state is TaskState.COMPLETED and total == 0:
        return f"{plan.task_id} completed, and its side effect never ran"
    return None


def held_while_quiet(name: str, protocol: Any) -> str | None:
    """Once every task has ended and nothing is left to deliver, no commit of a message is in
    flight, so no task may be held for one (a hold left behind makes every later message
    about the task wait for ever)."""
    held = sorted(key.task_id for key in protocol.tasks_held)
    if held:
        return f"{name} holds {', '.join(held)} with no commit in flight"
    return None


def handles_settled(name: str, handles: Mapping[TaskKey, Any], stored: Any) -> list[str]:
    """Every handle a live process returned for a task that ended is settled, with the
    outcome the store keeps (whichever process ended the task: a replica that let it go
    learns it from the store)."""
    found = []
    for key, handle in handles.items():
        rec = stored(key)
        if rec is None or not rec.is_final:
            continue
        kept = rec.state.value
        if not handle.settled:
            found.append(f"{name}: {key.task_id} never settled (stored {kept})")
        elif handle.state is not rec.state:
            found.append(f"{name}: {key.task_id} says {handle.state.value}, stored {kept}")
    return found


def check(
    plans: Iterable[TaskPlan], nodes: Mapping[str, Node], *, from_files: bool = False
) -> list[str]:
    """Every broken invariant, one line each (`from_files`: read what the stores' files
    hold, after the processes died)."""
    found: list[str] = []
    where = " (in the files)" if from_files else ""

    def note(name: str, text: str | None) -> None:
        if text is not None:
            found.append(f"{name}{where}: {text}")

    for plan in plans:
        requester, executor = nodes[plan.requester], nodes[plan.executor]
        r = stored_record(requester, plan.key, from_file=from_files)
        e = stored_record(executor, plan.key, from_file=from_files)
        note("submitted_tasks_are_kept", submitted_tasks_are_kept(plan, r, nodes))
        if r is None and e is None:
            continue
        note("records_agree", records_agree(r, e))
        for side, rec in (("R", r), ("E", e)):
            twice = applied_once(rec)
            note("applied_once", None if twice is None else f"{side} applied {twice} twice")
            wrong = history_in_the_table(rec)
            note(
                "history_in_the_table", None if wrong is None else f"{side} {plan.task_id}: {wrong}"
            )
        note(
            "acknowledged_messages_are_kept", acknowledged_messages_are_kept(requester, plan.key, r)
        )
        note(
            "acknowledged_messages_are_kept", acknowledged_messages_are_kept(executor, plan.key, e)
        )
        note("callbacks_in_order", callbacks_in_order(r, plan.executor))
        for node, rec in ((requester, r), (executor, e)):
            note("announced_outcomes_are_kept", announced_outcomes_are_kept(node, plan.key, rec))
        note("answers_kept_once", answers_kept_once(requester.answers, plan.key, r))
        effects = [(x.task, x.incarnation, x.resumable) for x in executor.effects]
        note("side_effects_once", side_effects_once(plan, r, effects))
    return found


__all__ = [
    "acknowledged_messages_are_kept",
    "announced_outcomes_are_kept",
    "answers_kept_once",
    "callbacks_in_order",
    "check",
    "held_while_quiet",
    "side_effects_once",
    "stored_record",
    "submitted_tasks_are_kept",
]
