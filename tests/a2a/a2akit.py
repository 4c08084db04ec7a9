"""Helpers of the A2A tests (official SDK clients, an SDK agent, event inspection)."""

from __future__ import annotations

import asyncio
import importlib.util
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import uvicorn
from a2a.client import Client, ClientConfig, ClientFactory
from a2a.types.a2a_pb2 import Message, SendMessageRequest, StreamResponse
from google.protobuf.json_format import MessageToDict, ParseDict

from benchmarks.ports import free_port as free_port  # re-exported
from synapse.a2a import A2AServer
from synapse.p2p.config import P2PConfig
from synapse.transport.peer import Peer

PUSH_SECRET = "push-secret-for-tests-0123456789"
#: The gRPC binding needs grpcio (the `grpc` extra, in `dev`).
GRPC_PRESENT = importlib.util.find_spec("grpc") is not None
#: Every binding the official SDK's client is run over (gRPC only with grpcio).
SDK_BINDINGS = ["JSONRPC", "HTTP+JSON"] + (["GRPC"] if GRPC_PRESENT else [])

SdkClientFactory = Callable[..., Awaitable[Client]]


def reserved_port() -> socket.socket:
    """A port held for a server a test starts later: bound with SO_REUSEADDR and never
    listening, so that no other bind takes it meanwhile (an ephemeral port of another server
    or connection), while a server binding it with `reuse_address=True` still can. Close it
    when the test is done."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


def fast_config(**overrides: Any) -> P2PConfig:
    """Retries and heartbeats in tens of milliseconds, so that faults heal within a test."""
    values: dict[str, Any] = {
        "max_retries": 2,
        "retry_base_delay": 0.05,
        "retry_max_delay": 0.2,
        "heartbeat_interval": 0.3,
        "request_timeout": 5.0,
    }
    values.update(overrides)
    return P2PConfig(**values)


@dataclass
class A2APeer:
    peer: Peer
    a2a: A2AServer
    base_url: str
    hook_port: int

    @property
    def hook_url(self) -> str:
        return f"http://127.0.0.1:{self.hook_port}/hooks/a2a"


async def open_sdk_client(
    base_url: str, binding: str, http: httpx.AsyncClient, *, streaming: bool = True
) -> Client:
    """The official SDK's client of the agent at `base_url` (discovered from its card), over
    `binding` only; close it, then `http`."""
    channel_factory = None
    if binding == "GRPC":
        import grpc

        def channel_factory(url: str) -> grpc.aio.Channel:
            return grpc.aio.insecure_channel(url)

    config = ClientConfig(
        streaming=streaming,
        httpx_client=http,
        supported_protocol_bindings=[binding],
        grpc_channel_factory=channel_factory,
    )
    return await ClientFactory(config).create_from_url(base_url)


def sdk_message(**fields: Any) -> Message:
    """An SDK `Message` from its JSON form (`role` and `messageId` filled in)."""
    value = {"messageId": f"m-{time.monotonic_ns()}", "role": "ROLE_USER", **fields}
    return ParseDict(value, Message())


async def collect(client: Client, message: Message, **configuration: Any) -> list[dict[str, Any]]:
    """Every event the SDK client yields for `message`, as JSON dicts."""
    request = SendMessageRequest(message=message)
    if configuration:
        ParseDict(configuration, request.configuration)
    events: list[dict[str, Any]] = []
    async with asyncio.timeout(15):
        async for event in client.send_message(request):
            events.append(as_dict(event))
    return events


def as_dict(value: Any) -> dict[str, Any]:
    result: dict[str, Any] = MessageToDict(value)
    return result


def state_of(event: dict[str, Any]) -> str | None:
    for key in ("task", "statusUpdate"):
        if key in event:
            state: str = event[key]["status"]["state"]
            return state
    return None


def task_id_of(events: list[dict[str, Any]]) -> str:
    for event in events:
        if "task" in event:
            task_id: str = event["task"]["id"]
            return task_id
        if "statusUpdate" in event:
            task_id = event["statusUpdate"]["taskId"]
            return task_id
    raise AssertionError(f"no task in {events}")


def texts(value: Any) -> list[str]:
    """Every `text` anywhere in a JSON value."""
    found: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "text" and isinstance(item, str):
                found.append(item)
            else:
                found.extend(texts(item))
    elif isinstance(value, list):
        for item in value:
            found.extend(texts(item))
    return found


# --- an A2A agent built with the official SDK's server classes --------------------------------


class UvicornThread:
    """A Starlette app served by uvicorn on an ephemeral port, in a background thread."""

    def __init__(self, build: Callable[[int], Any]) -> None:
        self.port = free_port()
        app = build(self.port)
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True, name="sdk-agent")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> UvicornThread:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the SDK agent did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def stream_response(value: dict[str, Any]) -> StreamResponse:
    return ParseDict(value, StreamResponse())


class LoopbackRelay:
    """An aiohttp app on an ephemeral port of 127.0.0.1 that hands every request to `relay`
    (a subclass's): the base of the proxies that cut connections in the tests."""

    def __init__(self) -> None:
        self.runner: Any = None
        self.url = ""

    async def relay(self, request: Any) -> Any:
        raise NotImplementedError

    async def start(self) -> None:
        from aiohttp import web

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.relay)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
