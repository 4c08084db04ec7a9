"""The typed requests of the A2A operations, from decoded JSON: `convert` (camelCase or
snake_case members, refused as `invalid_params`) and the checks every operation shares."""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from synapse.a2a import wire
from synapse.a2a.errors import invalid_params

S = TypeVar("S")


def convert(params: Any, cls: type[S], *, strict: bool = True) -> S:
    """The typed request `cls` of decoded JSON `params` (camelCase or snake_case members).
    Not `strict`: strings may stand for numbers and booleans (query parameters)."""
    try:
        return msgspec.convert(wire.camel_members(params, cls), cls, strict=strict)
    except msgspec.ValidationError as exc:
        raise invalid_params(f"Invalid params: {exc}") from None


def check_history_length(value: int | None) -> None:
    if value is not None and value < 0:
        raise invalid_params("history length must be non-negative", path="historyLength")


__all__ = ["check_history_length", "convert"]
