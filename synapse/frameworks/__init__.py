"""Agents built with other frameworks, served as Synapse task handlers: a Pydantic AI
`Agent`, a compiled LangGraph graph, an OpenAI Agents SDK `Agent` (docs/frameworks.md).

`as_handler(obj)` recognizes each by the module its type comes from, without importing a
framework that is not installed; `Peer(..., handler=obj)` and `synapse serve --handler
MODULE:ATTR` call it for any object that is not a `TaskHandler` already. Each framework's
adapter is in its own module and extra (`pip install 'synapse-agent-p2p[pydantic-ai]'`,
`[langgraph]`, `[openai-agents]`).
"""

from __future__ import annotations

from typing import Any

from synapse.runtime.handler import TaskHandler

#: The module prefix of each framework's objects → the adapter module and its class.
FRAMEWORKS = {
    "pydantic_ai": ("synapse.frameworks.pydantic_ai", "PydanticAIHandler"),
    "langgraph": ("synapse.frameworks.langgraph", "LangGraphHandler"),
    "agents": ("synapse.frameworks.openai_agents", "OpenAIAgentsHandler"),
}


def framework_of(obj: object) -> str | None:
    """The framework `obj` belongs to (a key of `FRAMEWORKS`), or None."""
    for cls in type(obj).__mro__:
        root = cls.__module__.partition(".")[0]
        if root in FRAMEWORKS:
            return root
    return None


def as_handler(obj: object, **options: Any) -> TaskHandler:
    """`obj` as a `TaskHandler`: itself if it is one, else its framework's adapter (with
    `options`, e.g. `task_type=`). Raises `TypeError` for anything else."""
    if isinstance(obj, TaskHandler) and not options:
        return obj
    framework = framework_of(obj)
    if framework is None:
        raise TypeError(
            f"{type(obj).__qualname__} is neither a TaskHandler nor an agent of a known "
            "framework (a Pydantic AI Agent, a compiled LangGraph graph, an OpenAI Agents SDK "
            "Agent)"
        )
    import importlib

    module_name, class_name = FRAMEWORKS[framework]
    adapter: Any = getattr(importlib.import_module(module_name), class_name)
    handler: TaskHandler = adapter(obj, **options)
    return handler


__all__ = ["FRAMEWORKS", "as_handler", "framework_of"]
