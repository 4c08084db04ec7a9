"""`synapse audit TASK_ID`: print a task's audit trail from a store and verify its hash chain
(see `synapse.p2p.audit`); `--export FILE` writes it as JSON Lines, one entry a line with its
`prev` and `digest`, for anyone to recompute."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from synapse.cli.errors import CliError, Exit
from synapse.p2p.audit import verify_chain
from synapse.p2p.engine import TaskRecord
from synapse.store import open_store
from synapse.store.base import TaskFilter


async def find_task(store_spec: str, task_id: str, requester: str | None) -> TaskRecord:
    try:
        store = open_store(store_spec)
    except (RuntimeError, OSError, sqlite3.Error) as exc:
        raise CliError(f"cannot open the store {store_spec}: {exc}") from exc
    try:
        rows = store.list_tasks(limit=10, where=TaskFilter(task_id=task_id, requester=requester))
        if not rows:
            raise CliError(f"no task {task_id!r} in {store_spec}")
        if len(rows) > 1:
            who = ", ".join(sorted(str(r.key.requester) for r in rows))
            raise CliError(f"task {task_id!r} was requested by several agents ({who}): --requester")
        rec = store.get_task(rows[0].key)
        if rec is None:
            raise CliError(f"no task {task_id!r} in {store_spec}")
        return rec
    finally:
        await store.close()


def run_audit(
    store_spec: str,
    task_id: str,
    *,
    requester: str | None,
    export: str | None,
    head: str | None,
    out: TextIO,
) -> int:
    postgres = store_spec.startswith(("postgresql://", "postgres://"))
    if store_spec == "memory" or (not postgres and not Path(store_spec).is_file()):
        raise CliError(f"no store at {store_spec!r}: give the --store of `synapse serve`")
    rec = asyncio.run(find_task(store_spec, task_id, requester))
    audit = rec.audit
    if export is not None:
        lines = [
            json.dumps(
                {
                    "at": e.at,
                    "actor": e.actor,
                    "action": e.action,
                    "message_id": e.message_id,
                    "detail": e.detail,
                    "prev": e.prev,
                    "digest": e.digest,
                },
                sort_keys=True,
            )
            for e in audit
        ]
        try:
            Path(export).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        except OSError as exc:
            raise CliError(f"cannot write {export}: {exc.strerror or exc}") from exc
    out.write(
        f"task {rec.task_id} ({rec.task.type}), {rec.role.value} of {rec.partner}: "
        f"{rec.state.value}\n"
    )
    for index, e in enumerate(audit):
        when = datetime.fromtimestamp(e.at, UTC).strftime("%Y-%m-%d %H:%M:%S")
        detail = json.dumps(e.detail, sort_keys=True, ensure_ascii=False)
        if len(detail) > 120:
            detail = detail[:117] + "..."
        out.write(f"{index:>3}  {when}  {e.actor:<16} {e.action:<18} {detail}\n")
    verdict = verify_chain(audit, head=head)
    out.write(f"{verdict}\n")
    return Exit.OK if verdict.intact else Exit.TASK_UNSUCCESSFUL
