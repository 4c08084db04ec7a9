"""The processes the benchmarks talk to over loopback (run by `benchmarks._common.Child`).

    python -m benchmarks._worker ROLE [options]

Roles:

- `synapse-peer`: a Synapse `Peer` (memory store, signatures on) serving the demo handler, or
  a handler whose tasks wait forever (`--idle`); with `--a2a` it also serves the A2A binding.
  It drives load too (`load`: submit echo tasks to a partner and await them) and reports
  the latency of every HTTP exchange it POSTed, from its observers (`stats`).
- `bare-server`: the ceiling: aiohttp answering `POST /` with a small JSON reply.
- `http-client`: aiohttp POSTing a fixed body to a URL (the ceiling's client), or A2A
  `SendMessage` JSON-RPC calls (`--jsonrpc`), at a given concurrency.
- `sdk-server`: an echo agent built with the official A2A SDK (Starlette + uvicorn).
- `floor-executor`, `floor-requester`: the floor of `benchmarks.floor`.
- `fastest-executor`: the fastest floor of `benchmarks.fastest` (needs httptools).
- `pg-floor-executor`: the PostgreSQL floor of `benchmarks.pg_floor` (`--store URL`).

Each prints one JSON line once it accepts connections, then answers each JSON command read
from stdin (`load`, `stats`, `cpu`, `quit`, ...) with one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Any

from benchmarks import floor, pg_floor
from benchmarks._common import (
    HOST,
    answer,
    commands,
    cpu_now,
    drive,
    quiet_logging,
    send_message,
)

PATH = "/synapse/callback"

Op = Callable[[], Awaitable[None]]


# --- synapse-peer --------------------------------------------------------------------------------


class IdleHandler:
    """Accepts `echo`; its tasks execute forever (until cancelled or timed out)."""

    def get_capabilities(self) -> Sequence[str]:
        return ("echo",)

    def validate_task(self, task_type: str, payload: dict[str, Any]) -> Any:
        from synapse.p2p.engine import Validation

        return Validation()

    async def execute_task(self, ctx: Any, task_type: str, payload: dict[str, Any]) -> Any:
        await asyncio.Event().wait()


class ExchangeClock:
    """Latency of each HTTP exchange this peer POSTed, from the runtime's observers."""

    def __init__(self) -> None:
        self.sent: dict[str, float] = {}
        self.latencies: dict[str, list[float]] = defaultdict(list)
        self.served = 0

    def __call__(self, event: Any) -> None:
        if event.direction == "out":
            self.sent[event.message.id] = time.perf_counter()
        elif event.direction == "reply_in":
            started = self.sent.pop(event.message.reply_to, None)
            if started is not None:
                kind = event.message.message_type.value.removeprefix("p2p:")
                self.latencies[kind].append(time.perf_counter() - started)
        elif event.direction == "in":
            self.served += 1

    def summary(self) -> dict[str, Any]:
        every = [x for values in self.latencies.values() for x in values]
        return {
            "posted": len(every),
            "served": self.served,
            "latencies": every,
            "by_reply": {k: len(v) for k, v in self.latencies.items()},
        }

    def reset(self) -> None:
        self.latencies.clear()
        self.served = 0


def submitter(peer: Any, partner: str, task_type: str) -> Op:
    """One task submitted to `partner` and awaited to its end."""

    async def one() -> None:
        handle = await peer.submit(partner, task_type, {"text": "hello"})
        outcome = await handle
        if not outcome.ok:
            raise RuntimeError(f"task ended {outcome.state.value}")

    return one


async def synapse_peer(args: argparse.Namespace) -> None:
    from synapse.demo.handler import DemoHandler
    from synapse.p2p.config import P2PConfig
    from synapse.runtime.listener import OnMessage
    from synapse.store import SqliteStore
    from synapse.transport.partners import Partner
    from synapse.transport.peer import Peer
    from synapse.types import TaskState, utc_now

    partners = []
    for item in args.peer:
        agent_id, _, url = item.partition("=")
        partners.append(Partner(agent_id, url, (args.secret,)))
    config = P2PConfig(
        heartbeat_interval=args.heartbeat_interval,
        max_concurrent_tasks=args.max_concurrent_tasks,
        task_timeout=args.task_timeout,
    )
    handler: Any = IdleHandler() if args.idle else DemoHandler()
    store = SqliteStore(args.store) if args.store != "memory" else None
    peer = Peer(
        args.agent_id,
        partners=partners,
        handler=handler,
        port=args.port,
        config=config,
        store=store,
    )
    if args.a2a:
        from synapse.a2a import enable_a2a

        enable_a2a(peer, default_task_type="echo")
    clock = ExchangeClock()
    await peer.start()
    peer.protocol.listeners.append(OnMessage(clock))
    answer({"endpoint": peer.endpoint, "port": peer.port})
    held: list[Any] = []
    async for command in commands():
        cmd = command["cmd"]
        if cmd == "stats":
            answer(clock.summary())
            if command.get("reset"):
                clock.reset()
        elif cmd == "load":
            clock.reset()
            result = await drive(
                submitter(peer, command["partner"], command.get("task_type", "echo")),
                concurrency=command["concurrency"],
                seconds=command["seconds"],
                warmup=command["warmup"],
            )
            answer({**result, "exchanges": clock.summary()})
        elif cmd == "hold":
            # Submit `count` tasks that the partner executes forever; answer once all run.
            when = utc_now() + timedelta(seconds=command["deadline_in"])
            for i in range(command["count"]):
                # Distinct deadlines: every one is its own heap entry at the executor.
                handle = await peer.submit(
                    command["partner"],
                    "echo",
                    {"text": "idle"},
                    deadline=when + timedelta(milliseconds=i),
                )
                held.append(handle)
            limit = time.monotonic() + 120
            while time.monotonic() < limit:
                if all(h.state is TaskState.EXECUTING for h in held):
                    break
                await asyncio.sleep(0.2)
            states: dict[str, int] = defaultdict(int)
            for h in held:
                states[h.state.value] += 1
            gc.collect()
            answer({"states": dict(states)})
        else:
            answer({"error": f"unknown command {cmd!r}"})
    await peer.close(drain_timeout=0.2)


# --- bare aiohttp -------------------------------------------------------------------------------


async def bare_server(args: argparse.Namespace) -> None:
    from aiohttp import web

    served = 0
    reply = {"version": "1.0", "type": "p2p:ack", "id": "", "payload": {}}

    async def handle(request: web.Request) -> web.Response:
        nonlocal served
        body = json.loads(await request.read())
        served += 1
        out = {**reply, "id": uuid.uuid4().hex, "reply_to": body.get("id")}
        return web.Response(body=json.dumps(out).encode(), content_type="application/json")

    app = web.Application()
    app.router.add_post("/", handle)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, HOST, args.port, reuse_address=True)
    await site.start()
    answer({"url": f"http://{HOST}:{args.port}/"})
    async for _command in commands(cpu=False):
        answer({**cpu_now(), "served": served})
    await runner.cleanup()


def poster(session: Any, url: str, body: bytes) -> Op:
    """One POST of `body`, its JSON reply read and parsed (the ceiling)."""
    headers = {"Content-Type": "application/json"}

    async def one() -> None:
        async with session.post(url, data=body, headers=headers) as resp:
            json.loads(await resp.read())
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}")

    return one


def sender(session: Any, url: str) -> Op:
    """One A2A `SendMessage` JSON-RPC call, answered once the task is completed."""

    async def one() -> None:
        await send_message(session, url)

    return one


async def http_client(args: argparse.Namespace) -> None:
    import aiohttp

    connector = aiohttp.TCPConnector(limit=100)
    session = aiohttp.ClientSession(connector=connector)
    answer({"ok": True})
    async for command in commands():
        if command.get("jsonrpc"):
            one = sender(session, command["url"])
        else:
            one = poster(session, command["url"], command["body"].encode())
        answer(
            await drive(
                one,
                concurrency=command["concurrency"],
                seconds=command["seconds"],
                warmup=command["warmup"],
            )
        )
    await session.close()


# --- the official A2A SDK -----------------------------------------------------------------------


def sdk_app(port: int) -> Any:
    """An echo agent as the SDK documents it: executor, default handler, Starlette routes."""
    from a2a.helpers import get_message_text, new_task_from_user_message, new_text_part
    from a2a.server.agent_execution import AgentExecutor, RequestContext
    from a2a.server.events import EventQueue
    from a2a.server.request_handlers import DefaultRequestHandler
    from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
    from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
    from a2a.types.a2a_pb2 import AgentCapabilities, AgentCard, AgentInterface, AgentSkill
    from starlette.applications import Starlette

    class EchoExecutor(AgentExecutor):
        async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
            assert context.message is not None
            task = context.current_task
            if task is None:
                task = new_task_from_user_message(context.message)
                await event_queue.enqueue_event(task)
            updater = TaskUpdater(event_queue, task.id, task.context_id)
            await updater.start_work()
            text = get_message_text(context.message)
            await updater.add_artifact([new_text_part(text)], name="echo")
            await updater.complete()

        async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
            raise NotImplementedError

    card = AgentCard(
        name="sdk-echo",
        description="An echo agent built with the official A2A SDK",
        version="1.0.0",
        supported_interfaces=[
            AgentInterface(
                url=f"http://{HOST}:{port}/a2a",
                protocol_binding="JSONRPC",
                protocol_version="1.0",
            )
        ],
        capabilities=AgentCapabilities(streaming=True, push_notifications=False),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[AgentSkill(id="echo", name="Echo", description="Echoes", tags=["echo"])],
    )
    handler = DefaultRequestHandler(
        agent_executor=EchoExecutor(), task_store=InMemoryTaskStore(), agent_card=card
    )
    routes = [*create_agent_card_routes(card), *create_jsonrpc_routes(handler, "/a2a")]
    return Starlette(routes=routes)


def sdk_config(port: int) -> Any:
    import uvicorn

    return uvicorn.Config(
        sdk_app(port),
        host=HOST,
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="off",
    )


async def start_uvicorn(config: Any) -> tuple[Any, asyncio.Task[None]]:
    """A uvicorn server of `config` serving on this loop, once it accepts connections; and
    the task serving it (set `server.should_exit`, then await it, to stop)."""
    import uvicorn

    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    while not server.started:  # uvicorn says so by a flag only: poll it
        if serving.done():
            serving.result()
        await asyncio.sleep(0.02)
    return server, serving


async def sdk_server(args: argparse.Namespace, config: Any = None) -> None:
    """Serve as `uvicorn.run` would (its event loop and HTTP parser of choice: uvloop and
    httptools when installed), on this process's loop, and answer commands beside it."""

    config = config or sdk_config(args.port)
    server, serving = await start_uvicorn(config)
    answer(
        {
            "url": f"http://{HOST}:{args.port}/a2a",
            "loop": type(asyncio.get_running_loop()).__module__,
            "http": config.http_protocol_class.__module__,
        }
    )
    async for _command in commands(cpu=False):
        answer(cpu_now())
    server.should_exit = True
    await serving


def run_sdk_server(args: argparse.Namespace) -> None:
    config = sdk_config(args.port)
    factory = config.get_loop_factory()
    loop = factory() if factory is not None else asyncio.new_event_loop()
    try:
        loop.run_until_complete(sdk_server(args, config))
    finally:
        loop.close()


# --- main --------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks._worker")
    parser.add_argument(
        "role",
        choices=[
            "synapse-peer",
            "bare-server",
            "http-client",
            "sdk-server",
            "floor-executor",
            "floor-requester",
            "fastest-executor",
            "pg-floor-executor",
        ],
    )
    parser.add_argument("--agent-id", default="agent-e")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--peer", action="append", default=[], help="ID=CALLBACK_URL")
    parser.add_argument("--secret", default="bench-secret")
    parser.add_argument("--idle", action="store_true", help="tasks execute forever")
    parser.add_argument("--a2a", action="store_true", help="also serve the A2A binding")
    parser.add_argument("--store", default="memory")
    parser.add_argument("--heartbeat-interval", type=float, default=30.0)
    parser.add_argument("--task-timeout", type=float, default=300.0)
    parser.add_argument("--max-concurrent-tasks", type=int, default=100)
    parser.add_argument("--connections", type=int, default=0, help="client pool, 0: unlimited")
    parser.add_argument("--uvloop", action="store_true", help="run on uvloop's event loop")
    parser.add_argument(
        "--log-file", default=None, help="log as `synapse serve` does by default (info), here"
    )
    return parser.parse_args(argv)


async def fastest_executor(args: argparse.Namespace) -> None:
    from benchmarks.fastest import fastest_executor as run  # needs httptools (bench extra)

    await run(args)


ROLES: dict[str, Callable[[argparse.Namespace], Awaitable[None]]] = {
    "synapse-peer": synapse_peer,
    "bare-server": bare_server,
    "http-client": http_client,
    "floor-executor": floor.floor_executor,
    "floor-requester": floor.floor_requester,
    "fastest-executor": fastest_executor,
    "pg-floor-executor": pg_floor.pg_floor_executor,
}


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    quiet_logging()
    if args.log_file:
        from synapse.cli.logs import configure_logging

        configure_logging(stream=open(args.log_file, "a"))  # noqa: SIM115 (the process's)
    with contextlib.suppress(KeyboardInterrupt):
        if args.role == "sdk-server":
            run_sdk_server(args)
        elif args.uvloop:
            import uvloop

            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                runner.run(ROLES[args.role](args))
        else:
            asyncio.run(ROLES[args.role](args))


if __name__ == "__main__":
    main()
