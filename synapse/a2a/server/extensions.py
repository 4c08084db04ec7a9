"""A2A extensions: declared on the card, negotiated per call, active on the tasks they
start, and written on what those tasks emit.

- **Declare.** `enable_a2a(extensions=[Extension(uri, ...)])` (or `serve
  --a2a-extension URI`, `--a2a-required-extension URI`) adds each to the card's
  `capabilities.extensions`, with its description, params and `required`.
- **Negotiate.** A call names the extensions it wants in the `A2A-Extensions` header (a
  comma-separated list, possibly repeated; 0.3's `X-A2A-Extensions`; over gRPC the
  `a2a-extensions` metadata). Those the agent declared are activated; the others are
  ignored. A call that leaves out an extension declared `required` is refused with -32008
  (`EXTENSION_SUPPORT_REQUIRED`). The answer says what was activated: the `A2A-Extensions`
  response header (gRPC: initial metadata).
- **Use.** A task started by a call keeps the extensions that call activated (durably, with
  its A2A context): its handler reads them with `synapse.a2a.active_extensions(ctx)`, and the
  message's own `extensions` and extension metadata (keyed by URI) are in its first
  message. An extension's `annotate` hook writes on every agent message and artifact the
  task emits (their `metadata`, keyed by the extension's URI, and their `extensions`).

`timestamp_extension()` is the timestamp extension of the A2A samples
(`github.com/a2aproject/a2a-samples`, `extensions/timestamp/v1`): an RFC 3339 UTC time on
each agent message and artifact.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import msgspec

from synapse.a2a import wire
from synapse.a2a.errors import A2ACode, A2AError

HEADER = "A2A-Extensions"
#: A2A 0.3's name of the header (RFC 6648 dropped the prefix in 1.0).
LEGACY_HEADER = "X-A2A-Extensions"
#: The extensions activated for the call being served (set once it is checked).
ACTIVE_EXTENSIONS: ContextVar[tuple[str, ...]] = ContextVar("a2a_extensions", default=())
#: Where a task keeps the extensions its call activated, in its A2A context data.
CONTEXT_EXTENSIONS = "extensions"

#: Writes an extension's data on one agent message's or artifact's metadata (a dict, created
#: if the object had none); returns whether it wrote anything.
Annotate = Callable[[dict[str, Any]], bool]


@dataclass(frozen=True)
class Extension:
    """An A2A extension the agent supports."""

    uri: str
    description: str = ""
    required: bool = False
    params: Mapping[str, Any] | None = None
    #: Called on each agent message and artifact of a task the extension is active for.
    annotate: Annotate | None = field(default=None, compare=False)

    def card_entry(self) -> wire.AgentExtension:
        params = dict(self.params) if self.params is not None else None
        return wire.AgentExtension(
            uri=self.uri, description=self.description, required=self.required, params=params
        )


def requested(headers: Mapping[str, str]) -> list[str]:
    """The extension URIs a call names, in order, each once (`headers`: lower-cased names,
    repeated headers joined with commas)."""
    found: dict[str, None] = {}
    for name in (HEADER.lower(), LEGACY_HEADER.lower()):
        for uri in headers.get(name, "").split(","):
            if uri.strip():
                found[uri.strip()] = None
    return list(found)


class Extensions:
    """The extensions an agent declares, and the negotiation of each call."""

    def __init__(self, declared: Iterable[Extension], builtin: Iterable[str] = ()) -> None:
        self.declared = {extension.uri: extension for extension in declared}
        #: URIs of the binding's own extensions (on the card already), activated on request.
        self.builtin = frozenset(builtin)

    def activate(self, headers: Mapping[str, str]) -> tuple[str, ...]:
        """The extensions a call activates; raises -32008 when it leaves out a required one."""
        asked = requested(headers)
        missing = [e.uri for e in self.declared.values() if e.required and e.uri not in asked]
        if missing:
            raise A2AError(
                A2ACode.EXTENSION_SUPPORT_REQUIRED,
                f"this agent requires the extension {missing[0]}: name it in {HEADER}",
                {"extensions": missing},
            )
        active = tuple(u for u in asked if u in self.declared or u in self.builtin)
        ACTIVE_EXTENSIONS.set(active)
        return active

    def annotators(self, active: Sequence[str]) -> tuple[tuple[str, Annotate], ...]:
        """The hooks of the extensions in `active` that write on what a task emits."""
        return tuple(
            (uri, hook)
            for uri in active
            if (extension := self.declared.get(uri)) is not None
            and (hook := extension.annotate) is not None
        )


def annotate(
    value: wire.Message | wire.Artifact, annotators: Sequence[tuple[str, Annotate]]
) -> Any:
    """`value` (a message or an artifact) with each hook's data in its metadata, and the
    URIs of the hooks that wrote in its `extensions`."""
    if not annotators:
        return value
    metadata = dict(value.metadata or {})
    contributed = list(value.extensions)
    for uri, hook in annotators:
        if hook(metadata) and uri not in contributed:
            contributed.append(uri)
    return msgspec.structs.replace(value, metadata=metadata or None, extensions=contributed)


# --- the timestamp extension of the A2A samples ----------------------------------------------

_TIMESTAMP_PATH = "github.com/a2aproject/a2a-samples/extensions/timestamp/v1"
TIMESTAMP_URI = f"https://{_TIMESTAMP_PATH}"
#: The metadata key of the timestamp.
TIMESTAMP_FIELD = f"{_TIMESTAMP_PATH}/timestamp"


def timestamp_extension(
    now: Callable[[], float] = time.time, *, required: bool = False
) -> Extension:
    """The A2A samples' timestamp extension: each agent message and artifact of a task that
    activated it carries the time it was made (RFC 3339, UTC), unless it has one."""

    def stamp(metadata: dict[str, Any]) -> bool:
        if TIMESTAMP_FIELD in metadata:
            return False  # respect a timestamp already there
        metadata[TIMESTAMP_FIELD] = datetime.fromtimestamp(now(), UTC).isoformat()
        return True

    return Extension(
        TIMESTAMP_URI,
        "Adds timestamps to messages and artifacts.",
        required=required,
        annotate=stamp,
    )


__all__ = [
    "ACTIVE_EXTENSIONS",
    "HEADER",
    "LEGACY_HEADER",
    "TIMESTAMP_FIELD",
    "TIMESTAMP_URI",
    "Annotate",
    "Extension",
    "Extensions",
    "annotate",
    "requested",
    "timestamp_extension",
]
