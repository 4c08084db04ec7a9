"""`synapse audit TASK_ID`: print a task's audit trail from a store and verify its hash chain
(see `synapse.p2p.audit`); `--export FILE` writes it as JSON Lines, one entry a line with its
`prev` and `digest`, for anyone to recompute. `--audit-key-file` (also `serve`'s) names the
secrets trails are keyed with."""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from synapse.cli.errors import CliError, Exit
from synapse.cli.options import AUDIT_KEY_FILE
from synapse.p2p.audit import AuditKeys, verify_chain
from synapse.p2p.engine import TaskRecord
from synapse.store import is_postgres_url, open_store
from synapse.store.base import TaskFilter


def add_audit_key_argument(parser: argparse.ArgumentParser, *, verify: bool) -> None:
    """`--audit-key-file [ID=]PATH`, for `serve` (keys new entries) and `audit` (verifies)."""
    use = (
        "verify trails keyed with it"
        if verify
        else "key the audit trails with it: the first given keys new entries and seals"
    )
    parser.add_argument(
        AUDIT_KEY_FILE.flag,
        dest=AUDIT_KEY_FILE.dest,
        action="append",
        metavar="[ID=]PATH",
        help=f"a secret of at least 16 bytes, kept outside the store; {use}; repeat for the "
        "older keys of a rotation (ID names each key, default 1; $SYNAPSE_AUDIT_KEY_FILES)",
    )


def audit_keys(specs: Sequence[str]) -> AuditKeys | None:
    """The keys `--audit-key-file [ID=]PATH` names (the first is current); None for none."""
    keys: dict[str, bytes] = {}
    for spec in specs:
        key_id, sep, path = spec.partition("=")
        if not sep:
            key_id, path = "1", spec
        if key_id in keys:
            raise CliError(f"--audit-key-file: key id {key_id!r} given twice (name them ID=PATH)")
        try:
            keys[key_id] = Path(path).expanduser().read_bytes().strip()
        except OSError as exc:
            raise CliError(f"cannot read audit key file {path}: {exc.strerror or exc}") from exc
    if not keys:
        return None
    try:
        return AuditKeys(keys, next(iter(keys)))
    except ValueError as exc:
        raise CliError(f"--audit-key-file: {exc}") from exc


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
    keys: AuditKeys | None = None,
) -> int:
    postgres = is_postgres_url(store_spec)
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
    verdict = verify_chain(audit, head=head, keys=keys, task=rec.key, seal=rec.audit_seal)
    out.write(f"{verdict}\n")
    out.write(_what_it_shows(keys is not None, head is not None) + "\n")
    return Exit.OK if verdict.intact else Exit.TASK_UNSUCCESSFUL


def _what_it_shows(keyed: bool, head: bool) -> str:
    """What the verdict can vouch for, said plainly under it."""
    if keyed:
        shown = (
            "checked with the audit key: no entry was changed, added, removed or moved, and "
            "the trail was not cut short or emptied, by anyone without the key"
        )
        if not head:
            shown += "; a whole record put back from an older copy of the store is not seen"
            shown += " without --head"
        return shown
    shown = (
        "checked without a key: finds accidental and careless edits; someone who can write "
        "the store can rewrite the chain (give --audit-key-file if the trails are keyed)"
    )
    if not head:
        shown += "; entries removed from the end are not seen without --head"
    return shown
