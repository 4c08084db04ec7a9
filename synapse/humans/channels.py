"""Delivering one notification through one channel: SMTP (STARTTLS, then login) with the
standard library's client in a worker thread, or an HTTP POST (generic JSON, Slack, Teams).

One call is one attempt; the service retries (`synapse.humans.service`). A notification sent
again after a crash carries the same key: `Message-ID` for e-mail, `Idempotency-Key` for
webhooks, so the receiving side can tell it is the same one.
"""

from __future__ import annotations

import asyncio
import smtplib
import ssl
from typing import Any

import aiohttp

from synapse.humans.config import Channel
from synapse.humans.notices import Notice, email_message, slack_body, teams_body, webhook_body
from synapse.types.errors import SynapseException

#: Slack and Teams answer a webhook POST with 200 and a short text body.
MAX_ANSWER = 64 * 1024


class NotificationFailed(SynapseException):
    """One attempt at delivering a notification failed; the message says why."""


def _send_mail(channel: Channel, notice: Notice, to: str) -> None:
    message = email_message(notice, sender=channel.sender, to=to)
    context = ssl.create_default_context(cafile=channel.ca_file or None)
    with smtplib.SMTP(channel.smtp_host, channel.smtp_port, timeout=channel.timeout) as smtp:
        smtp.ehlo()
        if channel.starttls:
            smtp.starttls(context=context)
            smtp.ehlo()
        if channel.username:
            smtp.login(channel.username, channel.password)
        refused = smtp.send_message(message)
        if refused:
            raise NotificationFailed(f"the SMTP server refused {', '.join(refused)}")


async def send_email(channel: Channel, notice: Notice, to: str) -> None:
    try:
        await asyncio.to_thread(_send_mail, channel, notice, to)
    except (OSError, smtplib.SMTPException, ssl.SSLError) as exc:
        raise NotificationFailed(f"e-mail to {to} through {channel.name}: {exc}") from exc


def webhook_payload(channel: Channel, notice: Notice) -> dict[str, Any]:
    if channel.kind == "slack":
        return slack_body(notice)
    if channel.kind == "teams":
        return teams_body(notice)
    return webhook_body(notice)


async def send_webhook(session: aiohttp.ClientSession, channel: Channel, notice: Notice) -> None:
    headers = {"Idempotency-Key": notice.key, "User-Agent": "synapse-humans"}
    try:
        async with session.post(
            channel.url,
            json=webhook_payload(channel, notice),
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=channel.timeout),
            allow_redirects=False,
        ) as response:
            await response.content.read(MAX_ANSWER)
            if response.status >= 300:
                raise NotificationFailed(f"webhook {channel.name} answered HTTP {response.status}")
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise NotificationFailed(f"webhook {channel.name}: {exc!r}") from exc


__all__ = ["NotificationFailed", "send_email", "send_webhook", "webhook_payload"]
