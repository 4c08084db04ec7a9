"""A2A v1.0 wire types: the JSON-RPC binding's objects, as the official SDK (`a2a-sdk` 1.3)
writes and reads them.

A2A v1.0 defines its data model in protobuf; the JSON-RPC binding carries the proto3 JSON
mapping of it: camelCase member names, enums by name (`TASK_STATE_WORKING`, `ROLE_USER`),
`Part` as a oneof (`{"text": …}`, `{"data": …}`, `{"url": …}`, `{"raw": <base64>}`), members
with default values left out. These msgspec structs produce and accept exactly that, so this
package needs no protobuf at run time. Unknown members are ignored (a newer minor may add
some); enum values are kept as strings so that an unknown one is not a decoding error.
"""

from __future__ import annotations

import functools
import re
from datetime import UTC, datetime
from typing import Any, Final

import msgspec

from synapse.a2a.errors import A2ACode, A2AError

#: The A2A protocol version this package speaks.
PROTOCOL_VERSION: Final = "1.0"
#: The HTTP header that carries it (A2A v1.0 "service parameter").
VERSION_HEADER: Final = "A2A-Version"
#: What a request without `A2A-Version` means (A2A v1.0 §3: such a client speaks 0.3).
VERSION_WITHOUT_HEADER: Final = "0.3"
#: Where the agent card is served.
AGENT_CARD_PATH: Final = "/.well-known/agent-card.json"
#: Where the JSON-RPC binding is served (and the REST routes under it), by default.
DEFAULT_PATH: Final = "/a2a"
#: The header carrying a push configuration's `token` on each notification.
NOTIFICATION_TOKEN_HEADER: Final = "X-A2A-Notification-Token"
JSONRPC_BINDING: Final = "JSONRPC"
REST_BINDING: Final = "HTTP+JSON"
GRPC_BINDING: Final = "GRPC"
#: Every protocol binding of A2A v1.0, in this package's default order of preference.
BINDINGS: Final = (JSONRPC_BINDING, REST_BINDING, GRPC_BINDING)
#: The A2A media type (A2A v1.0); `application/json` is what is written.
A2A_JSON_MEDIA_TYPE: Final = "application/a2a+json"
#: The agent-card extension that carries each skill's input schema (A2A skills have none).
TASK_TYPES_EXTENSION: Final = "https://synapse-p2p.dev/a2a/ext/task-types/v1"

# --- task states and roles (enum names of the proto) ----------------------------------------

SUBMITTED: Final = "TASK_STATE_SUBMITTED"
WORKING: Final = "TASK_STATE_WORKING"
COMPLETED: Final = "TASK_STATE_COMPLETED"
FAILED: Final = "TASK_STATE_FAILED"
CANCELED: Final = "TASK_STATE_CANCELED"
INPUT_REQUIRED: Final = "TASK_STATE_INPUT_REQUIRED"
REJECTED: Final = "TASK_STATE_REJECTED"
AUTH_REQUIRED: Final = "TASK_STATE_AUTH_REQUIRED"
UNSPECIFIED: Final = "TASK_STATE_UNSPECIFIED"

TERMINAL_STATES: Final = frozenset({COMPLETED, FAILED, CANCELED, REJECTED})
INTERRUPTED_STATES: Final = frozenset({INPUT_REQUIRED, AUTH_REQUIRED})
TASK_STATES: Final = frozenset(
    {SUBMITTED, WORKING, COMPLETED, FAILED, CANCELED, INPUT_REQUIRED, REJECTED, AUTH_REQUIRED}
)

ROLE_USER: Final = "ROLE_USER"
ROLE_AGENT: Final = "ROLE_AGENT"


def is_terminal(state: str) -> bool:
    return state in TERMINAL_STATES


def ends_stream(state: str) -> bool:
    """A stream of task events ends after a terminal or interrupted state (A2A v1.0)."""
    return state in TERMINAL_STATES or state in INTERRUPTED_STATES


def timestamp(at: datetime | None = None) -> str:
    """RFC 3339 UTC with milliseconds and `Z` (A2A v1.0: timestamps in milliseconds)."""
    value = (at or datetime.now(UTC)).astimezone(UTC)
    return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"


def parse_timestamp(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


class Wire(
    msgspec.Struct,
    kw_only=True,
    omit_defaults=True,
    rename="camel",
):
    """A proto3-JSON object: camelCase names, defaults left out, unknown members ignored."""


# --- messages, parts, artifacts ---------------------------------------------------------------


class Part(Wire):
    """One content part: exactly one of `text`, `raw` (base64), `url` or `data` is set."""

    text: str | msgspec.UnsetType = msgspec.UNSET
    raw: str | msgspec.UnsetType = msgspec.UNSET
    url: str | msgspec.UnsetType = msgspec.UNSET
    data: Any | msgspec.UnsetType = msgspec.UNSET
    metadata: dict[str, Any] | None = None
    filename: str = ""
    media_type: str = ""


class Message(Wire):
    message_id: str
    role: str
    parts: list[Part] = msgspec.field(default_factory=list)
    context_id: str = ""
    task_id: str = ""
    metadata: dict[str, Any] | None = None
    extensions: list[str] = msgspec.field(default_factory=list)
    reference_task_ids: list[str] = msgspec.field(default_factory=list)


class Artifact(Wire):
    artifact_id: str
    parts: list[Part] = msgspec.field(default_factory=list)
    name: str = ""
    description: str = ""
    metadata: dict[str, Any] | None = None
    extensions: list[str] = msgspec.field(default_factory=list)


class TaskStatus(Wire):
    state: str
    message: Message | None = None
    timestamp: str | None = None


class Task(Wire):
    id: str
    status: TaskStatus
    context_id: str = ""
    artifacts: list[Artifact] = msgspec.field(default_factory=list)
    history: list[Message] = msgspec.field(default_factory=list)
    metadata: dict[str, Any] | None = None


class TaskStatusUpdateEvent(Wire):
    task_id: str
    context_id: str
    status: TaskStatus
    metadata: dict[str, Any] | None = None


class TaskArtifactUpdateEvent(Wire):
    task_id: str
    context_id: str
    artifact: Artifact
    append: bool = False
    last_chunk: bool = False
    metadata: dict[str, Any] | None = None


class StreamResponse(Wire):
    """One event of a stream (and the body of a push notification): one member is set."""

    task: Task | None = None
    message: Message | None = None
    status_update: TaskStatusUpdateEvent | None = None
    artifact_update: TaskArtifactUpdateEvent | None = None

    @property
    def task_id(self) -> str:
        if self.task is not None:
            return self.task.id
        if self.status_update is not None:
            return self.status_update.task_id
        if self.artifact_update is not None:
            return self.artifact_update.task_id
        return self.message.task_id if self.message is not None else ""

    @property
    def state(self) -> str | None:
        """The task state this event reports, if it reports one."""
        if self.task is not None:
            return self.task.status.state
        if self.status_update is not None:
            return self.status_update.status.state
        return None


# --- push notifications -------------------------------------------------------------------------


class AuthenticationInfo(Wire):
    scheme: str
    credentials: str = ""


class TaskPushNotificationConfig(Wire):
    url: str
    id: str = ""
    task_id: str = ""
    token: str = ""
    authentication: AuthenticationInfo | None = None
    tenant: str = ""


# --- requests and responses of the JSON-RPC methods ---------------------------------------------


class SendMessageConfiguration(Wire):
    accepted_output_modes: list[str] = msgspec.field(default_factory=list)
    task_push_notification_config: TaskPushNotificationConfig | None = None
    history_length: int | None = None
    return_immediately: bool = False


class SendMessageRequest(Wire):
    message: Message
    configuration: SendMessageConfiguration | None = None
    metadata: dict[str, Any] | None = None
    tenant: str = ""


class SendMessageResponse(Wire):
    task: Task | None = None
    message: Message | None = None


class GetTaskRequest(Wire):
    id: str
    history_length: int | None = None
    tenant: str = ""


class ListTasksRequest(Wire):
    context_id: str = ""
    status: str = ""
    page_size: int | None = None
    page_token: str = ""
    history_length: int | None = None
    status_timestamp_after: str | None = None
    include_artifacts: bool = False
    tenant: str = ""


class ListTasksResponse(msgspec.Struct, kw_only=True, rename="camel"):
    """Every member is always written (the SDK prints fields without presence here)."""

    tasks: list[Task] = msgspec.field(default_factory=list)
    next_page_token: str = ""
    page_size: int = 0
    total_size: int = 0


class CancelTaskRequest(Wire):
    id: str
    metadata: dict[str, Any] | None = None
    tenant: str = ""


class SubscribeToTaskRequest(Wire):
    id: str
    tenant: str = ""


class TaskPushConfigRef(Wire):
    """`GetTaskPushNotificationConfigRequest` and `DeleteTaskPushNotificationConfigRequest`."""

    task_id: str
    id: str = ""
    tenant: str = ""


class ListTaskPushNotificationConfigsRequest(Wire):
    task_id: str
    page_size: int | None = None
    page_token: str = ""
    tenant: str = ""


class ListTaskPushNotificationConfigsResponse(Wire):
    configs: list[TaskPushNotificationConfig] = msgspec.field(default_factory=list)
    next_page_token: str = ""


class GetExtendedAgentCardRequest(Wire):
    tenant: str = ""


# --- the agent card ---------------------------------------------------------------------------


class AgentInterface(Wire):
    url: str
    protocol_binding: str
    protocol_version: str = ""
    tenant: str = ""


class AgentProvider(Wire):
    url: str = ""
    organization: str = ""


class AgentExtension(Wire):
    uri: str
    description: str = ""
    required: bool = False
    params: dict[str, Any] | None = None


class AgentCapabilities(Wire):
    streaming: bool = False
    push_notifications: bool = False
    extensions: list[AgentExtension] = msgspec.field(default_factory=list)
    extended_agent_card: bool = False


class StringList(Wire):
    values: list[str] = msgspec.field(default_factory=list, name="list")


class SecurityRequirement(Wire):
    schemes: dict[str, StringList] = msgspec.field(default_factory=dict)


class AgentSkill(Wire):
    id: str
    name: str
    description: str = ""
    tags: list[str] = msgspec.field(default_factory=list)
    examples: list[str] = msgspec.field(default_factory=list)
    input_modes: list[str] = msgspec.field(default_factory=list)
    output_modes: list[str] = msgspec.field(default_factory=list)
    security_requirements: list[SecurityRequirement] = msgspec.field(default_factory=list)


class AgentCardSignature(Wire):
    """A JWS over the canonical card (A2A v1.0): base64url protected header and signature;
    the payload is the RFC 8785 form of the card without `signatures` (not carried)."""

    protected: str
    signature: str
    header: dict[str, Any] | None = None


class AgentCard(Wire):
    name: str
    description: str = ""
    supported_interfaces: list[AgentInterface] = msgspec.field(default_factory=list)
    provider: AgentProvider | None = None
    version: str = ""
    documentation_url: str | None = None
    capabilities: AgentCapabilities = msgspec.field(default_factory=AgentCapabilities)
    #: Scheme name → `{"httpAuthSecurityScheme": {...}}` and the like (a proto oneof).
    security_schemes: dict[str, dict[str, Any]] = msgspec.field(default_factory=dict)
    security_requirements: list[SecurityRequirement] = msgspec.field(default_factory=list)
    default_input_modes: list[str] = msgspec.field(default_factory=list)
    default_output_modes: list[str] = msgspec.field(default_factory=list)
    skills: list[AgentSkill] = msgspec.field(default_factory=list)
    signatures: list[AgentCardSignature] = msgspec.field(default_factory=list)
    icon_url: str | None = None

    def interface(self, binding: str = JSONRPC_BINDING) -> AgentInterface | None:
        """The interface for `binding` speaking A2A 1.x (1.0 preferred), if there is one."""
        candidates = [
            i
            for i in self.supported_interfaces
            if i.protocol_binding == binding and major(i.protocol_version) == 1
        ]
        exact = [i for i in candidates if minor(i.protocol_version) == 0]
        found = exact or candidates
        return found[0] if found else None


_MAJOR_MINOR = re.compile(r"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)")


def check_version(given: str) -> None:
    """Refuse (-32009) what is not `1.MINOR`: no version (an A2A 0.3 client), another major,
    or anything but `MAJOR.MINOR` (`1.0.1`, `1`, `v1.0`). Never a silent downgrade."""
    version = given or VERSION_WITHOUT_HEADER
    matched = _MAJOR_MINOR.fullmatch(version)
    if matched is None or matched.group(1) != "1":
        if not given:
            told = "no A2A-Version header (that is A2A 0.3)"
        elif matched is None:
            told = f"A2A-Version {given!r} (not MAJOR.MINOR)"
        else:
            told = f"A2A-Version {given!r}"
        raise A2AError(
            A2ACode.VERSION_NOT_SUPPORTED,
            f"{told} is not supported: this agent speaks A2A {PROTOCOL_VERSION} only; "
            f"send '{VERSION_HEADER}: {PROTOCOL_VERSION}'",
            {"supportedVersions": PROTOCOL_VERSION, "requestedVersion": version},
        )


def major(version: str) -> int | None:
    head = version.strip().split(".", 1)[0]
    return int(head) if head.isdigit() else None


def minor(version: str) -> int | None:
    parts = version.strip().split(".")
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None


# --- member names ----------------------------------------------------------------------------


def camel_members(value: Any, cls: Any) -> Any:
    """`value` (decoded JSON meant for `cls`) with snake_case member names as camelCase.

    Proto3 JSON parsers accept both the camelCase JSON name and the original field name of
    every member, and clients in the wild send both; this package writes camelCase only.
    Only the members of the wire types are renamed, never the keys of free-form values
    (`metadata`, data parts, card extension `params`).
    """
    return _rename(value, _type_info(cls))


@functools.cache
def _type_info(cls: Any) -> msgspec.inspect.Type:
    """`msgspec.inspect.type_info` of a wire type, computed once: it walks every member's
    annotations (tens of microseconds, and a few hundred bytes that outlived each call)."""
    return msgspec.inspect.type_info(cls)


def _rename(value: Any, info: msgspec.inspect.Type) -> Any:
    if isinstance(info, msgspec.inspect.UnionType):
        for option in info.types:
            if isinstance(option, msgspec.inspect.StructType) and isinstance(value, dict):
                return _rename(value, option)
            if isinstance(option, msgspec.inspect.ListType) and isinstance(value, list):
                return _rename(value, option)
        return value
    if isinstance(info, msgspec.inspect.ListType) and isinstance(value, list):
        return [_rename(item, info.item_type) for item in value]
    if isinstance(info, msgspec.inspect.DictType) and isinstance(value, dict):
        if isinstance(info.value_type, msgspec.inspect.StructType):
            return {k: _rename(v, info.value_type) for k, v in value.items()}
        return value
    if isinstance(info, msgspec.inspect.StructType) and isinstance(value, dict):
        fields: dict[str, msgspec.inspect.Field] = {f.encode_name: f for f in info.fields}
        by_name: dict[str, str] = {f.name: f.encode_name for f in info.fields}
        renamed: dict[str, Any] = {}
        for key, item in value.items():
            name = str(key)
            if name not in fields:
                name = by_name.get(name, name)
            if name in renamed and name != key:
                continue  # both spellings given: the camelCase one wins
            field = fields.get(name)
            renamed[name] = _rename(item, field.type) if field is not None else item
        return renamed
    return value


# --- encoding ---------------------------------------------------------------------------------

_encoder = msgspec.json.Encoder()


def encode(value: Any) -> bytes:
    return _encoder.encode(value)


def to_builtins(value: Any) -> Any:
    """A struct as plain JSON values (dicts, lists, strings …)."""
    return msgspec.to_builtins(value)


def text_part(text: str) -> Part:
    return Part(text=text)


def data_part(data: Any) -> Part:
    return Part(data=data, media_type="application/json")


def grpc_available() -> bool:
    """Whether this installation can speak the GRPC binding (the `grpc` extra), as a client
    or a server."""
    import importlib.util

    try:
        return all(importlib.util.find_spec(name) is not None for name in ("grpc", "a2a.types"))
    except (ImportError, ValueError):
        return False


__all__ = [
    "AGENT_CARD_PATH",
    "AUTH_REQUIRED",
    "BINDINGS",
    "CANCELED",
    "COMPLETED",
    "FAILED",
    "GRPC_BINDING",
    "INPUT_REQUIRED",
    "INTERRUPTED_STATES",
    "JSONRPC_BINDING",
    "NOTIFICATION_TOKEN_HEADER",
    "PROTOCOL_VERSION",
    "REJECTED",
    "REST_BINDING",
    "ROLE_AGENT",
    "ROLE_USER",
    "SUBMITTED",
    "TASK_STATES",
    "TERMINAL_STATES",
    "VERSION_HEADER",
    "WORKING",
    "AgentCapabilities",
    "AgentCard",
    "AgentCardSignature",
    "AgentExtension",
    "AgentInterface",
    "AgentProvider",
    "AgentSkill",
    "Artifact",
    "AuthenticationInfo",
    "CancelTaskRequest",
    "GetTaskRequest",
    "ListTasksRequest",
    "ListTasksResponse",
    "Message",
    "Part",
    "SendMessageConfiguration",
    "SendMessageRequest",
    "SendMessageResponse",
    "StreamResponse",
    "SubscribeToTaskRequest",
    "Task",
    "TaskArtifactUpdateEvent",
    "TaskPushNotificationConfig",
    "TaskStatus",
    "TaskStatusUpdateEvent",
    "ends_stream",
    "grpc_available",
    "is_terminal",
]
