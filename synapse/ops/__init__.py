"""Operating a peer: health checks, Prometheus metrics, OpenTelemetry tracing, the web console.

Each is switched on for one `Peer` before it starts (docs/operations.md):

    from synapse.ops import enable_health, enable_metrics
    from synapse.ops.console import Reviewer, TokenAuth, enable_console
    from synapse.ops.tracing import enable_tracing      # needs the `otel` extra

    enable_health(peer)          # GET /healthz, GET /readyz
    enable_metrics(peer)         # GET /metrics, with the peer's own CollectorRegistry
    enable_console(peer, TokenAuth({"a-long-random-token": Reviewer("alice")}))
    enable_tracing(peer)
"""

from synapse.ops.health import Health, enable_health
from synapse.ops.metrics import PeerMetrics, enable_metrics

__all__ = ["Health", "PeerMetrics", "enable_health", "enable_metrics"]
