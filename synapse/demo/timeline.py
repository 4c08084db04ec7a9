"""A timeline of the messages between a requester (R) and an executor (E), for a newcomer.

`Timeline` listens to both peers' messages (`P2PProtocol.listeners`) and renders one line per
message: who sent it (`R → E`, `E → R`), whether it was a POST or the synchronous reply to one,
its type, its task, and how each side's task state changed because of it (`before → after`,
through every intermediate state). Message ids and timestamps are never shown, so the same
flow always prints the same lines.

How a state change is tied to a message, from the task records' histories:
- the receiver's changes are the ones it made between receiving a POST and replying to it
  (`handle_message` does both without awaiting, so nothing else can slip in);
- the changes a synchronous reply caused at the side that POSTed are those carrying the
  reply's message id (and the `recv nack` step for a refused `task_request`);
- every other change of a side (its own decisions: sending a request, a result, asking a
  person, …) belongs to the next message that side sends about the task.
Both peers must run in the same process, and the lines read best when exchanges are
serialized (the demo does that), so that the wire order is the order of the lines.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from synapse.p2p.engine import TaskKey, Transition
from synapse.p2p.states import Event
from synapse.runtime.listener import OnMessage
from synapse.runtime.protocol import Direction, MessageEvent, P2PProtocol
from synapse.types import (
    Ack,
    CapabilityQuery,
    CapabilityResponse,
    DecisionAction,
    Heartbeat,
    HumanDecision,
    Message,
    Nack,
    TaskAck,
    TaskCancel,
    TaskComplete,
    TaskConfirm,
    TaskFailed,
    TaskInfoProvided,
    TaskNeedHuman,
    TaskNeedInfo,
    TaskReject,
    TaskRequest,
    TaskState,
    TaskStatusUpdate,
)

Side = Literal["R", "E"]
SIDES: tuple[Side, Side] = ("R", "E")


def _other(side: Side) -> Side:
    return "E" if side == "R" else "R"


def task_id_of(message: Message) -> str | None:
    """The task a message is about, if any."""
    if isinstance(message, TaskRequest):
        return message.payload.task.id
    task_id = getattr(message.payload, "task_id", None)
    return task_id if isinstance(task_id, str) else None


@dataclass(frozen=True, slots=True)
class _Crossing:
    """One observed message, with how long each side's task history was at that moment."""

    side: Side
    direction: Direction
    message: Message
    task_id: str | None
    marks: dict[Side, int]


@dataclass(slots=True)
class Line:
    """One message of the timeline."""

    number: int
    sender: Side
    message: Message
    task_id: str | None
    #: The number of the POST this is the synchronous reply to (None for a POST).
    reply_to: int | None = None
    #: Each side's states, oldest first, when this message changed them (else absent).
    changes: dict[Side, list[TaskState]] = field(default_factory=dict)

    @property
    def is_reply(self) -> bool:
        return self.reply_to is not None

    @property
    def type(self) -> str:
        return self.message.message_type.short

    @property
    def arrow(self) -> str:
        return f"{self.sender} → {_other(self.sender)}"

    #: Each side's state as shown: `before → after` where it changed, else the state it was in.
    shown: dict[Side, str] = field(default_factory=dict)

    def states(self, side: Side) -> str:
        chain = self.changes.get(side)
        return " → ".join(s.value for s in chain) if chain else ""

    @property
    def detail(self) -> str:
        return describe(self.message)


REFUSED = Event.REQUEST_REFUSED


def state_when_sent(message: Message) -> TaskState | None:
    """The sender's state right after it decided to send `message`, where the type implies it."""
    if isinstance(message, TaskStatusUpdate):
        return message.payload.status
    if isinstance(message, HumanDecision):
        approved = message.payload.decision.action is DecisionAction.APPROVE
        return TaskState.HUMAN_APPROVED if approved else TaskState.HUMAN_REJECTED
    return _SENT_IN.get(type(message))


_SENT_IN: dict[type[Message], TaskState] = {
    TaskRequest: TaskState.PENDING,
    TaskInfoProvided: TaskState.INFO_PROVIDED,
    TaskNeedInfo: TaskState.INFO_NEEDED,
    TaskNeedHuman: TaskState.NEED_HUMAN,
    TaskComplete: TaskState.COMPLETED,
    TaskFailed: TaskState.FAILED,
}


def _made_for(c: _Crossing, history: list[Transition]) -> range:
    """Indexes of the sender's changes that led to the message of `c` (a POST going out).

    Its delivery may start after the sender moved on (a handler that completes right after
    its last progress report), so the changes are cut after the last one that reached the
    state the message was sent in.
    """
    end = min(c.marks[c.side], len(history))
    state = state_when_sent(c.message)
    if state is None:
        return range(end)
    last = -1
    for i in range(end):
        if history[i].to_state is state:
            last = i
        elif last >= 0:
            break
    return range(last + 1)


def _chain(transitions: Iterable[Transition]) -> list[TaskState]:
    """The states a side went through; a step to the same state (a status update) adds none."""
    chain: list[TaskState] = []
    for t in transitions:
        if not chain:
            chain.append(t.from_state)
        if t.to_state is not chain[-1]:
            chain.append(t.to_state)
    return chain if len(chain) > 1 else []


class Timeline:
    """Records what crosses between `requester` (R) and `executor` (E); renders it per section."""

    def __init__(self, requester: P2PProtocol, executor: P2PProtocol) -> None:
        self.protocols: dict[Side, P2PProtocol] = {"R": requester, "E": executor}
        self._crossings: list[_Crossing] = []
        self._task_of: dict[str, str] = {}  # message id → task id
        requester.listeners.append(OnMessage(self._observer("R")))
        executor.listeners.append(OnMessage(self._observer("E")))

    @property
    def requester_id(self) -> str:
        return self.protocols["R"].view.agent_id

    def _history(self, side: Side, task_id: str) -> list[Transition]:
        rec = self.protocols[side].view.get(TaskKey(self.requester_id, task_id))
        return rec.history if rec is not None else []

    def _observer(self, side: Side) -> Callable[[MessageEvent], None]:
        def observe(event: MessageEvent) -> None:
            message = event.message
            task_id = task_id_of(message)
            if task_id is None and message.reply_to is not None:  # an `ack` names no task
                task_id = self._task_of.get(message.reply_to)
            elif task_id is not None:
                self._task_of[message.id] = task_id
            marks: dict[Side, int] = {
                s: len(self._history(s, task_id)) if task_id is not None else 0 for s in SIDES
            }
            self._crossings.append(_Crossing(side, event.direction, event.message, task_id, marks))

        return observe

    def clear(self) -> None:
        """Forget what was recorded (start a new section)."""
        self._crossings.clear()

    @property
    def pending(self) -> int:
        return len(self._crossings)

    def lines(self) -> list[Line]:
        """The recorded messages as lines, in the order they reached their receiver."""
        lines: list[Line] = []
        posts: dict[str, Line] = {}  # POSTed message id → its line (placed or not)
        placed: set[int] = set()
        received_at: dict[str, int] = {}  # POSTed message id → receiver's mark at `in`
        taken: dict[tuple[Side, str], set[int]] = {}

        def take(side: Side, task_id: str, indexes: Iterable[int]) -> list[Transition]:
            used = taken.setdefault((side, task_id), set())
            history = self._history(side, task_id)
            chosen = [i for i in indexes if i not in used and i < len(history)]
            used.update(chosen)
            return [history[i] for i in sorted(chosen)]

        def place(line: Line) -> None:
            if id(line) not in placed:
                placed.add(id(line))
                line.number = len(lines) + 1
                lines.append(line)

        for c in self._crossings:
            task = c.task_id
            if c.direction == "out":
                line = Line(0, c.side, c.message, task)
                if task is not None:
                    own = take(c.side, task, _made_for(c, self._history(c.side, task)))
                    if chain := _chain(own):
                        line.changes[c.side] = chain
                posts[c.message.id] = line
            elif c.direction == "in":
                line = posts.get(c.message.id) or Line(0, _other(c.side), c.message, task)
                posts[c.message.id] = line
                place(line)
                received_at[c.message.id] = c.marks[c.side]
            elif c.direction == "reply_out":
                post_id = c.message.reply_to or ""
                line_or_none = posts.get(post_id)
                if line_or_none is not None and task is not None and post_id in received_at:
                    span = range(received_at[post_id], c.marks[c.side])
                    if chain := _chain(take(c.side, task, span)):
                        line_or_none.changes[c.side] = chain
            else:  # reply_in: the reply reached the side that POSTed
                post = posts.get(c.message.reply_to or "")
                if post is not None:
                    place(post)
                reply = Line(
                    0,
                    _other(c.side),
                    c.message,
                    task,
                    reply_to=post.number if post is not None else None,
                )
                if task is not None:
                    history = self._history(c.side, task)
                    caused = [
                        i
                        for i in range(c.marks[c.side], len(history))
                        if history[i].message_id == c.message.id
                        or (
                            isinstance(c.message, Nack)
                            and history[i].event is Event.REQUEST_REFUSED
                        )
                    ]
                    if chain := _chain(take(c.side, task, caused)):
                        reply.changes[c.side] = chain
                place(reply)
        for line in posts.values():  # a POST that never got a reply
            place(line)
        running: dict[tuple[Side, str], TaskState] = {}
        for line in lines:
            if line.task_id is None:
                continue
            for side in SIDES:
                states = line.changes.get(side)
                if states:
                    running[side, line.task_id] = states[-1]
                    line.shown[side] = " → ".join(state.value for state in states)
                elif (side, line.task_id) in running:
                    line.shown[side] = running[side, line.task_id].value
                else:
                    line.shown[side] = "—"
        return lines

    def render(self, labels: Mapping[Side, str] | None = None) -> str:
        """One line per message (number, direction, type, task, what it says), and under a
        message about a task, each side's state: `before → after` where the message changed
        it, else the state it stayed in (`—` before the side knows the task).
        """
        lines = self.lines()
        names = {side: f"{side} ({labels[side]})" if labels else side for side in SIDES}
        rows = [
            (
                str(line.number),
                line.arrow,
                f"↳ {line.type} (sync reply)" if line.is_reply else line.type,
                line.task_id or "",
            )
            for line in lines
        ]
        widths = [max((len(row[i]) for row in rows), default=0) for i in range(4)]
        r_width = max((len(names["R"]) + 1 + len(ln.shown.get("R", "")) for ln in lines), default=0)
        out = []
        for line, row in zip(lines, rows, strict=True):
            cells = [row[0].rjust(widths[0]), *(row[i].ljust(widths[i]) for i in (1, 2, 3))]
            out.append(("  ".join(c for c in cells if c) + "  " + line.detail).rstrip())
            if line.shown:
                indent = " " * (widths[0] + widths[1] + 4)
                left = f"{names['R']} {line.shown['R']}".ljust(r_width)
                out.append(f"{indent}{left}   {names['E']} {line.shown['E']}")
        return "\n".join(out)


# --- one-phrase descriptions of messages -------------------------------------------------------


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def _clip(text: str, width: int = 72) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def describe(message: Message) -> str:
    """What a message says, in a few words (no ids, no timestamps)."""
    if isinstance(message, TaskRequest):
        task = message.payload.task
        return _clip(f"{task.type} {_json(task.payload)}")
    if isinstance(message, TaskConfirm):
        eta = message.payload.estimated_duration
        return "accepted" + (f", about {eta} s" if eta is not None else "")
    if isinstance(message, TaskReject):
        reason = message.payload.reason
        return _clip(f"{reason.code}: {reason.message}")
    if isinstance(message, TaskNeedInfo):
        parts = []
        for m in message.payload.missing_fields:
            hint = []
            if m.suggested_value is not None:
                hint.append(f"suggested {_json(m.suggested_value)}")
            if m.alternatives:
                hint.append("or " + ", ".join(_json(a) for a in m.alternatives))
            parts.append(m.field + (f" ({'; '.join(hint)})" if hint else ""))
        return _clip("missing " + ", ".join(parts))
    if isinstance(message, TaskInfoProvided):
        return _clip(", ".join(f"{k} = {_json(v)}" for k, v in message.payload.fields.items()))
    if isinstance(message, TaskStatusUpdate):
        p = message.payload
        progress = f" {p.progress:g}%" if p.progress is not None else ""
        text = f" {p.message}" if p.message and p.message != p.status.value else ""
        return f"{p.status.value}{progress}{text}"
    if isinstance(message, TaskNeedHuman):
        need = message.payload
        options = ", ".join(f"{o.field} = {_json(o.value)}" for o in need.options)
        return _clip(f"{need.reason.code}" + (f"; option {options}" if options else ""))
    if isinstance(message, HumanDecision):
        d = message.payload.decision
        extra = f" {_json(d.approved_fields)}" if d.approved_fields else ""
        why = f": {d.rejection_reason}" if d.rejection_reason else ""
        return _clip(f"{d.action.value}{extra}{why}")
    if isinstance(message, TaskComplete):
        return _clip(f"output {_json(message.payload.result.output)}")
    if isinstance(message, TaskFailed):
        e = message.payload.error
        return _clip(f"{e.code}: {e.message}" + (" (recoverable)" if e.recoverable else ""))
    if isinstance(message, TaskCancel):
        return _clip(message.payload.reason or "")
    if isinstance(message, TaskAck):
        return f"state {message.payload.state.value}"
    if isinstance(message, Nack):
        return _clip(f"{message.payload.code}: {message.payload.message}")
    if isinstance(message, CapabilityQuery):
        return message.payload.task_type or "all task types"
    if isinstance(message, CapabilityResponse):
        return _clip(", ".join(c.name for c in message.payload.capabilities))
    if isinstance(message, Heartbeat):
        return f"{message.payload.status.value}, {message.payload.active_tasks} active"
    if isinstance(message, Ack):
        return ""
    return ""


__all__ = ["Line", "Timeline", "describe", "task_id_of"]
