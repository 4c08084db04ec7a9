"""Round trips to PostgreSQL, counted on the wire: a TCP relay between clients and the server.

A round trip is a turn of a connection: the client sent something, and the server's answer
then came back. The relay counts, per connection, each time bytes from the server follow
bytes from the client; a pipelined batch (many statements sent before any answer is read)
is one round trip, as it is on the network. It costs CPU of its own (every byte is copied
once more), so the benchmark counts with it in rounds of their own and reports throughput
from the rounds without it.
"""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit, urlunsplit

from benchmarks._common import HOST


class RoundTripRelay:
    """`127.0.0.1:port` relays to the PostgreSQL server at `target`; `turns` counts round
    trips of every connection relayed so far."""

    def __init__(self, target_url: str) -> None:
        parts = urlsplit(target_url)
        self.target_url = target_url
        self.target = (parts.hostname or HOST, parts.port or 5432)
        self.turns = 0
        self.server: asyncio.Server | None = None
        self.port = 0

    def url(self, database_url: str) -> str:
        """`database_url` (a database of the same server) through the relay."""
        parts = urlsplit(database_url)
        netloc = parts.netloc.rsplit("@", 1)
        host = f"{HOST}:{self.port}"
        location = f"{netloc[0]}@{host}" if len(netloc) == 2 else host
        return urlunsplit(parts._replace(netloc=location))

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._relay, HOST, 0)
        self.port = int(self.server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(*self.target)
        #: Who spoke last on this connection: a server answer after the client spoke is a turn.
        last = ["server"]

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter, side: str) -> None:
            with contextlib.suppress(ConnectionError):
                while data := await source.read(65536):
                    if side == "server" and last[0] == "client":
                        self.turns += 1
                    last[0] = side
                    sink.write(data)
                    await sink.drain()
            with contextlib.suppress(OSError):
                sink.close()

        await asyncio.gather(pipe(client_r, server_w, "client"), pipe(server_r, client_w, "server"))
