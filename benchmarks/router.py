"""What a router costs: `echo` tasks sent straight to a spoke, beside the same tasks sent through
a hub that routes them to that spoke (docs/routing.md).

    python -m benchmarks.router [--tasks 300] [--concurrency 20]

Everything runs in this one process on 127.0.0.1 (client, hub, spoke; memory stores, header
HMAC, structlog at warning), so the figure of merit is the ratio of CPU time per task, measured
side by side: a routed task is two Synapse tasks (client→hub, hub→spoke) plus the router's
choice and relays, so about 2× is the floor. Run by hand; not part of `python -m benchmarks`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from typing import Any

import structlog

SECRET = "bench-router-secret"


async def _run(tasks: int, concurrency: int) -> dict[str, Any]:
    from synapse.demo.handler import DemoHandler
    from synapse.router import PoolConfig, Router
    from synapse.router.pool import SynapsePartnerConfig
    from synapse.transport.peer import Peer

    spoke = Peer("spoke", handler=DemoHandler())
    client = Peer("client")
    hub = Peer("hub")
    async with spoke, client, hub:
        hub.add_partner("client", client.endpoint, (SECRET,))
        client.add_partner("hub", hub.endpoint, (SECRET,))
        client.add_partner("spoke", spoke.endpoint, (SECRET,))
        spoke.add_partner("hub", hub.endpoint, (SECRET,))
        spoke.add_partner("client", client.endpoint, (SECRET,))
        pool = PoolConfig(
            partner=[
                SynapsePartnerConfig(agent_id="spoke", endpoint=spoke.endpoint, secrets=[SECRET])
            ]
        )
        async with Router(hub, pool):
            figures: dict[str, Any] = {}
            for target in ("spoke", "hub", "spoke", "hub"):  # twice each, interleaved
                cpu, wall = await _round(client, target, tasks, concurrency)
                best = figures.get(target)
                if best is None or 1000 * cpu / tasks < best["cpu_ms_per_task"]:
                    figures[target] = {
                        "tasks_per_s": tasks / wall,
                        "cpu_ms_per_task": 1000 * cpu / tasks,
                    }
            return figures


async def _round(client: Any, target: str, tasks: int, concurrency: int) -> tuple[float, float]:
    """CPU and wall seconds for `tasks` echo tasks to `target`, `concurrency` at a time."""
    semaphore = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with semaphore:
            handle = await client.submit(target, "echo", {"text": f"t{i}"})
            outcome = await handle.result(30)
            assert outcome.ok, outcome

    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(tasks)))
    return time.process_time() - cpu, time.perf_counter() - wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.router")
    parser.add_argument("--tasks", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=20)
    args = parser.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    figures = asyncio.run(_run(args.tasks, args.concurrency))
    direct, routed = figures["spoke"], figures["hub"]
    print(f"echo tasks, {args.tasks} per run, concurrency {args.concurrency}, one process")
    for name, f in (("direct to the spoke", direct), ("through the hub", routed)):
        print(
            f"  {name:20} {f['tasks_per_s']:8.0f} tasks/s  {f['cpu_ms_per_task']:6.2f} ms CPU/task"
        )
    ratio = routed["cpu_ms_per_task"] / direct["cpu_ms_per_task"]
    print(f"  CPU per routed task: {ratio:.2f}× a direct one")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
