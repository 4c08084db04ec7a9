"""The HTTP client against a scripted partner on loopback: retries, signatures, replies."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest
from aiohttp import web

from benchmarks.ports import free_port
from synapse.logs import capture_events
from synapse.p2p.config import P2PConfig
from synapse.transport.client import (
    DeliveryError,
    HttpClient,
    encode_request,
    parse_retry_after,
)
from synapse.transport.inbound import Inbound, Refused, authenticate, encode_reply, nack_for
from synapse.transport.partners import Partner, PartnerRegistry
from synapse.transport.peer import HttpSender
from synapse.transport.retry import backoff_delay
from synapse.types import (
    SIGNATURE_HEADER,
    Ack,
    AckPayload,
    ErrorCode,
    Heartbeat,
    HeartbeatPayload,
    LocalProtocolError,
    Nack,
    Recipient,
    Sender,
    SynapseError,
    build_message_now,
    build_reply_now,
    decode_message,
    utc_now,
)

ME = "agent-r"
ME_ENDPOINT = "http://r.example/synapse/callback"
PEER = "agent-e"
SECRET = "shared-secret-0123456789abcdefgh"
CONFIG = P2PConfig(max_retries=3, retry_base_delay=0.01, retry_max_delay=5.0, request_timeout=2)
PEER_SENDER_ENDPOINT = "http://e.example/synapse/callback"

Action = Callable[["Received"], Awaitable[web.StreamResponse] | web.StreamResponse]


@dataclass
class Received:
    """One POST as the partner saw it."""

    body: bytes
    headers: dict[str, str]
    client_port: int
    inbound: Inbound | None = None
    refused: Refused | None = None
    transport: Any = None


@dataclass
class FakePartner:
    """A partner whose answers are scripted, one action per POST (then `default`)."""

    secrets: tuple[str, ...] = (SECRET,)
    script: list[Action] = field(default_factory=list)
    default: Action | None = None
    received: list[Received] = field(default_factory=list)

    def registry(self) -> PartnerRegistry:
        return PartnerRegistry([Partner(ME, ME_ENDPOINT, self.secrets)])

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        peer = request.transport.get_extra_info("peername") if request.transport else None
        seen = Received(body, dict(request.headers), peer[1] if peer else 0)
        seen.transport = request.transport
        try:
            seen.inbound = authenticate(
                body,
                request.headers.get(SIGNATURE_HEADER),
                partners=self.registry(),
                agent_id=PEER,
                now=utc_now(),
                config=P2PConfig(),
            )
        except Refused as refused:
            seen.refused = refused
        self.received.append(seen)
        action = self.script.pop(0) if self.script else (self.default or ack())
        response = action(seen)
        if not isinstance(response, web.StreamResponse):
            response = await response
        return response

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/synapse/callback", self.handle)
        return app

    @property
    def ids(self) -> list[str]:
        return [decode_message(r.body).id for r in self.received]


def _reply(
    message: Any, status: int = 200, *, secret: str | None = SECRET, **headers: str
) -> web.Response:
    sign_with = Partner(ME, ME_ENDPOINT, (secret,)) if secret else None
    body, all_headers = encode_reply(message, sign_with)
    all_headers.update(headers)
    return web.Response(status=status, body=body, headers=all_headers)


def _peer() -> Sender:
    return Sender(agent_id=PEER, endpoint=PEER_SENDER_ENDPOINT)


def ack(*, secret: str | None = SECRET, **changes: Any) -> Action:
    """Answer 200 with an ack of the request (signed with `secret`), after checking it."""

    def action(seen: Received) -> web.Response:
        if seen.refused is not None:
            error = seen.refused.error
            return _reply(
                seen.refused.nack(agent_id=PEER, endpoint=PEER_SENDER_ENDPOINT),
                error.http_status,
                secret=None,
            )
        request = decode_message(seen.body)
        reply = build_reply_now(Ack, AckPayload(), request=request, sender=_peer())
        if changes:
            reply = msgspec.structs.replace(reply, **changes)
        return _reply(reply, secret=secret)

    return action


def nack(status: int, code: ErrorCode, *, secret: str | None = None, **headers: str) -> Action:
    """Answer `status` with a nack (unsigned unless `secret`)."""

    def action(seen: Received) -> web.Response:
        request = decode_message(seen.body)
        message = nack_for(
            SynapseError(code, "scripted"),
            agent_id=PEER,
            endpoint=PEER_SENDER_ENDPOINT,
            request_id=request.id,
            to=ME,
        )
        return _reply(message, status, secret=secret, **headers)

    return action


def raw(status: int, body: bytes, **headers: str) -> Action:
    def action(seen: Received) -> web.Response:
        return web.Response(status=status, body=body, headers=headers)

    return action


@contextlib.asynccontextmanager
async def serving(app: web.Application, port: int = 0) -> AsyncIterator[int]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()


def endpoint(port: int) -> str:
    return f"http://127.0.0.1:{port}/synapse/callback"


class Sleeps:
    """An injected sleep: records the delays, sleeps none of them."""

    def __init__(self) -> None:
        self.delays: list[float] = []
        self.hooks: dict[int, Callable[[], Awaitable[None]]] = {}

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        hook = self.hooks.get(len(self.delays))
        if hook is not None:
            await hook()
        await asyncio.sleep(0)


class Clock:
    """Real time, one second later at each reading: every attempt has a distinct timestamp."""

    def __init__(self) -> None:
        self.now = utc_now()

    def __call__(self) -> datetime:
        self.now += timedelta(seconds=1)
        return self.now


def heartbeat(to: str = PEER) -> Heartbeat:
    return build_message_now(
        Heartbeat,
        HeartbeatPayload(),
        sender=Sender(agent_id=ME, endpoint=ME_ENDPOINT),
        to=to,
    )


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


@pytest.fixture
async def client(sleeps: Sleeps) -> AsyncIterator[HttpClient]:
    async with HttpClient(CONFIG, sleep=sleeps, clock=Clock(), jitter=lambda: 0.5) as client:
        yield client


@pytest.fixture
async def partner() -> AsyncIterator[tuple[FakePartner, Partner]]:
    fake = FakePartner()
    async with serving(fake.app()) as port:
        yield fake, Partner(PEER, endpoint(port), (SECRET, "older"))


# --- success and retries ------------------------------------------------------------------------


async def test_503_twice_then_200(
    client: HttpClient, partner: tuple[FakePartner, Partner], sleeps: Sleeps
) -> None:
    fake, peer = partner
    fake.script = [nack(503, ErrorCode.AGENT_NOT_READY)] * 2
    message = heartbeat()
    reply = await client.exchange(peer, message)
    assert reply.status == 200
    assert isinstance(reply.message, Ack)
    assert reply.verified and reply.attempts == 3
    assert reply.message.reply_to == message.id
    # Same id, refreshed timestamps, a fresh valid signature each time.
    assert fake.ids == [message.id] * 3
    assert all(r.inbound is not None and r.inbound.signed_by == "header" for r in fake.received)
    stamps = [decode_message(r.body).timestamp for r in fake.received]
    assert stamps == sorted(set(stamps))
    signatures = {r.headers[SIGNATURE_HEADER] for r in fake.received}
    assert len(signatures) == 3
    assert sleeps.delays == [0.01, 0.02]  # base·2^(n−1), jitter factor 1 here


def hang_up(seen: Received) -> web.Response:
    """Close the connection without a response (a server evicting an idle connection)."""
    seen.transport.close()
    return web.Response()


async def test_a_408_and_a_connection_closed_before_its_response_are_retried(
    client: HttpClient, partner: tuple[FakePartner, Partner], sleeps: Sleeps
) -> None:
    # Both are about the connection, never about the message: it was not read.
    fake, peer = partner
    fake.script = [
        raw(408, b'{"not": "an envelope"}'),
        hang_up,
        nack(408, ErrorCode.MESSAGE_FORMAT_INVALID),
    ]
    message = heartbeat()
    reply = await client.exchange(peer, message)
    assert reply.status == 200 and isinstance(reply.message, Ack)
    assert fake.ids == [message.id] * 4
    # The hang-up came on a kept-alive connection: the lean client sends it again at once on
    # a new one, as the same attempt (nothing of a response had come); aiohttp's client (used
    # while tracing hooks are installed) counts it as an attempt of its own.
    assert reply.attempts in (3, 4)


async def test_body_mode_signature(
    client: HttpClient, partner: tuple[FakePartner, Partner]
) -> None:
    fake, peer = partner
    fake.script = [nack(502, ErrorCode.AGENT_NOT_READY)]
    reply = await client.exchange(peer, heartbeat(), sender_mode="body")
    assert reply.verified and reply.attempts == 2
    assert [r.inbound.signed_by for r in fake.received if r.inbound] == ["body", "body"]
    assert all(SIGNATURE_HEADER not in r.headers for r in fake.received)
    signatures = [decode_message(r.body).signature for r in fake.received]
    assert len(set(signatures)) == 2


async def test_429_retry_after_is_honoured(
    client: HttpClient, partner: tuple[FakePartner, Partner], sleeps: Sleeps
) -> None:
    fake, peer = partner
    fake.script = [
        nack(429, ErrorCode.RATE_LIMITED, **{"Retry-After": "1"}),
        nack(503, ErrorCode.AGENT_NOT_READY, **{"Retry-After": "3600"}),  # capped
        nack(504, ErrorCode.AGENT_NOT_READY, **{"Retry-After": "soon"}),  # unreadable: backoff
    ]
    reply = await client.exchange(peer, heartbeat())
    assert reply.attempts == 4
    assert sleeps.delays == [1.0, CONFIG.retry_max_delay, 0.04]


async def test_partner_down_then_back(client: HttpClient, sleeps: Sleeps) -> None:
    fake = FakePartner()
    port = free_port()
    peer = Partner(PEER, endpoint(port), (SECRET,))
    stack = contextlib.AsyncExitStack()

    async def come_back() -> None:
        await stack.enter_async_context(serving(fake.app(), port))

    sleeps.hooks[2] = come_back  # two refused connections, then it listens
    async with stack:
        reply = await client.exchange(peer, heartbeat())
    assert reply.attempts == 3 and reply.verified
    assert len(fake.received) == 1


async def test_timeout_is_retried(sleeps: Sleeps, partner: tuple[FakePartner, Partner]) -> None:
    fake, peer = partner

    async def too_slow(seen: Received) -> web.StreamResponse:
        await asyncio.sleep(1)
        return ack()(seen)  # type: ignore[return-value]

    fake.script = [too_slow]
    config = P2PConfig(max_retries=1, retry_base_delay=0.01, request_timeout=0.2)
    async with HttpClient(config, sleep=sleeps) as client:
        reply = await client.exchange(peer, heartbeat())
    assert reply.attempts == 2
    assert fake.ids[0] == fake.ids[1]


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (500, ErrorCode.AGENT_NOT_READY),
        (400, ErrorCode.INVALID_PARAMS),
        (403, ErrorCode.PERMISSION_DENIED),
        (404, ErrorCode.TASK_NOT_FOUND),
        (409, ErrorCode.TASK_ALREADY_COMPLETED),
    ],
)
async def test_500_and_4xx_are_final(
    client: HttpClient, partner: tuple[FakePartner, Partner], status: int, code: ErrorCode
) -> None:
    fake, peer = partner
    fake.script = [nack(status, code)]
    reply = await client.exchange(peer, heartbeat())
    assert (reply.status, reply.attempts, reply.verified) == (status, 1, False)
    assert reply.is_nack and isinstance(reply.message, Nack)
    assert reply.message.payload.code == code.value
    assert len(fake.received) == 1


async def test_signed_nack_is_verified(
    client: HttpClient, partner: tuple[FakePartner, Partner]
) -> None:
    fake, peer = partner
    fake.script = [nack(400, ErrorCode.INVALID_PARAMS, secret=SECRET)]
    reply = await client.exchange(peer, heartbeat())
    assert reply.is_nack and reply.verified


async def test_max_retries_then_delivery_error(
    client: HttpClient, partner: tuple[FakePartner, Partner], sleeps: Sleeps
) -> None:
    fake, peer = partner
    fake.default = nack(503, ErrorCode.AGENT_NOT_READY)
    with pytest.raises(DeliveryError) as info:
        await client.exchange(peer, heartbeat())
    error = info.value
    assert error.retryable and error.status == 503
    assert error.attempts == CONFIG.max_retries + 1 == len(fake.received)
    assert error.reply is not None and error.reply.is_nack
    assert len(sleeps.delays) == CONFIG.max_retries


async def test_connection_refused_until_the_end(client: HttpClient, sleeps: Sleeps) -> None:
    peer = Partner(PEER, endpoint(free_port()), (SECRET,))
    with pytest.raises(DeliveryError) as info:
        await client.exchange(peer, heartbeat())
    assert info.value.retryable and info.value.status is None
    assert info.value.attempts == CONFIG.max_retries + 1
    assert info.value.__cause__ is not None


async def test_no_retries_configured(sleeps: Sleeps, partner: tuple[FakePartner, Partner]) -> None:
    fake, peer = partner
    fake.default = nack(503, ErrorCode.AGENT_NOT_READY)
    async with HttpClient(P2PConfig(max_retries=0), sleep=sleeps) as client:
        with pytest.raises(DeliveryError) as info:
            await client.exchange(peer, heartbeat())
    assert info.value.attempts == 1 and sleeps.delays == []


async def test_retries_overridden_per_call(
    client: HttpClient, partner: tuple[FakePartner, Partner], sleeps: Sleeps
) -> None:
    fake, peer = partner
    fake.default = nack(503, ErrorCode.AGENT_NOT_READY)
    with pytest.raises(DeliveryError) as info:
        await client.exchange(peer, heartbeat(), retries=1)
    assert info.value.attempts == 2 == len(fake.received)
    with pytest.raises(ValueError):
        await client.exchange(peer, heartbeat(), retries=-1)


# --- the reply is judged ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "action",
    [
        pytest.param(ack(secret="forged"), id="forged"),
        pytest.param(ack(secret=None), id="unsigned"),
        pytest.param(ack(reply_to="msg-other"), id="answers-another"),
        pytest.param(ack(to=Recipient(agent_id="x")), id="for-another"),
        pytest.param(ack(from_=Sender(agent_id="x", endpoint="http://x/")), id="from-another"),
        pytest.param(raw(200, b"<html>hello</html>"), id="not-json"),
        pytest.param(raw(200, b'{"a": 1}'), id="not-an-envelope"),
        pytest.param(raw(200, b'{"a": 1, "a": 1}'), id="not-i-json"),
        pytest.param(raw(500, b"Internal Server Error"), id="bare-500"),
        pytest.param(raw(503, b"Service Unavailable"), id="bare-503-exhausted"),
    ],
)
async def test_unacceptable_replies(
    client: HttpClient, partner: tuple[FakePartner, Partner], action: Action
) -> None:
    fake, peer = partner
    fake.default = action
    with pytest.raises(DeliveryError) as info:
        await client.exchange(peer, heartbeat())
    assert info.value.status in (200, 500, 503)
    assert info.value.retryable == (info.value.status == 503)


async def test_a_forged_ack_with_an_error_status_is_refused(
    client: HttpClient, partner: tuple[FakePartner, Partner]
) -> None:
    fake, peer = partner

    def signed_ack_400(seen: Received) -> web.Response:
        reply = build_reply_now(
            Ack, AckPayload(), request=decode_message(seen.body), sender=_peer()
        )
        return _reply(reply, 400)

    fake.script = [signed_ack_400]
    with pytest.raises(DeliveryError) as info:
        await client.exchange(peer, heartbeat())
    assert not info.value.retryable and info.value.status == 400


async def test_an_unsigned_nack_to_an_unread_request_is_accepted(
    client: HttpClient, partner: tuple[FakePartner, Partner]
) -> None:
    fake, peer = partner

    def too_large(seen: Received) -> web.Response:
        error = SynapseError(ErrorCode.MESSAGE_FORMAT_INVALID, "too large", http_status=413)
        message = nack_for(
            error, agent_id=PEER, endpoint=PEER_SENDER_ENDPOINT, request_id=None, to=None
        )
        return _reply(message, 413, secret=None)

    fake.script = [too_large]
    reply = await client.exchange(peer, heartbeat())
    assert (reply.status, reply.is_nack, reply.verified) == (413, True, False)


async def test_redirects_are_not_followed(
    client: HttpClient, partner: tuple[FakePartner, Partner]
) -> None:
    fake, peer = partner
    elsewhere = FakePartner()
    async with serving(elsewhere.app()) as port:
        fake.script = [raw(307, b"", Location=endpoint(port))]
        with pytest.raises(DeliveryError) as info:
            await client.exchange(peer, heartbeat())
    assert info.value.status == 307 and not info.value.retryable
    assert elsewhere.received == []


async def test_partner_without_secrets_exchanges_unsigned(client: HttpClient) -> None:
    fake = FakePartner(secrets=())
    async with serving(fake.app()) as port:
        reply = await client.exchange(Partner(PEER, endpoint(port)), heartbeat())
    assert reply.status == 200 and not reply.verified
    assert fake.received[0].inbound is not None
    assert fake.received[0].inbound.signed_by == "none"
    assert SIGNATURE_HEADER not in fake.received[0].headers


async def test_rotation_reply_signed_with_an_older_secret(client: HttpClient) -> None:
    fake = FakePartner()
    async with serving(fake.app()) as port:
        fake.script = [ack(secret="older")]
        reply = await client.exchange(Partner(PEER, endpoint(port), (SECRET, "older")), heartbeat())
    assert reply.verified


# --- the rest ---------------------------------------------------------------------------------


async def test_every_attempt_is_logged(
    client: HttpClient, partner: tuple[FakePartner, Partner]
) -> None:
    fake, peer = partner
    fake.script = [nack(503, ErrorCode.AGENT_NOT_READY)]
    message = heartbeat()
    with capture_events() as logs:
        await client.exchange(peer, message)
    attempts = [e for e in logs if e["event"] == "post_attempt"]
    assert [(e["attempt"], e["status"]) for e in attempts] == [(1, 503), (2, 200)]
    assert {e["message_id"] for e in attempts} == {message.id}
    assert {e["type"] for e in attempts} == {"p2p:heartbeat"}
    assert any(e["event"] == "post_retry" for e in logs)


async def test_one_kept_alive_connection_is_shared(
    client: HttpClient, partner: tuple[FakePartner, Partner]
) -> None:
    fake, peer = partner
    for _ in range(3):
        await client.exchange(peer, heartbeat())
    assert len({r.client_port for r in fake.received}) == 1


async def test_session_is_created_lazily_and_closed(
    partner: tuple[FakePartner, Partner],
) -> None:
    _, peer = partner
    client = HttpClient(CONFIG)
    try:
        assert (await client.exchange(peer, heartbeat())).status == 200
    finally:
        await client.close()
    await client.close()  # idempotent
    async with client:  # and reopens
        assert (await client.exchange(peer, heartbeat())).status == 200


async def test_local_errors_fail_loudly(
    client: HttpClient, partner: tuple[FakePartner, Partner]
) -> None:
    fake, peer = partner
    with pytest.raises(LocalProtocolError):
        await client.exchange(peer, heartbeat(to="agent-other"))
    reply_only = build_message_now(
        Ack, AckPayload(), sender=Sender(agent_id=ME, endpoint=ME_ENDPOINT), to=PEER
    )
    with pytest.raises(LocalProtocolError):
        await client.exchange(peer, reply_only)
    with pytest.raises(LocalProtocolError):
        await client.exchange(peer, msgspec.structs.replace(heartbeat(), reply_to="m"))
    assert fake.received == []


async def test_callback_sender_posts_only_to_registered_partners(
    client: HttpClient, partner: tuple[FakePartner, Partner]
) -> None:
    fake, peer = partner
    sender = HttpSender(client, PartnerRegistry([peer]), "body")
    reply = await sender.send_callback(PEER, heartbeat())
    assert reply.reply_to is not None
    assert [r.inbound.signed_by for r in fake.received if r.inbound] == ["body"]
    with pytest.raises(LocalProtocolError):
        await sender.send_callback("agent-unknown", heartbeat())
    assert len(fake.received) == 1


# --- pure helpers -----------------------------------------------------------------------------


def test_backoff_doubles_with_jitter_and_a_cap() -> None:
    config = P2PConfig()  # 2 s base, 120 s cap
    assert [backoff_delay(n, config) for n in range(1, 6)] == [2, 4, 8, 16, 32]
    assert backoff_delay(1, config, 0.0) == 1.5
    assert backoff_delay(1, config, 0.999) == pytest.approx(2.5, abs=0.01)
    assert backoff_delay(7, config) == 120
    assert backoff_delay(1000, config) == 120


def test_parse_retry_after() -> None:
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert parse_retry_after(None, now) is None
    assert parse_retry_after("0", now) == 0
    assert parse_retry_after(" 17 ", now) == 17
    assert parse_retry_after("Thu, 01 Jan 2026 12:00:30 GMT", now) == 30
    assert parse_retry_after("Thu, 01 Jan 2026 11:00:00 GMT", now) == 0  # past
    assert parse_retry_after("-5", now) is None
    assert parse_retry_after("1.5", now) is None
    assert parse_retry_after("tomorrow", now) is None


def test_encode_request_modes() -> None:
    message = heartbeat()
    body, headers = encode_request(message, SECRET, "header")
    assert headers["Content-Type"] == "application/json" and SIGNATURE_HEADER in headers
    body, headers = encode_request(message, SECRET, "body")
    assert SIGNATURE_HEADER not in headers
    assert decode_message(body).signature is not None
    body, headers = encode_request(message, None, "body")
    assert SIGNATURE_HEADER not in headers and decode_message(body).signature is None


@pytest.mark.parametrize("path", ["lean", "aiohttp"])
async def test_both_http_clients_deliver_alike_and_plain_http_takes_the_lean_one(
    path: str, partner: tuple[FakePartner, Partner], monkeypatch: pytest.MonkeyPatch
) -> None:
    import aiohttp

    from synapse.transport import client as client_module

    # Tracing's hooks exist only in aiohttp: it takes over while they are installed (and a
    # tracing test earlier in this process may have installed them for good).
    hooks = [aiohttp.TraceConfig()] if path == "aiohttp" else []
    monkeypatch.setattr(client_module, "TRACE_CONFIGS", hooks)
    fake, peer = partner
    fake.script = [lambda seen: _reply(decode_message(seen.body), 503, secret=None)]
    sleeps = Sleeps()
    async with HttpClient(CONFIG, sleep=sleeps) as client:
        reply = await client.exchange(peer, heartbeat())
        assert reply.status == 200 and reply.verified and reply.attempts == 2
        assert (client._session is None) == (path == "lean")
        assert (client._lean is None) == (path == "aiohttp")
    assert [r.inbound is not None for r in fake.received] == [True, True]
    assert "Content-Length" in fake.received[0].headers


async def test_a_reply_over_the_body_limit_is_final_with_its_status(
    partner: tuple[FakePartner, Partner],
) -> None:
    fake, peer = partner
    fake.default = lambda seen: web.Response(status=200, body=b"x" * 5000)
    async with HttpClient(P2PConfig(max_body_size=4096, max_retries=3)) as client:
        with pytest.raises(DeliveryError, match="exceeds 4096 bytes") as info:
            await client.exchange(peer, heartbeat())
    assert not info.value.retryable and info.value.status == 200
    assert len(fake.received) == 1
