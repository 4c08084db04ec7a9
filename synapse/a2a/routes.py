"""The routes of A2A v1.0's HTTP+JSON/REST binding: which operation each verb and path
template stands for. Shared by the server's binding (`synapse.a2a.server.rest`) and the client
(`synapse.a2a.client.transports`); neither imports the other.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote


@dataclass(frozen=True)
class Route:
    """One REST route: `verb` `template` stands for the operation `method`; path variables
    are members of its request; the rest comes from the body (`body`) or the query."""

    verb: str
    template: str
    method: str
    body: bool

    @property
    def pattern(self) -> re.Pattern[str]:
        regex = re.sub(
            r"\{(\w+)\}",
            r"(?P<\1>[^/:]+)",
            re.escape(self.template).replace(r"\{", "{").replace(r"\}", "}"),
        )
        return re.compile(regex)

    def path(self, params: dict[str, Any]) -> str:
        """The route's path for `params` (its path variables taken out of them)."""
        path = self.template
        for name in re.findall(r"\{(\w+)\}", self.template):
            path = path.replace("{" + name + "}", _segment(str(params.pop(name, ""))))
        return path


ROUTES: tuple[Route, ...] = (
    Route("POST", "/message:send", "SendMessage", True),
    Route("POST", "/message:stream", "SendStreamingMessage", True),
    Route("GET", "/tasks/{id}:subscribe", "SubscribeToTask", False),
    Route("POST", "/tasks/{id}:subscribe", "SubscribeToTask", True),
    Route("POST", "/tasks/{id}:cancel", "CancelTask", True),
    Route("GET", "/tasks/{id}", "GetTask", False),
    Route("GET", "/tasks", "ListTasks", False),
    Route(
        "POST", "/tasks/{taskId}/pushNotificationConfigs", "CreateTaskPushNotificationConfig", True
    ),
    Route(
        "GET", "/tasks/{taskId}/pushNotificationConfigs", "ListTaskPushNotificationConfigs", False
    ),
    Route(
        "GET",
        "/tasks/{taskId}/pushNotificationConfigs/{id}",
        "GetTaskPushNotificationConfig",
        False,
    ),
    Route(
        "DELETE",
        "/tasks/{taskId}/pushNotificationConfigs/{id}",
        "DeleteTaskPushNotificationConfig",
        False,
    ),
    Route("GET", "/extendedAgentCard", "GetExtendedAgentCard", False),
)
#: The route the client uses for each operation.
ROUTE_OF: dict[str, Route] = {}
for _route in ROUTES:
    ROUTE_OF.setdefault(_route.method, _route)
_PATTERNS = [(route, route.pattern) for route in ROUTES]


def _segment(value: str) -> str:
    return quote(value, safe="")


def match(verb: str, path: str) -> tuple[Route, dict[str, str], str] | str | None:
    """(route, path variables, tenant) for `verb path`; the allowed verbs (a string) if only
    the verb is wrong; None if no route has that path."""
    verbs: list[str] = []
    for tenant, rest in _tenant_split(path):
        for route, pattern in _PATTERNS:
            found = pattern.fullmatch(rest)
            if found is None:
                continue
            if route.verb != verb:
                verbs.append(route.verb)
                continue
            return route, {k: unquote(v) for k, v in found.groupdict().items()}, tenant
        if verbs:
            return ", ".join(sorted(set(verbs)))
    return None


def _tenant_split(path: str) -> list[tuple[str, str]]:
    """The path as it is, then without its first segment (a tenant)."""
    options = [("", path)]
    head, sep, tail = path.lstrip("/").partition("/")
    if sep and head:
        options.append((unquote(head), "/" + tail))
    return options
