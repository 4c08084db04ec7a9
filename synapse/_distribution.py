"""The name this package is installed by (`pip install synapse-agent-p2p`), for every message
that says how to install it or one of its extras. The import package is `synapse`."""

from __future__ import annotations

#: The distribution's name on the package index (`pyproject.toml`'s `project.name`).
NAME = "synapse-agent-p2p"


def install(extra: str | None = None) -> str:
    """The command that installs the package, with `extra` if given."""
    return f"pip install '{NAME}[{extra}]'" if extra else f"pip install {NAME}"


__all__ = ["NAME", "install"]
