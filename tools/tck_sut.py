"""A system under test for the official A2A TCK: a Synapse peer serving A2A on all three
bindings with a `TaskHandler` that does what the TCK's scenarios ask (its `scenarios/*.feature`:
the prefix of the A2A `messageId` says what the agent does).

Run by hand (the TCK is not a dependency of this repository):

    python tools/tck_sut.py --port 9999 --grpc-port 10000 &
    cd a2a-tck && ./run_tck.py --sut-host http://127.0.0.1:9999

What the scenarios ask that a Synapse handler cannot do yet is said where it is handled.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
from collections.abc import Mapping
from typing import Any

from synapse import ExecutionContext, Peer, TaskFailure, TaskResult, Validation
from synapse.a2a import (
    CallerIdentity,
    DirectRequest,
    Extension,
    answer_messages,
    enable_a2a,
    wire,
)
from synapse.p2p.config import P2PConfig
from synapse.types import ErrorCode, TaskError

TEXT_FILE = {
    "raw": base64.b64encode(b"tck").decode(),
    "filename": "output.txt",
    "media_type": "text/plain",
}
URL_FILE = {
    "url": "https://example.com/output.txt",
    "filename": "output.txt",
    "media_type": "text/plain",
}


def a2a_message_id(ctx: ExecutionContext) -> str:
    """The `messageId` of the A2A message that started the task (the bridge keeps the first
    message in the task's context)."""
    context = ctx.context
    if context is None:
        return ""
    first: Mapping[str, Any] = (context.metadata.get("a2a") or {}).get("message") or {}
    return str(first.get("messageId", ""))


class TckHandler:
    """The TCK's scenarios, by message id prefix (longest prefixes first)."""

    def get_capabilities(self) -> list[str]:
        return ["echo"]

    def validate_task(self, task_type: str, payload: dict[str, Any]) -> Validation:
        # The scenario "tck-reject-task" would be refused here, but validation sees the
        # payload only, not the A2A message id: it fails at execution instead.
        return Validation()

    def immediate_task_types(self) -> list[str]:
        return ["echo"]

    async def answer_message(
        self, task_type: str, payload: dict[str, Any], request: DirectRequest
    ) -> str | None:
        """ "tck-message-response" asks for a Message instead of a task; the rest are tasks."""
        if request.message_id.startswith("tck-message-response"):
            return "Direct message response"
        return None

    async def execute_task(
        self, ctx: ExecutionContext, task_type: str, payload: dict[str, Any]
    ) -> Any:
        message_id = a2a_message_id(ctx)
        if message_id.startswith("tck-input-required"):
            # Input is asked for again while the follow-ups say so ("tck-input-required"):
            # CORE-HIST-005/006 send two such messages, then "tck-complete-task".
            while True:
                await ctx.need_info(["answer"], question="TCK input required")
                answers = answer_messages(ctx)
                if not (answers and answers[-1].message_id.startswith("tck-input-required")):
                    return TaskResult(output_type="text", output="Hello from TCK")
        if message_id.startswith("tck-stream-artifact-chunked"):
            await ctx.progress(message="working", intermediate_result="chunk-1 ")
            return TaskResult(output_type="text", output="chunk-1 chunk-2")
        if message_id.startswith("test-resubscribe-message-id"):
            await ctx.progress(message="working")
            await asyncio.sleep(4)
            return TaskResult(output_type="text", output="done")
        for prefix, text in (
            ("tck-stream-artifact-text", "Streamed text content"),
            ("tck-stream-ordering-001", "Ordered output"),
            ("tck-stream-001", "Stream hello from TCK"),
            ("tck-stream-003", "Stream task lifecycle"),
        ):
            if message_id.startswith(prefix):
                await ctx.progress(message="working")
                return TaskResult(output_type="text", output=text)
        if message_id.startswith("tck-stream-artifact-file"):
            await ctx.progress(message="working")
            return TaskResult(output_type="file", output=TEXT_FILE)
        if message_id.startswith("tck-stream-002"):
            return TaskResult(output_type="text", output="")
        if message_id.startswith("tck-artifact-file-url"):
            return TaskResult(output_type="file", output=URL_FILE)
        if message_id.startswith("tck-artifact-file"):
            return TaskResult(output_type="file", output=TEXT_FILE)
        if message_id.startswith("tck-artifact-data"):
            return TaskResult(output_type="json", output={"key": "value", "count": 42})
        if message_id.startswith("tck-artifact-text"):
            return TaskResult(output_type="text", output="Generated text content")
        if message_id.startswith("tck-reject-task"):
            raise TaskFailure(TaskError(code=ErrorCode.EXECUTION_FAILED, message="rejected"))
        # "tck-complete-task" and anything else complete.
        if message_id.startswith("tck-complete-task"):
            return TaskResult(output_type="text", output="Hello from TCK")
        return TaskResult(output_type="text", output=f"Unhandled messageId prefix: {message_id}")


def members_card(card: wire.AgentCard, caller: CallerIdentity) -> wire.AgentCard:
    """The extended card of `--extended-card`: one skill more than the public card."""
    card.skills.append(wire.AgentSkill(id="members", name="Members", description="More"))
    return card


#: The extension CORE-CAP-004 looks for, declared required by `--required-extension`.
TCK_REQUIRED_EXTENSION = "urn:a2a:tck:required-extension"


async def main(port: int, grpc_port: int, extended_card: bool, required_extension: bool) -> None:
    peer = Peer("tck-sut", handler=TckHandler(), port=port, config=P2PConfig())
    enable_a2a(
        peer,
        default_task_type="echo",
        # The TCK's webhook receiver listens on this machine, on a port of its choosing; its
        # CRUD tests name example.com.
        push_allowlist=["http://127.0.0.1:*", "http://localhost:*", "https://example.com/"],
        bindings=["JSONRPC", "HTTP+JSON", "GRPC"],
        grpc_port=grpc_port,
        name="Synapse TCK SUT",
        # CARD-EXT-001 wants an extended card served, CARD-EXT-002 the error of one not
        # configured: no agent passes both; this flag chooses which one runs against a card.
        extended_card=members_card if extended_card else None,
        # CORE-CAP-004 runs against a card declaring the TCK's extension required; every
        # other test sends no A2A-Extensions, and is then refused as it must be: a run of
        # its own (`-k TestCapabilityExtensionRequired`).
        extensions=[Extension(TCK_REQUIRED_EXTENSION, "Required by the TCK's test", required=True)]
        if required_extension
        else (),
    )
    await peer.start()
    print(f"listening on http://127.0.0.1:{port} (gRPC on {grpc_port})", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await peer.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=9999)
    parser.add_argument("--grpc-port", type=int, default=10000)
    parser.add_argument(
        "--extended-card", action="store_true", help="serve an extended card (CARD-EXT tests)"
    )
    parser.add_argument(
        "--required-extension",
        action="store_true",
        help=f"declare {TCK_REQUIRED_EXTENSION} required (CORE-CAP-004, in a run of its own)",
    )
    args = parser.parse_args()
    asyncio.run(main(args.port, args.grpc_port, args.extended_card, args.required_extension))
