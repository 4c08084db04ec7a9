"""`synapse demo`: every flow of specs/protocol.md, 'Flows' between two real peers in this process,
as a timeline.

Two peers, `alice` (the requester, R) and `bob` (the executor, E, running the demo handler of
specs/protocol.md, 'The demo handler'), listen on ephemeral loopback ports and exchange signed HTTP
messages exactly as
two separate `synapse serve` processes would. One exchange (a POST and its synchronous reply)
is in flight at a time, so that the timeline reads in wire order and prints the same lines on
every run. Nothing waits for a person: alice's answers are scripted.
"""

from __future__ import annotations

import asyncio
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

from synapse.demo.handler import DemoHandler
from synapse.demo.timeline import Timeline
from synapse.p2p.config import P2PConfig
from synapse.p2p.engine import TaskKey
from synapse.runtime.protocol import Outcome, TaskHandle
from synapse.transport.client import SenderMode
from synapse.transport.peer import HttpSender, Peer
from synapse.types import Message, TaskNeedHuman, TaskNeedInfo, TaskStatusUpdate

#: Fast retries and timeouts: everything is on loopback.
DEMO_CONFIG = P2PConfig(
    max_retries=2, retry_base_delay=0.05, retry_max_delay=0.5, request_timeout=5.0
)
SECRET = "demo-secret-shared-by-alice-and-bob"
REQUESTER, EXECUTOR = "alice", "bob"


class SerialSender:
    """Lets one exchange (POST + synchronous reply) be in flight at a time, across both peers."""

    def __init__(self, inner: HttpSender, lock: asyncio.Lock) -> None:
        self.inner = inner
        self.lock = lock

    async def send_callback(self, partner: str, message: Message, *, retry: bool = True) -> Message:
        async with self.lock:
            return await self.inner.send_callback(partner, message, retry=retry)


@dataclass(frozen=True, slots=True)
class Flow:
    title: str
    explain: str
    task_type: str
    payload: dict[str, Any]
    task_id: str


FLOWS: tuple[Flow, ...] = (
    Flow(
        "1. A task that just runs (specs/protocol.md, 'Normal task'): echo",
        "alice asks; bob confirms in the HTTP reply, reports that it is executing, then "
        "POSTs the result, which alice acknowledges with task_ack.",
        "echo",
        {"text": "hello, bob"},
        "demo-echo",
    ),
    Flow(
        "2. Progress updates (specs/protocol.md, 'Normal task'): slow",
        "Each step is a task_status_update with its progress; each callback is POSTed only "
        "after the previous one was acknowledged.",
        "slow",
        {"steps": 3, "delay": 0.05},
        "demo-slow",
    ),
    Flow(
        "3. Missing information (specs/protocol.md, 'Missing information'): "
        "text_generation without a style",
        "bob answers the request with task_need_info instead of a confirm: it lacks the "
        "style, and offers the three the demo handler knows, 古典 (classical, its "
        "suggestion), 现代 (modern) and 浪漫 (romantic). alice provides 现代 and bob "
        "executes, without any task_confirm.",
        "text_generation",
        {"prompt": "spring"},
        "demo-text",
    ),
    Flow(
        "4. A person decides (specs/protocol.md, 'Human decision'): portrait, approved",
        "bob stops at need_human; a person at alice takes the question up (alice's state "
        "becomes human_deciding, which bob never sees) and approves with a human_decision; "
        "bob resumes and completes.",
        "portrait",
        {"subject": "Ada Lovelace"},
        "demo-portrait",
    ),
    Flow(
        "5. Cancelling (specs/protocol.md, 'Cancellation'): slow, cancelled after its first step",
        "alice sends task_cancel; bob stops the task and acknowledges with task_ack "
        "(state cancelled). Nothing more is sent about it.",
        "slow",
        {"steps": 5, "delay": 0.5},
        "demo-cancel",
    ),
    Flow(
        "6. A failure: fail",
        "bob confirms, then the task fails: task_failed with execution_failed.",
        "fail",
        {},
        "demo-fail",
    ),
    Flow(
        "7. A rejection: a task type bob does not offer",
        "bob answers the request with task_reject (capability_lacking): the task never starts.",
        "translate",
        {"text": "hello"},
        "demo-reject",
    ),
)


async def _drive(flow: Flow, handle: TaskHandle) -> Outcome:
    """alice's side of one flow: the scripted answers of a person."""
    async for event in handle:
        message = event.message
        if isinstance(message, TaskNeedInfo):
            await handle.provide_info({"style": "现代"})  # modern: one of the offered styles
        elif isinstance(message, TaskNeedHuman):
            await handle.start_deciding()
            await handle.approve({"authorized": True}, notes="the subject's estate agreed")
        elif (
            flow.task_id == "demo-cancel"
            and isinstance(message, TaskStatusUpdate)
            and message.payload.progress is not None
        ):
            await handle.cancel("no longer needed")
    return await handle.result()


def describe_outcome(outcome: Outcome) -> str:
    if outcome.result is not None:
        return f"{outcome.state.value}: {outcome.result.output}"
    if outcome.error is not None:
        return f"{outcome.state.value}: {outcome.error.code}: {outcome.error.message}"
    if outcome.reject is not None:
        reason = outcome.reject.reason
        return f"{outcome.state.value}: {reason.code}: {reason.message}"
    if outcome.refusal is not None:
        return f"{outcome.state.value}: refused: {outcome.refusal.code}: {outcome.refusal.message}"
    return outcome.state.value


async def _settled(peers: list[Peer], lock: asyncio.Lock, key: TaskKey, timeout: float) -> None:
    """Wait until both sides hold the task final and nothing is left to deliver."""

    def done() -> bool:
        for peer in peers:
            rec = peer.protocol.view.get(key)
            if rec is not None and not rec.is_final:
                return False
            if peer.protocol.pending_deliveries:
                return False
        return not lock.locked()

    for _ in range(int(timeout / 0.01)):
        if done():
            return
        await asyncio.sleep(0.01)


async def run_demo(out: TextIO, *, signing: SenderMode = "header") -> int:
    lock = asyncio.Lock()
    alice = Peer(REQUESTER, config=DEMO_CONFIG, signing_mode=signing)
    bob = Peer(EXECUTOR, handler=DemoHandler(), config=DEMO_CONFIG, signing_mode=signing)
    await alice.start()
    try:
        await bob.start()
        alice.add_partner(EXECUTOR, bob.endpoint, [SECRET])
        bob.add_partner(REQUESTER, alice.endpoint, [SECRET])
        for peer in (alice, bob):
            sender = HttpSender(peer.client, peer.partners, signing)
            peer.protocol.set_callback_sender(SerialSender(sender, lock))
        timeline = Timeline(alice.protocol, bob.protocol)
        write = _writer(out)
        write(
            "Synapse demo: two peers in this process, talking signed HTTP over loopback.\n"
            f"  R = {REQUESTER}, the requester.  E = {EXECUTOR}, the executor "
            "running the demo handler of specs/protocol.md.\n"
            f"  Every message is signed with HMAC-SHA256 ({signing} mode) and checked.\n"
            "Each numbered line is one message: `R → E` a POST from alice to bob, `E → R` one\n"
            "from bob to alice, `↳ … (sync reply)` the HTTP response to the POST just above.\n"
            "Under each message about a task: the task's state at alice (R) and at bob (E),\n"
            "`before → after` where that message changed it. A callback is acknowledged by\n"
            "`task_ack` (with the acknowledging side's state) when it ends a task or answers\n"
            "a question, by a plain `ack` when it reports progress or asks one.\n"
        )
        write("0. What can bob do? (capability_query)\n")
        caps = await alice.capabilities(EXECUTOR)
        write(_indent(timeline.render({"R": REQUESTER, "E": EXECUTOR})))
        write(f"   bob offers: {', '.join(c.name for c in caps.capabilities)}\n")
        outcomes: list[tuple[Flow, Outcome]] = []
        for flow in FLOWS:
            timeline.clear()
            explain = textwrap.fill(flow.explain, 92, initial_indent="   ", subsequent_indent="   ")
            write(f"{flow.title}\n{explain}\n")
            handle = await alice.submit(
                EXECUTOR, flow.task_type, flow.payload, task_id=flow.task_id
            )
            outcome = await asyncio.wait_for(_drive(flow, handle), 10)
            await _settled([alice, bob], lock, handle.key, 5)
            write(_indent(timeline.render({"R": REQUESTER, "E": EXECUTOR})))
            write(f"   outcome at alice: {describe_outcome(outcome)}\n")
            outcomes.append((flow, outcome))
        write("Summary\n")
        for flow, outcome in outcomes:
            write(f"   {flow.task_id:<14} {flow.task_type:<16} {outcome.state.value}\n")
        write(WHAT_NEXT)
    finally:
        await bob.close(0.5)
        await alice.close(0.5)
    return 0


#: Where a newcomer goes from here.
WHAT_NEXT = """What next
   `(recoverable)` above marks a failure worth trying again (error.recoverable).
   Run the same peers as two processes: `synapse serve` for bob, `synapse send` for alice
   (`synapse serve --help` and `synapse send --help` end with examples).
   Write your own handler: docs/handlers.md. Every message and state: specs/protocol.md.
"""


def _indent(text: str) -> str:
    return "".join(f"   {line}\n" for line in text.splitlines())


def _writer(out: TextIO) -> Callable[[str], None]:
    first = [True]

    def write(text: str) -> None:
        # A blank line before each section's title, none before the first.
        if not first[0] and not text.startswith(" "):
            out.write("\n")
        first[0] = False
        out.write(text)
        out.flush()

    return write


__all__ = ["DEMO_CONFIG", "FLOWS", "run_demo"]
