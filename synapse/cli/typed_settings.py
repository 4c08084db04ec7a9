"""The config file, decoded into typed structs: a value of the wrong type is refused.

TOML has types, and the file's values are taken as written: `port = "8080"`, `secret = 5` or
`max_concurrent_tasks = "many"` are errors, each reported in one line that names the key and
the file, never converted behind the user's back.

How to add a setting: give it a field in `FileValues` (top-level and per-command keys) with
the type its TOML value must have, or add a field to `P2PConfig` (the `[p2p]` table follows
it by itself) or to `HttpLimits` (the `[http]` table). A key known to `options.CONFIG_KEYS`
but not declared here is still typed, by the parser its command reads it with (see
`toml_type_of`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from synapse.cli import parsers
from synapse.cli.errors import CliError
from synapse.types.errors import unknown_key

T = TypeVar("T")


class FileValues(msgspec.Struct, forbid_unknown_fields=False, rename={"as_": "as"}):
    """Top-level keys of the config file (and of its `[serve]`, `[send]`, … tables)."""

    agent_id: str | None = None
    host: str | None = None
    port: int | None = None
    endpoint: str | None = None
    secret: str | None = None
    store: str | None = None
    handler: str | None = None
    signing: str | None = None
    target: str | None = None
    as_: str | None = None
    listen: str | None = None
    retries: int | None = None
    log_json: bool | None = None
    verbose: bool | None = None
    a2a: bool | None = None
    a2a_push_allow: list[str] | str | None = None
    a2a_tokens: list[str] | str | None = None
    a2a_token: str | None = None
    a2a_default_task_type: str | None = None
    a2a_public_url: str | None = None


class PeerTable(msgspec.Struct, forbid_unknown_fields=True):
    """One `[[peer]]` entry."""

    agent_id: str
    endpoint: str
    secret: str | None = None
    secrets: list[str] | None = None
    secret_file: str | None = None
    secret_env: str | None = None


_TYPE_NAMES = {
    "str": "a string",
    "int": "an integer",
    "float": "a number",
    "bool": "a boolean",
    "array": "an array",
    "object": "a table",
    "null": "absent",
}
_MESSAGE = re.compile(r"Expected `(?P<want>[^`]+)`, got `(?P<got>[^`]+)`")
_PATH = re.compile(r" - at `\$(?P<path>[^`]*)`$")


def _wording(error: msgspec.ValidationError) -> tuple[str, str]:
    """(the key path, what is wrong) of a msgspec validation error."""
    text = str(error)
    path_match = _PATH.search(text)
    path = path_match["path"].lstrip(".") if path_match else ""
    message = _PATH.sub("", text)
    found = _MESSAGE.search(message)
    if found:
        wants = [_TYPE_NAMES.get(w.strip(), w.strip()) for w in found["want"].split("|")]
        wants = [w for w in wants if w != "absent"] or ["absent"]
        got = _TYPE_NAMES.get(found["got"], found["got"])
        message = f"must be {' or '.join(wants)}, not {got}"
    return path, message


def typed(value: Any, cls: type[T], *, file: Path | None, table: str | None) -> T:
    """`value` (from TOML) as a `cls`, or a `CliError` naming the key and the file."""
    try:
        return msgspec.convert(value, cls, strict=True)
    except msgspec.ValidationError as exc:
        path, message = _wording(exc)
        where = "" if not table else (table if table.startswith("[") else f"[{table}]") + " "
        key = f"`{path}`" if path else "a value"
        raise CliError(f"config file {file}: {where}{key} {message}") from None


def typed_dataclass(values: Mapping[str, Any], cls: type[T], *, file: Path | None, table: str) -> T:
    """A frozen dataclass (`P2PConfig`, `HttpLimits`) from `values`, each field's type
    checked (ints are taken for floats); unknown fields and bad values are `CliError`s."""
    fields = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(values) - fields)
    if unknown:
        raise CliError(unknown_key(f"config file {file}: [{table}]", unknown[0], fields))
    try:
        return typed(dict(values), cls, file=file, table=table)
    except CliError:
        raise
    except (TypeError, ValueError) as exc:  # the dataclass's own checks (__post_init__)
        raise CliError(f"config file {file}: bad [{table}] settings: {exc}") from None


def toml_type_of(parse: Callable[[str], Any]) -> tuple[type, ...] | None:
    """The TOML type(s) a key read with `parse` must have (None: any scalar, as before)."""
    known: dict[Any, tuple[type, ...]] = {
        str: (str,),
        parsers.parse_port: (int,),
        parsers.parse_count: (int,),
        parsers.parse_bool: (bool,),
        parsers.parse_signing: (str,),
        parsers.parse_url: (str,),
        parsers.parse_http_url: (str,),
        parsers.parse_listen: (str,),
        parsers.parse_a2a_token: (str,),
    }
    return known.get(parse)


__all__ = ["FileValues", "PeerTable", "toml_type_of", "typed", "typed_dataclass"]
