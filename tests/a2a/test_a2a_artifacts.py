"""Several named artifacts per task (`synapse.a2a.emit_artifact`): streamed as artifact updates
(with `append` and `lastChunk`) on every binding, to Synapse's client and the official SDK's;
listed by `GetTask`, after a restart too; bounded per task; and, to a Synapse requester, the
same objects in its progress updates' `intermediate_result`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.types.a2a_pb2 import Message, Part, Role
from a2akit import GRPC_PRESENT, SDK_BINDINGS, collect, fast_config, open_sdk_client

from synapse import ExecutionContext, TaskResult, Validation
from synapse.a2a import A2AClient, emit_artifact, enable_a2a
from synapse.a2a.server import artifacts
from synapse.store import SqliteStore
from synapse.transport.partners import Partner
from synapse.transport.peer import Peer

SECRET = "artifacts-secret-0123456789abcdef"


class ReportHandler:
    """`report` emits an outline, then a table in two chunks, then completes; `huge` emits
    past the per-task bound and answers with what it was told."""

    def get_capabilities(self) -> list[str]:
        return ["report", "huge"]

    def validate_task(self, task_type: str, payload: dict[str, Any]) -> Validation:
        return Validation()

    async def execute_task(
        self, ctx: ExecutionContext, task_type: str, payload: dict[str, Any]
    ) -> TaskResult:
        if task_type == "huge":
            try:
                await emit_artifact(ctx, name="blob", text="x" * (artifacts.MAX_ARTIFACT_BYTES + 1))
            except ValueError as exc:
                return TaskResult(output_type="text", output=str(exc))
            return TaskResult(output_type="text", output="emitted")
        await emit_artifact(ctx, name="outline", text="intro", description="what comes")
        table = await emit_artifact(
            ctx, name="table", data={"rows": [1]}, last_chunk=False, message="first rows"
        )
        await emit_artifact(ctx, artifact_id=table, data={"rows": [2]}, append=True)
        return TaskResult(output_type="text", output="done")


def served_peer(path: Path, **a2a: Any) -> Peer:
    peer = Peer(
        "agent-art",
        handler=ReportHandler(),
        config=fast_config(),
        store=SqliteStore(path),
        partners=[Partner("agent-r", "http://127.0.0.1:9/synapse/callback", (SECRET,))],
    )
    enable_a2a(peer, default_task_type="report", **a2a)
    return peer


@pytest.fixture
async def base(tmp_path: Path) -> AsyncIterator[str]:
    async with served_peer(tmp_path / "store.db", grpc_port=0 if GRPC_PRESENT else None) as peer:
        yield f"http://127.0.0.1:{peer.port}"


def listed(task: Any) -> list[tuple[str, int]]:
    """(name, number of parts) of each artifact of a `wire.Task`."""
    return [(a.name, len(a.parts)) for a in task.artifacts]


@pytest.mark.parametrize("binding", SDK_BINDINGS)
async def test_artifacts_stream_in_chunks_and_are_listed(base: str, binding: str) -> None:
    async with A2AClient(base, bindings=[binding]) as client:
        handle = await client.send({"topic": "q3"}, task_type="report", stream=True)
        updates = []
        async for event in handle:
            if event.kind == "artifact_update" and event.raw is not None:
                update = event.raw.artifact_update
                assert update is not None
                updates.append((update.artifact.name, update.append, update.last_chunk))
        outcome = await handle
        assert outcome.ok and outcome.task is not None
        task = await client.get_task(outcome.task.id)
    assert updates[:3] == [("outline", False, True), ("table", False, False), ("", True, True)]
    assert listed(task) == [("outline", 1), ("table", 2), ("report", 1)]
    (table,) = [a for a in task.artifacts if a.name == "table"]
    assert [p.data for p in table.parts] == [{"rows": [1]}, {"rows": [2]}]


async def test_artifacts_are_listed_after_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    async with served_peer(path) as peer, A2AClient(f"http://127.0.0.1:{peer.port}") as client:
        outcome = await (await client.send({}, task_type="report"))
        assert outcome.task is not None
    async with served_peer(path) as peer, A2AClient(f"http://127.0.0.1:{peer.port}") as client:
        task = await client.get_task(outcome.task.id)
        listing = await client.list_tasks(include_artifacts=True)
    assert listed(task) == [("outline", 1), ("table", 2), ("report", 1)]
    assert [listed(t) for t in listing.tasks] == [listed(task)]


async def test_a_task_emits_at_most_max_artifact_bytes(base: str) -> None:
    async with A2AClient(base) as client:
        outcome = await (await client.send({}, task_type="huge"))
    assert outcome.ok and outcome.result is not None
    assert f"would pass {artifacts.MAX_ARTIFACT_BYTES:,} bytes" in str(outcome.result.output)


@pytest.mark.parametrize("binding", SDK_BINDINGS)
async def test_the_official_sdk_streams_every_artifact(base: str, binding: str) -> None:
    async with httpx.AsyncClient(timeout=10) as http:
        client = await open_sdk_client(base, binding, http)
        try:
            message = Message(
                message_id=f"sdk-art-{binding}", role=Role.ROLE_USER, parts=[Part(text="go")]
            )
            events = await collect(client, message)
        finally:
            await client.close()
    updates = [e["artifactUpdate"] for e in events if "artifactUpdate" in e]
    names = [
        (u["artifact"].get("name", ""), u.get("append", False), u.get("lastChunk", False))
        for u in updates
    ]
    assert names[:3] == [("outline", False, True), ("table", False, False), ("", True, True)]


async def test_a_synapse_requester_gets_the_artifacts_in_its_progress_updates(
    tmp_path: Path,
) -> None:
    requester = Peer("agent-r", config=fast_config())
    async with requester, served_peer(tmp_path / "store.db") as executor:
        executor.add_partner("agent-r", requester.endpoint, (SECRET,))
        requester.add_partner("agent-art", executor.endpoint, (SECRET,))
        handle = await requester.submit("agent-art", "report", {})
        carried = []
        async with asyncio.timeout(10):
            async for event in handle:
                if event.kind == "p2p:task_status_update":
                    result = event.message.payload.intermediate_result
                    if isinstance(result, dict) and artifacts.ARTIFACT_KEY in result:
                        chunk = result[artifacts.ARTIFACT_KEY]
                        carried.append(
                            (chunk["artifact"].get("name", ""), chunk.get("append", False))
                        )
        outcome = await handle
    assert outcome.ok
    assert carried == [("outline", False), ("table", False), ("", True)]
