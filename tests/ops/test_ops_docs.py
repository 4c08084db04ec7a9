"""docs/operations.md and the Grafana dashboard name only metrics that exist, and every metric
a peer exposes is in the reference."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from synapse.a2a.server.push_health import PushHealthBook, register_push_metrics
from synapse.ops.metrics import PeerMetrics

DOCS = Path(__file__).resolve().parents[2] / "docs"
SUFFIXES = ("_bucket", "_count", "_sum", "_created")


def exposed() -> dict[str, str]:
    """Family name → type of every metric a fresh peer's registry exposes, observed once."""
    metrics = PeerMetrics()
    metrics.handler_seconds.labels("echo", "completed").observe(0.1)
    metrics.http_seconds.labels("GET", "/metrics", "200").observe(0.1)
    metrics.commit_seconds.labels("ok").observe(0.1)
    metrics.transitions.labels("requester", "idle", "pending").inc()
    for counter in (metrics.received, metrics.sent):
        counter.labels("p2p:task_request", "accepted").inc()
    for counter in (metrics.nacks_sent, metrics.nacks_received, metrics.retries):
        counter.labels("x").inc()
    metrics.dead_letters.labels("p2p:task_request").inc()
    # A peer serving A2A counts its push deliveries in the same registry (`serve --a2a`).
    register_push_metrics(PushHealthBook(), metrics.registry)
    text = metrics.render()[0].decode()
    # prometheus_client's `*_created` timestamps come with every counter and histogram.
    families = {
        f.name: f.type
        for f in text_string_to_metric_families(text)
        if not f.name.endswith("_created")
    }
    # The runtime gauges appear once a peer runs; name them from the collector itself.
    families |= {
        "synapse_tasks": "gauge",
        "synapse_outbox_messages": "gauge",
        "synapse_outbox_oldest_age_seconds": "gauge",
        "synapse_outbox_dead_letters": "gauge",
        "synapse_partner_reachable": "gauge",
    }
    return families


def series_names(families: dict[str, str]) -> set[str]:
    names = set()
    for name, kind in families.items():
        if kind == "counter":
            names.add(name + "_total")
        elif kind == "histogram":
            names.update(name + s for s in SUFFIXES[:3])
        else:
            names.add(name)
    return names


def test_the_reference_lists_every_metric_with_its_type() -> None:
    doc = (DOCS / "operations.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `(synapse_\w+)` \| (\w+) \|", doc, re.MULTILINE))
    families = exposed()
    documented = {
        (name.removesuffix("_total") if kind == "counter" else name): kind
        for name, kind in rows.items()
    }
    assert documented == families


def test_dashboard_and_alerts_use_existing_series() -> None:
    names = series_names(exposed())
    dashboard = json.loads((DOCS / "grafana-dashboard.json").read_text(encoding="utf-8"))
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(exprs) >= 15
    used = {m for e in exprs for m in re.findall(r"synapse_\w+", e)}
    assert used <= names, used - names
    assert {"synapse_outbox_oldest_age_seconds", "synapse_partner_reachable"} <= used
    doc = (DOCS / "operations.md").read_text(encoding="utf-8")
    alerts = doc.split("### Alerts", 1)[1].split("## Tracing", 1)[0]
    in_alerts = set(re.findall(r"synapse_\w+", alerts))
    assert in_alerts <= names, in_alerts - names
    assert {
        "synapse_outbox_oldest_age_seconds",
        "synapse_dead_letters_total",
        "synapse_partner_reachable",
    } <= in_alerts


def test_the_screenshots_the_page_shows_exist() -> None:
    doc = (DOCS / "operations.md").read_text(encoding="utf-8")
    images = re.findall(r"\]\((images/[\w.-]+\.png)\)", doc)
    assert len(images) == 5
    for image in images:
        assert (DOCS / image).stat().st_size > 10_000, image
