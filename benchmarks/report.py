"""`docs/benchmarks.md` and its chart, from the sections one run measured.

The performance targets are judged here, from the figures; the chart needs matplotlib (the
`bench` extra) and is skipped, with a note, without it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks._common import Section, Table

KIB = 1024


@dataclass(frozen=True)
class Target:
    what: str
    goal: str
    #: The figure(s) it is judged on, formatted; and whether it is met. None: not measured.
    judge: Callable[[dict[str, float]], tuple[str, bool] | None]


def _get(figures: dict[str, float], *names: str) -> list[float] | None:
    values = [figures[n] for n in names if n in figures]
    return values if len(values) == len(names) else None


def _codec_vs_pydantic(f: dict[str, float]) -> tuple[str, bool] | None:
    v = _get(f, "codec.request.pydantic_over_typed", "codec.status_update.pydantic_over_typed")
    full = _get(f, "codec.request.pydantic_over_full", "codec.status_update.pydantic_over_full")
    if v is None or full is None:
        return None
    text = (
        f"typed decode {v[0]:.1f}× (task_request), {v[1]:.1f}× (task_status_update) faster; "
        f"with the I-JSON pass {full[0]:.1f}× / {full[1]:.1f}×"
    )
    return text, min(v) >= 4


def _codec_vs_floor(f: dict[str, float]) -> tuple[str, bool] | None:
    v = _get(f, "codec.request.typed_over_floor", "codec.status_update.typed_over_floor")
    full = _get(f, "codec.request.full_over_floor", "codec.status_update.full_over_floor")
    if v is None or full is None:
        return None
    text = (
        f"typed decode {v[0]:.2f}× / {v[1]:.2f}× the floor; "
        f"with the I-JSON pass {full[0]:.1f}× / {full[1]:.1f}×"
    )
    return text, max(v) <= 1.5


def _e2e_of_floor(key: str, goal: float) -> Callable[[dict[str, float]], tuple[str, bool] | None]:
    def judge(f: dict[str, float]) -> tuple[str, bool] | None:
        v = _get(f, f"e2e.{key}.of_floor", f"e2e.{key}.tasks_per_s", f"e2e.{key}.floor_tasks_per_s")
        if v is None:
            return None
        return f"{v[0] * 100:.0f} % ({v[1]:,.0f} ÷ {v[2]:,.0f} tasks/s)", v[0] >= goal

    return judge


def _e2e_cpu(f: dict[str, float]) -> tuple[str, bool] | None:
    v = _get(
        f,
        "e2e.serve_memory.cpu_vs_floor",
        "e2e.serve_memory.cpu_us_per_task",
        "e2e.serve_memory.floor_cpu_us_per_task",
    )
    if v is None:
        return None
    return f"{v[0]:.2f}× ({v[1]:,.0f} ÷ {v[2]:,.0f} µs per task)", v[0] <= 1.4


def _e2e_p99(f: dict[str, float]) -> tuple[str, bool] | None:
    v = _get(f, "e2e.c1.serve_exchange_p99_ms", "e2e.c1.floor_exchange_p99_ms")
    if v is None:
        return None
    return f"{v[0]:.2f} ms, worst of the 3 exchanges (floor: {v[1]:.2f} ms)", v[0] < 2


def _a2a(f: dict[str, float]) -> tuple[str, bool] | None:
    v = _get(f, "a2a.c50.synapse.over_sdk", "a2a.c50.a2a.over_sdk", "a2a.c50.sdk.tasks_per_s")
    if v is None:
        return None
    text = f"Synapse binding {v[0]:.1f}×, A2A binding {v[1]:.1f}× the SDK's {v[2]:,.0f} tasks/s"
    return text, min(v[0], v[1]) > 1


def _memory(f: dict[str, float]) -> tuple[str, bool] | None:
    keys = [k for k in f if k.startswith("memory.finished") and k.endswith("_bytes")]
    in_memory = [k for k in keys if "sqlite" not in k]
    if not in_memory:
        return None
    worst = max(f[k] for k in in_memory)
    return f"at most {worst:,.0f} B ({worst / KIB:.2f} KiB) per task, either role", worst <= 4 * KIB


def _timers(f: dict[str, float]) -> tuple[str, bool] | None:
    v = _get(f, "timers.executor_cpu_share", "timers.requester_cpu_share", "timers.window_s")
    if v is None:
        return None
    text = f"executor {v[0] * 100:.2f} %, requester {v[1] * 100:.2f} % (over {v[2]:g} s)"
    return text, max(v[0], v[1]) < 0.02


def _a2a_memory(f: dict[str, float]) -> tuple[str, bool] | None:
    v = _get(f, "a2a_memory.a2a.rss_bytes_per_task", "a2a_memory.sdk.rss_bytes_per_task")
    if v is None or v[1] <= 0:
        return None
    return f"{v[0]:,.0f} B against the SDK's {v[1]:,.0f} B ({v[0] / v[1]:.1f}×)", v[0] <= v[1]


def _replica_vs(
    other: str, key: str, goal: float, *, at_most: bool
) -> Callable[[dict[str, float]], tuple[str, bool] | None]:
    """One PostgreSQL replica's figure `key` against `other`'s (the floor, or SQLite)."""

    def judge(f: dict[str, float]) -> tuple[str, bool] | None:
        v = _get(f, f"replicas.one.{key}", f"replicas.{other}.{key}")
        if v is None or v[1] <= 0:
            return None
        unit = "tasks/s" if key == "tasks_per_s" else "ms per task"
        value = v[0] / v[1]
        text = f"{value:.2f}× ({v[0]:,.2f} ÷ {v[1]:,.2f} {unit})"
        if key == "tasks_per_s":
            text = f"{value * 100:.0f} % ({v[0]:,.0f} ÷ {v[1]:,.0f} tasks/s)"
        return text, value <= goal if at_most else value >= goal

    return judge


def _replica_costs(f: dict[str, float]) -> tuple[str, bool] | None:
    v = _get(f, "replicas.one.explicit_per_task", "replicas.one.round_trips_per_task")
    if v is None:
        return None
    text = f"{v[0]:.2f} transactions (BEGIN … COMMIT), {v[1]:.2f} round trips per task"
    return text, v[0] <= 0.5 and v[1] <= 3


def _two_replicas(f: dict[str, float]) -> tuple[str, bool] | None:
    v = _get(f, "replicas.two.tasks_per_s", "replicas.one.tasks_per_s")
    if v is None or v[1] <= 0:
        return None
    return f"{v[0] / v[1]:.2f}× ({v[0]:,.0f} ÷ {v[1]:,.0f} tasks/s)", v[0] / v[1] >= 1.3


def _takeover_scan(f: dict[str, float]) -> tuple[str, bool] | None:
    v = _get(f, "takeover_scan.buffers_ratio", "takeover_scan.size_ratio")
    if v is None:
        return None
    text = f"{v[0]:.2f}× the buffers per scan with {v[1]:.0f}× the finished tasks"
    return text, v[0] <= 1.25


def _scaling(
    kind: str, what: tuple[str, ...]
) -> Callable[[dict[str, float]], tuple[str, bool] | None]:
    def judge(f: dict[str, float]) -> tuple[str, bool] | None:
        v = _get(f, f"scaling.{kind}.largest", *(f"scaling.{kind}.{w}_ratio" for w in what))
        if v is None:
            return None
        ratios = ", ".join(f"{w} {r:.2f}×" for w, r in zip(what, v[1:], strict=True))
        return f"at {v[0]:,.0f}, per unit: {ratios}", max(v[1:]) <= 1.25

    return judge


def _instructions(key: str, goal: float) -> Callable[[dict[str, float]], tuple[str, bool] | None]:
    def judge(f: dict[str, float]) -> tuple[str, bool] | None:
        v = _get(
            f,
            f"instructions.{key}.x_first",
            f"instructions.{key}.per_task",
            "instructions.fastest_floor.per_task",
        )
        if v is None:
            return None
        return f"{v[0]:.2f}× ({v[1]:,.0f} against {v[2]:,.0f} instructions)", v[0] <= goal

    return judge


def _serial_latency(f: dict[str, float]) -> tuple[str, bool] | None:
    v = _get(f, "e2e.c1.serve_p50_vs_fastest", "e2e.c1.serve_p99_vs_fastest")
    if v is None:
        return None
    return f"p50 {v[0]:.2f}×, p99 {v[1]:.2f}×", max(v) <= 1.2


TARGETS = (
    Target(
        "serve instructions per echo task vs the fastest floor, memory store",
        "≤ 2.0×",
        _instructions("serve_memory_store", 2.0),
    ),
    Target(
        "serve instructions per echo task vs the fastest floor, SQLite",
        "≤ 3.0×",
        _instructions("serve_sqlite_store_writer_thread_included", 3.0),
    ),
    Target("serve serial latency vs the fastest floor, concurrency 1", "≤ 1.2×", _serial_latency),
    Target("codec vs pydantic v2, decode + validate", "≥ 4× faster", _codec_vs_pydantic),
    Target("codec vs bare msgspec floor", "within 1.5×", _codec_vs_floor),
    Target(
        "serve echo tasks/s vs the floor, memory store, concurrency 50",
        "≥ 80 %",
        _e2e_of_floor("serve_memory", 0.8),
    ),
    Target(
        "serve echo tasks/s vs the floor, SQLite, concurrency 50",
        "≥ 50 %",
        _e2e_of_floor("serve_sqlite", 0.5),
    ),
    Target("serve executor CPU per task vs the floor's", "≤ 1.4×", _e2e_cpu),
    Target("serve p99 per exchange, concurrency 1", "< 2 ms", _e2e_p99),
    Target("echo tasks/s vs official A2A SDK, concurrency 50", "ahead", _a2a),
    Target("memory per stored finished task", "≤ 4 KiB", _memory),
    Target("A2A binding: memory per finished task vs the A2A SDK", "≤ the SDK's", _a2a_memory),
    Target("10,000 idle in-flight tasks", "< 2 % of one core", _timers),
    Target(
        "one PostgreSQL replica vs the PostgreSQL floor, tasks/s (durable)",
        "≥ 80 %",
        _replica_vs("floor", "tasks_per_s", 0.8, at_most=False),
    ),
    Target(
        "one replica + server CPU per task vs the floor's",
        "≤ 1.5×",
        _replica_vs("floor", "total_cpu_ms", 1.5, at_most=True),
    ),
    Target(
        "one PostgreSQL replica vs one SQLite process, tasks/s",
        "≥ 50 %",
        _replica_vs("sqlite", "tasks_per_s", 0.5, at_most=False),
    ),
    Target(
        "one replica's CPU per task vs the SQLite process's",
        "≤ 2×",
        _replica_vs("sqlite", "cpu_ms", 2.0, at_most=True),
    ),
    Target(
        "per echo task on one replica, concurrency 50",
        "≤ 0.5 transactions, ≤ 3 round trips",
        _replica_costs,
    ),
    Target("two replicas vs one, on this 2-core machine", "≥ 1.3×", _two_replicas),
    Target(
        "takeover scan, 100,000 vs 10,000 finished tasks stored",
        "flat (≤ 1.25× the buffers)",
        _takeover_scan,
    ),
    Target(
        "tasks in flight: memory, CPU per new task and per message about one, vs the smallest size",
        "flat (≤ 1.25×)",
        _scaling("tasks", ("memory", "new", "cancel")),
    ),
    Target(
        "partners: memory, CPU per heartbeat and per request, vs the smallest size",
        "flat (≤ 1.25×)",
        _scaling("partners", ("memory", "heartbeat", "request")),
    ),
)


def targets_table(figures: dict[str, float]) -> Table:
    table = Table(["target", "goal", "measured", "met"], title="Targets")
    for target in TARGETS:
        judged = target.judge(figures)
        if judged is None:
            table.add(target.what, target.goal, "not measured in this run", "–")
        else:
            text, met = judged
            table.add(target.what, target.goal, text, "yes" if met else "no")
    return table


# --- the chart ------------------------------------------------------------------------------------


def chart(figures: dict[str, float], path: Path) -> bool:
    """Four panels of the run's main figures; False if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    _codec_panel(axes[0][0], figures)
    _e2e_panel(axes[0][1], figures)
    _a2a_panel(axes[1][0], figures)
    _memory_panel(axes[1][1], figures)
    fig.suptitle("Synapse benchmarks (each panel measured side by side in one run)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _short(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.2f}"


def _bars(ax: Any, groups: Sequence[str], series: dict[str, list[float]], unit: str) -> None:
    if not groups:
        ax.text(0.5, 0.5, "not measured in this run", ha="center", va="center")
        ax.set_xticks([])
        ax.set_yticks([])
        return
    width = 0.8 / max(1, len(series))
    for i, (label, values) in enumerate(series.items()):
        xs = [g + i * width - 0.4 + width / 2 for g in range(len(groups))]
        bars = ax.bar(xs, values, width, label=label)
        ax.bar_label(bars, fmt=_short, fontsize=7, padding=1)
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel(unit)
    ax.legend(fontsize=8)


def _codec_panel(ax: Any, f: dict[str, float]) -> None:
    names = {
        "msgspec floor": "floor_us",
        "Synapse typed": "typed_us",
        "Synapse + I-JSON": "full_us",
        "pydantic v2": "pydantic_us",
        "json.loads": "json_us",
    }
    msgs = [m for m in ("request", "status_update") if f"codec.{m}.typed_us" in f]
    series = {k: [f[f"codec.{m}.{v}"] for m in msgs] for k, v in names.items()}
    _bars(ax, [f"task_{m}" for m in msgs], series, "µs per decode (lower is better)")
    ax.set_title("Decode + validate")


def _e2e_panel(ax: Any, f: dict[str, float]) -> None:
    names = {
        "floor": "floor\nasyncio",
        "floor_uvloop": "floor\nuvloop",
        "serve_memory": "serve\nmemory",
        "serve_sqlite": "serve\nSQLite",
        "serve_logging_off": "serve\nlogging off",
    }
    found = [k for k in names if f"e2e.{k}.tasks_per_s" in f]
    series = {
        "echo tasks/s": [f[f"e2e.{k}.tasks_per_s"] for k in found],
        "executor CPU µs per task": [f[f"e2e.{k}.cpu_us_per_task"] for k in found],
    }
    _bars(ax, [names[k] for k in found], series, "tasks/s (higher) · µs/task (lower)")
    ax.set_title("End to end, concurrency 50: serve beside the floor")


def _a2a_panel(ax: Any, f: dict[str, float]) -> None:
    cs = [c for c in (1, 50) if f"a2a.c{c}.sdk.tasks_per_s" in f]
    labels = {"sdk": "A2A SDK", "a2a": "Synapse A2A binding", "synapse": "Synapse binding"}
    series = {v: [f[f"a2a.c{c}.{k}.tasks_per_s"] for c in cs] for k, v in labels.items()}
    _bars(ax, [f"concurrency {c}" for c in cs], series, "echo tasks/s (higher is better)")
    ax.set_title("Completed echo tasks vs the official A2A SDK")


def _memory_panel(ax: Any, f: dict[str, float]) -> None:
    counts = sorted(
        int(k.split(".")[1].removeprefix("finished"))
        for k in f
        if k.startswith("memory.finished") and k.endswith(".requester_bytes")
    )
    series = {
        "requester, memory": [f[f"memory.finished{n}.requester_bytes"] for n in counts],
        "executor, memory": [f[f"memory.finished{n}.executor_bytes"] for n in counts],
        "executor, SQLite": [f[f"memory.finished{n}.executor_sqlite_bytes"] for n in counts],
    }
    _bars(ax, [f"{n:,} finished" for n in counts], series, "bytes per task (lower is better)")
    ax.set_title("Bytes per stored finished task")
    if not counts:
        return
    ax.axhline(4 * KIB, color="grey", linestyle="--", linewidth=1)
    ax.text(-0.4, 4 * KIB * 1.02, "target: 4 KiB in memory", fontsize=8, color="grey")


# --- the document ---------------------------------------------------------------------------------


def _load_line(machine: dict[str, Any]) -> str:
    load = " / ".join(str(x) for x in machine["load"])
    where = f"load average {load} over 1 / 5 / 15 min at the start, on {machine['nproc']} CPUs"
    if machine["load"][0] < 1.0:
        return (
            f"- **Load**: measured on a quiet machine ({where}); each section notes the load "
            "at its own start, and a section kept from an earlier run says when it was measured"
        )
    return (
        f"- **Load**: the machine was shared while measuring ({where}): absolute rates are low "
        "and noisy, CPU per task and side-by-side ratios much less so; each section notes the "
        "load at its own start"
    )


def markdown(
    sections: Sequence[Section],
    machine: dict[str, Any],
    *,
    command: str,
    elapsed: float,
    chart_file: str | None,
    analysis: str,
) -> str:
    figures: dict[str, float] = {}
    for section in sections:
        figures |= section.figures
    versions = ", ".join(f"{k} {v}" for k, v in machine["versions"].items())
    out = [
        "# Benchmarks",
        "",
        "Generated by `" + command + "` — do not edit by hand; run it again. Every comparison "
        "below was measured "
        + ("within one run" if "--keep" in command else "in this one run")
        + ", side by side, and is given as a ratio: absolute figures on a shared machine drift, "
        "ratios much less."
        + (
            " Sections kept from an earlier run (`--keep`) say when they were measured."
            if "--keep" in command
            else ""
        ),
        "",
        f"- **Machine**: {machine['nproc']} CPUs (`nproc`), {machine['cpu']}; "
        f"{machine['platform']}",
        f"- **Python**: {machine['python']}",
        f"- **Libraries**: {versions}",
        f"- **Date**: {machine['date']}; the whole run took {elapsed:.0f} s",
        *([_load_line(machine)] if "load" in machine else []),
        "- **Network**: loopback only (127.0.0.1); every server and client in its own process "
        "unless said otherwise",
        "",
        "Commands (one per benchmark; `python -m benchmarks` runs them all and writes this "
        "file, `docs/benchmarks.png` and `docs/benchmarks.json`):",
        "",
        "```",
        *[s.command for s in sections],
        "python -m benchmarks            # all of the above (--quick: a smoke run)",
        "```",
        "",
        targets_table(figures).markdown(),
        "",
    ]
    if chart_file:
        out += [f"![The main figures of this run]({chart_file})", ""]
    if analysis:
        out += [analysis.strip(), ""]
    for section in sections:
        out += [f"## {section.title}", "", f"`{section.command}` ({section.seconds:.0f} s)", ""]
        for table in section.tables:
            out += [table.markdown(), ""]
        out += [f"- {note}" for note in section.notes]
        out.append("")
    return "\n".join(out)


def write_json(sections: Sequence[Section], machine: dict[str, Any], path: Path) -> None:
    data = {"machine": machine, "sections": [s.to_json() for s in sections]}
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
