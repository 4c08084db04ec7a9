"""Replicas in network namespaces under real partitions, pauses, kills and PostgreSQL
restarts, one replica's clock off (`partitions.py`): a short seeded run, its history
checked on both sides.

Needs root (network namespaces); without it the test is skipped outside CI, and fails
under `CI=true`. Longer runs: `python tests/cluster/partitions.py --seeds 0-9`.
"""

from __future__ import annotations

import os

import pytest
from partitions import run_seed

pytestmark = pytest.mark.slow

#: Bounded for CI: a few hundred tasks under about twenty seconds of faults per seed.
TASKS = int(os.environ.get("SYNAPSE_PARTITION_TASKS", "300"))
SECONDS = float(os.environ.get("SYNAPSE_PARTITION_SECONDS", "20"))


# Seeds 12 and 22 between them cut every link, pause, kill, and restart PostgreSQL both ways;
# seed 12 runs e2's clock 0.95 s ahead (past the third of a TTL between renewals), seed 22
# e1's 0.79 s behind.
@pytest.mark.parametrize("seed", [12, 22])
async def test_partitions_pauses_kills_and_database_restarts_lose_and_double_nothing(
    seed: int,
) -> None:
    outcome = await run_seed(seed, tasks=TASKS, seconds=SECONDS)
    print(
        f"partitions, seed {seed}: {outcome.run.tasks} tasks in {outcome.run.elapsed:.0f} s "
        f"under {len(outcome.faults)} faults ({'; '.join(map(str, outcome.faults))}), "
        f"{outcome.skew}: "
        f"{len(outcome.found)} anomalies; {dict(outcome.run.states())}"
    )
    assert outcome.found == []
    # The faults touched the run: not every task completed untouched by them.
    assert len(outcome.faults) >= 3
