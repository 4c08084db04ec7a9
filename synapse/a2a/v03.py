"""A2A 0.3 beside 1.0: the 0.3 JSON shapes translated to and from this package's 1.0 wire.

A2A 0.3 names its JSON-RPC methods by path (`message/send`, `tasks/get` …), tags every object
with `kind` (`task`, `message`, `status-update`, `text`, `data`, `file` …), spells states in
kebab case (`input-required`), roles in lower case (`user`, `agent`), answers `message/send`
with the task or message itself (1.0: `{"task": …}`), ends a stream with `final: true` on the
last status update, nests a push configuration in `pushNotificationConfig`, and publishes its
card at `/.well-known/agent.json` (`protocolVersion` 0.3.0, `url` and `preferredTransport`).

Both the server (`synapse.a2a.server.jsonrpc`, and `synapse.a2a.server.rest` through
`synapse.a2a.v03rest`: a 0.3 request is translated to the 1.0 operation, its answer back) and
the client (a 0.3 agent's card selects a 0.3 transport) use
these functions; they work on plain JSON values and never fail on a member they do not know.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from synapse.a2a import wire
from synapse.a2a.errors import A2ACode, A2AError, invalid_params

#: The version a 0.3 card declares.
PROTOCOL_VERSION_03: Final = "0.3.0"
#: Where a 0.3 agent publishes its card.
AGENT_CARD_PATH_03: Final = "/.well-known/agent.json"

#: 0.3 state → 1.0 state.
STATE_TO_V1: Final[dict[str, str]] = {
    "submitted": wire.SUBMITTED,
    "working": wire.WORKING,
    "input-required": wire.INPUT_REQUIRED,
    "completed": wire.COMPLETED,
    "canceled": wire.CANCELED,
    "failed": wire.FAILED,
    "rejected": wire.REJECTED,
    "auth-required": wire.AUTH_REQUIRED,
    "unknown": wire.UNSPECIFIED,
}
STATE_TO_V03: Final[dict[str, str]] = {v: k for k, v in STATE_TO_V1.items()}

#: 0.3 JSON-RPC method → the 1.0 operation it is.
METHOD_TO_V1: Final[dict[str, str]] = {
    "message/send": "SendMessage",
    "message/stream": "SendStreamingMessage",
    "tasks/get": "GetTask",
    "tasks/cancel": "CancelTask",
    "tasks/resubscribe": "SubscribeToTask",
    "tasks/pushNotificationConfig/set": "CreateTaskPushNotificationConfig",
    "tasks/pushNotificationConfig/get": "GetTaskPushNotificationConfig",
    "tasks/pushNotificationConfig/list": "ListTaskPushNotificationConfigs",
    "tasks/pushNotificationConfig/delete": "DeleteTaskPushNotificationConfig",
    "agent/getAuthenticatedExtendedCard": "GetExtendedAgentCard",
}
METHOD_TO_V03: Final[dict[str, str]] = {v: k for k, v in METHOD_TO_V1.items()}
#: The 0.3 methods that answer with a stream of events.
STREAMING_03: Final = frozenset({"message/stream", "tasks/resubscribe"})


#: The configuration id 0.3 clients ask for when they set one without an id (the TCK's 0.3
#: suite does): the task's own configuration (`task_config_v03`).
DEFAULT_CONFIG_ID_03: Final = "default"


def operation_of(method: str, params: Mapping[str, Any]) -> str:
    """The 1.0 operation a 0.3 call is: `METHOD_TO_V1`, but a push configuration asked for
    without its id (0.3 allows it), or as `default`, is the task's own configuration: looked
    up in the list (`task_config_v03`)."""
    if method == "tasks/pushNotificationConfig/get" and params.get("pushNotificationConfigId") in (
        None,
        "",
        DEFAULT_CONFIG_ID_03,
    ):
        return "ListTaskPushNotificationConfigs"
    return METHOD_TO_V1[method]


def task_config_v03(configs: list[dict[str, Any]]) -> dict[str, Any]:
    """The task's own push configuration, for a 0.3 client that names none (or `default`):
    the one with the id `default`, else the one set without an id (it took the task's id),
    else the newest."""
    if not configs:
        raise A2AError(A2ACode.TASK_NOT_FOUND, "the task has no push notification config")
    named = [c for c in configs if c.get("id") == DEFAULT_CONFIG_ID_03]
    unnamed = [c for c in configs if c.get("id") == c.get("taskId")]
    found: dict[str, Any] = (named or unnamed or configs)[-1]
    return found


def is_v03(version: str) -> bool:
    """Whether an `A2A-Version` value asks for 0.3 (none at all is 0.3, per A2A 1.0)."""
    return not version or version.strip() in ("0.3", "0.3.0") or version.startswith("0.3.")


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise invalid_params(f"{where} must be an object", path=where)
    return value


def _some(**members: Any) -> dict[str, Any]:
    """`members` without the absent ones (None)."""
    return {k: v for k, v in members.items() if v is not None}


# --- parts, messages, tasks --------------------------------------------------------------------


def part_to_v1(part: Any) -> dict[str, Any]:
    part = _object(part, "part")
    kind = part.get("kind")
    out: dict[str, Any] = _some(metadata=part.get("metadata"))
    if kind == "text":
        out["text"] = part.get("text")
    elif kind == "data":
        out["data"] = part.get("data")
        out["mediaType"] = "application/json"
    elif kind == "file":
        file = _object(part.get("file"), "part.file")
        if "uri" in file:
            out["url"] = file["uri"]
        else:
            out["raw"] = file.get("bytes")
        out.update(_some(mediaType=file.get("mimeType"), filename=file.get("name")))
    else:
        # 0.3 tags every part: one without `kind`, or of another kind, is not one.
        raise invalid_params(
            f"a part's kind must be text, data or file, not {kind!r}", path="part.kind"
        )
    return out


def part_to_v03(part: Mapping[str, Any]) -> dict[str, Any]:
    meta = _some(metadata=part.get("metadata"))
    if "text" in part:
        return {"kind": "text", "text": part["text"], **meta}
    if "data" in part:
        return {"kind": "data", "data": part["data"], **meta}
    file = _some(mimeType=part.get("mediaType") or None, name=part.get("filename") or None)
    if "url" in part:
        file["uri"] = part["url"]
    else:
        file["bytes"] = part.get("raw", "")
    return {"kind": "file", "file": file, **meta}


def message_to_v1(message: Any) -> dict[str, Any]:
    message = _object(message, "message")
    role = message.get("role")
    if role not in ("user", "agent"):
        raise invalid_params("message.role must be 'user' or 'agent'", path="message.role")
    out = {
        k: v
        for k, v in message.items()
        if k in ("messageId", "contextId", "taskId", "metadata", "extensions", "referenceTaskIds")
    }
    out["role"] = wire.ROLE_USER if role == "user" else wire.ROLE_AGENT
    out["parts"] = [part_to_v1(p) for p in message.get("parts") or []]
    return out


def message_to_v03(message: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in message.items() if k not in ("role", "parts")}
    role = str(message.get("role") or "")
    out["role"] = {wire.ROLE_USER: "user", wire.ROLE_AGENT: "agent"}.get(role, role)
    out["parts"] = [part_to_v03(p) for p in message.get("parts") or []]
    out["kind"] = "message"
    return out


def status_to_v03(status: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"state": STATE_TO_V03.get(status.get("state", ""), "unknown")}
    if status.get("message") is not None:
        out["message"] = message_to_v03(status["message"])
    if status.get("timestamp"):
        out["timestamp"] = status["timestamp"]
    return out


def artifact_to_v03(artifact: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in artifact.items() if k != "parts"}
    out["parts"] = [part_to_v03(p) for p in artifact.get("parts") or []]
    return out


def task_to_v03(task: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "kind": "task",
        "id": task["id"],
        "contextId": task.get("contextId", ""),
        "status": status_to_v03(task.get("status") or {}),
    }
    if task.get("artifacts"):
        out["artifacts"] = [artifact_to_v03(a) for a in task["artifacts"]]
    if "history" in task:
        out["history"] = [message_to_v03(m) for m in task["history"]]
    if task.get("metadata") is not None:
        out["metadata"] = task["metadata"]
    return out


def event_to_v03(event: Mapping[str, Any]) -> dict[str, Any]:
    """A 1.0 `StreamResponse` (or `SendMessageResponse`) as the 0.3 object it carries."""
    if "task" in event:
        return task_to_v03(event["task"])
    if "message" in event:
        return message_to_v03(event["message"])
    if "statusUpdate" in event:
        update = event["statusUpdate"]
        status = update.get("status") or {}
        return _some(
            kind="status-update",
            taskId=update.get("taskId"),
            contextId=update.get("contextId", ""),
            status=status_to_v03(status),
            final=wire.ends_stream(status.get("state", "")),
            metadata=update.get("metadata"),
        )
    if "artifactUpdate" in event:
        update = event["artifactUpdate"]
        return _some(
            kind="artifact-update",
            taskId=update.get("taskId"),
            contextId=update.get("contextId", ""),
            artifact=artifact_to_v03(update.get("artifact") or {}),
            append=update.get("append", False),
            lastChunk=update.get("lastChunk", False),
            metadata=update.get("metadata"),
        )
    return dict(event)


def event_to_v1(event: Mapping[str, Any]) -> dict[str, Any]:
    """A 0.3 result or stream event (tagged by `kind`) as a 1.0 `StreamResponse`."""
    kind = event.get("kind")
    if kind == "task":
        return {"task": task_to_v1(event)}
    if kind == "message":
        return {"message": message_to_v1(event)}
    if kind == "status-update":
        return {
            "statusUpdate": _some(
                taskId=event.get("taskId"),
                contextId=event.get("contextId", ""),
                status=status_to_v1(event.get("status") or {}),
                metadata=event.get("metadata"),
            )
        }
    if kind == "artifact-update":
        return {
            "artifactUpdate": _some(
                taskId=event.get("taskId"),
                contextId=event.get("contextId", ""),
                artifact=artifact_to_v1(event.get("artifact") or {}),
                append=event.get("append") or None,
                lastChunk=event.get("lastChunk") or None,
                metadata=event.get("metadata"),
            )
        }
    raise invalid_params(f"unknown result kind {kind!r}", path="result.kind")


def status_to_v1(status: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"state": STATE_TO_V1.get(status.get("state", ""), wire.UNSPECIFIED)}
    if status.get("message") is not None:
        out["message"] = message_to_v1(status["message"])
    if status.get("timestamp"):
        out["timestamp"] = status["timestamp"]
    return out


def artifact_to_v1(artifact: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in artifact.items() if k != "parts"}
    out["parts"] = [part_to_v1(p) for p in artifact.get("parts") or []]
    return out


def task_to_v1(task: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": task.get("id", ""),
        "contextId": task.get("contextId", ""),
        "status": status_to_v1(task.get("status") or {}),
        "artifacts": [artifact_to_v1(a) for a in task.get("artifacts") or []],
        "history": [message_to_v1(m) for m in task.get("history") or []],
    }
    if task.get("metadata") is not None:
        out["metadata"] = task["metadata"]
    return out


# --- push configurations ---------------------------------------------------------------------


def push_to_v1(config: Any, task_id: str) -> dict[str, Any]:
    config = _object(config, "pushNotificationConfig")
    out = _some(
        taskId=task_id,
        id=config.get("id"),
        url=config.get("url"),
        token=config.get("token"),
    )
    auth = config.get("authentication")
    if isinstance(auth, dict):
        schemes = auth.get("schemes") or []
        out["authentication"] = _some(
            scheme=schemes[0] if schemes else "", credentials=auth.get("credentials")
        )
    return out


def push_to_v03(config: Mapping[str, Any]) -> dict[str, Any]:
    inner = _some(
        id=config.get("id") or None,
        url=config.get("url"),
        token=config.get("token") or None,
    )
    auth = config.get("authentication")
    if isinstance(auth, Mapping):
        inner["authentication"] = _some(
            schemes=[auth.get("scheme", "")], credentials=auth.get("credentials") or None
        )
    return {"taskId": config.get("taskId", ""), "pushNotificationConfig": inner}


# --- requests and results of the JSON-RPC methods ----------------------------------------------


def params_to_v1(method: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """A 0.3 method's `params` as its 1.0 operation's request."""
    if method in ("message/send", "message/stream"):
        out: dict[str, Any] = {"message": message_to_v1(params.get("message"))}
        config = params.get("configuration")
        if config is None:
            config = {}
        if isinstance(config, dict):
            v1: dict[str, Any] = _some(
                acceptedOutputModes=config.get("acceptedOutputModes"),
                historyLength=config.get("historyLength"),
            )
            # 0.3 waits for the outcome only when asked (`blocking: true`); 1.0 by default.
            if config.get("blocking") is not True:
                v1["returnImmediately"] = True
            push = config.get("pushNotificationConfig")
            if push is not None:
                v1["taskPushNotificationConfig"] = push_to_v1(push, "")
            out["configuration"] = v1
        if params.get("metadata") is not None:
            out["metadata"] = params["metadata"]
        return out
    if method == "tasks/pushNotificationConfig/set":
        task_id = params.get("taskId")
        if not isinstance(task_id, str):
            raise invalid_params("taskId is required", path="params.taskId")
        return push_to_v1(params.get("pushNotificationConfig"), task_id)
    if method in ("tasks/pushNotificationConfig/get", "tasks/pushNotificationConfig/delete"):
        return _some(taskId=params.get("id"), id=params.get("pushNotificationConfigId"))
    if method == "tasks/pushNotificationConfig/list":
        return _some(taskId=params.get("id"))
    if method == "agent/getAuthenticatedExtendedCard":
        return {}
    # tasks/get, tasks/cancel, tasks/resubscribe: the same members
    return {k: v for k, v in params.items() if k in ("id", "historyLength", "metadata")}


def result_to_v03(method: str, result: Any) -> Any:
    """A 1.0 operation's result (plain JSON) as the 0.3 method's result."""
    if method == "message/send":
        return event_to_v03(result)
    if method in ("tasks/get", "tasks/cancel"):
        return task_to_v03(result)
    if method == "tasks/pushNotificationConfig/get" and "url" not in (result or {}):
        # asked without an id: the list of the task's configurations (`{}` when empty)
        return push_to_v03(task_config_v03((result or {}).get("configs", [])))
    if method in ("tasks/pushNotificationConfig/set", "tasks/pushNotificationConfig/get"):
        return push_to_v03(result)
    if method == "tasks/pushNotificationConfig/list":
        return [push_to_v03(c) for c in (result or {}).get("configs", [])]
    if method == "tasks/pushNotificationConfig/delete":
        return None
    if method == "agent/getAuthenticatedExtendedCard":
        return card_to_v03(result)
    return result


# --- the agent card -------------------------------------------------------------------------


def _scheme_to_v03(scheme: Mapping[str, Any]) -> dict[str, Any]:
    """A 1.0 security scheme (`{"httpAuthSecurityScheme": {…}}`) as 0.3's (`{"type": …}`)."""
    for key, kind in (
        ("apiKeySecurityScheme", "apiKey"),
        ("httpAuthSecurityScheme", "http"),
        ("oauth2SecurityScheme", "oauth2"),
        ("openIdConnectSecurityScheme", "openIdConnect"),
        ("mtlsSecurityScheme", "mutualTLS"),
    ):
        if key in scheme:
            inner = dict(scheme[key])
            if kind == "apiKey" and "location" in inner:
                inner["in"] = inner.pop("location")
            return {"type": kind, **inner}
    return dict(scheme)


#: The bindings this package speaks 0.3 on (its 0.3 card lists no other).
#: The bindings a 0.3 client is offered on the 0.3 card: 0.3 is served on each (gRPC: the 0.3
#: service on the gRPC port, `synapse.a2a.server.grpc_v03`).
BINDINGS_03: Final = (wire.JSONRPC_BINDING, wire.REST_BINDING, wire.GRPC_BINDING)


def card_to_v03(card: Mapping[str, Any]) -> dict[str, Any]:
    """A 1.0 agent card as the 0.3 card of the same agent (its 0.3 interfaces only)."""
    interfaces = [
        i for i in card.get("supportedInterfaces") or [] if i.get("protocolBinding") in BINDINGS_03
    ]
    first = interfaces[0] if interfaces else {"url": "", "protocolBinding": wire.JSONRPC_BINDING}
    caps = card.get("capabilities") or {}
    out: dict[str, Any] = {
        "protocolVersion": PROTOCOL_VERSION_03,
        "name": card.get("name", ""),
        "description": card.get("description", ""),
        "url": first.get("url", ""),
        "preferredTransport": first.get("protocolBinding", wire.JSONRPC_BINDING),
        "additionalInterfaces": [
            {"url": _url_03(i, first), "transport": i.get("protocolBinding", "")}
            for i in interfaces
        ],
        "version": card.get("version", ""),
        # Only what is true: both versions read an absent flag as false.
        "capabilities": _some(
            streaming=True if caps.get("streaming") else None,
            pushNotifications=True if caps.get("pushNotifications") else None,
            extensions=caps.get("extensions"),
        ),
        "defaultInputModes": card.get("defaultInputModes") or ["text/plain"],
        "defaultOutputModes": card.get("defaultOutputModes") or ["text/plain"],
        "skills": [
            {"tags": [], **{k: v for k, v in s.items() if k != "securityRequirements"}}
            for s in card.get("skills") or []
        ],
    }
    if caps.get("extendedAgentCard"):
        out["supportsAuthenticatedExtendedCard"] = True
    for key in ("provider", "documentationUrl", "iconUrl"):
        if card.get(key):
            out[key] = card[key]
    schemes = card.get("securitySchemes") or {}
    if schemes:
        out["securitySchemes"] = {name: _scheme_to_v03(s) for name, s in schemes.items()}
    requirements = card.get("securityRequirements") or []
    if requirements:
        out["security"] = [
            {
                name: list((scopes or {}).get("list", []))
                for name, scopes in r.get("schemes", {}).items()
            }
            for r in requirements
        ]
    return out


def _url_03(interface: Mapping[str, Any], first: Mapping[str, Any]) -> str:
    """An interface's URL on a 0.3 card. 1.0 gives gRPC's as `host:port`; 0.3 readers (the
    0.3 TCK among them) want an http(s) URL there too: the scheme of the card's first one."""
    url = str(interface.get("url", ""))
    if interface.get("protocolBinding") != wire.GRPC_BINDING or "://" in url:
        return url
    scheme = "https" if str(first.get("url", "")).startswith("https://") else "http"
    return f"{scheme}://{url}"


def with_v03_members(card: Mapping[str, Any]) -> dict[str, Any]:
    """A 1.0 card with the members of its 0.3 form added where it has none (nested objects
    merged the same way): one card both versions' clients read, as the official SDK
    serves."""
    return _merge(dict(card), card_to_v03(card))


def _merge(into: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    for key, value in extra.items():
        if key not in into:
            into[key] = value
        elif isinstance(value, Mapping) and isinstance(into[key], dict):
            into[key] = _merge(dict(into[key]), value)
        elif isinstance(value, list) and isinstance(into[key], list):
            into[key] = [
                _merge(dict(mine), theirs)
                if isinstance(mine, dict) and isinstance(theirs, Mapping)
                else mine
                for mine, theirs in zip(into[key], value, strict=False)
            ] + into[key][len(value) :]
    return into


# --- the client's direction: 1.0 requests to a 0.3 agent, its answers back ------------------


def params_to_v03(operation: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """A 1.0 operation's request as the params of the 0.3 method (`METHOD_TO_V03`)."""
    if operation in ("SendMessage", "SendStreamingMessage"):
        out: dict[str, Any] = {"message": message_to_v03(params["message"])}
        config = params.get("configuration")
        if isinstance(config, Mapping):
            legacy: dict[str, Any] = _some(
                acceptedOutputModes=config.get("acceptedOutputModes") or None,
                historyLength=config.get("historyLength"),
                blocking=not config.get("returnImmediately", False),
            )
            push = config.get("taskPushNotificationConfig")
            if isinstance(push, Mapping):
                legacy["pushNotificationConfig"] = push_to_v03(push)["pushNotificationConfig"]
            out["configuration"] = legacy
        if params.get("metadata") is not None:
            out["metadata"] = params["metadata"]
        return out
    if operation == "CreateTaskPushNotificationConfig":
        return push_to_v03(params)
    if operation in ("GetTaskPushNotificationConfig", "DeleteTaskPushNotificationConfig"):
        return _some(id=params.get("taskId"), pushNotificationConfigId=params.get("id") or None)
    if operation == "ListTaskPushNotificationConfigs":
        return {"id": params.get("taskId")}
    if operation == "GetExtendedAgentCard":
        return {}
    return {k: v for k, v in params.items() if k in ("id", "historyLength", "metadata")}


def result_to_v1(operation: str, result: Any) -> Any:
    """A 0.3 method's result as its 1.0 operation's answer (plain JSON)."""
    if operation == "SendMessage":
        return event_to_v1(_object(result, "result"))
    if operation in ("GetTask", "CancelTask"):
        return task_to_v1(_object(result, "result"))
    if operation in ("CreateTaskPushNotificationConfig", "GetTaskPushNotificationConfig"):
        value = _object(result, "result")
        return push_to_v1(value.get("pushNotificationConfig"), str(value.get("taskId", "")))
    if operation == "ListTaskPushNotificationConfigs":
        items = result if isinstance(result, list) else []
        return {
            "configs": [
                push_to_v1(c.get("pushNotificationConfig"), str(c.get("taskId", "")))
                for c in items
                if isinstance(c, dict)
            ]
        }
    if operation == "DeleteTaskPushNotificationConfig":
        return {}
    if operation == "GetExtendedAgentCard":
        return card_to_v1(_object(result, "result"))
    return result


_SCHEME_KEYS: Final = {
    "apiKey": "apiKeySecurityScheme",
    "http": "httpAuthSecurityScheme",
    "oauth2": "oauth2SecurityScheme",
    "openIdConnect": "openIdConnectSecurityScheme",
    "mutualTLS": "mtlsSecurityScheme",
}


def card_to_v1(card: Mapping[str, Any]) -> dict[str, Any]:
    """A 0.3 agent card (`url`, `preferredTransport` …) as a 1.0 card whose interfaces say
    `protocolVersion` 0.3.x: a client that speaks 0.3 too can pick one of them."""
    version = str(card.get("protocolVersion") or PROTOCOL_VERSION_03)
    interfaces: list[dict[str, Any]] = []
    seen: set[tuple[str, str]] = set()
    main = (str(card.get("url") or ""), str(card.get("preferredTransport") or "JSONRPC"))
    others = [
        (str(i.get("url") or ""), str(i.get("transport") or ""))
        for i in card.get("additionalInterfaces") or []
        if isinstance(i, dict)
    ]
    for url, binding in [main, *others]:
        if url and (url, binding) not in seen:
            seen.add((url, binding))
            interfaces.append({"url": url, "protocolBinding": binding, "protocolVersion": version})
    caps = card.get("capabilities") or {}
    out = {k: v for k, v in card.items() if k not in _V03_ONLY}
    out["supportedInterfaces"] = interfaces
    out["capabilities"] = _some(
        streaming=bool(caps.get("streaming")),
        pushNotifications=bool(caps.get("pushNotifications")),
        extensions=caps.get("extensions"),
        extendedAgentCard=bool(card.get("supportsAuthenticatedExtendedCard")),
    )
    schemes = card.get("securitySchemes") or {}
    out["securitySchemes"] = {
        name: _scheme_to_v1(scheme) for name, scheme in schemes.items() if isinstance(scheme, dict)
    }
    out["securityRequirements"] = [
        {"schemes": {name: {"list": list(scopes or [])} for name, scopes in r.items()}}
        for r in card.get("security") or []
        if isinstance(r, dict)
    ]
    return out


_V03_ONLY: Final = frozenset(
    {
        "protocolVersion",
        "url",
        "preferredTransport",
        "additionalInterfaces",
        "supportsAuthenticatedExtendedCard",
        "security",
        "securitySchemes",
        "capabilities",
    }
)


def _scheme_to_v1(scheme: Mapping[str, Any]) -> dict[str, Any]:
    kind = str(scheme.get("type") or "")
    key = _SCHEME_KEYS.get(kind)
    if key is None:
        return dict(scheme)
    inner = {k: v for k, v in scheme.items() if k != "type"}
    if "in" in inner:
        inner["location"] = inner.pop("in")
    return {key: inner}


__all__ = [
    "AGENT_CARD_PATH_03",
    "METHOD_TO_V03",
    "METHOD_TO_V1",
    "PROTOCOL_VERSION_03",
    "STATE_TO_V03",
    "STATE_TO_V1",
    "STREAMING_03",
    "card_to_v03",
    "card_to_v1",
    "event_to_v03",
    "event_to_v1",
    "is_v03",
    "message_to_v03",
    "message_to_v1",
    "operation_of",
    "params_to_v03",
    "params_to_v1",
    "part_to_v03",
    "part_to_v1",
    "push_to_v03",
    "push_to_v1",
    "result_to_v03",
    "result_to_v1",
    "task_to_v03",
    "task_to_v1",
    "with_v03_members",
]
