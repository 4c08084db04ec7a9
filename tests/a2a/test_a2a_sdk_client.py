"""The official A2A SDK's client against a Synapse peer speaking A2A (the demo handler).

It discovers the card, then sends, streams, gets, lists and cancels tasks of every demo task
type; need_info and need_human go through INPUT_REQUIRED and are answered by a follow-up
message on the same task.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from a2a.client import A2ACardResolver
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    SubscribeToTaskRequest,
    TaskState,
)
from a2a.utils.errors import (
    InvalidParamsError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from a2akit import (
    GRPC_PRESENT,
    A2APeer,
    SdkClientFactory,
    as_dict,
    collect,
    sdk_message,
    state_of,
    task_id_of,
    texts,
)
from google.protobuf.json_format import MessageToDict

from synapse.demo.handler import CAPABILITIES

WORKING = "TASK_STATE_WORKING"
COMPLETED = "TASK_STATE_COMPLETED"
INPUT_REQUIRED = "TASK_STATE_INPUT_REQUIRED"


def states(events: list[dict[str, Any]]) -> list[str]:
    return [s for e in events if (s := state_of(e)) is not None]


def artifact_texts(events: list[dict[str, Any]]) -> list[str]:
    found: list[str] = []
    for event in events:
        if "artifactUpdate" in event:
            found += texts(event["artifactUpdate"]["artifact"])
        if "task" in event:
            found += texts(event["task"].get("artifacts", []))
    return found


# --- discovery ----------------------------------------------------------------------------------


async def test_the_sdk_discovers_the_card_generated_from_the_handler(a2a_peer: A2APeer) -> None:
    async with httpx.AsyncClient() as http:
        card = await A2ACardResolver(http, a2a_peer.base_url).get_agent_card()
    assert card.name == "agent-a"
    assert [s.id for s in card.skills] == [c.name for c in CAPABILITIES]
    # Every binding served, in the default order of preference.
    interfaces = [(i.protocol_binding, i.url) for i in card.supported_interfaces]
    assert interfaces[:2] == [
        ("JSONRPC", f"{a2a_peer.base_url}/a2a"),
        ("HTTP+JSON", f"{a2a_peer.base_url}/a2a"),
    ]
    if GRPC_PRESENT:
        assert interfaces[2] == ("GRPC", f"127.0.0.1:{a2a_peer.a2a.grpc.port}")
    assert len(interfaces) == 2 + GRPC_PRESENT
    assert {i.protocol_version for i in card.supported_interfaces} == {"1.0"}
    assert card.capabilities.streaming
    assert card.capabilities.push_notifications
    # No scheme is enforced here, and the card says so.
    assert not card.security_schemes
    assert not card.security_requirements
    echo = next(s for s in card.skills if s.id == "echo")
    assert "default" in echo.description
    assert '"taskType":"echo"' in echo.examples[0]
    (extension,) = card.capabilities.extensions
    params = MessageToDict(extension.params)
    assert params["taskTypes"]["echo"]["inputSchema"]["required"] == ["text"]
    assert params["defaultTaskType"] == "echo"


# --- every demo task type, streaming and not ------------------------------------------


@pytest.mark.parametrize("streaming", [True, False], ids=["stream", "blocking"])
async def test_echo_by_default_and_by_skill(sdk_client: SdkClientFactory, streaming: bool) -> None:
    client = await sdk_client(streaming=streaming)
    events = await collect(client, sdk_message(parts=[{"text": "hello"}]))
    assert states(events)[-1] == COMPLETED
    assert "hello" in artifact_texts(events)
    events = await collect(
        client,
        sdk_message(parts=[{"data": {"text": "by skill"}}], metadata={"task_type": "echo"}),
    )
    assert states(events)[-1] == COMPLETED
    assert "by skill" in artifact_texts(events)
    if streaming:
        assert states(events)[0] == "TASK_STATE_SUBMITTED"
        assert WORKING in states(events)


async def test_slow_streams_its_progress_as_status_updates(sdk_client: SdkClientFactory) -> None:
    client = await sdk_client()
    message = sdk_message(
        parts=[{"data": {"steps": 3, "delay": 0.05}}], metadata={"task_type": "slow"}
    )
    events = await collect(client, message)
    updates = [e["statusUpdate"] for e in events if "statusUpdate" in e]
    progress = [texts(u["status"].get("message", {})) for u in updates]
    assert ["33%"] in progress or ["step 1/3"] in progress
    assert ["step 3/3"] in progress
    assert states(events)[-1] == COMPLETED
    assert artifact_texts(events) == ["done after 3 steps"]


@pytest.mark.parametrize("streaming", [True, False], ids=["stream", "blocking"])
async def test_fail_and_unknown_types(sdk_client: SdkClientFactory, streaming: bool) -> None:
    client = await sdk_client(streaming=streaming)
    events = await collect(
        client, sdk_message(parts=[{"data": {}}], metadata={"task_type": "fail"})
    )
    assert states(events)[-1] == "TASK_STATE_FAILED"
    final = events[-1].get("statusUpdate") or events[-1]["task"]
    assert any("execution_failed" in t for t in texts(final["status"]))
    events = await collect(
        client, sdk_message(parts=[{"data": {}}], metadata={"task_type": "no_such_type"})
    )
    assert states(events) == ["TASK_STATE_REJECTED"]
    assert any("capability_lacking" in t for t in texts(events[0]))


@pytest.mark.parametrize("streaming", [True, False], ids=["stream", "blocking"])
async def test_need_info_goes_through_input_required(
    sdk_client: SdkClientFactory, streaming: bool
) -> None:
    client = await sdk_client(streaming=streaming)
    events = await collect(
        client,
        sdk_message(
            parts=[{"data": {"prompt": "春天"}}], metadata={"task_type": "text_generation"}
        ),
    )
    assert states(events)[-1] == INPUT_REQUIRED
    question = events[-1].get("task") or events[-1]["statusUpdate"]
    assert any("style" in t for t in texts(question["status"]["message"]))
    task_id = task_id_of(events)
    answer = sdk_message(taskId=task_id, parts=[{"data": {"style": "现代"}}])
    events = await collect(client, answer)
    assert states(events)[-1] == COMPLETED
    (output,) = artifact_texts(events)
    assert "春天" in output
    assert "现代" in output


async def test_need_info_answered_with_text(sdk_client: SdkClientFactory) -> None:
    client = await sdk_client()
    events = await collect(
        client,
        sdk_message(parts=[{"data": {"prompt": "海"}}], metadata={"task_type": "text_generation"}),
    )
    task_id = task_id_of(events)
    events = await collect(client, sdk_message(taskId=task_id, parts=[{"text": "浪漫"}]))
    assert states(events)[-1] == COMPLETED
    assert "浪漫" in artifact_texts(events)[0]


@pytest.mark.parametrize(
    ("answer", "final"),
    [
        ({"text": "approve"}, COMPLETED),
        ({"data": {"action": "approve", "approved_fields": {"authorized": True}}}, COMPLETED),
        ({"data": {"action": "reject", "rejection_reason": "no consent"}}, "TASK_STATE_FAILED"),
    ],
    ids=["approve-text", "approve-data", "reject"],
)
@pytest.mark.parametrize("streaming", [True, False], ids=["stream", "blocking"])
async def test_need_human_goes_through_input_required(
    sdk_client: SdkClientFactory, streaming: bool, answer: dict[str, Any], final: str
) -> None:
    client = await sdk_client(streaming=streaming)
    events = await collect(
        client,
        sdk_message(parts=[{"data": {"subject": "Ada"}}], metadata={"task_type": "portrait"}),
    )
    assert states(events)[-1] == INPUT_REQUIRED
    asked = events[-1].get("task") or events[-1]["statusUpdate"]
    assert any("approve" in t for t in texts(asked["status"]["message"]))
    events = await collect(client, sdk_message(taskId=task_id_of(events), parts=[answer]))
    assert states(events)[-1] == final
    if final == COMPLETED:
        assert artifact_texts(events) == ["portrait of Ada"]
    else:
        last = events[-1].get("statusUpdate") or events[-1]["task"]
        assert any("permission_denied" in t for t in texts(last["status"]))


# --- get, list, cancel, subscribe ---------------------------------------------------------------


async def test_get_list_and_cancel(sdk_client: SdkClientFactory) -> None:
    client = await sdk_client(streaming=False)
    slow = sdk_message(
        parts=[{"data": {"steps": 200, "delay": 0.05}}],
        metadata={"task_type": "slow"},
        contextId="ctx-list",
    )
    (event,) = await collect(client, slow, returnImmediately=True)
    task_id = event["task"]["id"]
    assert event["task"]["contextId"] == "ctx-list"
    for _ in range(200):  # until it reports working (it was submitted a moment ago)
        task = await client.get_task(GetTaskRequest(id=task_id))
        if task.status.state != TaskState.TASK_STATE_SUBMITTED:
            break
    assert task.status.state == TaskState.TASK_STATE_WORKING
    assert task.metadata["taskType"] == "slow"
    assert [m.message_id for m in task.history][:1] == [slow.message_id]
    short = await client.get_task(GetTaskRequest(id=task_id, history_length=0))
    assert not short.history

    other = task_id_of(await collect(client, sdk_message(parts=[{"text": "other"}])))
    listed = await client.list_tasks(ListTasksRequest(context_id="ctx-list"))
    assert [t.id for t in listed.tasks] == [task_id]
    assert listed.total_size == 1
    assert not listed.tasks[0].artifacts  # unless includeArtifacts
    working = await client.list_tasks(ListTasksRequest(status=TaskState.TASK_STATE_WORKING))
    assert [t.id for t in working.tasks] == [task_id]

    cancelled = await client.cancel_task(CancelTaskRequest(id=task_id))
    assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
    assert (await client.get_task(GetTaskRequest(id=task_id))).status.state == (
        TaskState.TASK_STATE_CANCELED
    )
    with pytest.raises(TaskNotCancelableError):
        await client.cancel_task(CancelTaskRequest(id=task_id))

    # Newest first, one per page, until no token is left.
    first = await client.list_tasks(ListTasksRequest(page_size=1, include_artifacts=True))
    assert [t.id for t in first.tasks] == [task_id]
    assert first.total_size == 2
    assert first.next_page_token
    rest = await client.list_tasks(
        ListTasksRequest(page_size=1, page_token=first.next_page_token, include_artifacts=True)
    )
    assert [t.id for t in rest.tasks] == [other]
    assert [p.text for p in rest.tasks[0].artifacts[0].parts] == ["other"]
    assert not rest.next_page_token
    with pytest.raises(TaskNotFoundError):
        await client.get_task(GetTaskRequest(id="no-such-task"))
    with pytest.raises(InvalidParamsError):
        await client.list_tasks(ListTasksRequest(page_size=1000))


async def test_cancel_while_streaming(sdk_client: SdkClientFactory) -> None:
    client = await sdk_client()
    streamer = await sdk_client()
    request_events: list[dict[str, Any]] = []
    working = asyncio.Event()

    async def follow() -> None:
        from a2a.types.a2a_pb2 import SendMessageRequest

        message = sdk_message(
            parts=[{"data": {"steps": 500, "delay": 0.02}}], metadata={"task_type": "slow"}
        )
        async for event in streamer.send_message(SendMessageRequest(message=message)):
            request_events.append(as_dict(event))
            if WORKING in states(request_events):
                working.set()

    follower = asyncio.create_task(follow())
    async with asyncio.timeout(10):
        await working.wait()
    await client.cancel_task(CancelTaskRequest(id=task_id_of(request_events)))
    async with asyncio.timeout(10):
        await follower
    assert states(request_events)[-1] == "TASK_STATE_CANCELED"


async def test_subscribe_after_a_disconnect_replays_the_state_then_goes_live(
    sdk_client: SdkClientFactory,
) -> None:
    client = await sdk_client()
    from a2a.types.a2a_pb2 import SendMessageRequest

    message = sdk_message(
        parts=[{"data": {"steps": 6, "delay": 0.1}}], metadata={"task_type": "slow"}
    )
    seen: list[dict[str, Any]] = []
    async with asyncio.timeout(10):
        async for event in client.send_message(SendMessageRequest(message=message)):
            seen.append(as_dict(event))
            if WORKING in states(seen):
                break  # the client goes away mid-task
    task_id = task_id_of(seen)
    last_seen = texts([e for e in seen if state_of(e) is not None][-1])
    async with asyncio.timeout(10):  # a step is reported while nobody listens
        while True:
            status = as_dict(await client.get_task(GetTaskRequest(id=task_id)))["status"]
            now = texts(status)
            if now != last_seen and any(t.startswith("step") for t in now):
                break
            await asyncio.sleep(0.02)  # polling the peer's task, bounded
    again: list[dict[str, Any]] = []
    async with asyncio.timeout(10):
        async for event in client.subscribe(SubscribeToTaskRequest(id=task_id)):
            again.append(as_dict(event))
    first = again[0]["task"]
    assert first["status"]["state"] == WORKING
    assert any(t.startswith("step") for t in texts(first["status"]))
    assert states(again)[-1] == COMPLETED
    assert artifact_texts(again) == ["done after 6 steps"]
    with pytest.raises(UnsupportedOperationError):
        async for _ in client.subscribe(SubscribeToTaskRequest(id=task_id)):
            pass
