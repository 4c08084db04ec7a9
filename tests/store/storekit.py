"""Real task records and messages for store tests: two sans-IO engines run a task.

`Duo` wires a requester engine and an executor engine back to back on a fake clock and saves
every step's transitions to each side's store, the way `P2PProtocol.apply` does, so the
records a store keeps in these tests are exactly the ones the runtime would give it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from synapse.p2p.commands import Complete, ReportStatus, Submit
from synapse.p2p.dedup import StoredReply
from synapse.p2p.engine import Engine, Step, TaskKey, TaskRecord
from synapse.store.base import DedupEntry, OutboxItem, TaskStore
from synapse.types import Message, TaskResult, encode_message

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
R_ID, E_ID = "agent-r", "agent-e"
R_URL, E_URL = "http://127.0.0.1:1/r", "http://127.0.0.1:2/e"


class Clock:
    """A fake clock the test moves by hand (`clock.now += 11`)."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def save(store: TaskStore, engine: Engine, step: Step) -> None:
    """What `P2PProtocol._persist` does with a step: each touched task and its transitions."""
    by_task: dict[TaskKey, list[Any]] = {}
    for transition in step.transitions:
        by_task.setdefault(transition.key, []).append(transition)
    for key, transitions in by_task.items():
        rec = engine.get(key)
        assert rec is not None
        store.put_task(rec, transitions)


@dataclass
class Duo:
    r_store: TaskStore
    e_store: TaskStore
    now: float = T0
    r: Engine = field(init=False)
    e: Engine = field(init=False)
    #: Every message POSTed, in order (requests and callbacks).
    sent: list[Message] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.r = Engine(agent_id=R_ID, endpoint=R_URL)
        self.e = Engine(agent_id=E_ID, endpoint=E_URL)
        self.e.capabilities = lambda: ("echo", "slow")

    def tick(self, seconds: float = 1.0) -> float:
        self.now += seconds
        return self.now

    def deliver(self, sender: Engine, step: Step) -> None:
        """Save `step`, then POST its outgoing messages to the other engine, recursively."""
        store = self.r_store if sender is self.r else self.e_store
        save(store, sender, step)
        receiver = self.e if sender is self.r else self.r
        receiver_store = self.e_store if sender is self.r else self.r_store
        for out in step.outgoing:
            self.sent.append(out.message)
            got = receiver.receive(out.message, self.tick())
            save(receiver_store, receiver, got)
            assert got.reply is not None
            self.deliver(sender, sender.on_reply(out.message, got.reply, self.tick()))
            self.deliver(receiver, Step(outgoing=got.outgoing))

    def submit(self, task_type: str = "echo", task_id: str = "t-1") -> TaskKey:
        key, step = self.r.submit(
            Submit(E_ID, task_type, {"text": "hi"}, task_id=task_id), self.tick()
        )
        self.deliver(self.r, step)
        return key

    def progress(self, key: TaskKey, percent: float) -> None:
        self.deliver(self.e, self.e.handle(ReportStatus(key, progress=percent), self.tick()))

    def complete(self, key: TaskKey) -> None:
        result = TaskResult(output_type="text", output="hi")
        self.deliver(self.e, self.e.handle(Complete(key, result), self.tick()))

    def record(self, side: str, key: TaskKey) -> TaskRecord:
        rec = (self.r if side == "r" else self.e).get(key)
        assert rec is not None
        return rec


def outbox_item(seq: int, message_id: str | None = None, *, task: str | None = "t-1") -> OutboxItem:
    return OutboxItem(
        seq=seq,
        message_id=message_id or f"msg-{seq}",
        partner=R_ID,
        key=TaskKey(R_ID, task) if task is not None else None,
        body=f'{{"n":{seq}}}'.encode(),
        created_at=T0 + seq,
    )


def message_item(seq: int, message: Message, key: TaskKey | None) -> OutboxItem:
    return OutboxItem(seq, message.id, message.to.agent_id, key, encode_message(message), T0)


def dedup_entry(message_id: str, expires_at: float, *, status: int = 200) -> DedupEntry:
    reply = StoredReply.of(
        status,
        f'{{"reply_to":"{message_id}"}}'.encode(),
        {"Content-Type": "application/json", "X-Synapse-Signature": "sha256=" + "ab" * 32},
    )
    return DedupEntry((R_ID, message_id), b"\x01" * 32, expires_at, reply)


def free_port() -> int:
    """A port free on 127.0.0.1 right now (to start a peer on the same port again later)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
