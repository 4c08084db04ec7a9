"""Fixtures of the store tests that need a PostgreSQL server."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from storekit import FakeClock

from synapse.store.leases import Ownership
from synapse.store.postgres import PostgresStore


@pytest.fixture
async def pair(pg_url: str) -> AsyncIterator[tuple[list[Ownership], FakeClock]]:
    """Two replicas of agent-e on one database (lease TTL 10 s), on one fake clock."""
    clock = FakeClock()
    stores = [PostgresStore(pg_url), PostgresStore(pg_url)]
    owners = [
        Ownership(store, agent_id="agent-e", url=f"http://127.0.0.1:{n}/", ttl=10, clock=clock)
        for n, store in enumerate(stores, start=1)
    ]
    for owner in owners:
        owner.take_over_at_start()  # registers the replica
    yield owners, clock
    for store in stores:
        await store.close()
