"""A cluster: N replicas of agent-e on one PostgreSQL database behind nginx, and a requester."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from clusterkit import Cluster, ClusterFactory, Replica, Requester, replica_config
from lbserver import Nginx


@pytest.fixture
async def make_cluster(pg_url: str, tmp_path: Path) -> AsyncIterator[ClusterFactory]:
    made: list[Cluster] = []

    async def make(
        count: int = 3,
        *,
        lease_ttl: float = 2.0,
        read_timeout: float = 3.0,
        config_lines: str = "",
        handler: str | None = None,
        args: tuple[str, ...] = (),
    ) -> Cluster:
        # nginx needs the replicas' ports and the replicas need its URL: ports first.
        config = replica_config(tmp_path / "replica.toml", lease_ttl, config_lines)
        replicas = [
            Replica(f"e{n}", pg_url, "", "", config, tmp_path, handler=handler, args=args)
            for n in range(1, count + 1)
        ]
        nginx = Nginx([r.hostport for r in replicas], read_timeout=read_timeout)
        requester = Requester(f"{nginx.url}/synapse/callback")
        cluster = Cluster(replicas, nginx, requester, pg_url)
        made.append(cluster)
        nginx.start()
        for replica in replicas:
            replica.endpoint = f"{nginx.url}/synapse/callback"
            replica.requester_url = requester.url
        await requester.start()
        for replica in replicas:
            await replica.start()
        return cluster

    yield make
    for cluster in made:
        for replica in cluster.replicas:
            await replica.close()
        await cluster.requester.close()
        cluster.nginx.stop()
