"""Compact bytes for values that are kept long and read rarely: finished task records in
the memory store, the A2A views of finished tasks.

A finished echo task held as Python objects costs about 2 KiB (its record, history,
decision, result: dozens of small objects the collector keeps scanning). Packed, it is one
untracked `bytes`: its fields as MessagePack without their names (about 0.85 KB for a
Synapse echo task, 1.3 KB for one requested over A2A, whose context carries the first A2A
message), and, above `deflate_above` bytes, deflated against a preset dictionary (zlib's
`zdict`: a sample value of the same type, so that member names, states, event names and
the shape of the envelope are already "seen"): about 0.2 – 0.4 KB.

Deflating is what costs (measured inside `synapse serve` under load: ~25 µs for a record,
against ~7 µs to encode it): records deflate above 1 KB only, where it saves about a
kilobyte each; A2A views, small and only built for A2A tasks, always. Unpacking is what a
store lookup of a finished task costs anyway with SQLite.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import typing
import zlib
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import msgspec

if TYPE_CHECKING:
    from synapse.p2p.engine import TaskRecord

T = TypeVar("T")

#: Raw deflate (no zlib header or checksum: the bytes never leave this process), with a
#: 2 KiB window: room for the dictionary and a value of about 1 KB, and a small state to copy.
_WBITS = -11
#: Fastest level: a preset dictionary does most of the work on values this small.
_LEVEL = 1
#: Hash table memory of each compressor (1 – 9): small values need little.
_MEM_LEVEL = 2
#: Records longer than this (as MessagePack) are deflated too.
RECORD_DEFLATE_ABOVE = 1024


#: First byte of a packed value: how the rest is stored.
_PLAIN, _DEFLATED = b"\x00", b"\x01"


class Packer(Generic[T]):
    """Packs values of one type into compact bytes and back (exactly: a MessagePack round
    trip through the type's own decoder), deflated when longer than `deflate_above`."""

    __slots__ = ("_compressor", "_decoder", "_decompressor", "_deflate_above", "_encoder")

    def __init__(self, type_: Any, sample: T, *, deflate_above: int = 0) -> None:
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder: msgspec.msgpack.Decoder[T] = msgspec.msgpack.Decoder(type_)
        self._deflate_above = deflate_above
        zdict = self._encoder.encode(sample)
        # Primed once with the dictionary; each value is (de)compressed by a copy.
        self._compressor = zlib.compressobj(
            _LEVEL, zlib.DEFLATED, _WBITS, _MEM_LEVEL, zlib.Z_DEFAULT_STRATEGY, zdict
        )
        self._decompressor = zlib.decompressobj(_WBITS, zdict)

    def pack(self, value: T) -> bytes:
        data = self._encoder.encode(value)
        if len(data) <= self._deflate_above:
            return _PLAIN + data
        compressor = self._compressor.copy()
        return _DEFLATED + compressor.compress(data) + compressor.flush()

    def unpack(self, data: bytes) -> T:
        body = memoryview(data)[1:]
        if data[:1] == _DEFLATED:
            return self._decoder.decode(self._decompressor.copy().decompress(body))
        return self._decoder.decode(body)


_ID = "00000000-0000-4000-8000-000000000000"
_MSG = "msg-00000000000000000000000000000000"
_AT = 1_700_000_000.0
#: A finished echo task as its executor keeps it: the dictionary records are deflated
#: against (its member names and common values; the ids are placeholders).
_SAMPLE_RECORD: dict[str, Any] = {
    "key": {"requester": "agent-r", "task_id": _ID},
    "role": "executor",
    "partner": "agent-r",
    "task": {"id": _ID, "type": "echo", "priority": "normal", "payload": {"text": "hello"}},
    "context": {"session_id": _ID, "metadata": {}},
    "request_id": _MSG,
    "created_at": _AT,
    "state": "completed",
    "updated_at": _AT,
    "history": [
        {
            "key": {"requester": "agent-r", "task_id": _ID},
            "role": "executor",
            "from_state": from_state,
            "to_state": to_state,
            "event": event,
            "message_id": _MSG,
            "at": _AT,
        }
        for from_state, to_state, event in (
            ("idle", "confirmed", "send task_confirm"),
            ("confirmed", "executing", "start execution"),
            ("executing", "completed", "send task_complete"),
        )
    ],
    "decision": {
        "type": "p2p:task_confirm",
        "version": "1.0",
        "id": _MSG,
        "from": {"agent_id": "agent-e", "endpoint": "http://127.0.0.1:8000/synapse/callback"},
        "to": {"agent_id": "agent-r"},
        "timestamp": "2026-01-01T00:00:00.000000Z",
        "reply_to": _MSG,
        "payload": {"task_id": _ID, "confirmed": True, "capabilities_used": ["echo"]},
    },
    "result": {"output_type": "text", "output": "hello", "metadata": {}},
    "executed_time": 0.0001,
    "handler_started": True,
}


class RecordPacker:
    """Packs task records: their fields in order, without their names, and their history
    as (from, to, event, message id, at) rows (every transition of a record carries the
    record's own key and role), then deflated like any `Packer` value. Generic over the
    record's fields: a field added to `TaskRecord` is packed with the rest."""

    __slots__ = ("_fields", "_names", "_packer", "_record", "_transition")

    def __init__(self) -> None:
        from synapse.p2p.engine import TaskRecord, Transition
        from synapse.p2p.states import Event
        from synapse.types import TaskState

        self._record = TaskRecord
        self._transition = Transition
        self._names = tuple(f.name for f in dataclasses.fields(TaskRecord) if f.name != "history")
        self._fields = operator.attrgetter(*self._names)
        hints = typing.get_type_hints(TaskRecord)
        row = tuple[TaskState, TaskState, Event, str | None, float]
        packed: Any = tuple[(*(hints[name] for name in self._names), list[row])]  # type: ignore[misc]
        sample = msgspec.convert(_SAMPLE_RECORD, TaskRecord)
        self._packer: Packer[tuple[Any, ...]] = Packer(
            packed, self._values(sample), deflate_above=RECORD_DEFLATE_ABOVE
        )

    def _values(self, record: TaskRecord) -> tuple[Any, ...]:
        key, role = record.key, record.role
        rows = []
        for t in record.history:
            if t.key != key or t.role is not role:
                raise ValueError("a transition of another task in the history")
            rows.append((t.from_state, t.to_state, t.event, t.message_id, t.at))
        return (*self._fields(record), rows)

    def pack(self, record: TaskRecord) -> bytes:
        """The record as bytes; ValueError, TypeError or OverflowError if it cannot be."""
        return self._packer.pack(self._values(record))

    def unpack(self, data: bytes) -> TaskRecord:
        *values, rows = self._packer.unpack(data)
        fields = dict(zip(self._names, values, strict=True))
        key, role = fields["key"], fields["role"]
        transition = self._transition
        fields["history"] = [transition(key, role, *row) for row in rows]
        return self._record(**fields)


@functools.cache
def record_packer() -> RecordPacker:
    """The packer of task records (built on first use: the engine's types are needed)."""
    return RecordPacker()


__all__ = ["Packer", "RecordPacker", "record_packer"]
