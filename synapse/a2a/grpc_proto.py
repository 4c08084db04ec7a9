"""What the gRPC binding's server and client share: the `A2AService` of A2A v1.0's
`a2a.proto`, from the protobuf and gRPC modules the official `a2a-sdk` package ships (no
generated copies of our own), and the conversion between its messages and the proto JSON
the rest of this package speaks.

Importing this module needs the `grpc` extra (`pip install 'synapse-agent-p2p[grpc]'`: a2a-sdk's
generated modules, protobuf, grpcio); nothing else in `synapse` imports it unless the gRPC
binding is used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from synapse._distribution import install

try:
    import grpc
    from a2a.types import a2a_pb2
    from google.protobuf import any_pb2, message_factory
    from google.protobuf.json_format import MessageToDict, ParseDict
    from google.protobuf.message import Message as ProtoMessage
    from google.rpc import error_details_pb2, status_pb2
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        f"the A2A gRPC binding needs the grpc extra: {install('grpc')} (a2a-sdk and grpcio): {exc}"
    ) from exc

from synapse.a2a.errors import ERROR_DOMAIN, A2ACode, A2AError

SERVICE = a2a_pb2.DESCRIPTOR.services_by_name["A2AService"]
#: The gRPC metadata keys of A2A's service parameters (lowercase, as gRPC requires).
VERSION_KEY = "a2a-version"
EXTENSIONS_KEY = "a2a-extensions"
STATUS_DETAILS_KEY = "grpc-status-details-bin"


@dataclass(frozen=True)
class Method:
    name: str
    request: type[ProtoMessage]
    response: type[ProtoMessage]
    streaming: bool

    @property
    def path(self) -> str:
        return f"/{SERVICE.full_name}/{self.name}"


METHODS: dict[str, Method] = {
    m.name: Method(
        m.name,
        message_factory.GetMessageClass(m.input_type),
        message_factory.GetMessageClass(m.output_type),
        m.server_streaming,
    )
    for m in SERVICE.methods
}


def to_json(message: ProtoMessage) -> dict[str, Any]:
    """A protobuf message as proto JSON (camelCase members, enums by name)."""
    value: dict[str, Any] = MessageToDict(message)
    return value


def from_json(value: Any, cls: type[ProtoMessage]) -> ProtoMessage:
    """Proto JSON as a protobuf message of `cls` (unknown members ignored)."""
    message = cls()
    ParseDict(value if value is not None else {}, message, ignore_unknown_fields=True)
    return message


def status_code(error: A2AError) -> grpc.StatusCode:
    return (
        grpc.StatusCode[error.status[1]]
        if error.status[1] != "UNKNOWN"
        else grpc.StatusCode.UNKNOWN
    )


def rich_status(error: A2AError) -> tuple[grpc.StatusCode, bytes]:
    """The gRPC status of `error` and its `google.rpc.Status` (with an `ErrorInfo`: the
    reason and metadata), serialized for the `grpc-status-details-bin` trailer."""
    code = status_code(error)
    known = error.known
    info = error_details_pb2.ErrorInfo(
        reason=known.reason if known is not None else "UNKNOWN_ERROR",
        domain=ERROR_DOMAIN,
        metadata={k: str(v) for k, v in error.metadata.items()},
    )
    detail = any_pb2.Any()
    detail.Pack(info)
    status = status_pb2.Status(code=code.value[0], message=error.message, details=[detail])
    return code, status.SerializeToString()


def error_of(exc: grpc.aio.AioRpcError) -> A2AError:
    """The A2A error a failed call carries (its ErrorInfo reason), else one by status."""
    message = exc.details() or exc.code().name
    fallback = {
        grpc.StatusCode.NOT_FOUND: A2ACode.TASK_NOT_FOUND,
        grpc.StatusCode.INVALID_ARGUMENT: A2ACode.INVALID_PARAMS,
        grpc.StatusCode.UNAUTHENTICATED: A2ACode.AUTHENTICATION_FAILED,
        grpc.StatusCode.PERMISSION_DENIED: A2ACode.AUTHORIZATION_FAILED,
        grpc.StatusCode.UNAVAILABLE: A2ACode.AGENT_NOT_READY,
        grpc.StatusCode.UNIMPLEMENTED: A2ACode.UNSUPPORTED_OPERATION,
        grpc.StatusCode.FAILED_PRECONDITION: A2ACode.UNSUPPORTED_OPERATION,
    }.get(exc.code(), A2ACode.INTERNAL_ERROR)
    for key, value in exc.trailing_metadata() or ():
        if key != STATUS_DETAILS_KEY or not isinstance(value, bytes):
            continue
        status = status_pb2.Status()
        status.ParseFromString(value)
        for detail in status.details:
            info = error_details_pb2.ErrorInfo()
            if detail.Is(info.DESCRIPTOR) and detail.Unpack(info):
                made = A2AError.from_reason(info.reason, message, dict(info.metadata), fallback)
                return made
    return A2AError(fallback, message, {"grpcStatus": exc.code().name})


__all__ = [
    "EXTENSIONS_KEY",
    "METHODS",
    "SERVICE",
    "VERSION_KEY",
    "Method",
    "error_of",
    "from_json",
    "rich_status",
    "to_json",
]
