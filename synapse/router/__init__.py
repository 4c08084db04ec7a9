"""A host agent: a peer that routes each task to a capable partner of a pool, fails over,
passes questions through, and fans tasks out (docs/routing.md).

It sits above the transport and the A2A client, below the command line
(`synapse serve --route POOL.toml`).
"""

from synapse.router.fanout import FanOutPlan, SubResult, SubTask, fan_out
from synapse.router.pool import A2APartnerConfig, Member, Pool, PoolConfig, SynapsePartnerConfig
from synapse.router.router import Declined, Relay, Routed, Router, RoutingHandler
from synapse.router.trust import CardVerdict, CardVerifier, ResultCheck, judge_card

__all__ = [
    "A2APartnerConfig",
    "CardVerdict",
    "CardVerifier",
    "Declined",
    "FanOutPlan",
    "Member",
    "Pool",
    "PoolConfig",
    "Relay",
    "ResultCheck",
    "Routed",
    "Router",
    "RoutingHandler",
    "SubResult",
    "SubTask",
    "SynapsePartnerConfig",
    "fan_out",
    "judge_card",
]
