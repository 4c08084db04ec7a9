"""A2A extensions end to end: declared on the card, activated per call by `A2A-Extensions`
(said back in the answer), refused when a required one is left out, kept with the task for
its handler, and written on what the task emits; on every binding, with Synapse's client and
the official SDK's, using the A2A samples' timestamp extension."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client import ClientCallContext
from a2a.types.a2a_pb2 import Message, Part, Role, SendMessageRequest
from a2akit import GRPC_PRESENT, SDK_BINDINGS, fast_config, open_sdk_client
from google.protobuf.json_format import MessageToDict

from synapse import ExecutionContext, TaskResult, Validation
from synapse.a2a import A2AClient, Extension, active_extensions, enable_a2a, timestamp_extension
from synapse.a2a.errors import A2AError
from synapse.a2a.server.extensions import TIMESTAMP_FIELD, TIMESTAMP_URI
from synapse.store import SqliteStore
from synapse.transport.peer import Peer

TRACE = "https://example.com/a2a/ext/trace/v1"
POLICY = "https://example.com/a2a/ext/policy/v1"
NOW = 1_780_000_000.0  # 2026-05-28T20:26:40Z, the stamp's fixed clock


class ExtensionAwareHandler:
    """`work` reports progress, then answers with what its call activated and the trace id
    its first message carried; the trace extension's data goes on its result."""

    def get_capabilities(self) -> list[str]:
        return ["work"]

    def validate_task(self, task_type: str, payload: dict[str, Any]) -> Validation:
        return Validation()

    async def execute_task(
        self, ctx: ExecutionContext, task_type: str, payload: dict[str, Any]
    ) -> TaskResult:
        await ctx.progress(50, "halfway")
        active = active_extensions(ctx)
        first = (ctx.context.metadata.get("a2a") or {}).get("message") if ctx.context else None
        trace = ((first or {}).get("metadata") or {}).get(TRACE)
        return TaskResult(
            output_type="json",
            output={"active": active, "trace": trace},
            metadata={TRACE: {"span": "s-1"}} if TRACE in active else None,
        )


@dataclass
class Served:
    base: str
    port: int


def extensions(*, required: bool = False) -> list[Extension]:
    return [
        timestamp_extension(now=lambda: NOW),
        Extension(TRACE, "Carries a trace id", params={"format": "w3c"}),
        *([Extension(POLICY, "Clients must accept our policy", required=True)] if required else []),
    ]


def requiring_peer(agent_id: str) -> Peer:
    """A peer whose card also declares an extension every call must ask for (POLICY)."""
    peer = Peer(agent_id, handler=ExtensionAwareHandler(), config=fast_config())
    enable_a2a(
        peer,
        default_task_type="work",
        extensions=extensions(required=True),
        grpc_port=0 if GRPC_PRESENT else None,
    )
    return peer


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    peer = Peer(
        "agent-x",
        handler=ExtensionAwareHandler(),
        config=fast_config(),
        store=SqliteStore(tmp_path / "store.db"),
    )
    enable_a2a(
        peer,
        default_task_type="work",
        extensions=extensions(),
        grpc_port=0 if GRPC_PRESENT else None,
    )
    async with peer:
        yield Served(f"http://127.0.0.1:{peer.port}", peer.port)


async def test_the_card_declares_each_extension() -> None:
    peer = Peer("agent-c", handler=ExtensionAwareHandler(), config=fast_config())
    enable_a2a(peer, default_task_type="work", extensions=extensions(required=True))
    async with peer, A2AClient(f"http://127.0.0.1:{peer.port}") as client:
        card = await client.discover()
    declared = {e.uri: e for e in card.capabilities.extensions}
    assert declared[TIMESTAMP_URI].description == "Adds timestamps to messages and artifacts."
    assert declared[TRACE].params == {"format": "w3c"} and not declared[TRACE].required
    assert declared[POLICY].required
    assert "https://synapse-p2p.dev/a2a/ext/task-types/v1" in declared  # ours stays


@pytest.mark.parametrize("binding", SDK_BINDINGS)
async def test_a_call_activates_what_it_asks_for_and_the_task_carries_it(
    served: Served, binding: str
) -> None:
    asked = [TIMESTAMP_URI, TRACE, "https://example.com/not-supported/v1"]
    async with A2AClient(served.base, bindings=[binding], extensions=asked) as client:
        message_meta = {TRACE: "trace-42"}
        from synapse.a2a.client.values import user_message

        message = user_message({"n": 1}, "work")
        message.metadata = {**(message.metadata or {}), **message_meta}
        message.extensions = [TRACE]
        outcome = await (await client.send(message=message))
        assert client.transport is not None
        # What the agent activated: what we asked for that it supports, in our order.
        assert client.transport.activated_extensions == (TIMESTAMP_URI, TRACE)
    assert outcome.ok, outcome
    task = outcome.task
    assert task is not None
    (artifact,) = task.artifacts
    output = artifact.parts[0].data
    assert output == {"active": [TIMESTAMP_URI, TRACE], "trace": "trace-42"}
    meta = artifact.metadata or {}
    # The timestamp extension's stamp, and the handler's data for the trace extension.
    assert datetime.fromisoformat(meta[TIMESTAMP_FIELD]).timestamp() == NOW
    assert meta[TRACE] == {"span": "s-1"}
    assert set(artifact.extensions) == {TIMESTAMP_URI, TRACE}


async def test_without_asking_nothing_is_activated_or_stamped(served: Served) -> None:
    async with A2AClient(served.base) as client:
        outcome = await (await client.send({"n": 1}, task_type="work"))
        assert client.transport is not None and client.transport.activated_extensions == ()
    assert outcome.task is not None
    (artifact,) = outcome.task.artifacts
    assert artifact.parts[0].data == {"active": [], "trace": None}
    assert TIMESTAMP_FIELD not in (artifact.metadata or {}) and artifact.extensions == []


async def test_the_answers_header_names_the_activated_extensions(served: Served) -> None:
    request = {
        "jsonrpc": "2.0",
        "id": "1",
        "method": "GetTask",
        "params": {"id": "no-such-task"},
    }
    headers = {"A2A-Version": "1.0", "A2A-Extensions": f"{TRACE}, https://x.example/v1"}
    async with httpx.AsyncClient(timeout=10) as http:
        # Repeated headers are one list.
        answer = await http.post(
            f"{served.base}/a2a",
            json=request,
            headers=[*headers.items(), ("A2A-Extensions", TIMESTAMP_URI)],
        )
        plain = await http.post(f"{served.base}/a2a", json=request, headers={"A2A-Version": "1.0"})
    assert answer.headers["A2A-Extensions"] == f"{TRACE}, {TIMESTAMP_URI}"
    assert "A2A-Extensions" not in plain.headers  # a kept-alive connection forgets them


@pytest.mark.parametrize("binding", SDK_BINDINGS)
async def test_a_required_extension_left_out_is_refused(binding: str) -> None:
    peer = requiring_peer("agent-r")
    async with peer:
        base = f"http://127.0.0.1:{peer.port}"
        async with A2AClient(base, bindings=[binding]) as client:
            with pytest.raises(A2AError) as refused:
                await client.send({"n": 1}, task_type="work")
            assert refused.value.code == -32008
            assert POLICY in refused.value.message
        async with A2AClient(base, bindings=[binding], extensions=[POLICY]) as client:
            outcome = await (await client.send({"n": 1}, task_type="work"))
            assert outcome.ok
            assert client.transport is not None
            assert client.transport.activated_extensions == (POLICY,)


async def test_a_tasks_extensions_survive_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "store.db"

    def make() -> Peer:
        peer = Peer(
            "agent-s",
            handler=ExtensionAwareHandler(),
            config=fast_config(),
            store=SqliteStore(path),
        )
        enable_a2a(peer, default_task_type="work", extensions=extensions())
        return peer

    async with (
        make() as peer,
        A2AClient(f"http://127.0.0.1:{peer.port}", extensions=[TRACE]) as client,
    ):
        outcome = await (await client.send({"n": 1}, task_type="work"))
    assert outcome.task is not None
    async with make() as peer, A2AClient(f"http://127.0.0.1:{peer.port}") as client:
        again = await client.get_task(outcome.task.id)
    (artifact,) = again.artifacts
    assert (artifact.metadata or {})[TRACE] == {"span": "s-1"}  # rebuilt from the stored result
    assert artifact.extensions == [TRACE]


@pytest.mark.parametrize("binding", SDK_BINDINGS)
async def test_the_official_sdk_gets_the_samples_timestamp_extension(
    served: Served, binding: str
) -> None:
    async with httpx.AsyncClient(timeout=10) as http:
        client = await open_sdk_client(served.base, binding, http, streaming=False)
        try:
            message = Message(
                message_id="sdk-ts-1", role=Role.ROLE_USER, parts=[Part(text="hello")]
            )
            context = ClientCallContext(service_parameters={"A2A-Extensions": TIMESTAMP_URI})
            events = [
                MessageToDict(e)
                async for e in client.send_message(
                    SendMessageRequest(message=message), context=context
                )
            ]
        finally:
            await client.close()
    task = next(e["task"] for e in events if "task" in e)
    (artifact,) = task["artifacts"]
    stamp = artifact["metadata"][TIMESTAMP_FIELD]
    assert datetime.fromisoformat(stamp).timestamp() == NOW
    assert TIMESTAMP_URI in artifact.get("extensions", [])
    assert artifact["parts"][0]["data"]["active"] == [TIMESTAMP_URI]
