"""The sans-IO protocol engine: state machine, protocol handler, config, heartbeats, timers."""

from synapse.p2p.config import CapacityPolicy, P2PConfig

__all__ = ["CapacityPolicy", "P2PConfig"]
