"""One `Peer` in its own process, for the fault tests (independent of `synapse serve`).

    python tests/faults/peer_proc.py --agent-id agent-e --port 8001 --store e.sqlite \\
        --peer agent-r=http://127.0.0.1:8002/synapse/callback --secret s3cret [--fast] ...

It serves the Synapse endpoint `POST /synapse/callback` and, beside it, a small control API
the tests drive it with (`/control/submit`, `/control/tasks`, `/control/stats`). Once it
accepts connections, with its tasks restored from the store, it prints its endpoint as the
first line of stdout. It logs (structlog, JSON lines) to stderr only, and exits cleanly on
SIGTERM or SIGINT; the tests also SIGKILL it.

With `--executions-log PATH` every start of a handler appends `requester/task_id` to PATH and
flushes, so that a test can count executions across a SIGKILL and a restart.

With `--required-by SECONDS` the information the demo handler asks for in its reply is
needed within that many seconds (`task_need_info.required_by`).

With `--humans PATH` (a TOML file of a `[humans]` table and `[[notify]]` routes, as
`synapse serve --config` reads them) the peer's people are asked its partners' questions.

With `--kill-on WHAT` (a task state such as `failed`, or `dead_letter`) the process SIGKILLs
itself the instant a task's move to that state, or a dead letter, is announced to its
listeners: what a user was told then must be what the store gives back after a restart.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import signal
import sys
import tomllib
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from aiohttp import web

from synapse.demo.handler import DemoHandler
from synapse.humans import HumansConfig, enable_humans, humans_config_from_toml
from synapse.logs import EventHandler
from synapse.p2p.config import P2PConfig
from synapse.p2p.engine import TaskKey, TaskRecord, Transition, Validation
from synapse.runtime.handler import ExecutionContext
from synapse.runtime.listener import RuntimeListener
from synapse.store import SqliteStore
from synapse.store.base import TaskStore
from synapse.store.memory import MemoryStore
from synapse.transport.partners import Partner
from synapse.transport.peer import Peer
from synapse.types import Capability

PATH = "/synapse/callback"


class CountingHandler:
    """The demo handler, counting (and optionally logging) every handler start."""

    def __init__(
        self, *, resumable: bool, log_path: str | None, required_by: float | None = None
    ) -> None:
        self.inner = DemoHandler()
        self.resumable = resumable
        #: Seconds from the request until the information asked for in the reply is needed
        #: (`task_need_info.required_by`; None: the demo handler's, none).
        self.required_by = required_by
        self.executions: Counter[str] = Counter()
        self._log = open(log_path, "a", encoding="utf-8") if log_path else None  # noqa: SIM115

    def get_capabilities(self) -> Sequence[Capability]:
        return self.inner.get_capabilities()

    def validate_task(self, task_type: str, payload: dict[str, Any]) -> Validation:
        validation = self.inner.validate_task(task_type, payload)
        if self.required_by is None or not isinstance(validation, Validation):
            return validation
        when = datetime.now(UTC) + timedelta(seconds=self.required_by)
        return dataclasses.replace(validation, required_by=when)

    def is_resumable(self, task_type: str) -> bool:
        return self.resumable

    async def execute_task(
        self, ctx: ExecutionContext, task_type: str, payload: dict[str, Any]
    ) -> Any:
        key = str(ctx.key)
        self.executions[key] += 1
        if self._log is not None:
            self._log.write(key + "\n")
            self._log.flush()
        return await self.inner.execute_task(ctx, task_type, payload)


class KillOnAnnouncement(RuntimeListener):
    """SIGKILL this process as soon as one of `what` is announced (see the module's docstring)."""

    def __init__(self, what: Sequence[str]) -> None:
        self.what = set(what)

    def on_transition(self, transition: Transition) -> None:
        if transition.to_state.value in self.what:
            os.kill(os.getpid(), signal.SIGKILL)

    def on_dead_letter(self, message: Any, partner: str, reason: str) -> None:
        if "dead_letter" in self.what:
            os.kill(os.getpid(), signal.SIGKILL)


def _record(rec: TaskRecord, *, history: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "key": str(rec.key),
        "requester": rec.key.requester,
        "task_id": rec.key.task_id,
        "role": rec.role.value,
        "state": rec.state.value,
        "error": (
            {
                "code": rec.error.code,
                "message": rec.error.message,
                "recoverable": rec.error.recoverable,
            }
            if rec.error
            else None
        ),
        "output": rec.result.output if rec.result else None,
        "dead_letters": list(rec.dead_letters),
    }
    if history:
        out["history"] = [
            [t.from_state.value, t.to_state.value, t.event.value, t.message_id] for t in rec.history
        ]
    return out


def _config(args: argparse.Namespace) -> P2PConfig:
    if not args.fast:
        return P2PConfig(max_concurrent_tasks=args.max_concurrent_tasks)
    return P2PConfig(
        max_retries=args.max_retries,
        retry_base_delay=0.05,
        retry_max_delay=0.2,
        heartbeat_interval=args.heartbeat_interval,
        request_timeout=5.0,
        max_concurrent_tasks=args.max_concurrent_tasks,
        dead_letter_after=args.dead_letter_after,
        task_timeout=args.task_timeout,
        input_timeout=args.input_timeout,
    )


def _routes(peer: Peer, handler: CountingHandler) -> list[web.RouteDef]:
    async def submit(request: web.Request) -> web.Response:
        body = await request.json()
        count = int(body.get("count", 1))
        prefix = body.get("prefix")
        deadline_in = body.get("deadline_in")
        deadline = (
            datetime.now(UTC) + timedelta(seconds=float(deadline_in)) if deadline_in else None
        )
        ids = []
        for i in range(count):
            handle = await peer.submit(
                body["partner"],
                body["task_type"],
                body.get("payload") or {},
                task_id=f"{prefix}-{i}" if prefix else None,
                deadline=deadline,
            )
            ids.append(handle.task_id)
        return web.json_response({"task_ids": ids})

    async def cancel(request: web.Request) -> web.Response:
        body = await request.json()
        handle = peer.protocol.handle(TaskKey(peer.agent_id, body["task_id"]))
        if handle is None:
            return web.json_response({"error": "no such task"}, status=404)
        await handle.cancel(body.get("reason"))
        return web.json_response({"cancelled": body["task_id"]})

    async def tasks(request: web.Request) -> web.Response:
        # Every task kept: in flight (in memory) and finished (in the store only).
        protocol = peer.protocol
        listed = protocol.list_tasks()
        if request.query.get("summary"):
            states = Counter(state.value for state in listed.values())
            return web.json_response({"states": dict(states), "total": len(listed)})
        history = request.query.get("history", "1") != "0"
        records = []
        for name in listed:
            requester, _, task_id = name.partition("/")
            rec = protocol.engine.get(TaskKey(requester, task_id))
            if rec is not None:
                records.append(_record(rec, history=history))
        return web.json_response({"tasks": records})

    async def stats(request: web.Request) -> web.Response:
        return web.json_response(
            {
                "executions": dict(handler.executions),
                "pending_deliveries": peer.protocol.pending_deliveries,
                "dead_letters": len(peer.protocol.store.load().dead_letters),
            }
        )

    return [
        web.post("/control/submit", submit),
        web.post("/control/cancel", cancel),
        web.get("/control/tasks", tasks),
        web.get("/control/stats", stats),
    ]


def _store(spec: str, busy_timeout: float) -> TaskStore:
    return MemoryStore() if spec == "memory" else SqliteStore(spec, busy_timeout=busy_timeout)


async def run(args: argparse.Namespace) -> None:
    config = _config(args)
    partners = []
    for item in args.peer:
        agent_id, _, url = item.partition("=")
        partners.append(Partner(agent_id, url, (args.secret,)))
    handler = CountingHandler(
        resumable=args.resumable, log_path=args.executions_log, required_by=args.required_by
    )
    peer = Peer(
        args.agent_id,
        partners=partners,
        handler=handler,
        config=config,
        store=_store(args.store, args.busy_timeout),
        serve=False,
    )
    humans = enable_humans(peer, args.humans) if args.humans is not None else None
    if args.kill_on:
        peer.client.listeners.append(KillOnAnnouncement(args.kill_on))
    app = web.Application(client_max_size=config.max_body_size + 1024)
    endpoint = f"http://{args.host}:{args.port}{PATH}"
    peer.attach(app, endpoint)
    app.add_routes(_routes(peer, handler))
    # Restore before accepting connections: nothing may reach a half-restored peer.
    await peer.start()
    if humans is not None:
        await humans.start()
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port, reuse_address=True)
    await site.start()
    print(endpoint, flush=True)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    if humans is not None:
        await humans.close()
    await peer.close(drain_timeout=args.drain_timeout)
    await runner.cleanup()


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agent-id", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--store", default="memory", help="PATH of an SQLite file, or memory")
    parser.add_argument("--peer", action="append", default=[], help="PARTNER_ID=CALLBACK_URL")
    parser.add_argument("--secret", required=True)
    parser.add_argument("--fast", action="store_true", help="short retries and heartbeats")
    parser.add_argument("--max-retries", type=int, default=2)
    parser.add_argument("--heartbeat-interval", type=float, default=0.3)
    parser.add_argument("--dead-letter-after", type=float, default=3600.0)
    parser.add_argument("--task-timeout", type=float, default=3600.0)
    parser.add_argument("--input-timeout", type=float, default=3600.0)
    parser.add_argument(
        "--required-by", type=float, default=None, help="SECONDS: need_info.required_by"
    )
    parser.add_argument("--max-concurrent-tasks", type=int, default=100)
    parser.add_argument("--resumable", action="store_true", help="handlers resume on restart")
    parser.add_argument("--executions-log", default=None)
    parser.add_argument("--drain-timeout", type=float, default=0.5)
    parser.add_argument("--busy-timeout", type=float, default=5.0, help="SQLite busy timeout")
    parser.add_argument("--log-level", default="warning")
    parser.add_argument("--humans", default=None, help="PATH of a [humans] TOML file")
    parser.add_argument(
        "--kill-on", action="append", default=[], help="a task state, or dead_letter"
    )
    return parser.parse_args(argv)


def people_of(path: str | None) -> HumansConfig | None:
    """The `[humans]` table and `[[notify]]` routes of the TOML file at `path`, if given."""
    if path is None:
        return None
    table = tomllib.loads(Path(path).read_text())
    return humans_config_from_toml(table["humans"], table.get("notify", []), base=Path(path).parent)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    args.humans = people_of(args.humans)  # read before the loop runs
    level = logging.getLevelNamesMapping()[args.log_level.upper()]
    root = logging.getLogger()
    root.addHandler(EventHandler(sys.stderr, json=True))
    root.setLevel(logging.WARNING)
    logging.getLogger("synapse").setLevel(level)
    if args.store != "memory":
        Path(args.store).parent.mkdir(parents=True, exist_ok=True)
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
