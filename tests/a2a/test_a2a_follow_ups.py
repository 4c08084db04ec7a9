"""A follow-up message to a task that is working and asked nothing: kept, durably, in the
task's history and for its handler; a retry kept once; a reused messageId refused; a bound on
how many one task keeps; and still there after a restart. A follow-up that answers a
question: the handler reads it whole (`answer_messages`), it stays in the history across a
restart, and a retry of it answers nothing more."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2akit import fast_config

from synapse import ExecutionContext, TaskResult, Validation
from synapse.a2a import answer_messages, enable_a2a, follow_up_messages
from synapse.a2a.server.follow_ups import MAX_FOLLOW_UP_MESSAGES
from synapse.store import SqliteStore
from synapse.transport.peer import Peer
from synapse.types import HumanOption, Reason

V1 = {"A2A-Version": "1.0"}


class ListeningHandler:
    """`listen` works until the test lets it finish, then answers with the texts of the
    messages sent to it meanwhile."""

    def __init__(self) -> None:
        self.finish = asyncio.Event()

    def get_capabilities(self) -> list[str]:
        return ["listen"]

    def validate_task(self, task_type: str, payload: dict[str, Any]) -> Validation:
        return Validation()

    async def execute_task(
        self, ctx: ExecutionContext, task_type: str, payload: dict[str, Any]
    ) -> TaskResult:
        await ctx.progress(10, "listening")
        await self.finish.wait()
        heard = [part.text for m in follow_up_messages(ctx) for part in m.parts if part.text]
        return TaskResult(output_type="json", output={"heard": heard})


async def rpc(base: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
    request = {"jsonrpc": "2.0", "id": "1", "method": method, "params": params}
    async with httpx.AsyncClient(timeout=10) as http:
        answer: dict[str, Any] = (await http.post(f"{base}/a2a", json=request, headers=V1)).json()
    return answer


def message(text: str, message_id: str, **more: Any) -> dict[str, Any]:
    return {"messageId": message_id, "role": "ROLE_USER", "parts": [{"text": text}], **more}


async def follow_up(
    base: str, task_id: str, text: str, message_id: str, *, wait: bool = False
) -> dict[str, Any]:
    """SendMessage of `text` to the task (returning at once unless `wait`): the answer."""
    params: dict[str, Any] = {"message": message(text, message_id, taskId=task_id)}
    if not wait:
        params["configuration"] = {"returnImmediately": True}
    return await rpc(base, "SendMessage", params)


def user_texts(task: dict[str, Any]) -> list[str]:
    return [m["parts"][0]["text"] for m in task["history"] if m["role"] == "ROLE_USER"]


async def start_working(base: str) -> str:
    """A `listen` task, returned once the handler reported it works."""
    sent = await rpc(
        base,
        "SendMessage",
        {"message": message("start", "first"), "configuration": {"returnImmediately": True}},
    )
    task_id: str = sent["result"]["task"]["id"]
    stream = {"jsonrpc": "2.0", "id": "2", "method": "SubscribeToTask", "params": {"id": task_id}}
    async with (
        httpx.AsyncClient(timeout=10) as http,
        http.stream("POST", f"{base}/a2a", json=stream, headers=V1) as response,
    ):
        async for line in response.aiter_lines():
            if "TASK_STATE_WORKING" in line:
                break
    return task_id


@pytest.fixture
async def listening(tmp_path: Path) -> AsyncIterator[tuple[ListeningHandler, Path]]:
    yield ListeningHandler(), tmp_path / "store.db"


@asynccontextmanager
async def running(handler: Any, path: Path) -> AsyncIterator[str]:
    """A peer serving `handler` over A2A, on the store at `path`: its base URL."""
    peer = Peer("agent-l", handler=handler, config=fast_config(), store=SqliteStore(path))
    enable_a2a(peer, default_task_type=handler.get_capabilities()[0])
    await peer.start()
    try:
        yield f"http://127.0.0.1:{peer.port}"
    finally:
        await peer.close(drain_timeout=0.1)


async def test_a_working_task_keeps_follow_ups_for_its_handler(
    listening: tuple[ListeningHandler, Path],
) -> None:
    handler, path = listening
    async with running(handler, path) as base:
        task_id = await start_working(base)
        for n in (1, 2):
            answer = await follow_up(base, task_id, f"also {n}", f"more-{n}")
            task = answer["result"]["task"]
            assert task["status"]["state"] == "TASK_STATE_WORKING"  # no state change
            assert task["history"][-1]["parts"] == [{"text": f"also {n}"}]
        # A retry of the same message is kept once; the same id on another message is refused.
        again = await follow_up(base, task_id, "also 2", "more-2")
        assert again["result"]["task"]["id"] == task_id
        reused = await follow_up(base, task_id, "other", "more-2", wait=True)
        assert reused["error"]["code"] == -32602
        assert "already used for another message" in reused["error"]["message"]
        got = await rpc(base, "GetTask", {"id": task_id})
        texts = user_texts(got["result"])
        assert texts == ["start", "also 1", "also 2"]
        # A blocking follow-up waits for the task's end, like any blocking SendMessage.
        blocking = asyncio.ensure_future(follow_up(base, task_id, "last", "more-3", wait=True))
        # It is seen in the history once kept, and it waits from the same step on.
        async with asyncio.timeout(10):
            while True:
                got = await rpc(base, "GetTask", {"id": task_id})
                if got["result"]["history"][-1]["parts"] == [{"text": "last"}]:
                    break
        handler.finish.set()
        done = (await blocking)["result"]["task"]
        assert done["status"]["state"] == "TASK_STATE_COMPLETED"
        output = done["artifacts"][0]["parts"][0]["data"]
        assert output == {"heard": ["also 1", "also 2", "last"]}
        ended = await follow_up(base, task_id, "late", "more-4", wait=True)
        assert ended["error"]["code"] == -32004  # a terminal task takes nothing


async def test_kept_follow_ups_survive_a_restart(
    listening: tuple[ListeningHandler, Path],
) -> None:
    handler, path = listening
    async with running(handler, path) as base:
        task_id = await start_working(base)
        answer = await follow_up(base, task_id, "remember me", "kept-1")
        assert answer["result"]["task"]["status"]["state"] == "TASK_STATE_WORKING"
    handler = ListeningHandler()
    handler.finish.set()  # the resumed handler finishes at once
    async with running(handler, path) as base:
        got = await rpc(base, "GetTask", {"id": task_id})
        texts = user_texts(got["result"])
        assert texts[:2] == ["start", "remember me"]


async def test_a_task_keeps_a_bounded_number_of_follow_ups(
    listening: tuple[ListeningHandler, Path],
) -> None:
    handler, path = listening
    async with running(handler, path) as base:
        task_id = await start_working(base)
        for n in range(MAX_FOLLOW_UP_MESSAGES):
            answer = await follow_up(base, task_id, f"m{n}", f"id-{n}")
            assert "result" in answer, answer
        refused = await follow_up(base, task_id, "one more", "id-over", wait=True)
        assert refused["error"]["code"] == -32004
        assert str(MAX_FOLLOW_UP_MESSAGES) in refused["error"]["message"]
        handler.finish.set()


class AskingHandler:
    """`ask` asks for `answer` until an answering message's id starts with `done`; the result
    lists the ids and texts of the messages that answered."""

    def get_capabilities(self) -> list[str]:
        return ["ask"]

    def is_resumable(self, task_type: str) -> bool:
        return True  # its questions survive a restart

    def validate_task(self, task_type: str, payload: dict[str, Any]) -> Validation:
        return Validation()

    async def execute_task(
        self, ctx: ExecutionContext, task_type: str, payload: dict[str, Any]
    ) -> TaskResult:
        while True:
            fields = await ctx.need_info(["answer"], question="and then?")
            last = answer_messages(ctx)[-1]
            assert last.parts[0].text == fields["answer"]  # the message of this answer
            if last.message_id.startswith("done"):
                answered = [(m.message_id, m.parts[0].text) for m in answer_messages(ctx)]
                return TaskResult(output_type="json", output={"answered": answered})


async def until_input_required(base: str, task_id: str) -> None:
    async with asyncio.timeout(10):
        while True:
            got = await rpc(base, "GetTask", {"id": task_id})
            if got["result"]["status"]["state"] == "TASK_STATE_INPUT_REQUIRED":
                return
            await asyncio.sleep(0.02)  # another peer's task: no event of ours to wait on


async def test_a_handler_reads_the_messages_that_answered_it(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    async with running(AskingHandler(), path) as base:
        sent = await rpc(base, "SendMessage", {"message": message("go", "first")})
        task_id = sent["result"]["task"]["id"]
        assert sent["result"]["task"]["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
        again = await follow_up(base, task_id, "one", "more-1", wait=True)
        assert again["result"]["task"]["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
        # A retry of that answer answers nothing: the second question still waits.
        retry = await follow_up(base, task_id, "one", "more-1", wait=True)
        assert retry["result"]["task"]["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
        await until_input_required(base, task_id)
    # The answers are durable: after a restart they are in the history, and the handler
    # (resumed on its question) still reads them.
    async with running(AskingHandler(), path) as base:
        got = await rpc(base, "GetTask", {"id": task_id})
        assert user_texts(got["result"]) == ["go", "one"]
        done = await follow_up(base, task_id, "two", "done-1", wait=True)
        task = done["result"]["task"]
        assert task["status"]["state"] == "TASK_STATE_COMPLETED", task
        answered = task["artifacts"][0]["parts"][0]["data"]["answered"]
        assert answered == [["more-1", "one"], ["done-1", "two"]]
        assert user_texts(task) == ["go", "one", "two"]


async def test_the_same_message_id_on_another_answer_is_a_new_answer(tmp_path: Path) -> None:
    """Clients reuse message ids (the A2A TCK sends every answer of a session under one):
    only the same id with the same content is a retry."""
    async with running(AskingHandler(), tmp_path / "store.db") as base:
        sent = await rpc(base, "SendMessage", {"message": message("go", "reused")})
        task_id = sent["result"]["task"]["id"]
        for text in ("one", "two"):
            again = await follow_up(base, task_id, text, "reused", wait=True)
            assert again["result"]["task"]["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
        done = await follow_up(base, task_id, "three", "done-1", wait=True)
    task = done["result"]["task"]
    answered = task["artifacts"][0]["parts"][0]["data"]["answered"]
    assert answered == [["reused", "one"], ["reused", "two"], ["done-1", "three"]]


class DecidingHandler:
    """`decide` asks for a person's approval of `go` (a boolean), then for an `email`."""

    def get_capabilities(self) -> list[str]:
        return ["decide"]

    def validate_task(self, task_type: str, payload: dict[str, Any]) -> Validation:
        return Validation()

    async def execute_task(
        self, ctx: ExecutionContext, task_type: str, payload: dict[str, Any]
    ) -> TaskResult:
        decision = await ctx.need_human(
            Reason(code="risky", message="go?"), options=[HumanOption(field="go", value=True)]
        )
        fields = await ctx.need_info(["email"], question="where to?")
        go = (decision.decision.approved_fields or {}).get("go")
        return TaskResult(output_type="json", output={"go": go, "email": fields["email"]})


def data_message(data: dict[str, Any], message_id: str, task_id: str) -> dict[str, Any]:
    return {
        "messageId": message_id,
        "role": "ROLE_USER",
        "parts": [{"data": data}],
        "taskId": task_id,
    }


async def test_an_a2a_answer_passes_the_checks_every_answer_passes(tmp_path: Path) -> None:
    """The answer gate's checks on the A2A front: an edit of another type than the value
    proposed (a string for a boolean), and information without the field asked for, are
    refused (-32602) and change nothing; the right answers then go through."""
    async with running(DecidingHandler(), tmp_path / "store.db") as base:
        sent = await rpc(base, "SendMessage", {"message": message("go", "first")})
        task_id = sent["result"]["task"]["id"]
        assert sent["result"]["task"]["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
        wrong = {"action": "approve", "approved_fields": {"go": "yes"}}
        refused = await rpc(base, "SendMessage", {"message": data_message(wrong, "a-1", task_id)})
        assert refused["error"]["code"] == -32602, refused
        assert "'go' must be a boolean" in refused["error"]["message"]
        still = await rpc(base, "GetTask", {"id": task_id})
        assert still["result"]["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
        assert user_texts(still["result"]) == ["go"]  # the refused answer is not kept
        right = {"action": "approve", "approved_fields": {"go": False}}
        asked = await rpc(base, "SendMessage", {"message": data_message(right, "a-2", task_id)})
        assert asked["result"]["task"]["status"]["state"] == "TASK_STATE_INPUT_REQUIRED", asked
        await until_input_required(base, task_id)
        other = await rpc(
            base, "SendMessage", {"message": data_message({"phone": "1"}, "a-3", task_id)}
        )
        assert other["error"]["code"] == -32602, other
        assert "missing fields: email" in other["error"]["message"]
        email = {"email": "ada@example.com"}
        done = await rpc(base, "SendMessage", {"message": data_message(email, "a-4", task_id)})
    task = done["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED", task
    assert task["artifacts"][0]["parts"][0]["data"] == {"go": False, "email": "ada@example.com"}
