"""The agent card of a Synapse peer speaking A2A, generated from its handler's capabilities.

One skill per task type (its id is the `taskType` a message names in its metadata); A2A
skills have no input schema, so each task type's JSON Schema travels in a card extension
(`TASK_TYPES_EXTENSION`, `params.taskTypes[<id>].inputSchema`) and examples are generated
from it. `capabilities` and `securitySchemes` say what the binding actually does.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from synapse.a2a import wire
from synapse.types import Capability

TEXT = "text/plain"
JSON = "application/json"


def example_value(schema: Any, name: str = "") -> Any:
    """A plausible value for a JSON Schema (defaults, then minimums, then a placeholder)."""
    if not isinstance(schema, dict):
        return "example"
    if "default" in schema:
        return schema["default"]
    if "examples" in schema and isinstance(schema["examples"], list) and schema["examples"]:
        return schema["examples"][0]
    if "enum" in schema and isinstance(schema["enum"], list) and schema["enum"]:
        return schema["enum"][0]
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        props = schema.get("properties")
        if not isinstance(props, dict):
            return {}
        required = schema.get("required")
        keys = required if isinstance(required, list) and required else list(props)
        return {k: example_value(props.get(k), k) for k in keys if isinstance(k, str)}
    if kind == "integer":
        return int(schema.get("minimum", 1))
    if kind == "number":
        return schema.get("minimum", 1.0)
    if kind == "boolean":
        return True
    if kind == "array":
        return [example_value(schema.get("items"), name)]
    return f"example {name}".strip()


def skill_examples(capability: Capability) -> list[str]:
    """How to call this task type: the message metadata and its data part, as JSON text."""
    schema = capability.input_schema or {"type": "object"}
    payload = example_value(schema)
    message = {
        "role": wire.ROLE_USER,
        "metadata": {"taskType": capability.name},
        "parts": [{"data": payload}],
    }
    return [json.dumps(message, ensure_ascii=False, separators=(",", ":"))]


def build_card(
    capabilities: Sequence[Capability],
    *,
    name: str,
    description: str,
    interfaces: Sequence[wire.AgentInterface],
    version: str,
    default_task_type: str | None,
    push_notifications: bool,
    bearer: bool,
    provider: wire.AgentProvider | None = None,
    documentation_url: str | None = None,
) -> wire.AgentCard:
    skills: list[wire.AgentSkill] = []
    task_types: dict[str, Any] = {}
    for cap in capabilities:
        description_text = cap.description or f"Synapse task type {cap.name}"
        if cap.name == default_task_type:
            description_text += " (the default for messages without metadata.taskType)"
        skills.append(
            wire.AgentSkill(
                id=cap.name,
                name=cap.name,
                description=description_text,
                tags=["synapse", cap.name],
                examples=skill_examples(cap),
                input_modes=[JSON, TEXT],
                output_modes=[TEXT, JSON],
            )
        )
        entry: dict[str, Any] = {"version": cap.version}
        if cap.input_schema is not None:
            entry["inputSchema"] = cap.input_schema
        task_types[cap.name] = entry
    params: dict[str, Any] = {
        "taskTypeKey": "taskType",
        "defaultTaskType": default_task_type,
        "taskTypes": task_types,
    }
    extension = wire.AgentExtension(
        uri=wire.TASK_TYPES_EXTENSION,
        description=(
            "Synapse task types: name one in message.metadata.taskType and put its payload "
            "in the first data part; params.taskTypes[<skill id>].inputSchema is its JSON "
            "Schema."
        ),
        required=False,
        params=params,
    )
    schemes: dict[str, dict[str, Any]] = {}
    requirements: list[wire.SecurityRequirement] = []
    if bearer:
        schemes["bearer"] = {
            "httpAuthSecurityScheme": {
                "scheme": "Bearer",
                "description": "Issued by the operator; sent as Authorization: Bearer each call.",
            }
        }
        requirements.append(wire.SecurityRequirement(schemes={"bearer": wire.StringList()}))
    return wire.AgentCard(
        name=name,
        description=description or f"Synapse peer {name}, speaking A2A {wire.PROTOCOL_VERSION}",
        supported_interfaces=list(interfaces),
        provider=provider,
        version=version,
        documentation_url=documentation_url,
        capabilities=wire.AgentCapabilities(
            streaming=True,
            push_notifications=push_notifications,
            extensions=[extension],
            extended_agent_card=bearer,
        ),
        security_schemes=schemes,
        security_requirements=requirements,
        default_input_modes=[JSON, TEXT],
        default_output_modes=[TEXT, JSON],
        skills=skills,
    )


__all__ = ["build_card", "example_value", "skill_examples"]
