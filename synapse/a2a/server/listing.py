"""`ListTasks` over the store: through its indexes, a page at a time.

The tasks of one principal are the executor tasks whose requester is `a2a:<principal>`; the
store lists them newest first (`TaskStore.list_tasks`, keyset pagination on an index of
(requester, updated_at), or of (requester, context, updated_at) for a `contextId`), filtered
by state and `statusTimestampAfter` in SQL, and counts them (`TaskStore.count_tasks`). The
memory store keeps only finished tasks: the engine's tasks in flight are merged in. Only the
tasks of the page are turned into A2A tasks: the view in memory for a task in flight, else
one rebuilt from its stored record. A call costs the same at 100 tasks or at 100,000.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from synapse.a2a import mapping, wire
from synapse.a2a.errors import invalid_params
from synapse.a2a.server.view import view_of_record
from synapse.p2p.engine import TaskRecord
from synapse.store.base import ListCursor, TaskFilter, TaskRow
from synapse.types import TaskState


def states_of(status: str) -> frozenset[TaskState] | None:
    """The Synapse states an A2A `status` filter stands for (None: no filter)."""
    if not status or status == wire.UNSPECIFIED:
        return None
    return frozenset(s for s, a2a in mapping.STATE_MAP.items() if a2a == status)


def encode_token(at: float, requester: str, task_id: str) -> str:
    stamp = wire.timestamp(datetime.fromtimestamp(at, UTC))
    raw = json.dumps({"ts": stamp, "id": task_id, "at": at, "r": requester}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_token(token: str, requester: str) -> ListCursor:
    try:
        data: Any = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except (binascii.Error, ValueError):
        data = None
    if isinstance(data, dict) and isinstance(data.get("id"), str):
        at = data.get("at")
        if isinstance(at, int | float):
            return (float(at), requester, data["id"])
        if isinstance(data.get("ts"), str):
            try:
                return (wire.parse_timestamp(data["ts"]).timestamp(), requester, data["id"])
            except ValueError:
                pass
    raise invalid_params("pageToken is not a token this agent issued", path="pageToken")


def store_page(
    server: Any,
    req: wire.ListTasksRequest,
    principal: str,
    page_size: int,
    after: datetime | None,
) -> wire.ListTasksResponse:
    protocol = server.protocol
    # The A2A service (which imports this module: typed `Any`, no import back).
    requester = server.requester_prefix + principal
    where = TaskFilter(
        requester=requester,
        states=states_of(req.status),
        updated_after=after.timestamp() if after is not None else None,
        context_id=req.context_id or None,
    )
    before = decode_token(req.page_token, requester) if req.page_token else None
    store = protocol.store
    rows = store.list_tasks(limit=page_size + 1, before=before, where=where)
    total = store.count_tasks(where)
    if not store.durable:
        # The memory store keeps finished tasks only: those in flight are the engine's.
        live = _live_rows(protocol.view.records(), where, before)
        rows = sorted([*rows, *live], key=lambda row: row.cursor, reverse=True)[: page_size + 1]
        total += len(_live_rows(protocol.view.records(), where, None))
    page, more = rows[:page_size], len(rows) > page_size
    tasks: list[wire.Task] = []
    for row in page:
        view = server.tasks.get(row.key.task_id)
        if view is None or view.key != row.key:
            rec = protocol.view.get(row.key)
            if rec is None:
                continue  # purged between the two reads
            view = view_of_record(rec)
        tasks.append(
            view.snapshot(
                history_length=req.history_length, include_artifacts=req.include_artifacts
            )
        )
    token = encode_token(page[-1].updated_at, requester, page[-1].key.task_id) if more else ""
    return wire.ListTasksResponse(
        tasks=tasks,
        next_page_token=token,
        page_size=page_size,
        total_size=total,
    )


def _live_rows(
    records: Iterable[TaskRecord], where: TaskFilter, before: ListCursor | None
) -> list[TaskRow]:
    """The rows of the tasks in flight (held by the engine, not yet final) that `where`
    wants, strictly after `before`: few, however many tasks ended."""
    rows = []
    for rec in records:
        if rec.is_final:
            continue  # in the store already (written as it ended)
        row = TaskRow(rec.key, rec.role.value, rec.state, rec.updated_at)
        context_id = rec.context.session_id if rec.context is not None else None
        if where.matches(row, context_id) and (before is None or row.cursor < before):
            rows.append(row)
    return rows


__all__ = ["decode_token", "encode_token", "states_of", "store_page"]
