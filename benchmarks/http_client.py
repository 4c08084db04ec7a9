"""HTTP of a callback: Synapse's lean HTTP/1.1 client against aiohttp's client, and its
lean callback server against aiohttp's server.

    python -m benchmarks.http_client [--requests 20000] [--concurrency 50]

Clients: both POST the same signed-sized JSON body to the same aiohttp server, in this
process, on kept-alive connections, and read the whole reply. Servers: the lean client POSTs
to aiohttp's server and to the lean callback server (`synapse.transport.http1_server`, in
front of the same aiohttp app), each answering with the same stored reply. CPU per exchange
is the process's (client and server together, so the side not under test costs the same in
both rows), wall time gives requests/s. Alternating rounds; the best of each.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from benchmarks._common import HOST, Section, Table, free_port, rate

BODY = b'{"version":"1.0","payload":"x","pad":"' + b"p" * 420 + b'"}'
HEADERS = {"Content-Type": "application/json", "X-Synapse-Signature": "sha256=" + "0" * 64}
REPLY = b'{"version":"1.0","type":"p2p:ack","payload":{}}'


async def _measure(kind: str, url: str, requests: int, concurrency: int) -> dict[str, float]:
    """`kind`: "lean" or "aiohttp", the client; the server is the one `url` points at."""
    import aiohttp

    from synapse.transport.http1 import Http1Pool

    lean = Http1Pool()
    session = aiohttp.ClientSession()
    per_worker = requests // concurrency

    async def worker() -> None:
        for _ in range(per_worker):
            if kind == "lean":
                response = await lean.post(url, BODY, HEADERS, timeout=10, max_body=1 << 20)
                assert response.status == 200 and response.body == REPLY
            else:
                async with session.post(url, data=BODY, headers=HEADERS) as reply:
                    assert reply.status == 200 and await reply.read() == REPLY

    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    await lean.close()
    await session.close()
    done = per_worker * concurrency
    return {"cpu_us": cpu / done * 1e6, "rate": done / wall}


async def _run(requests: int, concurrency: int, rounds: int) -> dict[str, list[dict[str, float]]]:
    from aiohttp import web

    from synapse.p2p.dedup import StoredReply
    from synapse.transport.guard import GuardedSite, HttpLimits
    from synapse.transport.http1_server import CallbackRoute

    stored = StoredReply.of(200, REPLY, HEADERS)

    async def handle(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=REPLY, headers=HEADERS)

    async def answer(body: bytes, headers: Any, transport: Any) -> StoredReply:
        return stored

    app = web.Application()
    app.router.add_post("/synapse/callback", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port, lean_port = free_port(), free_port()
    await web.TCPSite(runner, HOST, port).start()
    limits = HttpLimits()
    route = CallbackRoute(
        "/synapse/callback",
        answer,
        max_body=1 << 20,
        limits=limits,
        timeout_reply=lambda: stored,
    )
    await GuardedSite(
        runner, HOST, lean_port, limits=limits, refusal=lambda s, r: b"{}", callbacks=route
    ).start()
    url = f"http://{HOST}:{port}/synapse/callback"
    lean_url = f"http://{HOST}:{lean_port}/synapse/callback"
    runs: dict[str, list[dict[str, float]]] = {"lean": [], "aiohttp": [], "lean server": []}
    try:
        await _measure("lean", url, min(requests, 500), concurrency)  # warm every pair up
        await _measure("aiohttp", url, min(requests, 500), concurrency)
        await _measure("lean", lean_url, min(requests, 500), concurrency)
        for _ in range(rounds):
            for kind in runs:
                if kind == "lean server":
                    runs[kind].append(await _measure("lean", lean_url, requests, concurrency))
                else:
                    runs[kind].append(await _measure(kind, url, requests, concurrency))
    finally:
        await runner.cleanup()
    assert route.served > 0 and route.handed_over == 0
    return runs


def run(*, requests: int = 20_000, concurrency: int = 50, rounds: int = 3) -> Section:
    started = time.monotonic()
    runs = asyncio.run(_run(requests, concurrency, rounds))
    section = Section(
        "http_client",
        "HTTP of a callback: the lean HTTP/1.1 client and server against aiohttp's",
        "python -m benchmarks.http_client",
    )
    best: dict[str, Any] = {
        kind: {
            "cpu_us": min(r["cpu_us"] for r in kind_runs),
            "rate": max(r["rate"] for r in kind_runs),
        }
        for kind, kind_runs in runs.items()
    }

    def compare(head: str, title: str, rows: list[tuple[str, str]], baseline: str) -> Table:
        table = Table(
            [head, "requests/s", "CPU µs per exchange (client + server)", "vs aiohttp"],
            title=title,
        )
        for kind, name in rows:
            b = best[kind]
            cpu = f"{b['cpu_us'] / best[baseline]['cpu_us']:.2f}×"
            table.add(name, rate(b["rate"]), f"{b['cpu_us']:.0f}", cpu)
            figure = kind.replace(" ", "_")
            section.figures |= {
                f"http_client.{figure}.cpu_us": b["cpu_us"],
                f"http_client.{figure}.requests_per_s": b["rate"],
            }
        return table

    clients = compare(
        "client (to aiohttp's server)",
        f"{requests:,} POSTs at concurrency {concurrency}, best of {rounds} rounds",
        [("lean", "synapse.transport.http1"), ("aiohttp", "aiohttp ClientSession")],
        "aiohttp",
    )
    servers = compare(
        "server (from the lean client)",
        "The same POSTs, from the lean client, to each server",
        [("lean server", "synapse.transport.http1_server"), ("lean", "aiohttp web")],
        "lean",
    )
    section.tables += [clients, servers]
    section.notes.append(
        "One process: the server and the client on one event loop (asyncio's), kept-alive "
        "connections, a 500-byte JSON body and a small reply. The lean server's answer is a "
        "stored reply, as aiohttp's handler's is: only HTTP is measured."
    )
    section.seconds = time.monotonic() - started
    return section


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.http_client", description=__doc__)
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    print(run(requests=args.requests, concurrency=args.concurrency, rounds=args.rounds).text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
