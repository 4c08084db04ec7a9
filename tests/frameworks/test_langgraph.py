"""A compiled LangGraph graph served as a Synapse handler, as it is (`Peer(handler=graph)`),
between two real peers over loopback HTTP; its chat node runs LangChain's fake chat model."""

from __future__ import annotations

import signal
from pathlib import Path

import lg_graphs
import pytest
from fwkit import HERE, pair, requester_of_serve, serve

from synapse.frameworks import as_handler, framework_of
from synapse.frameworks.base import APPROVAL_REQUIRED
from synapse.frameworks.langgraph import LangGraphHandler, _pack, _unpack
from synapse.types import MessageType, TaskState


def test_a_graph_is_recognized_and_named_by_its_task_type() -> None:
    assert framework_of(lg_graphs.publisher) == "langgraph"
    handler = as_handler(lg_graphs.publisher)
    assert isinstance(handler, LangGraphHandler)
    assert handler.task_type == "publisher"
    assert as_handler(lg_graphs.publisher, task_type="post").get_capabilities()[0].name == "post"


async def test_the_payload_is_the_input_state_and_the_final_state_the_result() -> None:
    async with pair(lg_graphs.orders) as (requester, _):
        outcome = await (
            await requester.submit("agent-e", "orders", {"item": "tea", "quantity": 2})
        )
    assert outcome.result is not None
    assert (outcome.result.output_type, outcome.result.output) == (
        "json",
        {"item": "TEA", "quantity": 2},
    )


async def test_the_input_schema_is_offered_and_checked_before_the_task_is_confirmed() -> None:
    async with pair(lg_graphs.orders) as (requester, _):
        [capability] = (await requester.capabilities("agent-e")).capabilities
        assert capability.input_schema is not None
        assert set(capability.input_schema["required"]) == {"item", "quantity"}
        missing = await (await requester.submit("agent-e", "orders", {"item": "tea"}))
        wrong = await (
            await requester.submit("agent-e", "orders", {"item": "tea", "quantity": "two"})
        )
    assert missing.state is TaskState.REJECTED and missing.reject is not None
    assert missing.reject.reason.code == "invalid_params"
    assert missing.reject.reason.message == "missing: quantity"
    assert wrong.state is TaskState.REJECTED and wrong.reject is not None
    assert wrong.reject.reason.message == "quantity must be of type integer"


async def test_messages_of_a_chat_model_come_back_as_their_fields() -> None:
    async with pair(lg_graphs.chat) as (requester, _):
        payload = {"messages": [{"role": "user", "content": "Salut"}]}
        outcome = await (await requester.submit("agent-e", "chat", payload))
    assert outcome.result is not None
    messages = outcome.result.output["messages"]
    assert [(m["type"], m["content"]) for m in messages] == [
        ("human", "Salut"),
        ("ai", "Bonjour !"),
    ]


async def test_interrupts_ask_the_requester_then_a_person_and_resume_the_graph(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "nodes.log"
    monkeypatch.setenv("FRAMEWORK_TEST_LOG", str(log))
    kinds: list[str] = []
    progress: list[str] = []
    async with pair(lg_graphs.publisher) as (requester, _):
        handle = await requester.submit("agent-e", "publisher", {"topic": "spring"})
        async for event in handle:
            kinds.append(event.kind)
            if (update := event.status_update) is not None and update.message:
                progress.append(update.message)
            if (info := event.need_info) is not None:
                [missing] = info.missing_fields
                assert (missing.field, missing.reason, missing.suggested_value) == (
                    "city",
                    "which city is it about?",
                    "Paris",
                )
                await handle.provide_info({"city": "Lyon"})
            if (asked := event.need_human) is not None:
                assert asked.reason.code == APPROVAL_REQUIRED
                assert asked.reason.message == "publish this post?"
                assert {o.field: o.value for o in asked.options} == {"text": "spring in Lyon"}
                await handle.approve({"text": "Spring in Lyon!"})
        outcome = await handle
    assert outcome.result is not None
    assert outcome.result.output == {
        "topic": "spring",
        "city": "Lyon",
        "text": "Spring in Lyon!",
        "published": True,
    }
    assert kinds.index(MessageType.TASK_NEED_INFO.value) < kinds.index(
        MessageType.TASK_NEED_HUMAN.value
    )
    assert "ask_city done" in progress
    # A node that interrupted runs again when resumed (LangGraph's rule); publish runs once.
    assert log.read_text().splitlines() == [
        "node: ask_city",
        "node: ask_city",
        "node: draft",
        "node: draft",
        "node: publish Spring in Lyon!",
    ]


async def test_a_rejection_fails_the_task_before_publishing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "nodes.log"
    monkeypatch.setenv("FRAMEWORK_TEST_LOG", str(log))
    async with pair(lg_graphs.publisher) as (requester, _):
        handle = await requester.submit("agent-e", "publisher", {"topic": "spring"})
        async for event in handle:
            if event.need_info is not None:
                await handle.provide_info({"city": "Lyon"})
            if event.need_human is not None:
                await handle.reject("off brand")
        outcome = await handle
    assert outcome.state is TaskState.FAILED
    assert outcome.error is not None and outcome.error.code == "permission_denied"
    assert not any(line.startswith("node: publish") for line in log.read_text().splitlines())


async def test_a_cancel_cancels_the_graph() -> None:
    async with pair(lg_graphs.slow) as (requester, _):
        handle = await requester.submit("agent-e", "slow", {})
        await lg_graphs.SLOW.started.wait()
        await handle.cancel("no longer needed")
        outcome = await handle
        await lg_graphs.SLOW.cancelled.wait()
    assert outcome.state is TaskState.CANCELLED


async def test_an_exception_in_a_node_fails_the_task_with_its_type_and_message() -> None:
    async with pair(lg_graphs.broken) as (requester, _):
        outcome = await (await requester.submit("agent-e", "broken", {}))
    assert outcome.state is TaskState.FAILED
    assert outcome.error is not None and outcome.error.code == "execution_failed"
    assert outcome.error.message == "KeyError: 'the archive is empty'"


async def test_a_graph_paused_on_a_question_resumes_after_a_sigkill(tmp_path: Path) -> None:
    """`synapse serve --handler lg_graphs:publisher` on SQLite, SIGKILLed while the person's
    approval waits: started again, the answer resumes the graph from its checkpoint (kept with
    the task): ask_city does not run again, the city is not asked again, publish runs once."""
    log = tmp_path / "nodes.log"
    async with requester_of_serve(tmp_path, "lg_graphs:publisher") as (requester, args, port):
        env = {"FRAMEWORK_TEST_LOG": str(log)}
        with serve(*args, port=port, env=env, cwd=str(HERE)) as first:
            handle = await requester.submit("agent-e", "publisher", {"topic": "autumn"})
            async for event in handle:
                if event.need_info is not None:
                    await handle.provide_info({"city": "Nantes"})
                if event.need_human is not None:
                    break
            first.stop(signal.SIGKILL)
        before = log.read_text().splitlines()
        assert before == ["node: ask_city", "node: ask_city", "node: draft"]
        with serve(*args, port=port, env=env, cwd=str(HERE)):
            await handle.approve()
            outcome = await handle
    assert outcome.state is TaskState.COMPLETED, outcome
    assert outcome.result is not None and outcome.result.output["text"] == "autumn in Nantes"
    assert log.read_text().splitlines() == [
        *before,
        "node: draft",
        "node: publish autumn in Nantes",
    ]


def test_the_checkpoint_encoding_keeps_bytes_tuples_and_tuple_keys() -> None:
    kept = {("t", "", "c1"): {("task", 0): ("task", "chan", ("msgpack", b"\x00\xff"), ())}}
    assert _unpack(_pack(kept)) == kept


def test_what_the_adapter_uses_of_langgraph_is_there() -> None:
    """A LangGraph release that renames or drops what the adapter calls fails here, by name."""
    import inspect

    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.types import Command

    saver = InMemorySaver()
    for attribute in ("storage", "writes", "blobs", "delete_thread"):
        assert hasattr(saver, attribute), attribute
    assert "resume" in inspect.signature(Command).parameters
    graph = lg_graphs.publisher
    for method in ("copy", "aget_state", "astream", "get_input_jsonschema"):
        assert callable(getattr(graph, method)), method
    assert graph.copy(update={"checkpointer": saver}).checkpointer is saver
