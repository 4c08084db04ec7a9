"""A2A 0.3 over gRPC, on the gRPC port beside 1.0: the 0.3 service (`a2a.v1.A2AService`, the
descriptors `a2a-sdk` ships in `a2a.compat.v0_3`) next to 1.0's (`lf.a2a.v1.A2AService`).

Each 0.3 call goes the way a 0.3 JSON-RPC call does (`synapse.a2a.v03`): the request, read
into the 0.3 JSON-RPC params by the SDK's own 0.3 protobuf mapping, becomes the 1.0 operation
it names; its answer (or each event of a stream) is translated back to 0.3 and written in the
0.3 protobuf form. Credentials and rights are judged as for every binding; 0.3 clients send
no `a2a-version`, so none is asked for.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import grpc
import grpc.aio
from a2a.compat.v0_3 import a2a_v0_3_pb2 as pb
from a2a.compat.v0_3 import proto_utils
from a2a.compat.v0_3 import types as types03
from google.protobuf import empty_pb2

from synapse.a2a import v03, wire
from synapse.a2a.errors import A2ACode, A2AError, invalid_params
from synapse.a2a.server.direct import DirectStream
from synapse.a2a.server.operations import METHODS
from synapse.a2a.server.view import Subscription
from synapse.logs import get_logger

log = get_logger("synapse.a2a")


class _Binding(Protocol):
    """What is used here of `synapse.a2a.server.grpc_binding.GrpcBinding`."""

    server: Any

    async def check_call(
        self, name: str, params: Any, context: Any, *, version: bool = True
    ) -> str: ...

    async def abort(self, context: Any, error: A2AError) -> None: ...


#: The 0.3 service's full name.
SERVICE = pb.DESCRIPTOR.services_by_name["A2AService"].full_name


def _dump(model: Any) -> dict[str, Any]:
    value: dict[str, Any] = model.model_dump(mode="json", by_alias=True, exclude_none=True)
    return value


def _send_params(request: Any) -> dict[str, Any]:
    """A 0.3 `SendMessageRequest`'s params. Proto3 has no absent field: a message sent
    without its `message_id` arrives with "", without its role with `ROLE_UNSPECIFIED`
    (which the SDK's conversion reads as "agent"); neither is a value, and each is refused
    as a missing one is on JSON-RPC and REST. A part with no content is invalid params."""
    try:
        params = _dump(proto_utils.FromProto.message_send_params(request))
    except ValueError as exc:
        raise invalid_params(f"Invalid params: {exc}".rstrip(": "), path="message") from None
    message = params.get("message")
    if isinstance(message, dict):
        if not message.get("messageId"):
            message.pop("messageId", None)
        if request.request.role == pb.ROLE_UNSPECIFIED:
            message.pop("role", None)
    return params


def _task_id(name: str, where: str) -> str:
    """`tasks/{id}` (or more after it) → the task's id."""
    parts = name.split("/")
    if len(parts) < 2 or parts[0] != "tasks" or not parts[1]:
        raise invalid_params(f"{where} must be tasks/{{id}}, not {name!r}", path=where)
    return parts[1]


def _push_ref(name: str) -> dict[str, Any]:
    """`tasks/{id}/pushNotificationConfigs/{config}` → 0.3 params."""
    parts = name.split("/")
    ref: dict[str, Any] = {"id": _task_id(name, "name")}
    if len(parts) >= 4 and parts[3]:
        ref["pushNotificationConfigId"] = parts[3]
    return ref


def _send_response(result: Any) -> Any:
    if isinstance(result, dict) and result.get("kind") == "message":
        return pb.SendMessageResponse(
            msg=proto_utils.ToProto.message(types03.Message.model_validate(result))
        )
    return pb.SendMessageResponse(
        task=proto_utils.ToProto.task(types03.Task.model_validate(result))
    )


def _task(result: Any) -> Any:
    return proto_utils.ToProto.task(types03.Task.model_validate(result))


def _push_config(result: Any) -> Any:
    config = types03.TaskPushNotificationConfig.model_validate(result)
    return proto_utils.ToProto.task_push_notification_config(config)


def _push_list(result: Any) -> Any:
    return pb.ListTaskPushNotificationConfigResponse(
        configs=[_push_config(c) for c in result or []]
    )


_EVENTS: dict[str, Any] = {
    "task": types03.Task,
    "message": types03.Message,
    "status-update": types03.TaskStatusUpdateEvent,
    "artifact-update": types03.TaskArtifactUpdateEvent,
}


def _stream_event(event: dict[str, Any]) -> Any:
    model = _EVENTS[str(event.get("kind"))].model_validate(event)
    return proto_utils.ToProto.stream_response(model)


@dataclass(frozen=True)
class _Method:
    """One 0.3 gRPC method: its request and response types, the 0.3 JSON-RPC method it
    stands for, its params from the request, and its answer from the 0.3 result."""

    request: Any
    response: Any
    method: str
    params: Callable[[Any], dict[str, Any]]
    answer: Callable[[Any], Any]
    streaming: bool = False


METHODS_03: dict[str, _Method] = {
    "SendMessage": _Method(
        pb.SendMessageRequest,
        pb.SendMessageResponse,
        "message/send",
        _send_params,
        _send_response,
    ),
    "SendStreamingMessage": _Method(
        pb.SendMessageRequest,
        pb.StreamResponse,
        "message/stream",
        _send_params,
        _stream_event,
        streaming=True,
    ),
    "GetTask": _Method(
        pb.GetTaskRequest,
        pb.Task,
        "tasks/get",
        lambda r: _dump(proto_utils.FromProto.task_query_params(r)),
        _task,
    ),
    "CancelTask": _Method(
        pb.CancelTaskRequest,
        pb.Task,
        "tasks/cancel",
        lambda r: {"id": _task_id(r.name, "name")},
        _task,
    ),
    "TaskSubscription": _Method(
        pb.TaskSubscriptionRequest,
        pb.StreamResponse,
        "tasks/resubscribe",
        lambda r: {"id": _task_id(r.name, "name")},
        _stream_event,
        streaming=True,
    ),
    "CreateTaskPushNotificationConfig": _Method(
        pb.CreateTaskPushNotificationConfigRequest,
        pb.TaskPushNotificationConfig,
        "tasks/pushNotificationConfig/set",
        lambda r: _dump(proto_utils.FromProto.task_push_notification_config_request(r)),
        _push_config,
    ),
    "GetTaskPushNotificationConfig": _Method(
        pb.GetTaskPushNotificationConfigRequest,
        pb.TaskPushNotificationConfig,
        "tasks/pushNotificationConfig/get",
        lambda r: _push_ref(r.name),
        _push_config,
    ),
    "ListTaskPushNotificationConfig": _Method(
        pb.ListTaskPushNotificationConfigRequest,
        pb.ListTaskPushNotificationConfigResponse,
        "tasks/pushNotificationConfig/list",
        lambda r: {"id": _task_id(r.parent, "parent")},
        _push_list,
    ),
    "DeleteTaskPushNotificationConfig": _Method(
        pb.DeleteTaskPushNotificationConfigRequest,
        empty_pb2.Empty,
        "tasks/pushNotificationConfig/delete",
        lambda r: _push_ref(r.name),
        lambda _result: empty_pb2.Empty(),
    ),
}


def handlers(binding: _Binding) -> grpc.GenericRpcHandler:
    """The 0.3 service's methods, served with `binding`'s checks and abort."""
    methods: dict[str, grpc.RpcMethodHandler] = {}
    for name, method in METHODS_03.items():
        kinds = {"request_deserializer": method.request.FromString}
        kinds["response_serializer"] = method.response.SerializeToString
        if method.streaming:
            methods[name] = grpc.unary_stream_rpc_method_handler(
                _streaming(binding, method), **kinds
            )
        else:
            methods[name] = grpc.unary_unary_rpc_method_handler(_unary(binding, method), **kinds)
    methods["GetAgentCard"] = grpc.unary_unary_rpc_method_handler(
        _card(binding),
        request_deserializer=pb.GetAgentCardRequest.FromString,
        response_serializer=pb.AgentCard.SerializeToString,
    )
    return grpc.method_handlers_generic_handler(SERVICE, methods)


async def _operation(binding: _Binding, method: _Method, request: Any, context: Any) -> Any:
    """The 1.0 operation a 0.3 request names, run once the caller is checked."""
    params03 = method.params(request)
    operation = v03.operation_of(method.method, params03)
    params = v03.params_to_v1(method.method, params03)
    principal = await binding.check_call(operation, params, context, version=False)
    return await METHODS[operation](binding.server.service, principal, params, strict=False)


def _unary(binding: _Binding, method: _Method) -> Callable[..., Any]:
    async def handle(request: Any, context: Any) -> Any:
        try:
            result = await _operation(binding, method, request, context)
            built = wire.to_builtins(result) if result is not None else None
            return method.answer(v03.result_to_v03(method.method, built))
        except A2AError as exc:
            await binding.abort(context, exc)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # never a traceback to the caller
            log.exception("a2a_internal_error", error=repr(exc), binding="grpc-0.3")
            await binding.abort(context, A2AError(A2ACode.INTERNAL_ERROR, "internal error"))
        raise AssertionError("unreachable: abort raises")

    return handle


def _streaming(binding: _Binding, method: _Method) -> Callable[..., AsyncIterator[Any]]:
    async def handle(request: Any, context: Any) -> AsyncIterator[Any]:
        subscription: Subscription | DirectStream | None = None
        try:
            result = await _operation(binding, method, request, context)
            assert isinstance(result, Subscription | DirectStream)
            subscription = result
            async for event in subscription.events(None):
                if event is not None:
                    yield method.answer(v03.event_to_v03(wire.to_builtins(event)))
        except A2AError as exc:
            await binding.abort(context, exc)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("a2a_internal_error", error=repr(exc), binding="grpc-0.3")
            await binding.abort(context, A2AError(A2ACode.INTERNAL_ERROR, "internal error"))
        finally:
            if subscription is not None:
                subscription.close()

    return handle


def _card(binding: _Binding) -> Callable[..., Any]:
    """0.3's `GetAgentCard`: the card the caller may see (its extended card, if the agent
    offers one), as a 0.3 card."""

    async def handle(request: Any, context: Any) -> Any:
        try:
            principal = await binding.check_call("GetExtendedAgentCard", {}, context, version=False)
            server = binding.server
            card = server.extended_card_for(principal) or server.card()
            value = v03.card_to_v03(wire.to_builtins(card))
            return proto_utils.ToProto.agent_card(types03.AgentCard.model_validate(value))
        except A2AError as exc:
            await binding.abort(context, exc)
        raise AssertionError("unreachable: abort raises")

    return handle


__all__ = ["METHODS_03", "SERVICE", "handlers"]
