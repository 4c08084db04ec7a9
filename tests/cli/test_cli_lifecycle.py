"""A `synapse serve` process that stops, and requesters that must not wait forever: real
processes, real signals, real loopback HTTP.

- SIGTERM drains: new task requests get 503 `agent_not_ready`, heartbeats say `draining`,
  running tasks get `--drain-timeout` to finish, what is still running then fails with
  `execution_failed` "agent shutting down" (recoverable), and the process exits 0;
- a second signal stops at once;
- on a durable store, a resumable handler's running task is left for recovery and finishes
  after the restart;
- `synapse send --timeout` cancels and exits 1 with one line; Ctrl-C answered by 404 (the
  executor lost the task) exits at once.
"""

from __future__ import annotations

import asyncio
import select
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
from clikit import (
    EXECUTOR,
    REQUESTER,
    SECRET,
    Server,
    clean_env,
    client_args,
    command,
    error_lines,
    executor_args,
    free_port,
    run,
    serve,
    url,
)
from rawpost import RawAgent, check_nack

from synapse.p2p.config import P2PConfig
from synapse.runtime.protocol import TaskHandle
from synapse.transport.partners import Partner
from synapse.transport.peer import Peer
from synapse.types import ErrorCode, TaskState

FAST = P2PConfig(max_retries=2, retry_base_delay=0.05, retry_max_delay=0.2, request_timeout=5)
RESUMABLE = """
from synapse.demo.handler import DemoHandler


class Handler(DemoHandler):
    def is_resumable(self, task_type: str) -> bool:
        return True
"""


@asynccontextmanager
async def requester(server: Server, port: int) -> AsyncIterator[Peer]:
    peer = Peer(
        REQUESTER,
        partners=[Partner(EXECUTOR, server.url, (SECRET,))],
        port=port,
        config=FAST,
    )
    await peer.start()
    try:
        yield peer
    finally:
        await peer.close(drain_timeout=0)


async def until(predicate: Callable[[], bool], timeout: float = 20.0, what: str = "") -> None:
    async def poll() -> None:
        while not predicate():  # noqa: ASYNC110 - the state is another process's log
            await asyncio.sleep(0.02)

    try:
        await asyncio.wait_for(poll(), timeout)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what or predicate}") from None


def logged(server: Server, event: str) -> bool:
    return any(event in line for line in server.lines)


async def executing(*handles: TaskHandle) -> None:
    await until(lambda: all(h.state is TaskState.EXECUTING for h in handles), what="executing")


async def exit_status(server: Server, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while server.process.poll() is None and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    status = server.process.poll()
    assert status is not None, f"serve did not exit within {timeout} s"
    return status


async def test_sigterm_drains_then_fails_what_still_runs_and_exits_0() -> None:
    requester_port = free_port()
    with serve(*executor_args(requester_port, "--drain-timeout", "2")) as server:
        async with requester(server, requester_port) as peer, aiohttp.ClientSession() as session:
            quick = await peer.submit(EXECUTOR, "slow", {"steps": 3, "delay": 0.4})
            long = await peer.submit(EXECUTOR, "slow", {"steps": 100, "delay": 0.2})
            await executing(quick, long)
            started = time.monotonic()
            server.process.send_signal(signal.SIGTERM)
            await until(lambda: logged(server, "draining"), what="the drain")
            raw = RawAgent(session, REQUESTER, url(requester_port), SECRET, server.url, EXECUTOR)
            refused = await raw.post(raw.task_request("new-1", "echo", {"text": "hi"}))
            details = check_nack(refused, 503, "agent_not_ready", signed=True, secret=SECRET)
            assert details["reason"] == "draining"
            beat = await raw.send("heartbeat", {"status": "ok", "active_tasks": 0})
            assert beat.status == 200 and beat.payload["status"] == "draining"

            done = await quick.result(10)  # finishes within the drain
            assert done.state is TaskState.COMPLETED
            failed = await long.result(10)  # still running when the drain ends
            assert failed.state is TaskState.FAILED and failed.error is not None
            assert failed.error.code == ErrorCode.EXECUTION_FAILED.value
            assert failed.error.message == "agent shutting down"
            assert failed.error.recoverable is True
            assert time.monotonic() - started >= 2 - 0.2  # it had its drain time
            assert await exit_status(server, 15) == 0
    log = "".join(server.lines)
    assert "stopped" in log and "Traceback" not in log


async def test_a_second_signal_stops_at_once() -> None:
    requester_port = free_port()
    with serve(*executor_args(requester_port, "--drain-timeout", "60")) as server:
        async with requester(server, requester_port) as peer:
            long = await peer.submit(EXECUTOR, "slow", {"steps": 500, "delay": 0.2})
            await executing(long)
            server.process.send_signal(signal.SIGTERM)
            await until(lambda: logged(server, "draining"), what="the drain")
            started = time.monotonic()
            server.process.send_signal(signal.SIGTERM)
            assert await exit_status(server, 10) == 0
            assert time.monotonic() - started < 10  # far less than the 60 s drain
    assert logged(server, "stopping_now")


async def test_a_resumable_task_on_a_durable_store_is_left_for_recovery(tmp_path: Path) -> None:
    (tmp_path / "resumable.py").write_text(RESUMABLE)
    requester_port, port = free_port(), free_port()
    store = str(tmp_path / "e.sqlite")
    args = executor_args(
        requester_port, "--store", store, "--handler", "resumable:Handler", "--drain-timeout", "0.3"
    )
    with serve(*args, port=port, cwd=str(tmp_path)) as server:
        async with requester(server, requester_port) as peer:
            task = await peer.submit(EXECUTOR, "slow", {"steps": 8, "delay": 0.25})
            await executing(task)
            server.process.send_signal(signal.SIGTERM)
            assert await exit_status(server, 15) == 0
            assert not task.settled  # no task_failed: the task waits for the restart
            assert logged(server, "left_for_recovery=1")
            with serve(*args, port=port, cwd=str(tmp_path)) as again:
                outcome = await task.result(20)
                assert outcome.state is TaskState.COMPLETED, outcome
                assert logged(again, "restored")


def test_send_timeout_cancels_and_exits_1_with_one_line() -> None:
    requester_port = free_port()
    with serve(*executor_args(requester_port)) as server:
        started = time.monotonic()
        result = run(
            "send",
            *client_args(server, requester_port),
            "--timeout",
            "1",
            "slow",
            '{"steps": 100, "delay": 0.2}',
        )
        elapsed = time.monotonic() - started
    assert result.returncode == 1, result.stderr
    [line] = error_lines(result.stderr)
    assert line.startswith("synapse: timed out after 1s waiting for task "), line
    assert "cancel sent" in line
    assert elapsed < 15
    assert any("task_cancel" in entry for entry in server.lines), "".join(server.lines)


def test_ctrl_c_answered_by_404_exits_at_once() -> None:
    requester_port, port = free_port(), free_port()
    with serve(*executor_args(requester_port), port=port) as first:
        process = subprocess.Popen(
            command(
                "send", *client_args(first, requester_port), "slow", '{"steps": 500, "delay": 0.1}'
            ),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=clean_env(),
        )
        try:
            assert process.stderr is not None
            seen = ""
            deadline = time.monotonic() + 20
            while "progress" not in seen and time.monotonic() < deadline:
                if select.select([process.stderr], [], [], 0.2)[0]:
                    seen += process.stderr.readline()
            assert "progress" in seen, seen
            first.process.kill()  # the executor dies, and its memory store with it
            first.process.wait(5)
            with serve(*executor_args(requester_port), port=port):
                started = time.monotonic()
                process.send_signal(signal.SIGINT)
                _, err = process.communicate(timeout=20)
                elapsed = time.monotonic() - started
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(5)
    assert process.returncode == 1, seen + err
    [line] = error_lines(err)
    assert "task_not_found" in line, err
    assert elapsed < 10  # not the 15 s wait for a cancel's acknowledgement


async def test_sigusr1_dumps_what_the_peer_is_waiting_on_and_changes_nothing() -> None:
    """`kill -USR1`: every asyncio task with what it awaits, the running handlers, the
    delivery queues and the commits, on stderr; the peer goes on serving."""
    requester_port = free_port()
    with serve(*executor_args(requester_port)) as server:
        async with requester(server, requester_port) as peer:
            handle = await peer.submit(EXECUTOR, "slow", {"steps": 40, "delay": 0.1})
            await executing(handle)
            server.process.send_signal(signal.SIGUSR1)
            await until(lambda: logged(server, "=== end of dump ==="), what="the dump")
            text = "".join(server.lines)
            dump = text[text.index("=== synapse state dump") :]
            assert "handlers running: 1" in dump
            assert f"synapse-task-{REQUESTER}/{handle.task_id}" in dump
            assert "synapse-timers" in dump and "commits: started" in dump
            assert "execute_task (" in dump  # the handler's await chain, with file and line
            outcome = await handle.result(timeout=20)
            assert outcome.ok
        assert server.stop() == 0


def test_port_0_says_which_port_it_bound() -> None:
    """`--port 0` with an `--endpoint` of its own (a proxy's, say): the `listening` line
    still says the port the system chose, and that port answers."""
    import json
    import urllib.request

    with serve(
        *executor_args(free_port(), "--endpoint", "https://proxy.example/synapse/callback"),
        "--log-json",
        port=0,
    ) as server:
        event = json.loads(server.lines[0])
        assert event["event"] == "listening" and event["host"] == "127.0.0.1"
        port = int(event["port"])
        assert port > 0 and event["url"] == "https://proxy.example/synapse/callback"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as r:
            assert r.status == 200
