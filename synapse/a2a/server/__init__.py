"""The A2A server: a peer's `TaskHandler` served to A2A clients over JSON-RPC, REST and gRPC
(`A2AServer`, mounted by `synapse.a2a.enable_a2a`), with its task service, listings, push
notifications and security schemes. It shares the wire types, the mapping and card checks of
`synapse.a2a` with the client, and imports nothing of it.
"""

from synapse.a2a.server.app import ANONYMOUS, DEFAULT_PATH, REQUESTER_PREFIX, A2AServer, A2ATask

__all__ = ["ANONYMOUS", "DEFAULT_PATH", "REQUESTER_PREFIX", "A2AServer", "A2ATask"]
