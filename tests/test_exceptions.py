"""One exception root: every exception class the package defines derives from
`SynapseException`, so `except SynapseException` catches whatever Synapse raises."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest

import synapse
from synapse import (
    DeliveryError,
    LocalProtocolError,
    NackError,
    NotReady,
    ProtocolError,
    RemoteProtocolError,
    SynapseException,
)
from synapse.types import ErrorCode

PACKAGE = Path(synapse.__file__).parent


def module_names() -> list[str]:
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        if parts[-1] == "__main__":
            continue
        names.append(".".join(parts))
    return names


@pytest.mark.parametrize("name", module_names())
def test_every_exception_derives_from_the_root(name: str) -> None:
    try:
        module = importlib.import_module(name)
    except ImportError as missing:  # an extra not installed (grpc, say)
        pytest.skip(f"{name} needs {missing.name}")
    strays = [
        cls.__qualname__
        for cls in vars(module).values()
        if inspect.isclass(cls)
        and issubclass(cls, BaseException)
        and cls.__module__ == name
        and not issubclass(cls, SynapseException)
    ]
    assert not strays, f"{name}: {strays} do not derive from SynapseException"


def test_the_split_is_by_fault() -> None:
    assert issubclass(RemoteProtocolError, ProtocolError)
    # Both kinds of refusal become a nack; only one is the partner's fault.
    assert issubclass(RemoteProtocolError, NackError) and issubclass(NotReady, NackError)
    assert not issubclass(NotReady, RemoteProtocolError)
    assert NotReady("draining").code is ErrorCode.AGENT_NOT_READY
    assert issubclass(LocalProtocolError, ProtocolError)
    assert not issubclass(RemoteProtocolError, LocalProtocolError)
    assert not issubclass(DeliveryError, ProtocolError)
    assert issubclass(ProtocolError, SynapseException)
    assert issubclass(DeliveryError, SynapseException)
    # The root catches nothing that is not ours.
    assert not issubclass(ValueError, SynapseException)
