"""`synapse outbox`: list, retry or drop the messages a peer's SQLite store has not delivered.

It works on the file, offline: the peer need not run. If it runs, SQLite's WAL mode and busy
timeout make each step safe, but the running peer does not see the change: a retried dead
letter is delivered at the peer's next start, and a pending message the running peer already
has queued may still be sent once before its next start forgets it.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TextIO

from synapse.cli.client import to_json
from synapse.cli.errors import CliError, Exit
from synapse.store.base import OutboxItem
from synapse.store.sqlite import SCHEMA_VERSION, SqliteStore

Action = Literal["list", "retry", "drop"]


@dataclass(frozen=True, slots=True)
class Row:
    """One undelivered message: pending in the outbox, or a dead letter."""

    item: OutboxItem
    dead_reason: str | None = None
    dead_at: float | None = None

    @property
    def status(self) -> str:
        return "pending" if self.dead_reason is None else "dead"

    @property
    def message_type(self) -> str:
        try:
            body = json.loads(self.item.body)
        except ValueError:
            return "?"
        kind = body.get("type") if isinstance(body, dict) else None
        return kind if isinstance(kind, str) else "?"

    def as_json(self, now: float) -> dict[str, Any]:
        key = self.item.key
        return {
            "status": self.status,
            "seq": self.item.seq,
            "message_id": self.item.message_id,
            "type": self.message_type,
            "partner": self.item.partner,
            "requester": key.requester if key else None,
            "task_id": key.task_id if key else None,
            "created_at": self.item.created_at,
            "age_s": round(max(0.0, now - self.item.created_at), 3),
            "dead_reason": self.dead_reason,
            "dead_at": self.dead_at,
        }


def check_store(spec: str) -> Path:
    """The path of an existing synapse store, or a one-line error.

    Checked read-only before `SqliteStore` opens it, since that would create a missing file
    and add the store's tables to any other SQLite database.
    """
    if spec == "memory":
        raise CliError(
            "--store memory: nothing to inspect (a memory store ends with its peer); "
            "give the SQLite file of `synapse serve --store PATH`"
        )
    path = Path(spec).expanduser()
    if not path.exists():
        raise CliError(f"no store at {path} (the SQLite file of `synapse serve --store PATH`)")
    if not path.is_file():
        raise CliError(f"{path} is not a synapse store: not a file")
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=5.0)
    except sqlite3.Error as exc:
        raise CliError(f"cannot open store {path}: {exc}") from exc
    try:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
        if not {"meta", "outbox", "tasks"} <= tables:
            raise CliError(f"{path} is not a synapse store: no outbox table")
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    except sqlite3.DatabaseError as exc:
        raise CliError(f"{path} is not a synapse store: {exc}") from exc
    finally:
        conn.close()
    # An older version is brought up to date when the store opens it.
    if row is None or not row[0].isdigit() or int(row[0]) > SCHEMA_VERSION:
        found = "no schema version" if row is None else f"schema {row[0]}"
        raise CliError(f"{path}: store has {found}; this version reads {SCHEMA_VERSION}")
    return path


def rows_of(store: SqliteStore) -> list[Row]:
    snapshot = store.load()
    rows = [Row(item) for item in snapshot.outbox]
    rows += [Row(d.item, d.reason, d.at) for d in snapshot.dead_letters]
    return sorted(rows, key=lambda row: row.item.seq)


def age(seconds: float) -> str:
    """`42s`, `3m05s`, `2h10m`, `3d04h`."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def table(rows: list[Row], now: float, path: Path) -> str:
    """The rows as an aligned table, then a summary line."""
    pending = sum(1 for row in rows if row.dead_reason is None)
    dead = len(rows) - pending
    summary = f"{path}: {pending} pending, {dead} dead letter{'' if dead == 1 else 's'}"
    if not rows:
        return summary
    lines: list[tuple[str, ...]] = [
        ("STATUS", "SEQ", "MESSAGE ID", "TYPE", "PARTNER", "TASK", "AGE", "DEAD REASON")
    ]
    for row in rows:
        key = row.item.key
        lines.append(
            (
                row.status,
                str(row.item.seq),
                row.item.message_id,
                row.message_type.removeprefix("p2p:"),
                row.item.partner,
                key.task_id if key else "-",
                age(now - row.item.created_at),
                row.dead_reason or "",
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    text = [
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines
    ]
    return "\n".join([*text, summary])


def _find(rows: list[Row], message_id: str, path: Path) -> Row:
    for row in rows:
        if row.item.message_id == message_id:
            return row
    raise CliError(f"no message {message_id!r} in the outbox of {path}")


async def run_outbox(
    spec: str, action: Action, message_id: str | None, *, out: TextIO, as_json: bool
) -> int:
    path = check_store(spec)
    try:
        store = SqliteStore(path)
    except (sqlite3.Error, RuntimeError, OSError) as exc:
        raise CliError(f"cannot open store {path}: {exc}") from exc
    try:
        return _act(store, path, action, message_id, out=out, as_json=as_json)
    except sqlite3.Error as exc:
        raise CliError(f"store {path}: {exc}") from exc
    finally:
        await store.close()


def _act(
    store: SqliteStore,
    path: Path,
    action: Action,
    message_id: str | None,
    *,
    out: TextIO,
    as_json: bool,
) -> int:
    rows = rows_of(store)
    now = time.time()
    if action == "list":
        if as_json:
            for row in rows:
                out.write(to_json(row.as_json(now)) + "\n")
        else:
            out.write(table(rows, now, path) + "\n")
        return Exit.OK
    assert message_id is not None
    row = _find(rows, message_id, path)
    if action == "retry":
        if row.dead_reason is None:
            raise CliError(
                f"message {message_id!r} is pending, not a dead letter: nothing to retry"
            )
        if not store.retry_dead_letter(message_id):  # gone since we read it
            raise CliError(f"no dead letter {message_id!r} in the outbox of {path}")
        done = "retried"
        text = (
            f"retried {message_id}: pending again for {row.item.partner}, "
            "delivered at the peer's next start"
        )
    else:
        if not store.drop_outbox(message_id):
            raise CliError(f"no message {message_id!r} in the outbox of {path}")
        done = "dropped"
        text = f"dropped {row.status} {message_id} ({row.message_type} for {row.item.partner})"
    if as_json:
        out.write(to_json({"action": done, **row.as_json(now)}) + "\n")
    else:
        out.write(text + "\n")
    return Exit.OK


__all__ = ["Row", "age", "check_store", "run_outbox", "table"]
