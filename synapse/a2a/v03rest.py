"""A2A 0.3's HTTP+JSON/REST binding: its routes (`/v1/message:send`, `/v1/tasks/{id}` …) and
its bodies, the proto JSON of the 0.3 `a2a.proto` (a message's parts in `content`, a data
part's object under `data.data`, files as `fileWithUri` / `fileWithBytes`, states and roles by
enum name, `TASK_STATE_CANCELLED`), translated to and from the 0.3 JSON-RPC shapes of
`synapse.a2a.v03`, which go on to 1.0 from there.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import quote

from synapse.a2a.errors import A2ACode, A2AError, invalid_params

#: 0.3 REST state name → 0.3 JSON-RPC state (kebab case), and back.
_STATES: Final[dict[str, str]] = {
    "TASK_STATE_SUBMITTED": "submitted",
    "TASK_STATE_WORKING": "working",
    "TASK_STATE_INPUT_REQUIRED": "input-required",
    "TASK_STATE_COMPLETED": "completed",
    "TASK_STATE_CANCELLED": "canceled",
    "TASK_STATE_FAILED": "failed",
    "TASK_STATE_REJECTED": "rejected",
    "TASK_STATE_AUTH_REQUIRED": "auth-required",
    "TASK_STATE_UNSPECIFIED": "unknown",
}
_STATES_BACK: Final[dict[str, str]] = {v: k for k, v in _STATES.items()}
_ROLES: Final[dict[str, str]] = {"ROLE_USER": "user", "ROLE_AGENT": "agent"}
_ROLES_BACK: Final[dict[str, str]] = {v: k for k, v in _ROLES.items()}


def _get(value: Mapping[str, Any], name: str) -> Any:
    """Member `name` (camelCase) of a proto JSON object, also read in snake_case, as protobuf
    parsers do (the official SDK's 0.3 REST client writes proto field names)."""
    if name in value:
        return value[name]
    return value.get(re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), name))


@dataclass(frozen=True, slots=True)
class Route03:
    """One 0.3 REST route: its verb and path pattern, the 0.3 method it is."""

    verb: str
    pattern: re.Pattern[str]
    method: str
    body: bool = False


def _route(verb: str, path: str, method: str, *, body: bool = False) -> Route03:
    regex = re.sub(
        r"\{(\w+)\}", r"(?P<\1>[^/:]+)", re.escape(path).replace(r"\{", "{").replace(r"\}", "}")
    )
    return Route03(verb, re.compile(regex + "$"), method, body)


ROUTES_03: Final = (
    _route("POST", "/v1/message:send", "message/send", body=True),
    _route("POST", "/v1/message:stream", "message/stream", body=True),
    _route("POST", "/v1/tasks/{id}:cancel", "tasks/cancel"),
    _route("GET", "/v1/tasks/{id}:subscribe", "tasks/resubscribe"),
    _route("POST", "/v1/tasks/{id}:subscribe", "tasks/resubscribe"),
    _route("GET", "/v1/tasks/{id}", "tasks/get"),
    _route(
        "GET", "/v1/tasks/{id}/pushNotificationConfigs/{cid}", "tasks/pushNotificationConfig/get"
    ),
    _route(
        "DELETE",
        "/v1/tasks/{id}/pushNotificationConfigs/{cid}",
        "tasks/pushNotificationConfig/delete",
    ),
    _route(
        "POST",
        "/v1/tasks/{id}/pushNotificationConfigs",
        "tasks/pushNotificationConfig/set",
        body=True,
    ),
    _route("GET", "/v1/tasks/{id}/pushNotificationConfigs", "tasks/pushNotificationConfig/list"),
    _route("GET", "/v1/card", "agent/getAuthenticatedExtendedCard"),
)


def match03(verb: str, path: str) -> tuple[Route03, dict[str, str]] | None:
    for route in ROUTES_03:
        found = route.pattern.match(path)
        if found is not None and route.verb == verb:
            return route, found.groupdict()
    return None


# --- requests: REST → the 0.3 JSON-RPC params ------------------------------------------------


def params_of(
    method: str, variables: Mapping[str, str], query: Mapping[str, Any], body: Mapping[str, Any]
) -> dict[str, Any]:
    """The 0.3 JSON-RPC params a 0.3 REST request stands for."""
    task_id = variables.get("id")
    if method in ("message/send", "message/stream"):
        message = body.get("message", body.get("request"))  # its json_name, or field name
        params: dict[str, Any] = {"message": message_to_rpc(message)}
        config = body.get("configuration")
        if isinstance(config, dict):
            rpc_config = {
                k: v
                for k in ("acceptedOutputModes", "historyLength", "blocking")
                if (v := _get(config, k)) is not None
            }
            push = _get(config, "pushNotification")
            if isinstance(push, dict):
                rpc_config["pushNotificationConfig"] = push_to_rpc(push)
            params["configuration"] = rpc_config
        if body.get("metadata") is not None:
            params["metadata"] = body["metadata"]
        return params
    if method == "tasks/get":
        params = {"id": task_id}
        if _get(query, "historyLength") is not None:
            try:
                params["historyLength"] = int(_get(query, "historyLength"))
            except (TypeError, ValueError):
                raise invalid_params("historyLength must be an integer") from None
        return params
    if method == "tasks/pushNotificationConfig/set":
        config = body.get("config")
        inner = _get(config, "pushNotificationConfig") if isinstance(config, dict) else None
        rpc = push_to_rpc(inner if isinstance(inner, dict) else {})
        if _get(body, "configId") and not rpc.get("id"):
            rpc["id"] = _get(body, "configId")
        return {"taskId": task_id, "pushNotificationConfig": rpc}
    if method in ("tasks/pushNotificationConfig/get", "tasks/pushNotificationConfig/delete"):
        return {"id": task_id, "pushNotificationConfigId": variables.get("cid")}
    if method == "agent/getAuthenticatedExtendedCard":
        return {}
    return {"id": task_id}


def message_to_rpc(message: Any) -> dict[str, Any]:
    if not isinstance(message, dict):
        raise invalid_params("message must be an object", path="message")
    out = {
        k: v
        for k in ("messageId", "contextId", "taskId", "metadata", "extensions")
        if (v := _get(message, k)) is not None
    }
    out["kind"] = "message"
    role = message.get("role")
    out["role"] = _ROLES.get(role, role) if isinstance(role, str) else role
    out["parts"] = [part_to_rpc(p) for p in message.get("content") or []]
    return out


def part_to_rpc(part: Any) -> dict[str, Any]:
    if not isinstance(part, dict):
        raise invalid_params("a part must be an object", path="part")
    meta = {"metadata": part["metadata"]} if part.get("metadata") is not None else {}
    if "text" in part:
        return {"kind": "text", "text": part["text"], **meta}
    if isinstance(part.get("data"), dict):
        return {"kind": "data", "data": part["data"].get("data") or {}, **meta}
    file = part.get("file")
    if isinstance(file, dict):
        rpc_file = {k: v for k in ("mimeType", "name") if (v := _get(file, k))}
        if _get(file, "fileWithUri") is not None:
            rpc_file["uri"] = _get(file, "fileWithUri")
        else:
            rpc_file["bytes"] = _get(file, "fileWithBytes") or ""
        return {"kind": "file", "file": rpc_file, **meta}
    raise invalid_params("a part holds text, file or data", path="part")


def push_to_rpc(config: Mapping[str, Any]) -> dict[str, Any]:
    return {
        k: v for k in ("id", "url", "token", "authentication") if (v := config.get(k)) is not None
    }


# --- answers: the 0.3 JSON-RPC result → REST -------------------------------------------------


def result_of(method: str, result: Any) -> Any:
    """The REST body of a 0.3 JSON-RPC result."""
    if method == "message/send":
        if isinstance(result, dict) and result.get("kind") == "message":
            return {"message": message_to_rest(result)}
        return {"task": task_to_rest(result)}
    if method in ("tasks/get", "tasks/cancel"):
        return task_to_rest(result)
    if method in ("tasks/pushNotificationConfig/set", "tasks/pushNotificationConfig/get"):
        return push_to_rest(result)
    if method == "tasks/pushNotificationConfig/list":
        return {"configs": [push_to_rest(c) for c in result or []]}
    if method == "tasks/pushNotificationConfig/delete":
        return {}
    return result


def event_to_rest(event: Mapping[str, Any]) -> dict[str, Any]:
    """A 0.3 stream event (tagged by `kind`) as the REST `StreamResponse`."""
    kind = event.get("kind")
    if kind == "task":
        return {"task": task_to_rest(event)}
    if kind == "message":
        return {"message": message_to_rest(event)}
    inner = {k: v for k, v in event.items() if k != "kind"}
    if kind == "status-update":
        inner["status"] = status_to_rest(event.get("status") or {})
        return {"statusUpdate": inner}
    inner["artifact"] = artifact_to_rest(event.get("artifact") or {})
    return {"artifactUpdate": inner}


def message_to_rest(message: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in message.items() if k not in ("kind", "parts", "role")}
    role = message.get("role")
    out["role"] = _ROLES_BACK.get(role, "ROLE_UNSPECIFIED") if isinstance(role, str) else role
    out["content"] = [part_to_rest(p) for p in message.get("parts") or []]
    return out


def part_to_rest(part: Mapping[str, Any]) -> dict[str, Any]:
    meta = {"metadata": part["metadata"]} if part.get("metadata") is not None else {}
    kind = part.get("kind")
    if kind == "text":
        return {"text": part.get("text", ""), **meta}
    if kind == "data":
        return {"data": {"data": part.get("data")}, **meta}
    file = part.get("file") or {}
    rest_file = {k: file[k] for k in ("mimeType", "name") if file.get(k)}
    if "uri" in file:
        rest_file["fileWithUri"] = file["uri"]
    else:
        rest_file["fileWithBytes"] = file.get("bytes", "")
    return {"file": rest_file, **meta}


def status_to_rest(status: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "state": _STATES_BACK.get(status.get("state", ""), "TASK_STATE_UNSPECIFIED")
    }
    if status.get("message") is not None:
        out["message"] = message_to_rest(status["message"])
    if status.get("timestamp"):
        out["timestamp"] = status["timestamp"]
    return out


def artifact_to_rest(artifact: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in artifact.items() if k != "parts"}
    out["parts"] = [part_to_rest(p) for p in artifact.get("parts") or []]
    return out


def task_to_rest(task: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in task.items() if k not in ("kind", "status", "artifacts", "history")}
    out["status"] = status_to_rest(task.get("status") or {})
    if task.get("artifacts"):
        out["artifacts"] = [artifact_to_rest(a) for a in task["artifacts"]]
    if "history" in task:
        out["history"] = [message_to_rest(m) for m in task["history"]]
    return out


def push_to_rest(config: Mapping[str, Any]) -> dict[str, Any]:
    inner = dict(config.get("pushNotificationConfig") or {})
    task_id = config.get("taskId", "")
    return {
        "name": f"tasks/{task_id}/pushNotificationConfigs/{inner.get('id', '')}",
        "pushNotificationConfig": inner,
    }


# --- the client side: a 0.3 JSON-RPC call over 0.3 REST, and the answer back ----------------


def _quote_id(value: Any) -> str:
    return quote(str(value or ""), safe="")


def request_of(method: str, params: Mapping[str, Any]) -> tuple[str, str, Any, dict[str, Any]]:
    """The REST request a 0.3 JSON-RPC call is: verb, path, JSON body (None: none) and query,
    as the official SDK's 0.3 REST client sends it."""
    if method in ("message/send", "message/stream"):
        body: dict[str, Any] = {"message": message_to_rest(params.get("message") or {})}
        config = params.get("configuration")
        if isinstance(config, Mapping):
            rest_config = {
                k: v
                for k in ("acceptedOutputModes", "historyLength", "blocking")
                if (v := config.get(k)) is not None
            }
            push = config.get("pushNotificationConfig")
            if isinstance(push, Mapping):
                rest_config["pushNotification"] = dict(push)
            body["configuration"] = rest_config
        if params.get("metadata") is not None:
            body["metadata"] = params["metadata"]
        return (
            "POST",
            "/v1/" + ("message:send" if method == "message/send" else "message:stream"),
            body,
            {},
        )
    if method == "agent/getAuthenticatedExtendedCard":
        return "GET", "/v1/card", None, {}
    if method == "tasks/pushNotificationConfig/set":
        task_id = str(params.get("taskId", ""))
        inner = dict(params.get("pushNotificationConfig") or {})
        config_id = str(inner.get("id") or "")
        body = {
            "parent": f"tasks/{task_id}",
            "configId": config_id,
            "config": {
                "name": f"tasks/{task_id}/pushNotificationConfigs/{config_id}",
                "pushNotificationConfig": inner,
            },
        }
        return "POST", f"/v1/tasks/{_quote_id(task_id)}/pushNotificationConfigs", body, {}
    task = f"/v1/tasks/{_quote_id(params.get('id'))}"
    if method == "tasks/get":
        query = {"historyLength": params["historyLength"]} if "historyLength" in params else {}
        return "GET", task, None, query
    if method == "tasks/cancel":
        return "POST", task + ":cancel", {"name": f"tasks/{params.get('id', '')}"}, {}
    if method == "tasks/resubscribe":
        return "POST", task + ":subscribe", None, {}
    if method == "tasks/pushNotificationConfig/list":
        return "GET", task + "/pushNotificationConfigs", None, {}
    config = f"{task}/pushNotificationConfigs/{_quote_id(params.get('pushNotificationConfigId'))}"
    if method == "tasks/pushNotificationConfig/get":
        return "GET", config, None, {}
    if method == "tasks/pushNotificationConfig/delete":
        return "DELETE", config, None, {}
    raise invalid_params(f"{method} has no 0.3 REST route")


def status_to_rpc(status: Mapping[str, Any]) -> dict[str, Any]:
    state = status.get("state", "")
    out: dict[str, Any] = {"state": _STATES.get(state, state) if isinstance(state, str) else state}
    if isinstance(status.get("message"), dict):
        out["message"] = message_to_rpc(status["message"])
    if status.get("timestamp"):
        out["timestamp"] = status["timestamp"]
    return out


def artifact_to_rpc(artifact: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in artifact.items() if k != "parts"}
    if "artifact_id" in out:
        out["artifactId"] = out.pop("artifact_id")
    out["parts"] = [part_to_rpc(p) for p in artifact.get("parts") or []]
    return out


def task_to_rpc(task: Mapping[str, Any]) -> dict[str, Any]:
    """A 0.3 REST task (proto JSON) as the 0.3 JSON-RPC task."""
    out: dict[str, Any] = {"kind": "task", "id": task.get("id", "")}
    out["contextId"] = _get(task, "contextId") or ""
    out["status"] = status_to_rpc(task.get("status") or {})
    if task.get("artifacts"):
        out["artifacts"] = [artifact_to_rpc(a) for a in task["artifacts"]]
    if "history" in task:
        out["history"] = [message_to_rpc(m) for m in task["history"] or []]
    if task.get("metadata") is not None:
        out["metadata"] = task["metadata"]
    return out


def push_to_rpc_result(config: Mapping[str, Any], task_id: str = "") -> dict[str, Any]:
    """A 0.3 REST push configuration (`name`, `pushNotificationConfig`) as the JSON-RPC one."""
    name = str(config.get("name") or "")
    parts = name.split("/")
    found = parts[1] if len(parts) >= 2 and parts[0] == "tasks" else task_id
    inner = _get(config, "pushNotificationConfig") or {}
    return {"taskId": found, "pushNotificationConfig": push_to_rpc(inner)}


def event_to_rpc(event: Mapping[str, Any]) -> dict[str, Any]:
    """A 0.3 REST stream event (`task`, `message`, `statusUpdate`, `artifactUpdate`) as the
    0.3 JSON-RPC event (tagged by `kind`)."""
    if isinstance(event.get("task"), dict):
        return task_to_rpc(event["task"])
    message = event.get("message", event.get("msg"))
    if isinstance(message, dict):
        return message_to_rpc(message)
    update = _get(event, "statusUpdate")
    if isinstance(update, dict):
        out = _ids(update)
        out.update(kind="status-update", status=status_to_rpc(update.get("status") or {}))
        out["final"] = bool(update.get("final"))
        return out
    artifact = _get(event, "artifactUpdate")
    if isinstance(artifact, dict):
        out = _ids(artifact)
        out.update(kind="artifact-update", artifact=artifact_to_rpc(artifact.get("artifact") or {}))
        for key in ("append", "lastChunk"):
            if _get(artifact, key) is not None:
                out[key] = _get(artifact, key)
        return out
    return task_to_rpc(event)  # a bare task (a `task` answer not wrapped)


def _ids(update: Mapping[str, Any]) -> dict[str, Any]:
    out = {"taskId": _get(update, "taskId") or "", "contextId": _get(update, "contextId") or ""}
    if update.get("metadata") is not None:
        out["metadata"] = update["metadata"]
    return out


def result_to_rpc(method: str, value: Any, params: Mapping[str, Any]) -> Any:
    """The 0.3 JSON-RPC result of a 0.3 REST answer."""
    if not isinstance(value, dict):
        value = {}
    if method == "message/send":
        return event_to_rpc(value)
    if method in ("tasks/get", "tasks/cancel"):
        return task_to_rpc(value)
    if method in ("tasks/pushNotificationConfig/set", "tasks/pushNotificationConfig/get"):
        return push_to_rpc_result(value, str(params.get("taskId") or params.get("id") or ""))
    if method == "tasks/pushNotificationConfig/list":
        task_id = str(params.get("id") or "")
        return [push_to_rpc_result(c, task_id) for c in value.get("configs") or []]
    if method == "tasks/pushNotificationConfig/delete":
        return None
    return value


#: The official SDK's 0.3 REST errors name their type: its JSON-RPC code.
_ERROR_TYPES: Final[dict[str, int]] = {
    "JSONParseError": -32700,
    "InvalidRequestError": -32600,
    "MethodNotFoundError": -32601,
    "InvalidParamsError": -32602,
    "InternalError": -32603,
    "TaskNotFoundError": -32001,
    "TaskNotCancelableError": -32002,
    "PushNotificationNotSupportedError": -32003,
    "UnsupportedOperationError": -32004,
    "ContentTypeNotSupportedError": -32005,
    "InvalidAgentResponseError": -32006,
    "AuthenticatedExtendedCardNotConfiguredError": -32007,
}


def error_of(value: Any, status: int) -> A2AError:
    """The error a 0.3 REST agent answered: a google.rpc status (ours, 1.0's shape), the SDK's
    `{"type", "message"}`, or only an HTTP status."""
    if isinstance(value, dict) and isinstance(value.get("error"), dict):
        return A2AError.from_status_json(value, status)
    if isinstance(value, dict) and value.get("type") in _ERROR_TYPES:
        code = A2ACode(_ERROR_TYPES[value["type"]])
        return A2AError(code, str(value.get("message") or value["type"]))
    message = value.get("message") if isinstance(value, dict) else None
    code = A2ACode.TASK_NOT_FOUND if status == 404 else A2ACode.INTERNAL_ERROR
    return A2AError(code, str(message or f"HTTP {status}"))


__all__ = [
    "ROUTES_03",
    "Route03",
    "error_of",
    "event_to_rest",
    "event_to_rpc",
    "match03",
    "message_to_rest",
    "message_to_rpc",
    "params_of",
    "part_to_rest",
    "part_to_rpc",
    "push_to_rest",
    "push_to_rpc",
    "request_of",
    "result_of",
    "result_to_rpc",
    "task_to_rest",
    "task_to_rpc",
]
