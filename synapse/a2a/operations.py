"""The operations of A2A v1.0 by method name, on decoded JSON params: what every binding
dispatches to once it has the method and its params (JSON-RPC `method` and `params`; a REST
route, its path, query and body; a gRPC method and its request as proto JSON).

`strict=False` lets strings stand for numbers and booleans (REST query parameters).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from synapse.a2a import wire
from synapse.a2a.service import A2AService, convert

#: An operation: (service, principal, params as decoded JSON) → the result (a wire type),
#: or a `Subscription` for the streaming ones.
Operation = Callable[..., Awaitable[Any]]


async def _send_message(
    service: A2AService, principal: str, params: Any, strict: bool = True
) -> Any:
    return await service.send_message(
        convert(params, wire.SendMessageRequest, strict=strict), principal
    )


async def _send_streaming_message(
    service: A2AService, principal: str, params: Any, strict: bool = True
) -> Any:
    req = convert(params, wire.SendMessageRequest, strict=strict)
    return await service.send_streaming_message(req, principal)


async def _subscribe_to_task(
    service: A2AService, principal: str, params: Any, strict: bool = True
) -> Any:
    return service.subscribe_to_task(
        convert(params, wire.SubscribeToTaskRequest, strict=strict), principal
    )


async def _get_task(service: A2AService, principal: str, params: Any, strict: bool = True) -> Any:
    return service.get_task(convert(params, wire.GetTaskRequest, strict=strict), principal)


async def _list_tasks(service: A2AService, principal: str, params: Any, strict: bool = True) -> Any:
    return service.list_tasks(convert(params, wire.ListTasksRequest, strict=strict), principal)


async def _cancel_task(
    service: A2AService, principal: str, params: Any, strict: bool = True
) -> Any:
    return await service.cancel_task(
        convert(params, wire.CancelTaskRequest, strict=strict), principal
    )


async def _create_push_config(
    service: A2AService, principal: str, params: Any, strict: bool = True
) -> Any:
    req = convert(params, wire.TaskPushNotificationConfig, strict=strict)
    return await service.create_push_config(req, principal)


async def _get_push_config(
    service: A2AService, principal: str, params: Any, strict: bool = True
) -> Any:
    return service.get_push_config(
        convert(params, wire.TaskPushConfigRef, strict=strict), principal
    )


async def _list_push_configs(
    service: A2AService, principal: str, params: Any, strict: bool = True
) -> Any:
    req = convert(params, wire.ListTaskPushNotificationConfigsRequest, strict=strict)
    return service.list_push_configs(req, principal)


async def _delete_push_config(
    service: A2AService, principal: str, params: Any, strict: bool = True
) -> Any:
    await service.delete_push_config(
        convert(params, wire.TaskPushConfigRef, strict=strict), principal
    )
    return None


async def _get_extended_card(
    service: A2AService, principal: str, params: Any, strict: bool = True
) -> Any:
    return service.get_extended_card(
        convert(params, wire.GetExtendedAgentCardRequest, strict=strict), principal
    )


#: The operations of A2A v1.0 by their method name (JSON-RPC `method`, gRPC method,
#: and what each REST route stands for).
METHODS: Mapping[str, Operation] = {
    "SendMessage": _send_message,
    "SendStreamingMessage": _send_streaming_message,
    "GetTask": _get_task,
    "ListTasks": _list_tasks,
    "CancelTask": _cancel_task,
    "SubscribeToTask": _subscribe_to_task,
    "CreateTaskPushNotificationConfig": _create_push_config,
    "GetTaskPushNotificationConfig": _get_push_config,
    "ListTaskPushNotificationConfigs": _list_push_configs,
    "DeleteTaskPushNotificationConfig": _delete_push_config,
    "GetExtendedAgentCard": _get_extended_card,
}


#: The methods that answer with a stream of events.
STREAMING = frozenset({"SendStreamingMessage", "SubscribeToTask"})

__all__ = ["METHODS", "STREAMING", "Operation"]
