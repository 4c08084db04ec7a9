"""`synapse mcp --http`: streamable HTTP for the official MCP client, behind bearer tokens and
OAuth 2.0 access tokens (JWTs of a local issuer), as on the A2A side."""

from __future__ import annotations

import contextlib
import select
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import httpx2
import mcp_types as types
import pytest
from clikit import Server, clean_env, command, run, stop_process
from mcp import Client
from mcp.client.session import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client
from mcpkit import ROOT, mcp_args, structured, text

sys.path.insert(0, str(Path(__file__).parent.parent / "security"))

from issuer import Issuer

TOKEN = "mcp-token-of-alice"
AUDIENCE = "synapse-mcp-tests"


@pytest.fixture
async def issuer() -> AsyncIterator[Issuer]:
    found = Issuer(audience=AUDIENCE)
    await found.start()
    try:
        yield found
    finally:
        await found.stop()


@contextlib.contextmanager
def mcp_http_process(
    executor: Server, requester_port: int, *extra: str
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`synapse mcp --http 127.0.0.1:0 …` as a process; yields it, once serving, with its MCP
    URL (read from its log)."""
    process = subprocess.Popen(
        command(*mcp_args(executor, requester_port, "--http", "127.0.0.1:0", *extra)),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
        cwd=str(ROOT),
    )
    try:
        yield process, _served_url(process)
    finally:
        stop_process(process)


@contextlib.contextmanager
def mcp_http(executor: Server, requester_port: int, *extra: str) -> Iterator[str]:
    """`mcp_http_process`'s URL only."""
    with mcp_http_process(executor, requester_port, *extra) as (_process, url):
        yield url


def _served_url(process: subprocess.Popen[str]) -> str:
    assert process.stderr is not None
    deadline = time.monotonic() + 30
    seen: list[str] = []
    while time.monotonic() < deadline:
        ready, _, _ = select.select([process.stderr], [], [], 0.1)
        if ready:
            line = process.stderr.readline()
            seen.append(line)
            if "serving MCP at " in line:
                return line.split("serving MCP at ", 1)[1].strip()
        if process.poll() is not None:
            break
    raise AssertionError(f"synapse mcp --http did not start: {''.join(seen)}")


def oauth_flags(issuer: Issuer) -> tuple[str, ...]:
    """`synapse mcp`'s flags for access tokens of `issuer`, for `AUDIENCE`."""
    return (
        "--mcp-oauth-issuer",
        issuer.base,
        "--mcp-oauth-jwks",
        issuer.jwks_url,
        "--mcp-oauth-audience",
        AUDIENCE,
    )


def authorized(url: str, token: str) -> Client:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30)
    return Client(streamable_http_client(url, http_client=http))


async def echo(client: Client, text: str) -> str:
    task = structured(
        await client.call_tool(
            "delegate_task", {"partner": "exec", "task_type": "echo", "payload": {"text": text}}
        )
    )
    output: str = task["result"]["output"]
    return output


async def status_without(url: str, token: str | None) -> tuple[int, str]:
    """What an `initialize` POST gets: the status and the `WWW-Authenticate` challenge."""
    headers = {"Accept": "application/json, text/event-stream"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"},
        },
    }
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, json=body, headers=headers) as response,
    ):
        return response.status, response.headers.get("WWW-Authenticate", "")


async def test_streamable_http_without_authentication(
    executor: Server, requester_port: int
) -> None:
    with mcp_http(executor, requester_port) as url:
        assert url.endswith("/mcp")
        async with Client(url) as client:
            assert await echo(client, "over streamable HTTP") == "over streamable HTTP"


def test_listening_beyond_loopback_with_nobody_checked_is_refused(
    executor: Server, requester_port: int
) -> None:
    """`--http 0.0.0.0:PORT` with no token and no issuer would serve every task to anyone on
    the network: refused (exit 2, one line) unless `--mcp-allow-anonymous` says so. (Refused
    before anything is bound.)"""
    refused = run(*mcp_args(executor, requester_port, "--http", "0.0.0.0:0"))
    assert refused.returncode == 2, refused.stderr
    [line] = refused.stderr.splitlines()
    assert "nobody would be checked" in line and "--mcp-allow-anonymous" in line


def test_a_loopback_server_with_nobody_checked_says_so(
    executor: Server, requester_port: int
) -> None:
    with mcp_http_process(executor, requester_port) as (process, _url):
        assert process.stderr is not None
        warning = process.stderr.readline()
        assert "warning: no --mcp-token or --mcp-oauth-issuer" in warning, warning


async def test_static_tokens_publish_no_authorization_server(
    executor: Server, requester_port: int, issuer: Issuer
) -> None:
    """The protected-resource metadata names an authorization server: with static tokens
    there is none, so none is published (it named this server, which issues nothing); with
    an OAuth issuer it names the issuer."""
    with mcp_http(executor, requester_port, "--mcp-token", f"{TOKEN}=alice") as url:
        base = url.rsplit("/mcp", 1)[0]
        status, challenge = await status_without(url, None)
        assert status == 401 and "resource_metadata" not in challenge
        async with (
            aiohttp.ClientSession() as session,
            session.get(base + "/.well-known/oauth-protected-resource/mcp") as response,
        ):
            assert response.status == 404
    flags = ("--mcp-oauth-issuer", issuer.base, "--mcp-oauth-jwks", issuer.jwks_url)
    with mcp_http(executor, requester_port, *flags) as url:
        base = url.rsplit("/mcp", 1)[0]
        async with (
            aiohttp.ClientSession() as session,
            session.get(base + "/.well-known/oauth-protected-resource/mcp") as response,
        ):
            assert response.status == 200
            metadata = await response.json()
        assert [s.rstrip("/") for s in metadata["authorization_servers"]] == [
            issuer.base.rstrip("/")
        ]


async def test_a_bearer_token_is_required_when_configured(
    executor: Server, requester_port: int
) -> None:
    with mcp_http(executor, requester_port, "--mcp-token", f"{TOKEN}=alice") as url:
        status, challenge = await status_without(url, None)
        assert status == 401 and challenge.startswith("Bearer")
        status, _ = await status_without(url, "a-token-nobody-gave-out")
        assert status == 401
        async with authorized(url, TOKEN) as client:
            assert await echo(client, "with a token") == "with a token"


async def test_oauth_access_tokens_of_the_issuer(
    executor: Server, requester_port: int, issuer: Issuer
) -> None:
    with mcp_http(executor, requester_port, *oauth_flags(issuer)) as url:
        expired = issuer.mint(exp=int(time.time()) - 3600)
        assert (await status_without(url, expired))[0] == 401
        elsewhere = issuer.mint(aud="another-service")
        assert (await status_without(url, elsewhere))[0] == 401
        async with authorized(url, issuer.mint()) as client:
            assert await echo(client, "with OAuth") == "with OAuth"


async def owner_and_other(owner: Client, other: Client) -> None:
    """`owner` delegates a long task; `other` neither sees, lists nor cancels it; the
    owner lists and cancels it."""
    started = structured(
        await owner.call_tool(
            "delegate_task",
            {
                "partner": "exec",
                "task_type": "slow",
                "payload": {"steps": 100, "delay": 0.1},
                "wait_seconds": 0.2,
            },
        )
    )
    task_id = started["task_id"]
    peeked = await other.call_tool("get_task", {"task_id": task_id})
    assert peeked.is_error and f"no task {task_id!r}" in text(peeked)
    assert (await other.call_tool("cancel_task", {"task_id": task_id})).is_error
    assert structured(await other.call_tool("list_tasks", {}))["tasks"] == []
    owned = structured(await owner.call_tool("list_tasks", {}))["tasks"]
    assert [t["task_id"] for t in owned] == [task_id]
    mine = structured(await owner.call_tool("cancel_task", {"task_id": task_id}))
    assert mine["status"] == "cancelled"


async def test_a_principal_sees_only_its_own_tasks(executor: Server, requester_port: int) -> None:
    tokens = ("--mcp-token", f"{TOKEN}=alice", "--mcp-token", "token-of-bob=bob")
    with mcp_http(executor, requester_port, *tokens) as url:
        async with authorized(url, TOKEN) as alice, authorized(url, "token-of-bob") as bob:
            await owner_and_other(alice, bob)


@pytest.mark.parametrize("mode", ["2026-07-28", "legacy"])
async def test_elicitation_progress_and_answers_over_http(
    executor: Server, requester_port: int, mode: str
) -> None:
    """The stdio flows over streamable HTTP: a need_info asked through elicitation (in the
    result on 2026-07-28, over the SSE back-channel before), progress notifications, and a
    decision answered with answer_task."""
    asked: list[str] = []
    progress: list[float] = []

    async def elicit(
        context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"style": "古典"})

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append(done)

    with mcp_http(executor, requester_port) as url:
        async with Client(url, elicitation_callback=elicit, mode=mode) as client:
            written = structured(
                await client.call_tool(
                    "delegate_task",
                    {
                        "partner": "exec",
                        "task_type": "text_generation",
                        "payload": {"prompt": "山"},
                    },
                )
            )
            slow = structured(
                await client.call_tool(
                    "delegate_task",
                    {"partner": "exec", "task_type": "slow", "payload": {"steps": 4, "delay": 0.1}},
                    progress_callback=on_progress,
                )
            )
        async with Client(url, mode=mode) as plain:
            waiting = structured(
                await plain.call_tool(
                    "delegate_task",
                    {"partner": "exec", "task_type": "portrait", "payload": {"subject": "Kim"}},
                )
            )
            approved = structured(
                await plain.call_tool(
                    "answer_task", {"task_id": waiting["task_id"], "decision": "approve"}
                )
            )
    assert written["result"]["metadata"]["style"] == "古典"
    assert len(asked) == 1
    assert slow["status"] == "completed"
    assert 100.0 in progress and progress == sorted(progress)
    assert waiting["status"] == "input_required"
    assert approved["status"] == "completed"


async def test_a_jwt_subject_is_not_the_static_token_of_the_same_name(
    executor: Server, requester_port: int, issuer: Issuer
) -> None:
    """Both ways of signing in at once: a token named alice and an issuer whose JWT says
    `sub: alice`. They are two principals (`alice` and `ISSUER#alice`): neither sees,
    lists nor cancels the other's task."""
    flags = ("--mcp-token", f"{TOKEN}=alice", *oauth_flags(issuer))
    with mcp_http(executor, requester_port, *flags) as url:
        async with (
            authorized(url, TOKEN) as by_token,
            authorized(url, issuer.mint(sub="alice")) as by_jwt,
        ):
            await owner_and_other(by_token, by_jwt)


def test_a_token_name_cannot_pose_as_an_oauth_principal(
    executor: Server, requester_port: int
) -> None:
    refused = run(
        *mcp_args(executor, requester_port, "--http", "127.0.0.1:0", "--mcp-token", "t=https://x#a")
    )
    assert refused.returncode == 2 and "may not contain '#'" in refused.stderr
