"""What the SQL stores (SQLite, PostgreSQL) share: row decoding and the task listing.

Both keep the same tables with the same columns; they differ in their driver's placeholder
(`?` or `%s`) and in how they write. The listing (`TaskStore.list_tasks`, `count_tasks`) is
one query shape over the `tasks_listing` / `tasks_by_requester` indexes, built here once.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from synapse.p2p.dedup import StoredReply
from synapse.p2p.engine import TaskKey, TaskRecord, Transition
from synapse.p2p.states import Event, Role
from synapse.store.base import (
    DedupEntry,
    ListCursor,
    OutboxItem,
    TaskFilter,
    TaskRow,
)
from synapse.types import TaskState

FINAL = "('completed', 'failed', 'cancelled', 'rejected')"
OUTBOX_COLUMNS = "seq, message_id, partner, requester, task_id, body, created_at"
TRANSITION_COLUMNS = "requester, task_id, role, from_state, to_state, event, message_id, at"
DEDUP_COLUMNS = "sender, message_id, fingerprint, expires_at, status, body, headers"

_record_encoder = msgspec.json.Encoder()
_record_decoder = msgspec.json.Decoder(TaskRecord)


def encode_record(record: TaskRecord) -> bytes:
    """The `record` column: the record without its history (kept row by row in
    `transitions`). Called on the event loop, where a store stages its writes."""
    # Encoded with its history set aside for the call rather than from a copy
    # (`dataclasses.replace` was 2 % of an executor's samples); nothing else runs meanwhile.
    history, record.history = record.history, []
    try:
        return _record_encoder.encode(record)
    finally:
        record.history = history


def decode_record(blob: bytes) -> TaskRecord:
    """A record as `encode_record` stored it (its history is read from `transitions`)."""
    return _record_decoder.decode(blob)


def outbox_item(row: Sequence[Any]) -> OutboxItem:
    """An `OUTBOX_COLUMNS` row (more columns may follow)."""
    seq, message_id, partner, requester, task_id, body, created_at = row[:7]
    key = TaskKey(requester, task_id) if requester is not None else None
    return OutboxItem(int(seq), message_id, partner, key, bytes(body), float(created_at))


def transition(row: Sequence[Any]) -> Transition:
    """A `TRANSITION_COLUMNS` row."""
    return Transition(
        TaskKey(row[0], row[1]),
        Role(row[2]),
        TaskState(row[3]),
        TaskState(row[4]),
        Event(row[5]),
        row[6],
        float(row[7]),
    )


def transition_row(t: Transition) -> tuple[Any, ...]:
    """The `TRANSITION_COLUMNS` of `t`, to insert."""
    # str() of these string enums is their value, and costs a third of what `.value` (a
    # Python-level property) does: this runs for every transition a store writes.
    key = t.key
    return (
        key.requester,
        key.task_id,
        str(t.role),
        str(t.from_state),
        str(t.to_state),
        str(t.event),
        t.message_id,
        t.at,
    )


def dedup_entry(row: Sequence[Any]) -> DedupEntry:
    """A `DEDUP_COLUMNS` row."""
    sender, message_id, fingerprint, expires_at, status, body, headers = row
    reply = StoredReply(int(status), bytes(body), tuple(tuple(h) for h in json.loads(headers)))
    return DedupEntry((sender, message_id), bytes(fingerprint), float(expires_at), reply)


def where_clauses(
    where: TaskFilter | None, mark: str, context: str
) -> tuple[list[str], tuple[Any, ...]]:
    """SQL conditions (and their parameters) for a listing filter; `mark`: the driver's
    placeholder; `context`: the indexed expression of a task's context id (each database
    reads it from the record its own way)."""
    clauses: list[str] = []
    params: tuple[Any, ...] = ()
    if where is None:
        return clauses, params
    if where.requester is not None:
        clauses.append(f"requester = {mark}")
        params += (where.requester,)
    if where.states is not None:
        states = sorted(state.value for state in where.states)
        clauses.append(f"state IN ({', '.join([mark] * len(states))})")
        params += tuple(states)
    if where.updated_after is not None:
        clauses.append(f"updated_at >= {mark}")
        params += (where.updated_after,)
    if where.context_id is not None:
        clauses.append(f"{context} = {mark}")
        params += (where.context_id,)
    if where.task_id is not None:
        clauses.append(f"task_id = {mark}")
        params += (where.task_id,)
    return clauses, params


def listing_query(
    where: TaskFilter | None, before: ListCursor | None, limit: int, mark: str, context: str
) -> tuple[str, tuple[Any, ...]]:
    """A page of `list_tasks`: newest first, strictly after `before`."""
    clauses, params = where_clauses(where, mark, context)
    if before is not None:
        clauses.append(f"(updated_at, requester, task_id) < ({mark}, {mark}, {mark})")
        params += before
    query = "SELECT requester, task_id, role, state, updated_at FROM tasks"
    if clauses:
        query += " WHERE " + " AND ".join(clauses)
    query += f" ORDER BY updated_at DESC, requester DESC, task_id DESC LIMIT {mark}"
    return query, (*params, limit)


def count_query(where: TaskFilter | None, mark: str, context: str) -> tuple[str, tuple[Any, ...]]:
    clauses, params = where_clauses(where, mark, context)
    query = "SELECT count(*) FROM tasks" + (" WHERE " + " AND ".join(clauses) if clauses else "")
    return query, params


def task_rows(rows: Iterable[Sequence[Any]]) -> list[TaskRow]:
    """The rows of a `listing_query`."""
    return [
        TaskRow(TaskKey(req, tid), role, TaskState(state), float(at))
        for req, tid, role, state, at in rows
    ]


class OutboxMaintenance:
    """What a person does to the outbox (`synapse outbox`): retry a dead letter, drop a
    message. A store supplies `_maintain` (one statement, committed; rows changed)."""

    #: The driver's placeholder.
    _mark = "?"
    #: Columns a retried dead letter starts afresh with, besides its reason and time.
    _reset_on_retry: tuple[str, ...] = ()

    def _maintain(self, query: str, params: tuple[Any, ...]) -> int:
        raise NotImplementedError

    def retry_dead_letter(self, message_id: str) -> bool:
        """Put a dead letter back in the outbox; delivered at the next start."""
        sets = ", ".join(f"{c} = NULL" for c in ("dead_reason", "dead_at", *self._reset_on_retry))
        query = (
            f"UPDATE outbox SET {sets} WHERE message_id = {self._mark} AND dead_reason IS NOT NULL"
        )
        return self._maintain(query, (message_id,)) > 0

    def drop_outbox(self, message_id: str) -> bool:
        """Delete a pending message or dead letter for good."""
        return (
            self._maintain(f"DELETE FROM outbox WHERE message_id = {self._mark}", (message_id,)) > 0
        )


__all__ = [
    "DEDUP_COLUMNS",
    "FINAL",
    "OUTBOX_COLUMNS",
    "TRANSITION_COLUMNS",
    "OutboxMaintenance",
    "count_query",
    "dedup_entry",
    "listing_query",
    "outbox_item",
    "task_rows",
    "transition",
    "transition_row",
    "where_clauses",
]
