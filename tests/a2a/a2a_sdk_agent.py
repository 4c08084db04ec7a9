"""An A2A agent built only with the official SDK's server classes (Starlette routes, the
default request handler, an in-memory task store), for testing our client against it.

What it does depends on the text of the message:
- `ask ...`: INPUT_REQUIRED ("What is your name?"); the answer completes it with
  `hello <answer>`;
- `slow`: works, reporting progress, until cancelled;
- `fail`: fails;
- anything else: completes with an artifact echoing the text (or the data part).

It serves every binding the SDK has: JSON-RPC at `/`, REST under `/rest`, and gRPC on a
port of its own when grpcio is installed; its card lists them with `first` first (the
agent's preference), so a client that follows the card's order uses that one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from a2a.helpers import get_message_text, new_task_from_user_message, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import (
    create_agent_card_routes,
    create_jsonrpc_routes,
    create_rest_routes,
)
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Part,
    TaskState,
)
from google.protobuf.json_format import MessageToDict
from starlette.applications import Starlette


class EchoExecutor(AgentExecutor):
    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.message is not None
        task = context.current_task
        if task is None:
            task = new_task_from_user_message(context.message)
            await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        text = get_message_text(context.message)
        if task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED:
            await updater.start_work()
            await updater.add_artifact([new_text_part(f"hello {text}")], name="greeting")
            await updater.complete()
            return
        await updater.start_work()
        if text.startswith("ask"):
            question = updater.new_agent_message([new_text_part("What is your name?")])
            await updater.requires_input(question)
            return
        if text == "fail":
            await updater.failed(updater.new_agent_message([new_text_part("it broke")]))
            return
        if text == "slow":
            step = 0
            while True:
                step += 1
                note = updater.new_agent_message([new_text_part(f"step {step}")])
                await updater.update_status(TaskState.TASK_STATE_WORKING, note)
                await asyncio.sleep(0.05)
        parts = list(context.message.parts)
        data = [MessageToDict(p) for p in parts if p.HasField("data")]
        echoed: list[Part] = [new_text_part(text)] if text else []
        if data:
            echoed.append(parts[0])
        await updater.add_artifact(echoed, name="echo")
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        task = context.current_task
        assert task is not None
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        await updater.cancel(updater.new_agent_message([new_text_part("cancelled")]))


def agent_card(
    port: int, grpc_port: int | None = None, first: str = "JSONRPC", *, version: str = "1.0"
) -> AgentCard:
    urls = {"JSONRPC": f"http://127.0.0.1:{port}/", "HTTP+JSON": f"http://127.0.0.1:{port}/rest"}
    if grpc_port is not None:
        urls["GRPC"] = f"127.0.0.1:{grpc_port}"
    order = [first, *(b for b in urls if b != first)]
    return AgentCard(
        name="sdk-echo",
        description="An echo agent built with the official A2A SDK",
        version="1.0.0",
        supported_interfaces=[
            AgentInterface(url=urls[b], protocol_binding=b, protocol_version=version) for b in order
        ],
        capabilities=AgentCapabilities(streaming=True, push_notifications=False),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[AgentSkill(id="echo", name="Echo", description="Echoes", tags=["echo"])],
    )


def build_app(
    port: int, grpc_port: int | None = None, first: str = "JSONRPC", *, legacy: bool = False
) -> Any:
    """The agent; `legacy`: an A2A 0.3 agent (the SDK's 0.3 compatibility) whose card offers
    only its `first` binding."""
    if legacy:
        card = agent_card(port, None, first, version="0.3")
        del card.supported_interfaces[1:]
        grpc_port = None
    else:
        card = agent_card(port, grpc_port, first)
    handler = DefaultRequestHandler(
        agent_executor=EchoExecutor(), task_store=InMemoryTaskStore(), agent_card=card
    )
    routes = [
        *create_agent_card_routes(card),
        *create_jsonrpc_routes(handler, "/", enable_v0_3_compat=legacy),
        *create_rest_routes(handler, path_prefix="/rest", enable_v0_3_compat=legacy),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        if grpc_port is None:
            yield
            return
        import grpc
        from a2a.server.request_handlers import GrpcHandler
        from a2a.types import a2a_pb2_grpc

        server = grpc.aio.server()
        a2a_pb2_grpc.add_A2AServiceServicer_to_server(GrpcHandler(handler), server)
        server.add_insecure_port(f"127.0.0.1:{grpc_port}")
        await server.start()
        try:
            yield
        finally:
            await server.stop(0.5)

    return Starlette(routes=routes, lifespan=lifespan)
