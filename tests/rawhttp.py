"""Raw HTTP/1.1 on a socket, for tests that send what no client library would (broken
framing, half a head, pipelined requests) and read exactly what the server wrote back."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

from synapse.types import SIGNATURE_HEADER

PATH = "/synapse/callback"


async def exchange(port: int, raw: bytes, *, timeout: float = 5.0) -> bytes:
    """Send `raw` on a new connection and read until the peer closes it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()


def request(body: bytes, headers: Sequence[tuple[str, str]]) -> bytes:
    lines = [f"POST {PATH} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def parse(response: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = response.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers, body


def unsigned_nack(response: bytes, status: int, code: str) -> dict[str, Any]:
    got, headers, body = parse(response)
    assert got == status, response
    assert headers.get("content-type", "").startswith("application/json"), response
    assert SIGNATURE_HEADER.lower() not in headers, response
    value = json.loads(body)
    assert value["type"] == "p2p:nack" and value["payload"]["code"] == code, value
    assert value.get("signature") is None
    details: dict[str, Any] = value["payload"].get("details") or {}
    return details
