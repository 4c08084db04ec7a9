"""JSON Schema of the wire messages, generated from the structs so that it cannot drift.

`message_schemas()` gives one schema for the whole `Message` union (discriminated by `type`)
and one self-contained schema per message type. Run as a module to write them into
`specs/schema/`, or with `--check` to fail (exit 1) when the checked-in files are stale:

    python -m synapse.types.schema [--check] [--dir specs/schema]

The schemas describe shape only. What JSON Schema cannot say is in `specs/protocol.md`:
I-JSON limits, which major versions are accepted, when `reply_to` is present, signatures.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import msgspec

from synapse.types.enums import (
    EXECUTOR_TO_REQUESTER,
    REPLY_ONLY_TYPES,
    REQUESTER_TO_EXECUTOR,
    MessageType,
)
from synapse.types.messages import MESSAGE_CLASSES, PROTOCOL_VERSION, Message

JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
#: Where the generated files are checked in, relative to the repository root.
DEFAULT_DIR = Path("specs") / "schema"
UNION_FILE = "message.json"


def _direction(message_type: MessageType) -> str:
    if message_type in EXECUTOR_TO_REQUESTER:
        who = "executor → requester"
    elif message_type in REQUESTER_TO_EXECUTOR or message_type is MessageType.TASK_REQUEST:
        who = "requester → executor"
    else:
        who = "either way"
    if message_type in REPLY_ONLY_TYPES:
        return f"{who}; only ever a synchronous reply (carries `reply_to`)"
    return who


def _document(schema: dict[str, Any], title: str, description: str) -> dict[str, Any]:
    head = {"$schema": JSON_SCHEMA_DIALECT, "title": title, "description": description}
    return {**head, **schema}


def message_schemas() -> dict[str, dict[str, Any]]:
    """File name → JSON Schema: `message.json` for the union, `<type>.json` for each type."""
    schemas = {
        UNION_FILE: _document(
            msgspec.json.schema(Message),
            "Synapse P2P message",
            f"Any of the 17 `p2p:` envelopes of protocol version {PROTOCOL_VERSION}, "
            "discriminated by `type`. Unknown members are allowed and ignored.",
        )
    }
    for message_type, cls in MESSAGE_CLASSES.items():
        schemas[f"{message_type.short}.json"] = _document(
            msgspec.json.schema(cls),
            message_type.value,
            f"The `{message_type.value}` envelope ({_direction(message_type)}).",
        )
    return schemas


def render(schema: dict[str, Any]) -> str:
    """The file text: stable, readable, UTF-8, one trailing newline."""
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def stale_files(directory: Path) -> list[str]:
    """Names of the files in `directory` that are missing, differ, or are no longer generated."""
    expected = {name: render(schema) for name, schema in message_schemas().items()}
    stale = [
        name
        for name, text in expected.items()
        if not (directory / name).is_file() or (directory / name).read_text("utf-8") != text
    ]
    if directory.is_dir():
        stale += sorted(p.name for p in directory.glob("*.json") if p.name not in expected)
    return stale


def write_schemas(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, schema in message_schemas().items():
        path = directory / name
        path.write_text(render(schema), "utf-8")
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m synapse.types.schema",
        description="Write the JSON Schema of the Synapse messages, or check it is current.",
    )
    parser.add_argument(
        "--dir", type=Path, default=DEFAULT_DIR, help="output directory (default: %(default)s)"
    )
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if the files there are not current"
    )
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files(args.dir)
        if stale:
            print(
                f"stale schema in {args.dir}: {', '.join(stale)}; "
                "run `python -m synapse.types.schema`",
                file=sys.stderr,
            )
            return 1
        return 0
    for path in write_schemas(args.dir):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
