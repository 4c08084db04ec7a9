"""The gRPC binding of A2A v1.0, server side: the `A2AService` of `a2a.proto` on
`grpc.aio`, every method (the two server-streaming ones included) dispatched to the same
operations as the other bindings. Requests and answers go through proto JSON; errors are
gRPC statuses (A2A v1.0's mapping) with a `google.rpc.Status` carrying an `ErrorInfo` in
`grpc-status-details-bin`, as the SDK's clients read them. The `a2a-version` metadata is
checked as the `A2A-Version` header is.

Every call is judged by the server's `SecurityPolicy`, the same code as the HTTP bindings'
(`synapse.a2a.server.security.Presented.from_grpc`: metadata for headers, the verified client
certificate of the TLS channel for mTLS): a refused credential is UNAUTHENTICATED, a valid
one lacking a scope or skill PERMISSION_DENIED, each with the `ErrorInfo` (reason
`UNAUTHENTICATED` / `PERMISSION_DENIED`) the other bindings give, and the challenge in a
`www-authenticate` trailer. With the peer's TLS the port serves TLS, requires client
certificates when the peer does, and checks them against its CRLs (`synapse.a2a.grpc_tls`).

Needs the `grpc` extra; imported only when `A2AServer(grpc_port=…)` serves it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import grpc

from synapse.a2a import grpc_proto, grpc_tls, wire
from synapse.a2a.errors import A2ACode, A2AError
from synapse.a2a.server.direct import DirectStream
from synapse.a2a.server.extensions import ACTIVE_EXTENSIONS
from synapse.a2a.server.operations import METHODS
from synapse.a2a.server.security import AuthError, Presented
from synapse.a2a.server.view import Subscription
from synapse.logs import get_logger

if TYPE_CHECKING:
    from synapse.a2a.server.host import BindingHost

log = get_logger("synapse.a2a")


class GrpcBinding:
    """A `grpc.aio` server for the A2A service of one `A2AServer`."""

    def __init__(self, server: BindingHost) -> None:
        self.server = server
        self.port: int | None = None
        self._grpc: grpc.aio.Server | None = None
        tls = server.tls
        #: Client certificates are checked against these CRLs (grpcio cannot).
        self.revocations = (
            tls.revocation_list() if tls is not None and tls.client_ca is not None else None
        )

    async def start(self, host: str, port: int) -> int:
        handlers: dict[str, grpc.RpcMethodHandler] = {}
        for name, method in grpc_proto.METHODS.items():
            if method.streaming:
                handlers[name] = grpc.unary_stream_rpc_method_handler(
                    self._streaming(name),
                    request_deserializer=method.request.FromString,
                    response_serializer=method.response.SerializeToString,
                )
            else:
                handlers[name] = grpc.unary_unary_rpc_method_handler(
                    self._unary(name),
                    request_deserializer=method.request.FromString,
                    response_serializer=method.response.SerializeToString,
                )
        self._grpc = grpc.aio.server()
        services = [grpc.method_handlers_generic_handler(grpc_proto.SERVICE.full_name, handlers)]
        try:  # A2A 0.3 beside it, from the 0.3 descriptors the SDK ships (and its pydantic)
            from synapse.a2a.server import grpc_v03
        except ImportError as exc:
            log.info("a2a_grpc_v03_unavailable", error=repr(exc))
        else:
            services.append(grpc_v03.handlers(self))
        self._grpc.add_generic_rpc_handlers(tuple(services))
        credentials = grpc_tls.server_credentials(self.server.tls) if self.server.tls else None
        if credentials is None:
            self.port = self._grpc.add_insecure_port(f"{host}:{port}")
        else:
            self.port = self._grpc.add_secure_port(f"{host}:{port}", credentials)
        await self._grpc.start()
        log.info("a2a_grpc_listening", host=host, port=self.port, tls=credentials is not None)
        return self.port

    async def stop(self, grace: float | None = None) -> None:
        server, self._grpc = self._grpc, None
        if server is not None:
            await server.stop(grace)

    async def check_call(
        self,
        name: str,
        params: Any,
        context: grpc.aio.ServicerContext[Any, Any],
        *,
        version: bool = True,
    ) -> str:
        """The caller's principal, once credentials, rights and (unless `version` is false:
        a 0.3 call) the version are checked, in the order of the HTTP bindings."""
        auth_context = context.auth_context() or {}
        if self.revocations is not None:
            pem = auth_context.get("x509_pem_cert")
            why = self.revocations.why_revoked(pem[0]) if pem else "no client certificate"
            if why is not None:
                raise AuthError(f"client certificate refused: {why}", challenge="MutualTLS")
        presented = Presented.from_grpc(context.invocation_metadata() or (), auth_context)
        principal = await self.server.authenticate_call(presented)
        await self.server.authorize(presented, name, params)
        if version:
            wire.check_version(presented.headers.get(grpc_proto.VERSION_KEY, "").strip())
        active = ACTIVE_EXTENSIONS.get()
        if active:  # what the call activated, as the HTTP bindings' answer header says
            await context.send_initial_metadata(((grpc_proto.EXTENSIONS_KEY, ",".join(active)),))
        return principal

    def _unary(self, name: str) -> Callable[..., Any]:
        method = grpc_proto.METHODS[name]

        async def handle(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            try:
                params = grpc_proto.to_json(request)
                principal = await self.check_call(name, params, context)
                result = await METHODS[name](self.server.service, principal, params, strict=False)
                return grpc_proto.from_json(
                    wire.to_builtins(result) if result is not None else {}, method.response
                )
            except A2AError as exc:
                await self.abort(context, exc)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # never a traceback to the caller
                log.exception("a2a_internal_error", error=repr(exc), binding="grpc")
                await self.abort(context, A2AError(A2ACode.INTERNAL_ERROR, "internal error"))
            raise AssertionError("unreachable: abort raises")

        return handle

    def _streaming(self, name: str) -> Callable[..., AsyncIterator[Any]]:
        method = grpc_proto.METHODS[name]

        async def handle(
            request: Any, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            subscription: Subscription | DirectStream | None = None
            try:
                params = grpc_proto.to_json(request)
                principal = await self.check_call(name, params, context)
                result = await METHODS[name](self.server.service, principal, params, strict=False)
                assert isinstance(result, Subscription | DirectStream)
                subscription = result
                async for event in subscription.events(None):
                    if event is not None:
                        yield grpc_proto.from_json(wire.to_builtins(event), method.response)
            except A2AError as exc:
                await self.abort(context, exc)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.exception("a2a_internal_error", error=repr(exc), binding="grpc")
                await self.abort(context, A2AError(A2ACode.INTERNAL_ERROR, "internal error"))
            finally:
                if subscription is not None:
                    subscription.close()

        return handle

    async def abort(self, context: grpc.aio.ServicerContext[Any, Any], error: A2AError) -> None:
        if error.code in (A2ACode.INTERNAL_ERROR, A2ACode.AGENT_NOT_READY):
            log.warning("a2a_error", code=error.code, message=error.message, binding="grpc")
        else:
            log.info("a2a_refused", code=error.code, message=error.message, binding="grpc")
        code, details = grpc_proto.rich_status(error)
        trailer: list[tuple[str, str | bytes]] = [(grpc_proto.STATUS_DETAILS_KEY, details)]
        challenge = getattr(error, "www_authenticate", "")
        if challenge:
            trailer.append(("www-authenticate", challenge))
        context.set_trailing_metadata(tuple(trailer))
        await context.abort(code, error.message)


__all__ = ["GrpcBinding"]
