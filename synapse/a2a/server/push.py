"""A2A push notifications, delivered through the Synapse outbox.

Each push configuration of a task is a virtual partner, `a2a-push:<task id>/<config id>`.
When the A2A binding learns something about a task (a Synapse callback reached it, or a
synchronous decision, or a cancel), it queues a copy of that Synapse message for each of
the task's push configurations in the runtime's outbox. The outbox delivers them one at a
time and in order, keeps them durably until acknowledged, parks them after the retries run
out until the next heartbeat, and dead-letters them after `dead_letter_after`, exactly like
callbacks to a real partner. `PushSender` is the `CallbackSender` behind that prefix: it
turns each message into an A2A `StreamResponse` and POSTs it to the webhook with the
configuration's token (`X-A2A-Notification-Token`), its `Authorization`, and an
`X-Synapse-Signature` (HMAC-SHA256 of the body, specs/protocol.md, 'Signatures' header mode) when
the operator
configured a push secret. The body carries the message id and timestamp in
`metadata.synapse`, so a receiver can deduplicate retries and refuse stale replays.

Only URLs the operator allowed receive notifications (`PushAllowlist`).
"""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime
from typing import Any, Protocol
from urllib.parse import urlsplit

import aiohttp
import yarl

from synapse._distribution import NAME
from synapse.a2a import wire
from synapse.a2a.server.push_health import PushHealthBook
from synapse.logs import get_logger
from synapse.p2p.config import P2PConfig
from synapse.runtime.sender import DeliveryError
from synapse.transport.client import RETRYABLE_STATUSES, TRACE_CONFIGS, parse_retry_after
from synapse.transport.retry import RetriesExhausted, Transient, retrying
from synapse.types import (
    Ack,
    AckPayload,
    Heartbeat,
    HeartbeatPayload,
    Message,
    Sender,
    build_reply_now,
    format_timestamp,
)
from synapse.types.signing import SIGNATURE_HEADER, Secret, header_signature

log = get_logger("synapse.a2a.server.push")

#: Agent-id prefix of the virtual partners that stand for push configurations.
PUSH_PREFIX = "a2a-push:"
USER_AGENT = f"{NAME}-a2a-push/0.1"

Sleep = Callable[[float], Awaitable[None]]


def push_partner(task_id: str, config_id: str) -> str:
    return f"{PUSH_PREFIX}{task_id}/{config_id}"


_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
#: What may appear, unencoded, in a normalized path or query (RFC 3986 pchar, "/" and "?").
_PATH_CHARS = _UNRESERVED | frozenset("!$&'()*+,;=:@/%")
_QUERY_CHARS = _PATH_CHARS | frozenset("?")
_HOST = re.compile(r"[a-z0-9._~!$&'()*+,;=-]+|\[[0-9a-f:.]+\]")
_HEX = frozenset("0123456789ABCDEFabcdef")


def _normalize_percent(text: str, allowed: frozenset[str], *, path: bool) -> str | None:
    """Decode percent-encoded unreserved characters, upper-case the other escapes (RFC 3986
    §6.2.2.2); None for an invalid escape, a character outside `allowed`, or an encoded
    "/" or "\\" (a server may decode it into a path separator)."""
    out: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char == "%":
            pair = text[i + 1 : i + 3]
            if len(pair) != 2 or not set(pair) <= _HEX:
                return None
            decoded = chr(int(pair, 16))
            if decoded in _UNRESERVED:
                out.append(decoded)
            elif path and decoded in "/\\":
                return None
            else:
                out.append("%" + pair.upper())
            i += 3
            continue
        if char not in allowed:
            return None
        out.append(char)
        i += 1
    return "".join(out)


def _remove_dot_segments(path: str) -> str:
    """RFC 3986 §5.2.4, for an absolute path."""
    out: list[str] = []
    segments = path.split("/")[1:]
    for index, segment in enumerate(segments):
        last = index == len(segments) - 1
        if segment in (".", ".."):
            if segment == ".." and out:
                out.pop()
            if last:
                out.append("")
        else:
            out.append(segment)
    return "/" + "/".join(out)


#: The longest push URL a client may configure (characters, as given): a configuration is
#: stored with its task and every notification is POSTed to it.
MAX_PUSH_URL = 2048


def normalize_url(url: str) -> str | None:
    """`url` in RFC 3986 normal form (§6.2.2: case of scheme and host, percent-encoding of
    unreserved characters, dot segments; and the scheme's default port left out), or None
    if it is not an http(s) URL a webhook may have: userinfo, an encoded "/" or "\\", a
    backslash, or any character outside RFC 3986 refuse it. The fragment, never sent, is
    dropped. What this returns is what is compared with the allowlist and what is POSTed to.
    """
    if not url.isascii() or any(c.isspace() or ord(c) < 0x20 for c in url) or "\\" in url:
        return None
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or "@" in parts.netloc:
        return None
    host = (parts.netloc.rpartition(":")[0] if port is not None else parts.netloc).lower()
    if not _HOST.fullmatch(host):  # no escapes in a host: one spelling per name
        return None
    path = _normalize_percent(parts.path or "/", _PATH_CHARS, path=True)
    query = _normalize_percent(parts.query, _QUERY_CHARS, path=False)
    if path is None or query is None or not path.startswith("/"):
        return None
    path = _remove_dot_segments(path)
    default = 443 if scheme == "https" else 80
    netloc = host if port in (None, default) else f"{host}:{port}"
    return f"{scheme}://{netloc}{path}" + (f"?{query}" if query else "")


#: An allowlist entry whose port is `*` (any port): group 1 ends with its host.
_ANY_PORT = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^/:@]+):\*(?=/|$)")


def _normalized(url: str) -> tuple[str, str, int, str] | None:
    """(scheme, host, port, path) of the normal form of `url` (see `normalize_url`)."""
    normal = normalize_url(url)
    if normal is None:
        return None
    parts = urlsplit(normal)
    scheme, host = parts.scheme, parts.netloc.rpartition(":")[0] if parts.port else parts.netloc
    return scheme, host, parts.port or (443 if scheme == "https" else 80), parts.path


class PushAllowlist:
    """The webhook URLs the operator allows: each entry is a URL prefix (scheme, host and
    port must match exactly, the path must start with the entry's path; a port written `*`,
    as in `http://127.0.0.1:*/hooks/`, matches any port of that host). Empty: push
    notifications are off."""

    def __init__(self, prefixes: Iterable[str] = ()) -> None:
        self.prefixes = tuple(prefixes)
        #: (scheme, host, port or None for any, path) of each entry.
        self._entries: list[tuple[str, str, int | None, str]] = []
        for prefix in self.prefixes:
            any_port = _ANY_PORT.match(prefix)
            # Checked (and kept) without its port when the port is any.
            portless = prefix if any_port is None else _ANY_PORT.sub(r"\1", prefix, count=1)
            entry = _normalized(portless)
            if entry is None:
                raise ValueError(f"push allowlist entry {prefix!r} is not an http(s) URL")
            scheme, host, port, path = entry
            self._entries.append((scheme, host, None if any_port else port, path))

    def __bool__(self) -> bool:
        return bool(self._entries)

    def allows(self, url: str) -> bool:
        """Whether `url`, in its normal form (see `normalize_url`), is under an entry."""
        candidate = _normalized(url)
        if candidate is None:
            return False
        scheme, host, port, path = candidate
        for e_scheme, e_host, e_port, e_path in self._entries:
            if (scheme, host) != (e_scheme, e_host) or e_port not in (None, port):
                continue
            if path == e_path or path.startswith(e_path.rstrip("/") + "/") or e_path == "/":
                return True
        return False


class PushTargets(Protocol):
    """What the sender asks of the A2A service (`A2AService`) it sends for."""

    @property
    def allowlist(self) -> PushAllowlist: ...

    def push_target(
        self, partner: str, message: Message
    ) -> tuple[wire.TaskPushNotificationConfig, wire.StreamResponse] | None:
        """The configuration `partner` stands for, and the notification `message` becomes."""
        ...


class PushSender:
    """The `CallbackSender` for `a2a-push:` partners: POSTs A2A notifications to webhooks."""

    def __init__(
        self,
        server: PushTargets,
        config: P2PConfig,
        *,
        secret: Secret | None = None,
        sleep: Sleep = asyncio.sleep,
        jitter: Callable[[], float] = random.random,
        disable_after: int | None = None,
    ) -> None:
        self.server = server
        self.config = config
        self.secret = secret
        #: How each configuration's deliveries go (`synapse.a2a.server.push_health`).
        self.health = PushHealthBook(disable_after=disable_after)
        self._sleep = sleep
        self._jitter = jitter
        self._session: aiohttp.ClientSession | None = None
        #: TLS of the webhooks' connections (a custom CA, our client certificate); None: the
        #: system's CAs (`enable_a2a` passes the peer's `TLSConfig.client_context()`).
        self.ssl: Any = None

    def _ensure_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.config.request_timeout),
                headers={"User-Agent": USER_AGENT},
                trace_configs=list(TRACE_CONFIGS) or None,
                connector=aiohttp.TCPConnector(ssl=self.ssl if self.ssl is not None else True),
            )
        return self._session

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None and not session.closed:
            await session.close()

    async def send_callback(self, partner: str, message: Message, *, retry: bool = True) -> Message:
        me = Sender(agent_id=partner, endpoint="a2a://push")
        if isinstance(message, Heartbeat):
            # The webhook has no heartbeat: answering lets parked notifications try again.
            return build_reply_now(Heartbeat, HeartbeatPayload(), request=message, sender=me)
        found = self.server.push_target(partner, message)
        if found is None:
            log.info("push_dropped", partner=partner, message_id=message.id, reason="no config")
            return build_reply_now(Ack, AckPayload(), request=message, sender=me)
        target, event = found
        if self.health.drop(target.task_id, target.id):
            log.info("push_dropped", partner=partner, message_id=message.id, reason="disabled")
            return build_reply_now(Ack, AckPayload(), request=message, sender=me)

        def current() -> wire.TaskPushNotificationConfig:
            # Read the configuration again on each attempt: a token (or URL) rotated while
            # this notification waits is the one it goes out with; nothing is dropped.
            again = self.server.push_target(partner, message)
            return again[0] if again is not None else target

        await self._post(
            target, event, message, retries=self.config.max_retries if retry else 0, current=current
        )
        return build_reply_now(Ack, AckPayload(), request=message, sender=me)

    def body(self, event: wire.StreamResponse, message: Message) -> bytes:
        """The JSON body: the event, with the message id and the attempt's time inside."""
        stamp = {
            "messageId": message.id,
            "type": message.message_type.value,
            "timestamp": format_timestamp(datetime.now(UTC)),
        }
        inner: Any = event.task or event.status_update or event.artifact_update
        if inner is not None:
            inner.metadata = {**(inner.metadata or {}), "synapse": stamp}
        return wire.encode(event)

    def headers(self, target: wire.TaskPushNotificationConfig, body: bytes) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if target.token:
            headers[wire.NOTIFICATION_TOKEN_HEADER] = target.token
        auth = target.authentication
        if auth is not None and auth.scheme and auth.credentials:
            headers["Authorization"] = f"{auth.scheme} {auth.credentials}"
        if self.secret is not None:
            headers[SIGNATURE_HEADER] = header_signature(self.secret, body)
        return headers

    async def _post(
        self,
        target: wire.TaskPushNotificationConfig,
        event: wire.StreamResponse,
        message: Message,
        *,
        retries: int,
        current: Callable[[], wire.TaskPushNotificationConfig] | None = None,
    ) -> None:
        """POST with the retries of specs/protocol.md, 'Transport'; raise `DeliveryError` when it
        gives up."""
        session = self._ensure_session()
        # Exactly the URL that was checked: its normal form, not re-parsed or re-quoted.
        normal = normalize_url(target.url)
        if normal is None or not self.server.allowlist.allows(normal):
            raise DeliveryError(f"push URL {target.url!r} is not allowed", retryable=False)
        url = yarl.URL(normal, encoded=True)

        async def attempt(number: int) -> None:
            nonlocal target
            if current is not None:
                target = current()
            body = self.body(event, message)  # a fresh timestamp and signature each attempt
            fields = {"task_id": target.task_id, "config_id": target.id, "message_id": message.id}
            try:
                async with session.post(
                    url,
                    data=body,
                    headers=self.headers(target, body),
                    allow_redirects=False,
                ) as response:
                    status = response.status
                    await response.read()
                    retry_after = parse_retry_after(
                        response.headers.get("Retry-After"), datetime.now(UTC)
                    )
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError) as exc:
                error = f"{type(exc).__name__}: {exc}".rstrip(": ")
                log.info("push_attempt", **fields, attempt=number, error=error)
                self.health.failed(target.task_id, target.id, error)
                if self.health.is_disabled(target.task_id, target.id):
                    raise DeliveryError(
                        f"push to {target.url} disabled: {error}", retryable=False
                    ) from exc
                raise Transient[None](error) from exc
            except aiohttp.ClientError as exc:
                self.health.failed(target.task_id, target.id, repr(exc))
                raise DeliveryError(
                    f"cannot POST to {target.url}: {exc!r}", retryable=False
                ) from exc
            if 200 <= status < 300:
                log.info("push_delivered", **fields, attempt=number)
                self.health.succeeded(target.task_id, target.id)
                return
            self.health.failed(target.task_id, target.id, f"HTTP {status}")
            if status not in RETRYABLE_STATUSES:
                raise DeliveryError(
                    f"push to {target.url} refused: HTTP {status}", retryable=False, status=status
                )
            if self.health.is_disabled(target.task_id, target.id):
                raise DeliveryError(
                    f"push to {target.url} disabled: HTTP {status}", retryable=False
                )
            log.info("push_attempt", **fields, attempt=number, error=f"HTTP {status}")
            raise Transient[None](f"HTTP {status}", status=status, retry_after=retry_after)

        try:
            await retrying(
                attempt,
                retries=retries,
                config=self.config,
                sleep=self._sleep,
                jitter=self._jitter,
            )
        except RetriesExhausted as exhausted:
            raise DeliveryError(
                f"no push delivery to {target.url} after {exhausted.attempts} attempts: "
                f"{exhausted.last}",
                retryable=True,
                status=exhausted.last.status,
                attempts=exhausted.attempts,
            ) from exhausted.last


__all__ = [
    "MAX_PUSH_URL",
    "PUSH_PREFIX",
    "PushAllowlist",
    "PushSender",
    "normalize_url",
    "push_partner",
]
