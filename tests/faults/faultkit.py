"""Real peers in real processes on 127.0.0.1, for the fault tests.

`PeerProcess` runs `peer_proc.py` (a `Peer` with a store, the counting demo handler and a
small control API), waits for the endpoint it prints once listening, and can stop it with
SIGTERM or SIGKILL and start it again on the same port and store. `RawPartner` speaks to a
peer as one of its registered partners with hand-made, hand-signed envelopes, and `Sink` is
that partner's callback endpoint (it acknowledges, signed, what the peer POSTs to it).

Every wait is bounded: a test that cannot reach its goal fails with a timeout, never hangs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from rawpost import RawReply, sign

from benchmarks.ports import free_ports as free_ports  # re-exported
from synapse.types import (
    SIGNATURE_HEADER,
    format_timestamp,
    new_message_id,
    utc_now,
    verify_header_signature,
)

PEER_PROC = Path(__file__).with_name("peer_proc.py")
PATH = "/synapse/callback"
SECRET = "fault-test-secret-0123456789abcd"
CLIENT_TIMEOUT = aiohttp.ClientTimeout(total=15)
FINAL = {"completed", "failed", "cancelled", "rejected"}


def url(port: int) -> str:
    return f"http://127.0.0.1:{port}{PATH}"


async def eventually(
    probe: Callable[[], Awaitable[bool]], *, timeout: float, every: float = 0.1, what: str = ""
) -> None:
    """Poll `probe` until it returns true; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if await probe():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout} s: {what}")
        await asyncio.sleep(every)


@dataclass
class PeerProcess:
    """`peer_proc.py` as a child process; start it again with the same arguments."""

    agent_id: str
    port: int
    store: str
    peers: Mapping[str, str]
    workdir: Path
    options: Sequence[str] = ("--fast",)
    secret: str = SECRET
    proc: asyncio.subprocess.Process | None = None
    starts: int = 0
    session: aiohttp.ClientSession | None = field(default=None, repr=False)

    @property
    def endpoint(self) -> str:
        return url(self.port)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def executions_log(self) -> Path:
        return self.workdir / f"{self.agent_id}.executions"

    @property
    def log_path(self) -> Path:
        return self.workdir / f"{self.agent_id}.log"

    def argv(self) -> list[str]:
        argv = [
            sys.executable,
            str(PEER_PROC),
            "--agent-id",
            self.agent_id,
            "--port",
            str(self.port),
            "--store",
            self.store,
            "--secret",
            self.secret,
            "--executions-log",
            str(self.executions_log),
        ]
        for partner, endpoint in self.peers.items():
            argv += ["--peer", f"{partner}={endpoint}"]
        return argv + list(self.options)

    async def start(self, timeout: float = 20.0) -> str:
        assert self.proc is None or self.proc.returncode is not None, "already running"
        self.starts += 1
        with self.log_path.open("ab") as log:
            log.write(f"--- start {self.starts}\n".encode())
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv(),
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                stdin=asyncio.subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        assert self.proc.stdout is not None
        try:
            line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        except TimeoutError:
            self.kill()
            raise AssertionError(f"{self.agent_id} did not start: {self.tail()}") from None
        endpoint = line.decode().strip()
        assert endpoint == self.endpoint, f"{endpoint!r}; log: {self.tail()}"
        if self.session is None or self.session.closed:
            self.session = aiohttp.ClientSession(timeout=CLIENT_TIMEOUT)
        return endpoint

    def kill(self) -> None:
        """SIGKILL: no drain, no commit, no goodbye."""
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)

    async def wait(self, timeout: float = 10.0) -> int:
        assert self.proc is not None
        return await asyncio.wait_for(self.proc.wait(), timeout)

    async def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM and wait (SIGKILL if it does not exit in time)."""
        if self.proc is None or self.proc.returncode is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return await self.wait(timeout)
        except TimeoutError:
            self.kill()
            return await self.wait(timeout)

    async def crash(self) -> None:
        self.kill()
        await self.wait()

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.stop(5.0)
        self.kill()
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(Exception):
                await self.wait(5.0)
        if self.session is not None:
            await self.session.close()

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def log_events(self, event: str) -> list[dict[str, Any]]:
        found = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    entry = json.loads(line)
                    if entry.get("event") == event:
                        found.append(entry)
        return found

    def executions(self) -> dict[str, int]:
        """Handler starts per task, over every run of this peer (from the executions log)."""
        counts: dict[str, int] = {}
        if self.executions_log.exists():
            for line in self.executions_log.read_text().splitlines():
                counts[line] = counts.get(line, 0) + 1
        return counts

    # --- the control API --------------------------------------------------------------------

    async def _get(self, path: str) -> Any:
        assert self.session is not None
        async with self.session.get(self.base + path) as response:
            assert response.status == 200, await response.text()
            return await response.json()

    async def submit(
        self,
        partner: str,
        task_type: str,
        payload: Mapping[str, Any] | None = None,
        *,
        count: int = 1,
        prefix: str | None = None,
        deadline_in: float | None = None,
    ) -> list[str]:
        assert self.session is not None
        body = {
            "partner": partner,
            "task_type": task_type,
            "payload": dict(payload or {}),
            "count": count,
            "prefix": prefix,
            "deadline_in": deadline_in,
        }
        async with self.session.post(self.base + "/control/submit", json=body) as response:
            assert response.status == 200, await response.text()
            ids: list[str] = (await response.json())["task_ids"]
            return ids

    async def cancel(self, task_id: str, reason: str | None = None) -> None:
        """Cancel a task this peer requested (returns once the cancel is durable)."""
        assert self.session is not None
        body = {"task_id": task_id, "reason": reason}
        async with self.session.post(self.base + "/control/cancel", json=body) as response:
            assert response.status == 200, await response.text()

    async def tasks(self, *, history: bool = True) -> dict[str, dict[str, Any]]:
        """Every task of the peer by `task_id`, with its state, error and history."""
        got = await self._get(f"/control/tasks?history={int(history)}")
        return {t["task_id"]: t for t in got["tasks"]}

    async def summary(self) -> dict[str, int]:
        got = await self._get("/control/tasks?summary=1")
        states: dict[str, int] = got["states"]
        return states

    async def stats(self) -> dict[str, Any]:
        got: dict[str, Any] = await self._get("/control/stats")
        return got

    async def states(self, ids: Sequence[str]) -> dict[str, str | None]:
        tasks = await self.tasks(history=False)
        return {i: (tasks[i]["state"] if i in tasks else None) for i in ids}

    async def wait_states(
        self, ids: Sequence[str], accept: Callable[[str | None], bool], *, timeout: float
    ) -> dict[str, str | None]:
        last: dict[str, str | None] = {}

        async def probe() -> bool:
            nonlocal last
            try:
                last = await self.states(ids)
            except aiohttp.ClientError:
                return False
            return all(accept(s) for s in last.values())

        try:
            await eventually(probe, timeout=timeout, every=0.1)
        except AssertionError:
            raise AssertionError(f"{self.agent_id}: states {last}; log:\n{self.tail()}") from None
        return last

    async def wait_final(self, ids: Sequence[str], *, timeout: float) -> dict[str, str | None]:
        return await self.wait_states(ids, lambda s: s in FINAL, timeout=timeout)


# --- raw envelopes --------------------------------------------------------------------------


@dataclass
class RawPartner:
    """Speaks to a peer as its registered partner `agent_id` (whose endpoint is `endpoint`)."""

    agent_id: str
    endpoint: str
    peer_id: str
    peer_url: str
    session: aiohttp.ClientSession
    secret: str = SECRET

    def envelope(
        self,
        mtype: str,
        payload: Mapping[str, Any],
        *,
        message_id: str | None = None,
        timestamp: datetime | None = None,
    ) -> dict[str, Any]:
        return {
            "version": "1.0",
            "id": message_id or new_message_id(),
            "type": mtype if ":" in mtype else f"p2p:{mtype}",
            "from": {"agent_id": self.agent_id, "endpoint": self.endpoint},
            "to": {"agent_id": self.peer_id},
            "timestamp": format_timestamp(timestamp or utc_now()),
            "payload": dict(payload),
        }

    def task_request(
        self, task_id: str, task_type: str, payload: Mapping[str, Any], **kw: Any
    ) -> dict[str, Any]:
        task = {"id": task_id, "type": task_type, "priority": "normal", "payload": dict(payload)}
        return self.envelope("task_request", {"task": task}, **kw)

    def restamped(self, value: Mapping[str, Any], skew: float = 0.0) -> dict[str, Any]:
        """The same message (same id) with a new timestamp `skew` s from now."""
        return {**value, "timestamp": format_timestamp(utc_now() + timedelta(seconds=skew))}

    async def post_bytes(self, body: bytes, headers: Mapping[str, str]) -> RawReply:
        async with self.session.post(self.peer_url, data=body, headers=dict(headers)) as resp:
            return RawReply(resp.status, await resp.read(), dict(resp.headers))

    async def post(self, value: Mapping[str, Any]) -> RawReply:
        return await self.post_bytes(*sign(value, self.secret))


class Sink:
    """A registered partner's callback endpoint: records POSTs and acknowledges them, signed.

    `hold` (a message type) makes the sink keep its reply to such a POST until `release()`.
    """

    def __init__(self, agent_id: str, port: int, secret: str = SECRET) -> None:
        self.agent_id = agent_id
        self.port = port
        self.secret = secret
        self.received: list[dict[str, Any]] = []
        self.hold: str | None = None
        self.held = asyncio.Event()
        self._release = asyncio.Event()
        self.decision: Callable[[dict[str, Any]], tuple[str, dict[str, Any]]] | None = None
        self._runner: web.AppRunner | None = None

    @property
    def endpoint(self) -> str:
        return url(self.port)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post(PATH, self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True).start()

    async def close(self) -> None:
        self._release.set()
        if self._runner is not None:
            await self._runner.cleanup()

    def release(self) -> None:
        self._release.set()

    def of_type(self, mtype: str) -> list[dict[str, Any]]:
        return [m for m in self.received if m["type"] == f"p2p:{mtype}"]

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        signature = request.headers.get(SIGNATURE_HEADER, "")
        if not verify_header_signature((self.secret,), body, signature):
            return web.json_response({"unsigned": True}, status=403)
        message = json.loads(body)
        self.received.append(message)
        mtype = message["type"]
        payload = message["payload"]
        if self.decision is not None and mtype == "p2p:task_request":
            rtype, rpayload = self.decision(message)
        elif mtype == "p2p:heartbeat":
            rtype, rpayload = "p2p:heartbeat", {"status": "ok", "active_tasks": 0}
        elif mtype in ("p2p:task_complete", "p2p:task_failed"):
            state = "completed" if mtype == "p2p:task_complete" else "failed"
            rtype, rpayload = "p2p:task_ack", {"task_id": payload["task_id"], "state": state}
        else:
            rtype, rpayload = "p2p:ack", {}
        if self.hold is not None and mtype == f"p2p:{self.hold}":
            self.held.set()
            await asyncio.wait_for(self._release.wait(), 30)
        reply = {
            "version": "1.0",
            "id": new_message_id(),
            "type": rtype,
            "from": {"agent_id": self.agent_id, "endpoint": self.endpoint},
            "to": {"agent_id": message["from"]["agent_id"]},
            "timestamp": format_timestamp(utc_now()),
            "reply_to": message["id"],
            "payload": rpayload,
        }
        out, headers = sign(reply, self.secret)
        return web.Response(status=200, body=out, headers=headers)


def status_updates(task: Mapping[str, Any]) -> list[str]:
    """Message ids of the status updates a requester applied to `task` (from its history)."""
    return [h[3] for h in task["history"] if h[2] == "recv task_status_update"]


def assert_applied_once(task: Mapping[str, Any]) -> None:
    """No message moved the task twice, and it never left a final state."""
    ids = [h[3] for h in task["history"] if h[3] is not None]
    assert len(ids) == len(set(ids)), f"a message was applied twice: {task['history']}"
    finals = [h for h in task["history"] if h[1] in FINAL]
    assert len(finals) <= 1, f"more than one final transition: {task['history']}"
    if finals:
        assert task["history"][-1] is finals[0] or task["history"][-1] == finals[0]
