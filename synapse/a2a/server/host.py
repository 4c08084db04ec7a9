"""What an A2A binding needs of the server it serves (`BindingHost`): the bindings
(`jsonrpc`, `rest`, `grpc_binding`) are made by `A2AServer`, and see it only through this
protocol, so neither side imports the other."""

from __future__ import annotations

from typing import Any, Protocol

from aiohttp import web

from synapse.a2a.server.security import Presented
from synapse.a2a.server.service import A2AService
from synapse.p2p.config import P2PConfig
from synapse.transport.tls import TLSConfig


class BindingHost(Protocol):
    """The server a binding answers for: its service, limits and security checks."""

    @property
    def config(self) -> P2PConfig: ...

    @property
    def service(self) -> A2AService: ...

    @property
    def keepalive(self) -> float:
        """Seconds between keep-alive comments on an idle event stream."""
        ...

    @property
    def tls(self) -> TLSConfig | None: ...

    async def authenticate(self, request: web.Request) -> str:
        """The principal of an HTTP request's caller (refused with an `A2AError`)."""
        ...

    async def authenticate_call(self, presented: Presented) -> str:
        """The principal of a caller, whatever the binding."""
        ...

    async def authorize(self, request: web.Request | Presented, method: str, params: Any) -> None:
        """Refuse a method (or a new task's skill) the caller may not use."""
        ...
