"""The operations of A2A v1.0 by method name, on decoded JSON params: what every binding
dispatches to once it has the method and its params (JSON-RPC `method` and `params`; a REST
route, its path, query and body; a gRPC method and its request as proto JSON).

`strict=False` lets strings stand for numbers and booleans (REST query parameters).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from synapse.a2a import wire
from synapse.a2a.server.requests import convert
from synapse.a2a.server.service import A2AService

#: An operation: (service, principal, params as decoded JSON) → the result (a wire type),
#: or a `Subscription` for the streaming ones.
Operation = Callable[..., Awaitable[Any]]


def _operation(name: str, request: type[Any]) -> Operation:
    """The operation that decodes its params as `request` and calls the service's `name`
    (awaited when it is a coroutine: the ones that wait for the engine or the store)."""

    async def operation(
        service: A2AService, principal: str, params: Any, strict: bool = True
    ) -> Any:
        typed = convert(params, request, strict=strict)
        # Everything the caller owns is per tenant: its principal is scoped to the one named.
        principal = service.tenants.scope(principal, getattr(typed, "tenant", "") or "")
        result = getattr(service, name)(typed, principal)
        return await result if inspect.isawaitable(result) else result

    operation.__name__ = operation.__qualname__ = name
    return operation


#: The operations of A2A v1.0 by their method name (JSON-RPC `method`, gRPC method,
#: and what each REST route stands for).
METHODS: Mapping[str, Operation] = {
    method: _operation(name, request)
    for method, name, request in (
        ("SendMessage", "send_message", wire.SendMessageRequest),
        ("SendStreamingMessage", "send_streaming_message", wire.SendMessageRequest),
        ("GetTask", "get_task", wire.GetTaskRequest),
        ("ListTasks", "list_tasks", wire.ListTasksRequest),
        ("CancelTask", "cancel_task", wire.CancelTaskRequest),
        ("SubscribeToTask", "subscribe_to_task", wire.SubscribeToTaskRequest),
        ("CreateTaskPushNotificationConfig", "create_push_config", wire.TaskPushNotificationConfig),
        ("GetTaskPushNotificationConfig", "get_push_config", wire.TaskPushConfigRef),
        (
            "ListTaskPushNotificationConfigs",
            "list_push_configs",
            wire.ListTaskPushNotificationConfigsRequest,
        ),
        ("DeleteTaskPushNotificationConfig", "delete_push_config", wire.TaskPushConfigRef),
        ("GetExtendedAgentCard", "get_extended_card", wire.GetExtendedAgentCardRequest),
    )
}


#: The methods that answer with a stream of events.
STREAMING = frozenset({"SendStreamingMessage", "SubscribeToTask"})

__all__ = ["METHODS", "STREAMING", "Operation"]
