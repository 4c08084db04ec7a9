"""What watching a peer costs: CPU per echo task with metrics and health, and with tracing too.

    python -m benchmarks.ops_overhead [--tasks 2000] [--rounds 3]

Two peers in one process over loopback HTTP run `--tasks` echo tasks, 50 at a time, in each
configuration; the figure is process CPU time per task (less disturbed by a loaded machine
than wall time), the best of `--rounds`. Results: docs/operations.md, "What it costs".
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable

from benchmarks._common import quiet_logging
from synapse.demo.handler import DemoHandler
from synapse.p2p.config import P2PConfig
from synapse.transport.peer import Peer

SECRET = "bench-ops-secret"
CONCURRENCY = 50


def plain(peer: Peer) -> None:
    pass


def metrics(peer: Peer) -> None:
    from synapse.ops import enable_health, enable_metrics

    enable_health(peer)
    enable_metrics(peer)


def traced(peer: Peer) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from synapse.ops.tracing import enable_tracing

    metrics(peer)
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    enable_tracing(peer, tracer_provider=provider)


async def run_once(setup: Callable[[Peer], None], tasks: int) -> float:
    config = P2PConfig(max_concurrent_tasks=10_000, heartbeat_interval=3600)
    r = Peer("bench-r", handler=DemoHandler(), config=config)
    e = Peer("bench-e", handler=DemoHandler(), config=config)
    setup(r)
    setup(e)
    async with r, e:
        r.add_partner("bench-e", e.endpoint, (SECRET,))
        e.add_partner("bench-r", r.endpoint, (SECRET,))
        semaphore = asyncio.Semaphore(CONCURRENCY)

        async def one(i: int) -> None:
            async with semaphore:
                handle = await r.submit("bench-e", "echo", {"text": f"t{i}"})
                outcome = await handle.result(timeout=60)
                assert outcome.ok

        started = time.process_time()
        await asyncio.gather(*(one(i) for i in range(tasks)))
        return (time.process_time() - started) / tasks


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    quiet_logging()
    base = None
    for name, setup in (("plain", plain), ("metrics+health", metrics), ("+tracing", traced)):
        best = min(asyncio.run(run_once(setup, args.tasks)) for _ in range(args.rounds))
        base = base or best
        print(f"{name:16} {best * 1e3:7.3f} ms CPU/task  ×{best / base:.2f}")


if __name__ == "__main__":
    main()
