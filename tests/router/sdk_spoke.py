"""An A2A spoke built only with the official SDK's server classes (Starlette routes, the
default request handler, an in-memory task store), for the router's hub-and-spokes tests.

Skills (the task type comes in `message.metadata.task_type`, the payload in a data part):
- `echo`: completes with the payload's `text`;
- `text_generation`: asks "Which style?" (INPUT_REQUIRED, free text), then completes with
  `poem about <prompt> in <style>`;
- `slow`: reports progress until cancelled;
- `fail`: fails.

It counts, per parent task id (`metadata.parent_task_id`), how many tasks it started, and
notes cancellations, so that tests can assert nothing ran twice.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from typing import Any

from a2a.helpers import get_message_text, new_task_from_user_message, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentCardSignature,
    AgentInterface,
    AgentSkill,
    TaskState,
)
from google.protobuf.json_format import MessageToDict
from starlette.applications import Starlette

SKILLS = ("echo", "text_generation", "slow", "fail")


class SpokeExecutor(AgentExecutor):
    def __init__(self) -> None:
        self.lock = threading.Lock()
        #: Parent task id (the hub's original task) → tasks started for it.
        self.starts: Counter[str] = Counter()
        self.cancelled: set[str] = set()
        self.prompts: dict[str, str] = {}
        self.cancel_seen = threading.Event()
        self.working = threading.Event()

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.message is not None
        message = MessageToDict(context.message)
        metadata: dict[str, Any] = message.get("metadata", {})
        task = context.current_task
        if task is None:
            task = new_task_from_user_message(context.message)
            await event_queue.enqueue_event(task)
            with self.lock:
                self.starts[str(metadata.get("parent_task_id", task.id))] += 1
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        if task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED:
            style = get_message_text(context.message)
            with self.lock:
                prompt = self.prompts.get(task.id, "?")
            await updater.start_work()
            await updater.add_artifact(
                [new_text_part(f"poem about {prompt} in {style}")], name="poem"
            )
            await updater.complete()
            return
        payload: dict[str, Any] = {}
        for part in message.get("parts", []):
            if isinstance(part.get("data"), dict):
                payload = part["data"]
                break
        task_type = metadata.get("taskType", metadata.get("task_type", "echo"))
        await updater.start_work()
        if task_type == "text_generation":
            with self.lock:
                self.prompts[task.id] = str(payload.get("prompt", ""))
            question = updater.new_agent_message([new_text_part("Which style?")])
            await updater.requires_input(question)
            return
        if task_type == "fail":
            await updater.failed(updater.new_agent_message([new_text_part("it broke")]))
            return
        if task_type == "slow":
            step = 0
            while True:
                step += 1
                note = updater.new_agent_message([new_text_part(f"step {step}")])
                await updater.update_status(TaskState.TASK_STATE_WORKING, note)
                self.working.set()
                await asyncio.sleep(0.05)
        await updater.add_artifact([new_text_part(str(payload.get("text", "")))], name="echo")
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        task = context.current_task
        assert task is not None
        with self.lock:
            self.cancelled.add(task.id)
        self.cancel_seen.set()
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        await updater.cancel(updater.new_agent_message([new_text_part("cancelled")]))


def agent_card(port: int, signature: str | None = None) -> AgentCard:
    """The card; with `signature`, it carries one (a stand-in JWS the tests' verifier knows)."""
    signatures = (
        [AgentCardSignature(protected="eyJhbGciOiJFUzI1NiJ9", signature=signature)]
        if signature is not None
        else []
    )
    return AgentCard(
        signatures=signatures,
        name="sdk-spoke",
        description="A spoke built with the official A2A SDK",
        version="1.0.0",
        supported_interfaces=[
            AgentInterface(
                url=f"http://127.0.0.1:{port}/",
                protocol_binding="JSONRPC",
                protocol_version="1.0",
            )
        ],
        capabilities=AgentCapabilities(streaming=True, push_notifications=False),
        default_input_modes=["application/json", "text/plain"],
        default_output_modes=["text/plain"],
        skills=[AgentSkill(id=s, name=s, description=f"{s} (SDK)", tags=[s]) for s in SKILLS],
    )


def build(executor: SpokeExecutor, signature: str | None = None) -> Any:
    def app(port: int) -> Any:
        card = agent_card(port, signature)
        handler = DefaultRequestHandler(
            agent_executor=executor, task_store=InMemoryTaskStore(), agent_card=card
        )
        routes = [*create_agent_card_routes(card), *create_jsonrpc_routes(handler, "/")]
        return Starlette(routes=routes)

    return app
