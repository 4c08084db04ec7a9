"""Conformance kit: check any Synapse peer against the protocol's flows, black box, over HTTP.

    report = await run_conformance("http://127.0.0.1:8765/synapse/callback", "agent-e", secret)
    print(report.table())

The kit plays the requester against a running peer that offers the demo capabilities of
specs/protocol.md, 'The demo handler' and judges every reply and callback it gets (see
docs/conformance.md).
"""

from synapse.conformance.checks import CHECKS, Check, Timing
from synapse.conformance.fixture_types import ConformanceRunner, ExecutorFactory
from synapse.conformance.kit import (
    DEFAULT_KIT_ID,
    DEFAULT_LISTEN,
    ConformanceKit,
    KitConfig,
    run_conformance,
)
from synapse.conformance.report import CheckResult, Report, Status

__all__ = [
    "CHECKS",
    "DEFAULT_KIT_ID",
    "DEFAULT_LISTEN",
    "Check",
    "CheckResult",
    "ConformanceKit",
    "ConformanceRunner",
    "ExecutorFactory",
    "KitConfig",
    "Report",
    "Status",
    "Timing",
    "run_conformance",
]
