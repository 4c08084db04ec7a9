"""specs/protocol.md names every message type, state and error code with the protocol's spelling."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest

from synapse.types import ErrorCode, MessageType, TaskState
from synapse.types.messages import MESSAGE_CLASSES, PAYLOAD_CLASSES

DOC = (Path(__file__).resolve().parents[2] / "specs" / "protocol.md").read_text("utf-8")


@pytest.mark.parametrize("message_type", list(MessageType), ids=lambda t: t.short)
def test_every_message_type_is_described(message_type: MessageType) -> None:
    assert f"`{message_type.value}`" in DOC


@pytest.mark.parametrize("state", list(TaskState))
def test_every_state_is_described(state: TaskState) -> None:
    assert f"| `{state.value}` |" in DOC


@pytest.mark.parametrize("code", list(ErrorCode))
def test_every_error_code_is_described(code: ErrorCode) -> None:
    assert f"| `{code.value}` |" in DOC


def test_links_to_the_generated_companions() -> None:
    for target in ("state-machine.md", "schema/", "examples/", "signature-vectors.json"):
        assert f"]({target})" in DOC
    assert "canceled" not in DOC  # the protocol spells it `cancelled`


# --- fields: the tables of specs/protocol.md and the types cannot drift ----------------------


def _section(message_type: MessageType) -> str:
    """The text that documents `message_type`'s payload: its own subsection of §4, or its row
    in '4.11 The other payloads'."""
    heading = re.search(rf"^### 4\.\d+ `{message_type.short}`\n", DOC, re.M)
    if heading is not None:
        rest = DOC[heading.end() :]
        return rest[: re.search(r"^##", rest, re.M).start()]  # type: ignore[union-attr]
    row = re.search(rf"^\| `{message_type.short}` \|.*$", DOC, re.M)
    assert row is not None, f"{message_type.short} has no payload table or row"
    return row.group(0)


def _struct_of(t: msgspec.inspect.Type) -> msgspec.inspect.StructType | None:
    """The struct a field holds, through `| None` and lists."""
    if isinstance(t, msgspec.inspect.StructType):
        return t
    if isinstance(t, msgspec.inspect.UnionType):
        structs = [s for s in map(_struct_of, t.types) if s is not None]
        return structs[0] if structs else None
    if isinstance(t, msgspec.inspect.ListType):
        return _struct_of(t.item_type)
    return None


def _paths(
    struct: msgspec.inspect.StructType, prefix: tuple[str, ...] = ()
) -> set[tuple[str, ...]]:
    """Every wire field of `struct`, nested ones as paths (`task`, `task.id`, …)."""
    found: set[tuple[str, ...]] = set()
    for field in struct.fields:
        path = (*prefix, field.encode_name)
        found.add(path)
        inner = _struct_of(field.type)
        if inner is not None:
            found |= _paths(inner, path)
    return found


def _payload_paths(message_type: MessageType) -> set[tuple[str, ...]]:
    info = msgspec.inspect.type_info(PAYLOAD_CLASSES[message_type])
    assert isinstance(info, msgspec.inspect.StructType)
    return _paths(info)


@pytest.mark.parametrize("message_type", list(MessageType), ids=lambda t: t.short)
def test_every_payload_field_is_documented(message_type: MessageType) -> None:
    """A field added to a payload fails here until specs/protocol.md describes it, in the
    section of its message: as a row (`task.id`), or named in its parent's notes."""
    text = _section(message_type)
    missing = [
        ".".join(path)
        for path in sorted(_payload_paths(message_type))
        if f"`{'.'.join(path)}`" not in text
        and f"`{'.'.join(path)}." not in text
        and f"`{path[-1]}`" not in text
        and f"{path[-1]} (" not in text  # in a list of `name (type)` entries
    ]
    assert not missing, f"{message_type.short}: not in specs/protocol.md: {missing}"


def _documented(message_type: MessageType) -> set[str]:
    """The field names a payload's section lists: its tables' first column, or in a row of
    4.11 the names written as `name` (type …)."""
    text = _section(message_type)
    if text.startswith("| `"):
        cells = re.split(r"(?<!\\)\|", text)  # a `\|` inside a cell is no border
        return set(re.findall(r"`([a-z_]+)` \(", cells[2]))
    return set(re.findall(r"^\| `([a-z_.]+)` \|", text, re.M))


@pytest.mark.parametrize("message_type", list(MessageType), ids=lambda t: t.short)
def test_every_documented_field_exists(message_type: MessageType) -> None:
    """And the other way: a field documented but absent from the types fails here."""
    paths = {".".join(p) for p in _payload_paths(message_type)}
    leaves = {p[-1] for p in _payload_paths(message_type)}
    unknown = sorted(
        name for name in _documented(message_type) if name not in paths and name not in leaves
    )
    assert not unknown, f"{message_type.short}: documented but not a field: {unknown}"


def test_every_envelope_member_is_documented_and_exists() -> None:
    table = DOC[DOC.index("## 3. Envelope") : DOC.index("## 4. Payloads")]
    documented = set(re.findall(r"^\| `([a-z_]+)` \|", table, re.M))
    info = msgspec.inspect.type_info(MESSAGE_CLASSES[MessageType.TASK_REQUEST])
    assert isinstance(info, msgspec.inspect.StructType)
    members = {f.encode_name for f in info.fields} | {"type"}  # `type` is the tag
    assert documented == members
