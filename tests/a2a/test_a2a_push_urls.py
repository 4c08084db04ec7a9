"""Push URLs are compared as they will be sent (issue 12 §3).

With the allowlist `http://127.0.0.1:H/hooks/`, no spelling of a path outside `/hooks/`
(dot segments, percent-encoded dots, encoded slashes, userinfo) is accepted, and an accepted
URL in any spelling is kept and POSTed to in its RFC 3986 normal form: a webhook that records
every path it is sent to sees `/hooks/a2a` and nothing else.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from a2akit import A2APeer
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st
from test_a2a_binding import code, rpc, send_params

from synapse.a2a.server.push import MAX_PUSH_URL, PushAllowlist, normalize_url


class PathRecorder:
    """A webhook server on the allowlisted port that records the path of every POST."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.paths: list[str] = []
        self.arrived = asyncio.Event()
        self.runner: web.AppRunner | None = None

    async def _any(self, request: web.Request) -> web.Response:
        self.paths.append(request.raw_path)
        self.arrived.set()
        return web.Response(status=204)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("POST", "/{tail:.*}", self._any)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port, reuse_address=True).start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


@pytest.fixture
async def recorder(a2a_peer: A2APeer) -> AsyncIterator[PathRecorder]:
    hook = PathRecorder(a2a_peer.hook_port)
    await hook.start()
    yield hook
    await hook.stop()


ESCAPES = [
    "/hooks/../admin",
    "/hooks/%2e%2e/admin",
    "/hooks/%2E%2E/admin",
    "/hooks/.%2e/admin",
    "/hooks/%2e./admin",
    "/hooks/./../admin",
    "/hooks/a/../../admin",
    "/hooks/..",
    "/hooks/%2e%2e%2fadmin",
    "/hooks/..%2Fadmin",
    "/hooks/..%5cadmin",
    "/hooks\\..\\admin",
    "/hook%73/../admin",
]


@pytest.mark.parametrize("path", ESCAPES)
async def test_no_spelling_of_a_path_outside_the_allowlist_is_accepted(
    a2a_peer: A2APeer, recorder: PathRecorder, path: str
) -> None:
    base = a2a_peer.base_url
    slow = send_params(data={"steps": 3, "delay": 0.05}, metadata={"task_type": "slow"})
    slow["configuration"] = {"returnImmediately": True}
    _, started = await rpc(base, "SendMessage", slow)
    task_id = started["result"]["task"]["id"]
    url = f"http://127.0.0.1:{a2a_peer.hook_port}{path}"
    _, answer = await rpc(base, "CreateTaskPushNotificationConfig", {"taskId": task_id, "url": url})
    assert code(answer) == -32602, answer
    assert answer["error"]["data"][0]["metadata"]["reason"] == "push_url_not_allowed"
    await rpc(base, "CancelTask", {"id": task_id})
    assert not [p for p in recorder.paths if not p.startswith("/hooks/")]


@pytest.mark.parametrize(
    "url",
    [
        "http://user@127.0.0.1:{port}/hooks/a2a",
        "http://user:pw@127.0.0.1:{port}/hooks/a2a",
        "http://@127.0.0.1:{port}/hooks/a2a",
        "http://127.0.0.1:{port}@evil.example/hooks/a2a",
    ],
)
async def test_userinfo_is_refused(a2a_peer: A2APeer, url: str) -> None:
    base = a2a_peer.base_url
    _, started = await rpc(base, "SendMessage", {**send_params(text="x")})
    task_id = started["result"]["task"]["id"]
    _, answer = await rpc(
        base,
        "CreateTaskPushNotificationConfig",
        {"taskId": task_id, "url": url.format(port=a2a_peer.hook_port)},
    )
    assert code(answer) == -32602, answer


async def test_a_push_url_is_at_most_2048_characters(a2a_peer: A2APeer) -> None:
    base = a2a_peer.base_url
    _, started = await rpc(base, "SendMessage", {**send_params(text="x")})
    task_id = started["result"]["task"]["id"]
    prefix = f"http://127.0.0.1:{a2a_peer.hook_port}/hooks/"
    for length, accepted in ((MAX_PUSH_URL, True), (MAX_PUSH_URL + 1, False), (100_000, False)):
        url = prefix + "a" * (length - len(prefix))
        _, answer = await rpc(
            base, "CreateTaskPushNotificationConfig", {"taskId": task_id, "url": url}
        )
        if accepted:
            assert answer["result"]["url"] == url, answer
        else:
            assert code(answer) == -32602, answer
            assert "2048" in answer["error"]["message"]


async def test_an_accepted_url_is_kept_and_sent_in_its_normal_form(
    a2a_peer: A2APeer, recorder: PathRecorder
) -> None:
    base = a2a_peer.base_url
    slow = send_params(data={"steps": 2, "delay": 0.05}, metadata={"task_type": "slow"})
    slow["configuration"] = {"returnImmediately": True}
    _, started = await rpc(base, "SendMessage", slow)
    task_id = started["result"]["task"]["id"]
    spelled = f"HTTP://127.0.0.1:{a2a_peer.hook_port}/hooks/x/%2E%2e/%61%32a"
    _, created = await rpc(
        base, "CreateTaskPushNotificationConfig", {"taskId": task_id, "url": spelled, "id": "c"}
    )
    assert created["result"]["url"] == f"http://127.0.0.1:{a2a_peer.hook_port}/hooks/a2a"
    async with asyncio.timeout(10):
        while not recorder.paths:
            recorder.arrived.clear()
            await recorder.arrived.wait()
    await rpc(base, "CancelTask", {"id": task_id})
    assert set(recorder.paths) == {"/hooks/a2a"}


def test_normal_forms() -> None:
    assert normalize_url("HTTP://Example.COM:80/a/./b/../c") == "http://example.com/a/c"
    assert normalize_url("https://example.com:443") == "https://example.com/"
    assert normalize_url("http://example.com:8080/%7e%41?q=%2f%7e") == (
        "http://example.com:8080/~A?q=%2F~"
    )
    assert normalize_url("http://[::1]:9/x#frag") == "http://[::1]:9/x"
    for bad in (
        "http://u@example.com/",
        "http://example.com/%zz",
        "http://example.com/a%2fb",
        "http://exa%6dple.com/",
        "http://example.com/a b",
        "http://example.com/é",
        "ftp://example.com/",
        "http:///x",
    ):
        assert normalize_url(bad) is None, bad


SEGMENTS = ["a", ".", "..", "%2e", "%2E%2e", ".%2e", "hooks", ""]


@given(st.lists(st.sampled_from(SEGMENTS), max_size=8))
def test_allowed_means_the_normal_form_is_under_the_entry(segments: list[str]) -> None:
    allow = PushAllowlist(["http://127.0.0.1:9000/hooks/"])
    url = "http://127.0.0.1:9000/hooks/" + "/".join(segments)
    normal = normalize_url(url)
    assert normal is not None
    assert allow.allows(url) == normal.startswith("http://127.0.0.1:9000/hooks/")
    assert normalize_url(normal) == normal  # idempotent
