"""An explicit-state model checker of the protocol: two real engines, every interleaving.

`explore(Bounds())` takes every move of every reachable state of one task between a
requester and an executor (the two `synapse.p2p.engine.Engine`s a peer runs, with the
runtime's delivery rules around them), within the bounds on faults: messages lost,
duplicated and reordered, retries of the same id, commits that fail, waits past the
deduplication window, timers, a cancel, people's answers and handlers' choices. It checks
the invariants of `synapse.model.invariants` in every state, and liveness over the whole
graph; a violation comes with its shortest trace. `python -m synapse.model` runs it
(docs/verification.md).
"""

from synapse.model.bounds import Bounds
from synapse.model.checker import Result, Violation, explore

__all__ = ["Bounds", "Result", "Violation", "explore"]
