"""End to end: completed `echo` tasks per second between two peers in two processes, beside the
bare aiohttp ceiling measured in the same run.

    python -m benchmarks.e2e [--seconds 5] [--quick]

R (a `Peer` driving load) and E (a `Peer` serving the demo handler) run in two processes on
127.0.0.1, memory stores, header-mode HMAC signatures on, structlog filtered at warning. An
`echo` task costs 3 HTTP exchanges (specs/protocol.md, 'Transport'): R POSTs `task_request` (E
answers
`task_confirm`), E POSTs `task_status_update{executing}` (R answers `ack`), E POSTs
`task_complete` (R answers `task_ack`).

The ceiling is a bare aiohttp server answering a POST of the same size with a small JSON reply,
and an aiohttp client, also in two processes: the most requests per second this stack can
carry here. The engine's figure of merit is its exchanges per second (3 × tasks/s) as a
fraction of the ceiling's requests per second, at the same concurrency.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from benchmarks._common import (
    Child,
    Section,
    Table,
    children,
    free_port,
    ms,
    pct,
    percentile,
    rate,
)

EXCHANGES_PER_TASK = 3
SECRET = "bench-secret-2026"


def sample_body() -> str:
    """A signed-sized envelope like the task_request of an echo task, for the ceiling."""
    from synapse.types import (
        Sender,
        TaskRequest,
        TaskRequestPayload,
        TaskSpec,
        build_message_now,
        encode_message,
    )

    message = build_message_now(
        TaskRequest,
        TaskRequestPayload(
            task=TaskSpec(id="task-" + "0" * 32, type="echo", payload={"text": "hello"})
        ),
        sender=Sender(agent_id="agent-r", endpoint="http://127.0.0.1:1/synapse/callback"),
        to="agent-e",
    )
    return encode_message(message).decode()


def _url(port: int) -> str:
    return f"http://127.0.0.1:{port}/synapse/callback"


def synapse_pair(*extra: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Worker specs of E and R, wired to each other."""
    e_port, r_port = free_port(), free_port()
    common = ("--secret", SECRET, *extra)
    e = ("synapse-peer", "--agent-id", "agent-e", "--port", str(e_port))
    e += ("--peer", f"agent-r={_url(r_port)}", *common)
    r = ("synapse-peer", "--agent-id", "agent-r", "--port", str(r_port))
    r += ("--peer", f"agent-e={_url(e_port)}", *common)
    return e, r


def measure_synapse(
    e: Child, r: Child, concurrency: int, seconds: float, warmup: float
) -> dict[str, Any]:
    """One load run of R against E; CPU of both processes; per-exchange latencies."""
    e.call("stats", reset=True)
    e_before = e.call("cpu")
    result = r.call(
        "load",
        partner="agent-e",
        concurrency=concurrency,
        seconds=seconds,
        warmup=warmup,
        timeout=seconds + warmup + 60,
    )
    e_after = e.call("cpu")
    e_stats = e.call("stats")
    if result["errors"]:
        raise RuntimeError(f"{result['errors']} tasks failed: {result['last_error']}")
    tasks = result["completed"]
    exchanges = result["exchanges"]["latencies"] + e_stats["latencies"]
    e_cpu_per_task = (e_after["cpu"] - e_before["cpu"]) / max(1, e_stats["served"])
    r_cpu_per_task = result["cpu"] / max(1, tasks)
    return {
        "tasks_per_s": result["rate"],
        "exchanges_per_s": result["rate"] * EXCHANGES_PER_TASK,
        "p50": result["p50"],
        "p99": result["p99"],
        "exchange_p50": percentile(exchanges, 50),
        "exchange_p99": percentile(exchanges, 99),
        "cpu_per_exchange": (e_cpu_per_task + r_cpu_per_task) / EXCHANGES_PER_TASK,
        "r_cpu": result["cpu"] / result["seconds"],
        "e_cpu": (e_after["cpu"] - e_before["cpu"]) / (e_after["wall"] - e_before["wall"]),
    }


def measure_ceiling(
    server: Child,
    client: Child,
    url: str,
    body: str,
    concurrency: int,
    seconds: float,
    warmup: float,
) -> dict[str, Any]:
    before = server.call("cpu")
    result = client.call(
        "load",
        url=url,
        body=body,
        concurrency=concurrency,
        seconds=seconds,
        warmup=warmup,
        timeout=seconds + warmup + 60,
    )
    after = server.call("cpu")
    if result["errors"]:
        raise RuntimeError(f"{result['errors']} requests failed: {result['last_error']}")
    served = max(1, after["served"] - before["served"])
    return {
        "requests_per_s": result["rate"],
        "p50": result["p50"],
        "p99": result["p99"],
        "cpu_per_exchange": result["cpu"] / max(1, result["completed"])
        + (after["cpu"] - before["cpu"]) / served,
        "client_cpu": result["cpu"] / result["seconds"],
        "server_cpu": (after["cpu"] - before["cpu"]) / (after["wall"] - before["wall"]),
    }


def best(runs: list[dict[str, Any]], key: str) -> dict[str, Any]:
    return max(runs, key=lambda r: r[key])


def run(
    *,
    seconds: float = 5.0,
    warmup: float = 1.0,
    concurrencies: tuple[int, ...] = (1, 50),
    rounds: int = 1,
) -> Section:
    started = time.monotonic()
    body = sample_body()
    e_spec, r_spec = synapse_pair()
    b_port = free_port()
    results: dict[int, dict[str, Any]] = {}
    with children(e_spec, r_spec, ("bare-server", "--port", str(b_port)), ("http-client",)) as (
        e,
        r,
        server,
        client,
    ):
        url = server.ready["url"]
        for c in concurrencies:
            ceiling_runs, synapse_runs = [], []
            # Alternate the two so that a slow spell of the machine hits both alike.
            for _ in range(rounds):
                ceiling_runs.append(measure_ceiling(server, client, url, body, c, seconds, warmup))
                synapse_runs.append(measure_synapse(e, r, c, seconds, warmup))
            results[c] = {
                "ceiling": best(ceiling_runs, "requests_per_s"),
                "synapse": best(synapse_runs, "tasks_per_s"),
            }
    return report(results, body, seconds, rounds, time.monotonic() - started)


def report(
    results: dict[int, dict[str, Any]], body: str, seconds: float, rounds: int, elapsed: float
) -> Section:
    section = Section(
        "e2e",
        "End to end: echo tasks between two peer processes vs the bare aiohttp ceiling",
        "python -m benchmarks.e2e",
        seconds=elapsed,
    )
    tasks = Table(
        [
            "concurrency",
            "Synapse tasks/s",
            "exchanges/s (3 per task)",
            "ceiling requests/s",
            "fraction of ceiling",
            "task p50 ms",
            "task p99 ms",
        ],
        title="Throughput (per HTTP exchange, against the ceiling)",
    )
    latency = Table(
        [
            "concurrency",
            "Synapse exchange p50 ms",
            "Synapse exchange p99 ms",
            "ceiling p50 ms",
            "ceiling p99 ms",
            "CPU µs/exchange Synapse",
            "CPU µs/exchange ceiling",
            "CPU ratio",
        ],
        title="Per exchange (latency as seen by the POSTing side; CPU of both processes)",
    )
    for c, res in results.items():
        s, b = res["synapse"], res["ceiling"]
        fraction = s["exchanges_per_s"] / b["requests_per_s"]
        tasks.add(
            c,
            rate(s["tasks_per_s"]),
            rate(s["exchanges_per_s"]),
            rate(b["requests_per_s"]),
            pct(fraction),
            ms(s["p50"]),
            ms(s["p99"]),
        )
        latency.add(
            c,
            ms(s["exchange_p50"]),
            ms(s["exchange_p99"]),
            ms(b["p50"]),
            ms(b["p99"]),
            f"{s['cpu_per_exchange'] * 1e6:.0f}",
            f"{b['cpu_per_exchange'] * 1e6:.0f}",
            f"{s['cpu_per_exchange'] / b['cpu_per_exchange']:.2f}×",
        )
        section.figures |= {
            f"e2e.c{c}.tasks_per_s": s["tasks_per_s"],
            f"e2e.c{c}.exchanges_per_s": s["exchanges_per_s"],
            f"e2e.c{c}.ceiling_per_s": b["requests_per_s"],
            f"e2e.c{c}.fraction": fraction,
            f"e2e.c{c}.task_p50_ms": s["p50"] * 1e3,
            f"e2e.c{c}.task_p99_ms": s["p99"] * 1e3,
            f"e2e.c{c}.exchange_p50_ms": s["exchange_p50"] * 1e3,
            f"e2e.c{c}.exchange_p99_ms": s["exchange_p99"] * 1e3,
            f"e2e.c{c}.ceiling_p50_ms": b["p50"] * 1e3,
            f"e2e.c{c}.ceiling_p99_ms": b["p99"] * 1e3,
            f"e2e.c{c}.cpu_us_per_exchange": s["cpu_per_exchange"] * 1e6,
            f"e2e.c{c}.ceiling_cpu_us_per_request": b["cpu_per_exchange"] * 1e6,
        }
    section.tables += [tasks, latency]
    section.notes += [
        "One echo task = 3 HTTP exchanges: task_request → task_confirm, "
        "task_status_update{executing} → ack, task_complete → task_ack.",
        f"Each figure is the best of {rounds} run(s) of {seconds:g} s after a warm-up; "
        "ceiling and Synapse runs alternate.",
        f"Ceiling: aiohttp server parsing a {len(body)}-byte JSON POST and answering a small "
        "JSON reply, aiohttp client reading and parsing it; no signatures, no protocol.",
        "Synapse: two `Peer`s, memory stores, header-mode HMAC-SHA256 on every request and "
        "reply, DemoHandler `echo`, structlog filtered at warning.",
    ]
    return section


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.e2e", description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0, help="measured time per run")
    parser.add_argument("--rounds", type=int, default=2, help="runs per figure (best kept)")
    parser.add_argument("--quick", action="store_true", help="short runs (a smoke test)")
    args = parser.parse_args(argv)
    if args.quick:
        section = run(seconds=0.5, warmup=0.2, rounds=1)
    else:
        section = run(seconds=args.seconds, rounds=args.rounds)
    print(section.text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
