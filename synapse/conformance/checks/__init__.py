"""The checks: each one exercises the target from outside and raises `CheckFailed` on a fault.

A check is an async function of a `CheckContext`, registered with an id, a title and the section of
the spec it covers. `setup` runs first (if it fails nothing else can work); the `main` checks run
concurrently, each on task ids of its own; the `final` ones judge, once everything settled, what
the listener saw across all of them (specs/protocol.md: 'Signatures', the
one-at-a-time delivery of 'Transport', the rules of 'Task states').
"""

from __future__ import annotations

from synapse.conformance.checks.base import CHECKS, Check, CheckContext, CheckFn, Timing, check

# Importing a module registers its checks; the order of these imports is the order of the
# checks (setup first, the final ones last).
# isort: off
from synapse.conformance.checks import flows  # noqa: F401
from synapse.conformance.checks import refusals  # noqa: F401
from synapse.conformance.checks import dedup  # noqa: F401
# isort: on

__all__ = ["CHECKS", "Check", "CheckContext", "CheckFn", "Timing", "check"]
