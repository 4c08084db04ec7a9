"""Related tasks (`synapse.a2a.related_tasks`): a handler reads the tasks its message
references (`referenceTaskIds`) and the other tasks of its context, as its caller may see them
(another principal's tasks are missing to it), through the store after a restart too."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
from a2akit import fast_config

from synapse import ExecutionContext, TaskResult, Validation
from synapse.a2a import enable_a2a, related_tasks, wire
from synapse.store import SqliteStore
from synapse.transport.peer import Peer

V1 = {"A2A-Version": "1.0"}
TOKENS = {"tok-alice": "alice", "tok-bob": "bob"}


class RelatingHandler:
    """`note` completes with its text; `relate` answers with what `related_tasks` says."""

    def get_capabilities(self) -> list[str]:
        return ["note", "relate"]

    def validate_task(self, task_type: str, payload: dict[str, Any]) -> Validation:
        return Validation()

    async def execute_task(
        self, ctx: ExecutionContext, task_type: str, payload: dict[str, Any]
    ) -> TaskResult:
        if task_type == "note":
            return TaskResult(output_type="text", output=str(payload.get("text", "")))
        related = related_tasks(ctx)

        def summary(task: wire.Task) -> list[Any]:
            texts = [p.text for a in task.artifacts for p in a.parts if p.text]
            return [task.id, task.context_id, task.status.state, texts]

        return TaskResult(
            output_type="json",
            output={
                "referenced": [summary(t) for t in related.referenced],
                "missing": related.missing,
                "context": [summary(t) for t in related.context],
            },
        )


@asynccontextmanager
async def serving(path: Path) -> AsyncIterator[str]:
    peer = Peer(
        "agent-rel", handler=RelatingHandler(), config=fast_config(), store=SqliteStore(path)
    )
    enable_a2a(peer, default_task_type="note", tokens=TOKENS)
    async with peer:
        yield f"http://127.0.0.1:{peer.port}"


async def send(base: str, token: str, message: dict[str, Any]) -> dict[str, Any]:
    request = {"jsonrpc": "2.0", "id": "1", "method": "SendMessage", "params": {"message": message}}
    headers = {**V1, "Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(timeout=10) as http:
        answer: dict[str, Any] = (
            await http.post(f"{base}/a2a", json=request, headers=headers)
        ).json()
    assert "result" in answer, answer
    task: dict[str, Any] = answer["result"]["task"]
    return task


def note(text: str, message_id: str, context_id: str) -> dict[str, Any]:
    return {
        "messageId": message_id,
        "role": "ROLE_USER",
        "contextId": context_id,
        "parts": [{"data": {"text": text}}],
    }


def relate(message_id: str, context_id: str, references: list[str]) -> dict[str, Any]:
    return {
        "messageId": message_id,
        "role": "ROLE_USER",
        "contextId": context_id,
        "referenceTaskIds": references,
        "parts": [{"data": {}}],
        "metadata": {"taskType": "relate"},
    }


async def test_a_handler_reads_its_referenced_and_context_tasks_as_its_caller_may(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store.db"
    async with serving(path) as base:
        first = await send(base, "tok-alice", note("draft one", "m1", "ctx-a"))
        elsewhere = await send(base, "tok-alice", note("other work", "m2", "ctx-b"))
        bobs = await send(base, "tok-bob", note("bob's", "m3", "ctx-a"))
        assert first["status"]["state"] == "TASK_STATE_COMPLETED"
    # After a restart: finished tasks are read from the store, not from memory.
    async with serving(path) as base:
        asked = [first["id"], elsewhere["id"], bobs["id"], "no-such-task"]
        task = await send(base, "tok-alice", relate("m4", "ctx-a", asked))
    output = task["artifacts"][0]["parts"][0]["data"]
    completed = "TASK_STATE_COMPLETED"
    assert output["referenced"] == [
        [first["id"], "ctx-a", completed, ["draft one"]],
        [elsewhere["id"], "ctx-b", completed, ["other work"]],
    ]
    # Bob's task is bob's: to alice it is as missing as one that does not exist.
    assert output["missing"] == [bobs["id"], "no-such-task"]
    # The context's other tasks: alice's in ctx-a, not this one, not bob's.
    assert output["context"] == [[first["id"], "ctx-a", completed, ["draft one"]]]


async def test_a_task_without_references_or_context_peers_relates_to_nothing(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path / "store.db") as base:
        task = await send(base, "tok-alice", relate("m1", "ctx-new", []))
    assert task["artifacts"][0]["parts"][0]["data"] == {
        "referenced": [],
        "missing": [],
        "context": [],
    }
