"""Richer parts: a handler receives a message's file parts (inline bytes and URLs) in its
payload and can return files as artifacts; its partial output (`intermediate_result`) is
streamed as chunks of the output artifact (`append` / `lastChunk`), which the result
replaces at the end. Over JSON-RPC and REST raw, and through our client on each binding."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx
import pytest
from a2akit import GRPC_PRESENT, SDK_BINDINGS, fast_config

from synapse.a2a import A2AClient, enable_a2a, wire
from synapse.p2p.engine import Validation
from synapse.runtime.handler import ExecutionContext
from synapse.transport.peer import Peer
from synapse.types import Capability, TaskResult

V1 = {"A2A-Version": "1.0"}
WAIT = 10.0
PNG = b"\x89PNG\r\n\x1a\n-not-really-an-image"


class FilesHandler:
    """`files`: answers with the files it got, and one of its own; `chunks`: streams its
    output in pieces (`intermediate_result`), then completes with all of it."""

    def __init__(self) -> None:
        self.payloads: list[dict[str, Any]] = []
        self.chunks_sent = 0
        self.release = asyncio.Event()

    def get_capabilities(self) -> Sequence[Capability]:
        return [Capability(name="files"), Capability(name="chunks")]

    def validate_task(self, task_type: str, payload: dict[str, Any]) -> Validation:
        return Validation()

    async def execute_task(
        self, ctx: ExecutionContext, task_type: str, payload: dict[str, Any]
    ) -> Any:
        self.payloads.append(payload)
        if task_type == "files":
            received = payload.get("files", [])
            mine = {"raw": PNG, "filename": "made.png", "media_type": "image/png"}
            return TaskResult(output_type="files", output=[*received, mine])
        pieces = ["alpha ", "beta ", "gamma"]
        for i, piece in enumerate(pieces):
            await ctx.progress(100 * (i + 1) // len(pieces), intermediate_result=piece)
            self.chunks_sent += 1
        await self.release.wait()  # the test reads the chunks first, then lets it finish
        return "".join(pieces)


@pytest.fixture
async def files_peer() -> AsyncIterator[tuple[str, FilesHandler]]:
    handler = FilesHandler()
    peer = Peer("agent-f", handler=handler, config=fast_config())
    enable_a2a(peer, default_task_type="files", grpc_port=0 if GRPC_PRESENT else None)
    await peer.start()
    try:
        yield f"http://127.0.0.1:{peer.port}", handler
    finally:
        handler.release.set()
        await peer.close(drain_timeout=0.5)


def file_message(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"message": {"messageId": "m-f", "role": "ROLE_USER", "parts": list(parts)}}


async def test_file_parts_in_and_file_artifacts_out(files_peer: tuple[str, FilesHandler]) -> None:
    base, handler = files_peer
    raw = base64.b64encode(b"hello bytes").decode()
    body = file_message(
        {"text": "two files"},
        {"url": "https://files.example/a.pdf", "filename": "a.pdf", "mediaType": "application/pdf"},
        {"raw": raw, "filename": "b.txt", "mediaType": "text/plain"},
    )
    async with httpx.AsyncClient(timeout=WAIT) as http:
        response = await http.post(f"{base}/a2a/message:send", json=body, headers=V1)
    task = response.json()["task"]
    assert task["status"]["state"] == wire.COMPLETED
    assert handler.payloads[-1] == {
        "text": "two files",
        "files": [
            {
                "url": "https://files.example/a.pdf",
                "filename": "a.pdf",
                "media_type": "application/pdf",
            },
            {"raw": raw, "filename": "b.txt", "media_type": "text/plain"},
        ],
    }
    (artifact,) = task["artifacts"]
    assert artifact["metadata"]["outputType"] == "files"
    assert artifact["parts"] == [
        {"url": "https://files.example/a.pdf", "filename": "a.pdf", "mediaType": "application/pdf"},
        {"raw": raw, "filename": "b.txt", "mediaType": "text/plain"},
        {"raw": base64.b64encode(PNG).decode(), "filename": "made.png", "mediaType": "image/png"},
    ]


async def test_a_message_of_files_only_is_a_payload_and_bad_bytes_are_refused(
    files_peer: tuple[str, FilesHandler],
) -> None:
    base, handler = files_peer
    async with httpx.AsyncClient(timeout=WAIT) as http:
        only = await http.post(
            f"{base}/a2a/message:send", json=file_message({"url": "https://x/f"}), headers=V1
        )
        assert only.json()["task"]["status"]["state"] == wire.COMPLETED
        assert handler.payloads[-1] == {"files": [{"url": "https://x/f"}]}
        bad = await http.post(
            f"{base}/a2a/message:send", json=file_message({"raw": "not base64!"}), headers=V1
        )
        assert bad.status_code == 400
        assert bad.json()["error"]["details"][0]["reason"] == "INVALID_PARAMS"
        clash = await http.post(
            f"{base}/a2a/message:send",
            json=file_message({"data": {"files": 1}}, {"url": "https://x/f"}),
            headers=V1,
        )
        assert clash.status_code == 400
        nothing = await http.post(f"{base}/a2a/message:send", json=file_message({}), headers=V1)
        assert nothing.status_code == 415
        assert nothing.json()["error"]["details"][0]["reason"] == "CONTENT_TYPE_NOT_SUPPORTED"


async def test_intermediate_results_stream_as_artifact_chunks(
    files_peer: tuple[str, FilesHandler],
) -> None:
    base, handler = files_peer
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "SendStreamingMessage",
        "params": {
            "message": {
                "messageId": "m-c",
                "role": "ROLE_USER",
                "parts": [{"text": "go"}],
                "metadata": {"taskType": "chunks"},
            }
        },
    }
    updates: list[dict[str, Any]] = []
    async with (
        httpx.AsyncClient(timeout=WAIT) as http,
        http.stream("POST", f"{base}/a2a", json=body, headers=V1) as response,
    ):
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])["result"]
            if "artifactUpdate" in event:
                updates.append(event["artifactUpdate"])
                if len(updates) == 3:
                    handler.release.set()
    chunks, final = updates[:3], updates[3:]
    assert [c["artifact"]["parts"] for c in chunks] == [
        [{"text": "alpha "}],
        [{"text": "beta "}],
        [{"text": "gamma"}],
    ]
    assert [c.get("append", False) for c in chunks] == [False, True, True]
    assert [c.get("lastChunk", False) for c in chunks] == [False, False, False]
    ids = {u["artifact"]["artifactId"] for u in updates}
    assert len(ids) == 1  # one output artifact: its chunks, then the result replacing them
    (result,) = final
    assert result.get("append", False) is False and result["lastChunk"] is True
    assert result["artifact"]["parts"] == [{"text": "alpha beta gamma"}]


@pytest.mark.parametrize("binding", SDK_BINDINGS)
async def test_our_client_gets_files_and_chunks_over_each_binding(
    files_peer: tuple[str, FilesHandler], binding: str
) -> None:
    base, handler = files_peer
    async with A2AClient(base, bindings=[binding]) as client:
        message = wire.Message(
            message_id="m-o",
            role=wire.ROLE_USER,
            parts=[wire.Part(url="https://x/in.pdf", filename="in.pdf")],
            metadata={"taskType": "files"},
        )
        outcome = await (await client.send(message=message)).result(WAIT)
        assert outcome.result is not None
        assert outcome.result.output_type == "files"
        assert outcome.result.output[0] == {"url": "https://x/in.pdf", "filename": "in.pdf"}
        assert base64.b64decode(outcome.result.output[1]["raw"]) == PNG

        handler.release = asyncio.Event()
        handle = await client.send("go", task_type="chunks")
        pieces: list[str] = []
        async with asyncio.timeout(WAIT):
            async for event in handle:
                if event.kind == "artifact_update" and len(pieces) < 3:
                    pieces.append(event.text)
                    if len(pieces) == 3:
                        handler.release.set()
        assert pieces == ["alpha ", "beta ", "gamma"]
        done = await handle.result(WAIT)
        assert done.text == "alpha beta gamma"  # the result replaced the chunks
        assert len(done.task.artifacts if done.task else []) == 1
