"""The official A2A SDK beside Synapse: completed `echo` tasks per second, measured alike.

    python -m benchmarks.a2a_sdk [--seconds 4] [--quick]

Three servers, each in its own process on 127.0.0.1, each completing an `echo` task per call:

- **A2A SDK**: an echo agent built with the official `a2a-sdk` as it documents (an
  `AgentExecutor`, `DefaultRequestHandler`, `InMemoryTaskStore`, its Starlette JSON-RPC routes)
  served by uvicorn the way `uvicorn.run` does (uvloop and httptools when installed);
- **Synapse, A2A binding**: a `Peer` with `DemoHandler` and `enable_a2a(peer,
  default_task_type="echo")`, JSON-RPC at `/a2a`;
- **Synapse, Synapse binding**: the same peer reached by a second `Peer` in its own process
  (signed, 3 HTTP exchanges per task), as in `benchmarks.e2e`.

The two A2A servers get the same client: raw JSON-RPC `SendMessage` POSTs from aiohttp in a
fourth process (not the SDK's client, so that the client is not what is measured), one text
part, blocking until the task is `TASK_STATE_COMPLETED`.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import Child, Section, Table, children, free_port, ms, rate, ratio

SECRET = "bench-secret-2026"


def _url(port: int) -> str:
    return f"http://127.0.0.1:{port}/synapse/callback"


def _load(client: Child, **params: Any) -> dict[str, Any]:
    result = client.call("load", timeout=params["seconds"] + params["warmup"] + 60, **params)
    if result["errors"]:
        raise RuntimeError(f"{result['errors']} calls failed: {result['last_error']}")
    return result


def run(
    *,
    seconds: float = 4.0,
    warmup: float = 1.0,
    concurrencies: tuple[int, ...] = (1, 50),
    rounds: int = 1,
) -> Section:
    started = time.monotonic()
    sdk_port, e_port, r_port, l_port = free_port(), free_port(), free_port(), free_port()
    log_file = Path(tempfile.mkdtemp(prefix="synapse-a2a-")) / "a2a.log"
    # The A2A binding again, logging as `synapse serve --a2a` does by default (info, a file).
    l_spec = ("synapse-peer", "--agent-id", "agent-l", "--port", str(l_port), "--a2a")
    l_spec += ("--log-file", str(log_file))
    e_spec = ("synapse-peer", "--agent-id", "agent-e", "--port", str(e_port), "--a2a")
    e_spec += ("--peer", f"agent-r={_url(r_port)}", "--secret", SECRET)
    r_spec = ("synapse-peer", "--agent-id", "agent-r", "--port", str(r_port))
    r_spec += ("--peer", f"agent-e={_url(e_port)}", "--secret", SECRET)
    results: dict[int, dict[str, dict[str, Any]]] = {}
    with children(
        ("sdk-server", "--port", str(sdk_port)), e_spec, r_spec, l_spec, ("http-client",)
    ) as (sdk, _e, r, _l, client):
        sdk_url, a2a_url = sdk.ready["url"], f"http://127.0.0.1:{e_port}/a2a"
        logged_url = f"http://127.0.0.1:{l_port}/a2a"
        for c in concurrencies:
            runs: dict[str, list[dict[str, Any]]] = {k: [] for k in LABELS}
            common = {"concurrency": c, "seconds": seconds, "warmup": warmup}
            for _ in range(rounds):
                runs["sdk"].append(_load(client, url=sdk_url, jsonrpc=True, **common))
                runs["a2a"].append(_load(client, url=a2a_url, jsonrpc=True, **common))
                runs["a2a_logged"].append(_load(client, url=logged_url, jsonrpc=True, **common))
                runs["synapse"].append(_load(r, partner="agent-e", **common))
            results[c] = {k: max(v, key=lambda x: x["rate"]) for k, v in runs.items()}
        stack = f"{sdk.ready['loop']} loop, {sdk.ready['http'].rsplit('.', 1)[-1]}"
    return report(results, stack, seconds, rounds, time.monotonic() - started)


LABELS = {
    "sdk": "A2A SDK (Starlette + uvicorn)",
    "a2a": "Synapse, A2A binding",
    "a2a_logged": "Synapse, A2A binding, serve's default logging (info, to a file)",
    "synapse": "Synapse, Synapse binding",
}


def report(
    results: dict[int, dict[str, dict[str, Any]]],
    stack: str,
    seconds: float,
    rounds: int,
    elapsed: float,
) -> Section:
    table = Table(
        ["server", "concurrency", "echo tasks/s", "÷ A2A SDK", "p50 ms", "p99 ms"],
        title="Completed echo tasks per second",
    )
    section = Section(
        "a2a_sdk",
        "The official A2A SDK beside Synapse's two bindings",
        "python -m benchmarks.a2a_sdk",
        tables=[table],
        seconds=elapsed,
    )
    for c, res in results.items():
        base = res["sdk"]["rate"]
        for key, label in LABELS.items():
            x = res[key]
            table.add(
                label, c, rate(x["rate"]), ratio(x["rate"] / base), ms(x["p50"]), ms(x["p99"])
            )
            section.figures |= {
                f"a2a.c{c}.{key}.tasks_per_s": x["rate"],
                f"a2a.c{c}.{key}.p50_ms": x["p50"] * 1e3,
                f"a2a.c{c}.{key}.p99_ms": x["p99"] * 1e3,
                f"a2a.c{c}.{key}.over_sdk": x["rate"] / base,
            }
    section.notes += [
        f"A2A SDK: `a2a-sdk` echo agent (executor → TaskUpdater: start_work, add_artifact, "
        f"complete), served by uvicorn ({stack}).",
        "A2A clients: raw JSON-RPC `SendMessage` from aiohttp (one text part, blocking until "
        "TASK_STATE_COMPLETED), the same client for both A2A servers; latency per call.",
        "Synapse's A2A binding is measured twice: as the library runs by default (quiet: "
        "warnings only) and logging as `synapse serve --a2a` does by default (info, one line "
        "a task, to a file).",
        "Synapse binding: a requester `Peer` process submitting echo tasks (3 signed HTTP "
        "exchanges each) and awaiting their outcome; latency per task.",
        f"Each figure is the best of {rounds} run(s) of {seconds:g} s after a warm-up; the "
        "three servers are measured one after the other at each concurrency.",
    ]
    return section


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.a2a_sdk", description=__doc__)
    parser.add_argument("--seconds", type=float, default=4.0, help="measured time per run")
    parser.add_argument("--rounds", type=int, default=1, help="runs per figure (best kept)")
    parser.add_argument("--quick", action="store_true", help="short runs (a smoke test)")
    args = parser.parse_args(argv)
    if args.quick:
        section = run(seconds=0.5, warmup=0.2)
    else:
        section = run(seconds=args.seconds, rounds=args.rounds)
    print(section.text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
