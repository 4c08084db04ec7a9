"""Compact bytes for values that are kept long and read rarely: finished task records in
the memory store, the A2A views of finished tasks.

A finished echo task held as Python objects costs about 2 KiB (its record, history,
decision, result: dozens of small objects the collector keeps scanning); the same record
as MessagePack is about 1.9 KB, and deflated against a preset dictionary (zlib's
`zdict`: a sample value of the same type, so that member names, states, event names and
the shape of the envelope are already "seen") about 0.3 KB: one untracked `bytes` object.
Packing costs a few tens of microseconds once per finished task; unpacking is what a
store lookup of a finished task costs anyway with SQLite.
"""

from __future__ import annotations

import functools
import zlib
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import msgspec

if TYPE_CHECKING:
    from synapse.p2p.engine import TaskRecord

T = TypeVar("T")

#: Raw deflate (no zlib header or checksum: the bytes never leave this process), with a
#: 4 KiB window: room for the dictionary and a value of a few KB, and a small state to copy.
_WBITS = -12
#: Fastest level: a preset dictionary does most of the work on values this small.
_LEVEL = 1
#: Hash table memory of each compressor (1 – 9): small values need little.
_MEM_LEVEL = 4


class Packer(Generic[T]):
    """Packs values of one type into compact bytes and back (exactly: a MessagePack round
    trip through the type's own decoder)."""

    __slots__ = ("_compressor", "_decoder", "_decompressor", "_encoder")

    def __init__(self, type_: type[T], sample: T) -> None:
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder: msgspec.msgpack.Decoder[T] = msgspec.msgpack.Decoder(type_)
        zdict = self._encoder.encode(sample)
        # Primed once with the dictionary; each value is (de)compressed by a copy.
        self._compressor = zlib.compressobj(
            _LEVEL, zlib.DEFLATED, _WBITS, _MEM_LEVEL, zlib.Z_DEFAULT_STRATEGY, zdict
        )
        self._decompressor = zlib.decompressobj(_WBITS, zdict)

    def pack(self, value: T) -> bytes:
        compressor = self._compressor.copy()
        return compressor.compress(self._encoder.encode(value)) + compressor.flush()

    def unpack(self, data: bytes) -> T:
        return self._decoder.decode(self._decompressor.copy().decompress(data))


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


@functools.cache
def record_packer() -> Packer[TaskRecord]:
    """The packer of task records (built on first use: the engine's types are needed)."""
    from synapse.p2p.engine import TaskRecord

    return Packer(TaskRecord, msgspec.convert(_SAMPLE_RECORD, TaskRecord))


__all__ = ["Packer", "record_packer"]
