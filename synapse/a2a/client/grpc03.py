"""gRPC to an A2A 0.3 agent: each 1.0 operation sent as the 0.3 service's method
(`a2a.v1.A2AService`, the descriptors `a2a-sdk` ships), its answer read back as 1.0's.

The request is the 0.3 JSON-RPC params of the operation (`synapse.a2a.v03`) written in 0.3's
protobuf form by the SDK's own 0.3 mapping; the answer goes the other way. Needs the `grpc`
extra, as 1.0 over gRPC does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from a2a.compat.v0_3 import a2a_v0_3_pb2 as pb
from a2a.compat.v0_3 import proto_utils
from a2a.compat.v0_3 import types as types03
from google.protobuf import empty_pb2

from synapse.a2a import v03
from synapse.a2a.client.transports import GrpcTransport
from synapse.a2a.errors import A2ACode, A2AError

SERVICE = pb.DESCRIPTOR.services_by_name["A2AService"].full_name


def _dump(model: Any) -> Any:
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


def _send(rpc: dict[str, Any]) -> Any:
    params = types03.MessageSendParams.model_validate(rpc)
    request = pb.SendMessageRequest(
        request=proto_utils.ToProto.message(params.message),
        metadata=proto_utils.ToProto.metadata(params.metadata),
    )
    if params.configuration is not None:
        request.configuration.CopyFrom(
            proto_utils.ToProto.message_send_configuration(params.configuration)
        )
    return request


def _push_name(rpc: dict[str, Any]) -> str:
    name = f"tasks/{rpc.get('id', '')}/pushNotificationConfigs"
    config = rpc.get("pushNotificationConfigId")
    return f"{name}/{config}" if config else name


def _create_push(rpc: dict[str, Any]) -> Any:
    config = types03.TaskPushNotificationConfig.model_validate(rpc)
    return pb.CreateTaskPushNotificationConfigRequest(
        parent=f"tasks/{config.task_id}",
        config_id=config.push_notification_config.id or "",
        config=proto_utils.ToProto.task_push_notification_config(config),
    )


def _send_answer(response: Any) -> Any:
    if response.WhichOneof("payload") == "msg":
        return _dump(proto_utils.FromProto.message(response.msg))
    return _dump(proto_utils.FromProto.task(response.task))


#: 0.3 method → (gRPC method, its request from the 0.3 params, its response type, the 0.3
#: result from the response).
_METHODS: dict[str, tuple[str, Callable[[dict[str, Any]], Any], Any, Callable[[Any], Any]]] = {
    "message/send": ("SendMessage", _send, pb.SendMessageResponse, _send_answer),
    "message/stream": (
        "SendStreamingMessage",
        _send,
        pb.StreamResponse,
        lambda r: _dump(proto_utils.FromProto.stream_response(r)),
    ),
    "tasks/get": (
        "GetTask",
        lambda rpc: pb.GetTaskRequest(
            name=f"tasks/{rpc.get('id', '')}", history_length=rpc.get("historyLength") or 0
        ),
        pb.Task,
        lambda r: _dump(proto_utils.FromProto.task(r)),
    ),
    "tasks/cancel": (
        "CancelTask",
        lambda rpc: pb.CancelTaskRequest(name=f"tasks/{rpc.get('id', '')}"),
        pb.Task,
        lambda r: _dump(proto_utils.FromProto.task(r)),
    ),
    "tasks/resubscribe": (
        "TaskSubscription",
        lambda rpc: pb.TaskSubscriptionRequest(name=f"tasks/{rpc.get('id', '')}"),
        pb.StreamResponse,
        lambda r: _dump(proto_utils.FromProto.stream_response(r)),
    ),
    "tasks/pushNotificationConfig/set": (
        "CreateTaskPushNotificationConfig",
        _create_push,
        pb.TaskPushNotificationConfig,
        lambda r: _dump(proto_utils.FromProto.task_push_notification_config(r)),
    ),
    "tasks/pushNotificationConfig/get": (
        "GetTaskPushNotificationConfig",
        lambda rpc: pb.GetTaskPushNotificationConfigRequest(name=_push_name(rpc)),
        pb.TaskPushNotificationConfig,
        lambda r: _dump(proto_utils.FromProto.task_push_notification_config(r)),
    ),
    "tasks/pushNotificationConfig/list": (
        "ListTaskPushNotificationConfig",
        lambda rpc: pb.ListTaskPushNotificationConfigRequest(parent=f"tasks/{rpc.get('id', '')}"),
        pb.ListTaskPushNotificationConfigResponse,
        lambda r: [
            _dump(proto_utils.FromProto.task_push_notification_config(c)) for c in r.configs
        ],
    ),
    "tasks/pushNotificationConfig/delete": (
        "DeleteTaskPushNotificationConfig",
        lambda rpc: pb.DeleteTaskPushNotificationConfigRequest(name=_push_name(rpc)),
        empty_pb2.Empty,
        lambda _r: None,
    ),
    "agent/getAuthenticatedExtendedCard": (
        "GetAgentCard",
        lambda _rpc: pb.GetAgentCardRequest(),
        pb.AgentCard,
        lambda r: _dump(proto_utils.FromProto.agent_card(r)),
    ),
}


class Grpc03Transport(GrpcTransport):
    """The 0.3 service over the channel `GrpcTransport` opens (TLS, credentials and
    extensions as for 1.0; no `a2a-version`, which 0.3 has not)."""

    def _prepare(
        self, method: str, params: dict[str, Any], kind: str
    ) -> tuple[Any, Any, Callable[[Any], Any]]:
        legacy = v03.METHOD_TO_V03.get(method)
        if legacy is None or legacy not in _METHODS:
            raise A2AError(
                A2ACode.UNSUPPORTED_OPERATION,
                f"{method} is not an operation of A2A 0.3 over gRPC, which this agent speaks",
            )
        name, request_of, response, answer = _METHODS[legacy]
        request = request_of(v03.params_to_v03(method, params))
        stub = getattr(self._channel, kind)(
            f"/{SERVICE}/{name}",
            request_serializer=type(request).SerializeToString,
            response_deserializer=response.FromString,
        )
        if kind == "unary_stream":
            return stub, request, lambda event: v03.event_to_v1(answer(event))
        return stub, request, lambda value: v03.result_to_v1(method, answer(value))

    async def _metadata(self, method: str, params: dict[str, Any]) -> tuple[tuple[str, str], ...]:
        found = await super()._metadata(method, params)
        return tuple(e for e in found if e[0] != self._proto.VERSION_KEY)


__all__ = ["Grpc03Transport"]
