"""Synapse: a Python engine for the Synapse agent-to-agent P2P protocol."""

__version__ = "0.1.0"
