"""The A2A client: call A2A agents (over JSON-RPC, REST or gRPC) with the handle API of
Synapse tasks. It shares the wire types, the mapping and card checks of `synapse.a2a` with the
server, and imports nothing of it.
"""

from synapse.a2a.client.auth import ClientCredentials, OAuthClient
from synapse.a2a.client.core import (
    A2AClient,
    A2AEvent,
    A2AOutcome,
    A2ATaskHandle,
    describe_failure,
    parse_card,
    user_message,
)

__all__ = [
    "A2AClient",
    "A2AEvent",
    "A2AOutcome",
    "A2ATaskHandle",
    "ClientCredentials",
    "OAuthClient",
    "describe_failure",
    "parse_card",
    "user_message",
]
