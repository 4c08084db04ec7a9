"""The value parsers of the command line's settings: each takes the text a flag, an
environment variable or the config file gives and returns the value, or raises `ValueError`
with a readable message. `synapse.cli.settings` reads with them, and
`synapse.cli.typed_settings` knows the TOML type each expects."""

from __future__ import annotations

import hashlib
import ipaddress
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

from synapse.p2p.durations import parse_duration
from synapse.transport.partners import normalize_url


def parse_port(text: str) -> int:
    if not text.strip().isdigit() or int(text) > 65535:
        raise ValueError(f"not a port number (0-65535): {text!r}")
    return int(text)


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off", ""}:
        return False
    raise ValueError(f"not a yes/no value: {text!r}")


def parse_count(text: str) -> int:
    if not text.strip().isdigit():
        raise ValueError(f"not a non-negative integer: {text!r}")
    return int(text)


def parse_positive_count(text: str) -> int:
    value = parse_count(text)
    if value < 1:
        raise ValueError(f"not a positive integer: {text!r}")
    return value


def parse_signing(text: str) -> str:
    if text not in ("header", "body"):
        raise ValueError(f"signing must be 'header' or 'body', not {text!r}")
    return text


def parse_url(text: str) -> str:
    normalize_url(text)  # raises ValueError with a readable message
    return text


def parse_extension_uri(text: str) -> str:
    """An A2A extension's URI: absolute, with a scheme and no spaces or commas (the
    `A2A-Extensions` header lists them separated by commas)."""
    uri = text.strip()
    parts = urlsplit(uri)
    if not parts.scheme or not (parts.netloc or parts.path) or any(c in uri for c in " ,\t"):
        raise ValueError(f"not an extension URI (absolute, no commas or spaces): {text!r}")
    return uri


def parse_http_url(text: str) -> str:
    """An http or https URL (where push notifications may go)."""
    parse_url(text)
    if urlsplit(text.strip()).scheme.lower() not in ("http", "https"):
        raise ValueError(f"not an http(s) URL: {text!r}")
    return text


def is_loopback(host: str) -> bool:
    """Whether a listening address is reachable from this machine only (127.0.0.0/8, ::1,
    localhost); `0.0.0.0`, `::` and every other address are reachable from others."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def parse_push_prefix(text: str) -> str:
    """A push allowlist entry: an http(s) URL prefix, whose port may be `*` (any port of the
    host), checked as the A2A server checks it."""
    from synapse.a2a.server.push import PushAllowlist

    PushAllowlist([text.strip()])  # ValueError: says what is wrong with it
    return text.strip()


def parse_listen(text: str) -> tuple[str, int]:
    """`HOST:PORT` (`[::1]:PORT` for IPv6) → (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, parse_port(port)


def parse_positive(text: str) -> float:
    """A positive number (a rate, say)."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"not a number: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise ValueError(f"must be a positive number: {text!r}")
    return value


def parse_pair(text: str, what: str) -> tuple[str, str]:
    """`NAME=VALUE` → (name, value); the name must not be empty."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise ValueError(f"expected {what}, got {text!r}")
    return name.strip(), value


def parse_a2a_token(text: str) -> tuple[str, str]:
    """`--a2a-token TOKEN[=NAME]` → (token, principal name).

    NAME is what follows the last `=`, if anything does (a base64 token's `==` padding stays
    in the token); without a name the principal is `token-` and the first 8 hex digits of the
    token's SHA-256: stable across restarts (tasks in a durable store keep their principal),
    and never the token itself, which would end up in logs.
    """
    token, sep, name = text.rpartition("=")
    if not sep or not name.strip():
        token, name = text, ""
    token, name = token.strip(), name.strip()
    if not token:
        raise ValueError(f"expected TOKEN or TOKEN=NAME, got {text!r}")
    if not name:
        name = "token-" + hashlib.sha256(token.encode()).hexdigest()[:8]
    return token, name


def parse_a2a_tenant(text: str) -> tuple[str, str]:
    """`--a2a-tenant NAME=TENANT` → (principal name, a tenant it may name)."""
    name, sep, tenant = text.partition("=")
    name, tenant = name.strip(), tenant.strip()
    if not sep or not name or not tenant:
        raise ValueError(f"expected NAME=TENANT, got {text!r}")
    return name, tenant


#: What `--a2a-bindings` / `--a2a-binding` accept for each A2A protocol binding.
A2A_BINDING_NAMES = {
    "jsonrpc": "JSONRPC",
    "json-rpc": "JSONRPC",
    "http+json": "HTTP+JSON",
    "rest": "HTTP+JSON",
    "grpc": "GRPC",
}


def parse_a2a_binding(text: str) -> str:
    """`JSONRPC`, `HTTP+JSON` (or `REST`), `GRPC`, in any case."""
    found = A2A_BINDING_NAMES.get(text.strip().lower())
    if found is None:
        raise ValueError(f"not an A2A binding (JSONRPC, HTTP+JSON or REST, GRPC): {text!r}")
    return found


def parse_a2a_bindings(text: str) -> tuple[str, ...]:
    """A comma-separated list of A2A bindings, in order (each at most once)."""
    found = tuple(parse_a2a_binding(name) for name in text.split(",") if name.strip())
    if not found or len(set(found)) != len(found):
        raise ValueError(f"expected distinct A2A bindings, comma-separated: {text!r}")
    return found


def parse_when(text: str, now: datetime | None = None) -> datetime:
    """A deadline: a duration from `now` (`30s`, `15m`, `2h`, seconds) or an RFC 3339 time
    with its offset (`2026-12-24T18:00:00Z`), in UTC."""
    now = now or datetime.now(UTC)
    try:
        return now + timedelta(seconds=parse_duration(text))
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"not a duration (30s, 15m, 2h) or an RFC 3339 time: {text!r}") from None
    if when.tzinfo is None:
        raise ValueError(f"an RFC 3339 time needs its offset (Z or +01:00): {text!r}")
    if when <= now:
        raise ValueError(f"{text!r} has already passed")
    return when.astimezone(UTC)


__all__ = [
    "A2A_BINDING_NAMES",
    "parse_a2a_binding",
    "parse_a2a_bindings",
    "parse_a2a_token",
    "parse_bool",
    "parse_count",
    "parse_http_url",
    "parse_listen",
    "parse_pair",
    "parse_port",
    "parse_signing",
    "parse_url",
    "parse_when",
]
