"""A deterministic simulation of whole peers: seeded faults, virtual time, one process.

`simulate(seed)` runs two real peers (`synapse.Peer`: the asyncio runtime, the engine, the
transport's server and client, memory or SQLite stores) on a virtual clock
(`synapse.simulation.loop`) and a simulated network (`synapse.simulation.network`) that
loses, delays, duplicates and reorders messages, while peers are killed and restarted
(SIGKILL: memory lost, store kept), commits fail or crawl and clocks jump. The seed decides
everything; the run's trace is the same each time. When the faults stop, every task must end
on both sides, and the invariants of `synapse.simulation.invariants` must hold.

    python -m synapse.simulation --seeds 1000        # seeds 0..999
    python -m synapse.simulation --seed 17 --trace   # one seed, every event
"""

from synapse.simulation.run import RunOutcome, Scenario, simulate

__all__ = ["RunOutcome", "Scenario", "simulate"]
