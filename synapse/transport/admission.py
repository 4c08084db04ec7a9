"""Which HTTP requests get in: one admission table for both of a peer's HTTP doors.

A peer answers HTTP through two doors. On plain-http connections the lean callback server
(`synapse.transport.http1_server`) reads every request head itself, answers callback POSTs and
hands anything else to aiohttp; with TLS, or under an application's own middlewares, aiohttp
reads every request. Both doors must answer a request that cannot get in alike: the same HTTP
status, an unsigned `nack` with code `message_format_invalid` (`details.reason` from the table
below), and a closed connection. Neither may wait for a head that can never become a request.

`RULES` is that table. The lean door applies it by parsing (`check_head` on a whole head,
`check_partial` on the bytes of one still arriving, so that a TLS ClientHello or a bare-LF
head is refused at once); the aiohttp door by aiohttp's own parser, configured with the
limits below (`PARSER_LIMITS`), plus `admission_middleware` and `expect_handler` for the rules
aiohttp's parser does not enforce. `tests/transport/test_transport_admission.py` sends one
corpus to both doors and compares what comes back.

Only framing is judged here; what the request means (its route, its body) is judged behind
the door that admitted it.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec
from aiohttp import web
from aiohttp.typedefs import Middleware

#: The longest request target, header name and header value (aiohttp's `max_line_size` and
#: `max_field_size`).
MAX_FIELD: Final = 8190
#: The most header lines one request may have (aiohttp's `max_headers`).
MAX_HEADERS: Final = 128
#: The longest header line (name and value) judged far from the length limits.
PLAIN_FIELD: Final = 4096
#: Digits of a `Content-Length` read at most: any body we accept is far shorter, and a longer
#: run of digits must never reach `int()` (Python refuses more than 4,300 digits).
MAX_LENGTH_DIGITS: Final = 18
#: What aiohttp's `RequestHandler` takes so that its parser enforces the same limits.
PARSER_LIMITS: Final = {
    "max_line_size": MAX_FIELD,
    "max_field_size": MAX_FIELD,
    "max_headers": MAX_HEADERS,
}


@dataclass(frozen=True, slots=True)
class Rule:
    """One way a request is refused at the door."""

    status: int
    #: `details.reason` of the nack.
    reason: str
    #: What the nack's message says (completed with the specifics).
    message: str


#: Every refusal at the door, by name. The statuses follow RFC 9110 and RFC 9112.
RULES: Final = {
    "request_line": Rule(400, "http", "malformed request line"),
    "version": Rule(400, "http", "unsupported HTTP version"),
    "line_ending": Rule(400, "http", "a line of the head does not end in CRLF"),
    "field_too_long": Rule(400, "http", f"a request target or header longer than {MAX_FIELD}"),
    "too_many_headers": Rule(400, "http", f"more than {MAX_HEADERS} header lines"),
    "header_syntax": Rule(400, "http", "malformed header line"),
    "header_repeated": Rule(400, "http", "a header that may be given once is repeated"),
    "host": Rule(400, "http", "an HTTP/1.1 request needs exactly one Host header"),
    "content_length": Rule(400, "http", "malformed or conflicting Content-Length"),
    "transfer_encoding": Rule(400, "http", "Transfer-Encoding is not allowed here"),
    "upgrade": Rule(400, "http", "protocol upgrades are not supported"),
    "expectation": Rule(417, "http", "only 'Expect: 100-continue' is understood"),
    "too_large": Rule(413, "too_large", "request body exceeds the limit"),
    "head_timeout": Rule(408, "http", "request head not received in time"),
}


@dataclass(frozen=True, slots=True)
class NotAdmitted:
    """A head refused at the door: answer `status` with an unsigned nack, then close."""

    rule: str
    detail: str = ""
    #: More of the nack's `details`, beside its `reason`.
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def status(self) -> int:
        return RULES[self.rule].status

    @property
    def reason(self) -> str:
        return RULES[self.rule].reason

    @property
    def message(self) -> str:
        text = RULES[self.rule].message
        return f"{text}: {self.detail}" if self.detail else text

    @property
    def details(self) -> dict[str, Any]:
        """The nack's `details`."""
        return {"reason": self.reason, **self.extra}


class Head(msgspec.Struct, frozen=True, gc=False):
    """A request head that got in (a frozen msgspec struct: built in C, one a request)."""

    method: bytes
    target: bytes
    #: `b"1.1"` or `b"1.0"`.
    version: bytes
    #: (name as sent, value with surrounding whitespace removed), in order.
    headers: list[tuple[bytes, bytes]]
    #: The header names, lower case, in the same order.
    keys: list[bytes]
    #: The declared body length (None: none declared).
    content_length: int | None
    #: The `Transfer-Encoding` codings, lower case (empty: none).
    transfer_codings: tuple[bytes, ...]
    #: The `Connection` options, lower case.
    connection: frozenset[bytes]
    #: `Expect: 100-continue` was sent.
    expects_continue: bool


_TOKEN = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
#: The bytes of an HTTP token (RFC 9110 `tchar`): header names, methods.
TOKEN_BYTES = b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
#: Visible ASCII: what a request target is made of.
_VISIBLE = bytes(range(0x21, 0x7F))
#: What a head may hold: visible characters, obs-text, space, tab, and CR LF ending lines.
_HEAD_BYTES = bytes(range(0x20, 0x7F)) + bytes(range(0x80, 0x100)) + b"\t\r\n"
_VERSION = re.compile(rb"HTTP/([0-9])\.([0-9])")
#: Headers a request may carry once at most (aiohttp's parser refuses them repeated too).
_SINGLETONS = frozenset(
    {
        b"content-length",
        b"content-location",
        b"content-range",
        b"content-type",
        b"etag",
        b"host",
        b"max-forwards",
        b"server",
        b"transfer-encoding",
        b"user-agent",
    }
)
#: The header names the table reads.
_FRAMING = frozenset({b"host", b"content-length", b"transfer-encoding", b"connection", b"expect"})
#: A byte that cannot appear in a head at all, a CR not followed by LF, or an LF not
#: preceded by CR (a CR at the very end may still get its LF).
_BAD_BYTE = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]|\r(?=[^\n])|(?<!\r)\n")
_METHOD_PREFIX = re.compile(_TOKEN)


def check_partial(buffer: bytes | bytearray) -> NotAdmitted | None:
    """A refusal if the start of a head still arriving can never become a request head.

    Called on the bytes received so far when they hold no complete head: a TLS ClientHello,
    an HTTP/2 preface, a bare LF and a line longer than the limits are refused at once
    instead of waiting for the head timeout.
    """
    bad = _BAD_BYTE.search(buffer)
    if bad is not None:
        return NotAdmitted("line_ending" if bad.group() in (b"\r", b"\n") else "header_syntax")
    first_end = buffer.find(b"\r\n")
    first = buffer if first_end < 0 else buffer[:first_end]
    if first_end < 0 and first.endswith(b"\r"):
        first = first[:-1]
    method = _METHOD_PREFIX.match(first)
    if first and (method is None or (method.end() < len(first) and first[method.end()] != 0x20)):
        return NotAdmitted("request_line")
    if first_end < 0:
        if len(first) > MAX_FIELD + 64:
            return NotAdmitted("field_too_long")
        return None
    lines = bytes(buffer[first_end + 2 :]).split(b"\r\n")
    if len(lines) - 1 > MAX_HEADERS:
        return NotAdmitted("too_many_headers")
    refused = _check_request_line(bytes(first))
    if isinstance(refused, NotAdmitted):
        return refused
    *complete, last = lines
    if last.endswith(b"\r"):  # its LF is still to come
        last = last[:-1]
    for line in complete:
        parsed = _header(line)
        if isinstance(parsed, NotAdmitted):
            return parsed
    name, colon, value = last.partition(b":")
    if len(name) > MAX_FIELD or len(value.strip(b" \t")) > MAX_FIELD:
        return NotAdmitted("field_too_long")
    if name and not colon and _METHOD_PREFIX.fullmatch(name) is None:
        return NotAdmitted("header_syntax")
    return None


def _check_request_line(line: bytes) -> tuple[bytes, bytes, bytes] | NotAdmitted:
    parts = line.split(b" ")
    if len(parts) != 3:
        return NotAdmitted("request_line")
    method, target, version = parts
    if not _is_token(method) or not target or target.translate(None, _VISIBLE):
        return NotAdmitted("request_line")
    if len(target) > MAX_FIELD:
        return NotAdmitted("field_too_long")
    if version == b"HTTP/1.1" or version == b"HTTP/1.0":
        return method, target, version[5:]
    match = _VERSION.fullmatch(version)
    if match is None:
        return NotAdmitted("request_line")
    major, minor = match.groups()
    return NotAdmitted("version", f"HTTP/{major.decode()}.{minor.decode()}")


def _is_token(value: bytes) -> bool:
    return bool(value) and not value.translate(None, TOKEN_BYTES)


def _header(line: bytes) -> tuple[bytes, bytes] | NotAdmitted:
    """(name, value) of a header line whose bytes are known to be allowed in a head."""
    name, colon, value = line.partition(b":")
    if not colon or not _is_token(name):
        if line[:1] in (b" ", b"\t"):
            return NotAdmitted("header_syntax", "obsolete line folding")
        return NotAdmitted("header_syntax")
    value = value.strip(b" \t")
    if len(name) > MAX_FIELD or len(value) > MAX_FIELD:
        return NotAdmitted("field_too_long")
    return name, value


def _bad_byte(raw: bytes) -> NotAdmitted | None:
    """A refusal if `raw` holds a byte no head may hold, or a CR or LF not in a CRLF."""
    if raw.translate(None, _HEAD_BYTES):
        return NotAdmitted("header_syntax", "a control character")
    crlf = raw.count(b"\r\n")
    if raw.count(b"\r") != crlf or raw.count(b"\n") != crlf:
        return NotAdmitted("line_ending")
    return None


def check_head(raw: bytes, *, max_body: int | None = None) -> Head | NotAdmitted:
    """The head `raw` (without its final CRLFCRLF) if it gets in, else why not.

    `max_body`: given for a request to the route it is the body limit of, whose own rules
    then apply too: a `Content-Length` above it is refused with 413 (before any
    `100 Continue`), an expectation other than `100-continue` with 417. None leaves both to
    whoever serves the request.
    """
    bad = _bad_byte(raw)
    if bad is not None:
        return bad
    lines = raw.split(b"\r\n")
    if len(lines) - 1 > MAX_HEADERS:
        return NotAdmitted("too_many_headers")
    request_line = _check_request_line(lines[0])
    if isinstance(request_line, NotAdmitted):
        return request_line
    method, target, version = request_line
    headers: list[tuple[bytes, bytes]] = []
    keys: list[bytes] = []
    singletons: set[bytes] = set()
    longest = 0
    hosts = 0
    length: int | None = None
    codings: list[bytes] = []
    connection: set[bytes] = set()
    expectations: list[bytes] = []
    for line in lines[1:]:
        parsed = _header(line)
        if isinstance(parsed, NotAdmitted):
            return parsed
        name, value = parsed
        headers.append(parsed)
        longest = max(longest, len(name) + len(value))
        key = name.lower()
        keys.append(key)
        if key in _SINGLETONS:
            if key in singletons:
                return NotAdmitted("header_repeated", key.decode("ascii"))
            singletons.add(key)
        if key not in _FRAMING:
            continue
        if key == b"host":
            hosts += 1
        elif key == b"content-length":
            if length is not None or not value.isdigit() or len(value) > MAX_LENGTH_DIGITS:
                return NotAdmitted("content_length")
            length = int(value)
        elif key == b"transfer-encoding":
            codings += [c.strip().lower() for c in value.split(b",") if c.strip()]
        elif key == b"connection":
            connection.update(c.strip().lower() for c in value.split(b","))
        else:
            expectations.append(value.lower())
    # The 400s first, in any order; then what a route answers (417, 413), as aiohttp does.
    if version == b"1.1" and hosts != 1:
        return NotAdmitted("host")
    if codings:
        if version == b"1.0":
            # RFC 9112 §6.1: its framing is faulty, the connection must close after it.
            return NotAdmitted("transfer_encoding", "in an HTTP/1.0 request")
        if length is not None:
            return NotAdmitted("content_length", "together with Transfer-Encoding")
    if b"upgrade" in connection:
        return NotAdmitted("upgrade")
    # The route's own rules: only for the route it names, and only for a head whose lines
    # are far from the length limits (near them, parsers count a few bytes differently:
    # whoever serves the route judges such a head).
    if max_body is not None and longest <= PLAIN_FIELD:
        if any(e != b"100-continue" for e in expectations):
            return NotAdmitted("expectation")
        if length is not None and length > max_body:
            return _too_large(length, max_body)
    return Head(
        method=method,
        target=target,
        version=version,
        headers=headers,
        keys=keys,
        content_length=length,
        transfer_codings=tuple(codings),
        connection=frozenset(connection),
        expects_continue=bool(expectations),
    )


# --- the aiohttp door ------------------------------------------------------------------------

#: (status, message, details) → the body of an unsigned nack.
RefusalBody = Callable[[int, str, dict[str, Any]], bytes]


def refusal_response(refused: NotAdmitted, body: RefusalBody) -> web.Response:
    """The aiohttp response refusing a request at the door; the connection closes after it."""
    response = web.Response(
        status=refused.status,
        body=body(refused.status, refused.message, refused.details),
        content_type="application/json",
    )
    response.force_close()
    return response


def check_request(request: web.BaseRequest, max_body: int | None) -> NotAdmitted | None:
    """The rules aiohttp's parser does not enforce, on a request it parsed, in the order
    `check_head` applies them."""
    version = request.version
    headers = request.headers
    if version not in ((1, 0), (1, 1)):
        return NotAdmitted("version", f"HTTP/{version[0]}.{version[1]}")
    if version == (1, 1) and len(headers.getall("Host", ())) != 1:
        return NotAdmitted("host")
    codings = [
        c for v in headers.getall("Transfer-Encoding", ()) for c in v.split(",") if c.strip()
    ]
    if codings and version < (1, 1):
        return NotAdmitted("transfer_encoding", "in an HTTP/1.0 request")
    options = {
        option.strip().lower()
        for value in headers.getall("Connection", ())
        for option in value.split(",")
    }
    if "upgrade" in options:
        return NotAdmitted("upgrade")
    if any(e.strip().lower() != "100-continue" for e in headers.getall("Expect", ())):
        return NotAdmitted("expectation")
    length = request.content_length
    if max_body is not None and length is not None and length > max_body:
        return _too_large(length, max_body)
    return None


def _too_large(length: int, max_body: int) -> NotAdmitted:
    return NotAdmitted("too_large", f"{length} > {max_body} bytes", {"max_body_size": max_body})


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def admission_middleware(
    body: RefusalBody, max_body: Callable[[web.Request], int | None]
) -> Middleware:
    """The aiohttp door's share of `RULES` (see the module docstring), as a middleware.

    `max_body(request)` is the body limit of the request's route (None: the route decides).
    The lean door applies the same rules itself, so the callback route may skip it.
    """

    @web.middleware
    async def admit(request: web.Request, handler: Handler) -> web.StreamResponse:
        refused = check_request(request, max_body(request))
        if refused is not None:
            return refusal_response(refused, body)
        return await handler(request)

    # The lean callback server applies the same table: this middleware never stops it.
    admit.synapse_lean_callbacks = None  # type: ignore[attr-defined]
    return admit


def expect_handler(
    body: RefusalBody, max_body: Callable[[web.Request], int | None]
) -> Callable[[web.Request], Awaitable[web.StreamResponse | None]]:
    """An aiohttp `expect_handler`: `100 Continue` only for a body the route will take.

    aiohttp's own says `100 Continue` to any `Expect: 100-continue`, then refuses a body
    over the limit with 413: a client would send the whole body first.
    """

    async def expect(request: web.Request) -> web.StreamResponse | None:
        refused = check_request(request, max_body(request))
        if refused is not None:
            return refusal_response(refused, body)
        if request.version >= (1, 1):
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        return None

    return expect


__all__ = [
    "MAX_FIELD",
    "MAX_HEADERS",
    "PARSER_LIMITS",
    "RULES",
    "TOKEN_BYTES",
    "Head",
    "NotAdmitted",
    "admission_middleware",
    "check_head",
    "check_partial",
    "check_request",
    "expect_handler",
]
