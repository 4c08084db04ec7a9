"""The checked-in JSON Schema (specs/schema/) is current and complete."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from synapse.types import (
    MessageType,
)
from synapse.types import schema as schema_module

SPECS = Path(__file__).resolve().parents[2] / "specs"
SCHEMA = SPECS / "schema"


def test_checked_in_schema_is_current() -> None:
    stale = schema_module.stale_files(SCHEMA)
    assert not stale, f"run `python -m synapse.types.schema` to refresh: {stale}"


def test_schema_check_mode_fails_on_stale_files(tmp_path: Path) -> None:
    assert schema_module.main(["--check", "--dir", str(tmp_path)]) == 1
    assert schema_module.main(["--dir", str(tmp_path)]) == 0
    assert schema_module.main(["--check", "--dir", str(tmp_path)]) == 0
    (tmp_path / "ack.json").write_text("{}\n")
    assert schema_module.main(["--check", "--dir", str(tmp_path)]) == 1
    assert schema_module.stale_files(tmp_path) == ["ack.json"]
    schema_module.main(["--dir", str(tmp_path)])
    (tmp_path / "task_progress.json").write_text("{}\n")
    assert schema_module.stale_files(tmp_path) == ["task_progress.json"]


def test_one_schema_for_the_union_and_one_per_type() -> None:
    schemas = schema_module.message_schemas()
    assert set(schemas) == {"message.json"} | {f"{t.short}.json" for t in MessageType}
    union = schemas["message.json"]
    assert union["discriminator"]["propertyName"] == "type"
    assert set(union["discriminator"]["mapping"]) == {t.value for t in MessageType}
    assert len(union["anyOf"]) == 17
    for message_type in MessageType:
        one = schemas[f"{message_type.short}.json"]
        assert one["title"] == message_type.value
        root = one["$defs"][one["$ref"].rsplit("/", 1)[1]]
        assert root["properties"]["type"] == {"enum": [message_type.value]}
        assert root["properties"]["timestamp"]["format"] == "date-time"
        required = {"type", "version", "id", "from", "to", "timestamp", "payload"}
        assert set(root["required"]) == required
        # Self-contained: every reference resolves inside the file.
        refs = {r.rsplit("/", 1)[1] for r in _refs(one)}
        assert refs <= set(one["$defs"])


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return found + [r for v in node.values() for r in _refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []
