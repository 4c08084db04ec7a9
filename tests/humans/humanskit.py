"""Real receivers for the humans tests: an SMTP server (aiosmtpd) on 127.0.0.1 that requires
STARTTLS and a login, with a certificate of a test CA; and an HTTP server that keeps what
webhooks POST to it. Both let a test wait for what arrives, without sleeping."""

from __future__ import annotations

import asyncio
import contextlib
import email
import email.policy
import re
import ssl
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import trustme
from aiohttp import web
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

from benchmarks.ports import free_port as free_port  # re-exported
from synapse.humans import Channel

SMTP_USER, SMTP_PASSWORD = "synapse", "mail-secret"
LINK = re.compile(r"https?://\S+/humans/links/\S+")


@dataclass
class Mailbox:
    """What the SMTP server accepted, in order; `wait` for the n-th message."""

    messages: list[EmailMessage] = field(default_factory=list)
    logins: list[str] = field(default_factory=list)
    tls: list[bool] = field(default_factory=list)
    _changed: threading.Condition = field(default_factory=threading.Condition)

    def add(self, message: EmailMessage, tls: bool) -> None:
        with self._changed:
            self.messages.append(message)
            self.tls.append(tls)
            self._changed.notify_all()

    def of(self, task_id: str | None) -> list[EmailMessage]:
        return [m for m in self.messages if task_id is None or m["X-Synapse-Task"] == task_id]

    async def wait(
        self, count: int, task_id: str | None = None, timeout: float = 20.0
    ) -> list[EmailMessage]:
        """The first `count` e-mails (about `task_id`), once they arrived."""

        def until() -> bool:
            with self._changed:
                return self._changed.wait_for(lambda: len(self.of(task_id)) >= count, timeout)

        if not await asyncio.to_thread(until):
            raise AssertionError(f"{len(self.of(task_id))} e-mails arrived, {count} awaited")
        return self.of(task_id)


class _Handler:
    def __init__(self, box: Mailbox) -> None:
        self.box = box

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        parsed = email.message_from_bytes(envelope.content, policy=email.policy.default)
        assert isinstance(parsed, EmailMessage)
        self.box.add(parsed, session.ssl is not None)
        return "250 Message accepted for delivery"


def _authenticator(box: Mailbox) -> Callable[..., AuthResult]:
    def check(server: Any, session: Any, envelope: Any, mechanism: str, data: Any) -> AuthResult:
        ok = (
            isinstance(data, LoginPassword)
            and data.login.decode() == SMTP_USER
            and data.password.decode() == SMTP_PASSWORD
        )
        if ok:
            box.logins.append(data.login.decode())
        return AuthResult(success=ok, handled=False)

    return check


@dataclass
class SmtpServer:
    host: str
    port: int
    ca_file: Path
    box: Mailbox
    controller: Controller


def start_smtp(tmp: Path) -> SmtpServer:
    """An SMTP server on 127.0.0.1: STARTTLS required, then AUTH LOGIN/PLAIN required."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(context)
    ca_file = tmp / "smtp-ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    box = Mailbox()
    port = free_port()
    controller = Controller(
        _Handler(box),
        hostname="127.0.0.1",
        port=port,
        server_hostname="localhost",
        tls_context=context,
        require_starttls=True,
        auth_required=True,
        authenticator=_authenticator(box),
    )
    controller.start()
    return SmtpServer("127.0.0.1", port, ca_file, box, controller)


def mail_channel(smtp: SmtpServer) -> Channel:
    """The `email` channel of `smtp`: STARTTLS with the test CA, then the tests' login."""
    return Channel(
        "mail",
        "email",
        smtp_host=smtp.host,
        smtp_port=smtp.port,
        username=SMTP_USER,
        password=SMTP_PASSWORD,
        sender="synapse@example.com",
        ca_file=str(smtp.ca_file),
    )


def links_of(message: EmailMessage) -> dict[str, str]:
    """The links of a notification e-mail's plain text: action → URL."""
    body = message.get_body(preferencelist=("plain",))
    assert body is not None
    text = body.get_content()
    found = {}
    for line in text.splitlines():
        match = LINK.search(line)
        if match and ":" in line:
            found[line.split(":", 1)[0].strip().lower()] = match.group(0)
    return found


@dataclass
class Hook:
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class HookReceiver:
    """An HTTP server keeping every POST (path, headers, JSON body)."""

    url: str
    hooks: list[Hook]
    runner: web.AppRunner
    arrived: asyncio.Condition
    #: Answer with this status (to test failures); 200 otherwise.
    status: list[int] = field(default_factory=lambda: [200])
    #: While set, the next POST is kept waiting (unanswered) until this event is set.
    hold: list[asyncio.Event] = field(default_factory=list)

    async def wait(
        self,
        count: int,
        path: str | None = None,
        timeout: float = 20.0,
        task_id: str | None = None,
    ) -> list[Hook]:
        def matching() -> list[Hook]:
            return [
                h
                for h in self.hooks
                if (path is None or h.path == path)
                and (task_id is None or h.body.get("task_id") == task_id)
            ]

        async with asyncio.timeout(timeout), self.arrived:
            await self.arrived.wait_for(lambda: len(matching()) >= count)
        return matching()

    async def close(self) -> None:
        await self.runner.cleanup()


@contextlib.asynccontextmanager
async def running_hooks() -> AsyncIterator[HookReceiver]:
    """A webhook receiver for one test (the `hooks` fixtures)."""
    receiver = await start_hooks()
    try:
        yield receiver
    finally:
        await receiver.close()


async def start_hooks() -> HookReceiver:
    hooks: list[Hook] = []
    arrived = asyncio.Condition()
    receiver: list[HookReceiver] = []

    async def keep(request: web.Request) -> web.Response:
        hooks.append(Hook(request.path, dict(request.headers), await request.json()))
        async with arrived:
            arrived.notify_all()
        if receiver[0].hold:
            await receiver[0].hold.pop().wait()
        return web.Response(status=receiver[0].status[0], text="1")

    app = web.Application()
    app.router.add_post("/{name}", keep)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    receiver.append(HookReceiver(f"http://127.0.0.1:{port}", hooks, runner, arrived))
    return receiver[0]
