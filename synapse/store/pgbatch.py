"""How a batch of buffered writes travels to PostgreSQL: one statement per write, but the
history rows and the delivered outbox rows of the whole batch in one statement each.

A group commit carries the writes of many messages (`synapse.store.postgres`). Most are a
task's row, its new transitions, an outbox row written or delivered, a dedup entry. The
transitions are append-only rows of their own table, and the rows of delivered messages are
deleted by id, so neither depends on the order of the other writes of the transaction: the
batch's transitions are inserted by one statement (from arrays, in the batch's order, so the
history keeps its order), and its delivered rows are deleted by another, after every write of
the batch (an outbox row is deleted only once its message was delivered, which waits for the
commit that wrote it). Each statement saved is work saved on both sides of the connection.

`Group`: the commits one transaction writes, and how each ended.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import Any

import psycopg

from synapse.p2p.engine import TaskKey
from synapse.store.shared import Tag
from synapse.store.sql import TRANSITION_COLUMNS

#: A buffered write: a statement, its parameters (a list of them: executemany), and the
#: lease that fences it (None: not a write of one task, or no replicas).
Op = tuple[str, Sequence[Any] | list[Sequence[Any]], bool, Tag | None]

INSERT_TRANSITIONS = (
    f"INSERT INTO transitions ({TRANSITION_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
)
DELETE_DELIVERED = "DELETE FROM outbox WHERE message_id = %s"

_INSERT_TRANSITIONS_FROM_ARRAYS = (
    f"INSERT INTO transitions ({TRANSITION_COLUMNS}) SELECT * FROM unnest("
    "%s::text[], %s::text[], %s::text[], %s::text[], %s::text[], %s::text[], %s::text[], "
    "%s::float8[])"
).encode()
_DELETE_DELIVERED_BY_IDS = b"DELETE FROM outbox WHERE message_id = ANY(%s::text[])"


async def send_batch(cur: psycopg.AsyncCursor[Any], batch: list[Op]) -> None:
    """Send `batch`'s writes on `cur` (in a transaction, usually in pipeline mode)."""
    transitions: list[Sequence[Any]] = []
    delivered: list[Any] = []
    for query, params, many, _tag in batch:
        if query == INSERT_TRANSITIONS:
            transitions.extend(params if many else [params])
        elif query == DELETE_DELIVERED:
            delivered.append(params[0])
        elif many:
            await cur.executemany(query.encode(), params)
        else:
            await cur.execute(query.encode(), params)
    if delivered:
        await cur.execute(_DELETE_DELIVERED_BY_IDS, (delivered,))
    if transitions:
        columns = [list(column) for column in zip(*transitions, strict=True)]
        await cur.execute(_INSERT_TRANSITIONS_FROM_ARRAYS, columns)


@dataclasses.dataclass(slots=True)
class Commit:
    """One `commit()` call: its writes, how many of them outlive a failure (the rest the
    caller rolls back), and the future it awaits (the tasks lost if it was fenced out)."""

    ops: list[Op]
    keep: int
    done: asyncio.Future[frozenset[TaskKey] | None]


def _read_outcome(done: asyncio.Future[Any]) -> None:
    if not done.cancelled():
        done.exception()


@dataclasses.dataclass(slots=True)
class Group:
    """The commits one transaction writes."""

    commits: list[Commit] = dataclasses.field(default_factory=list)

    def join(self, ops: list[Op], keep: int) -> asyncio.Future[frozenset[TaskKey] | None]:
        done: asyncio.Future[frozenset[TaskKey] | None] = asyncio.get_running_loop().create_future()
        # A caller cancelled while its transaction was written (shielded: the transaction
        # goes on) never reads how it ended: a failure is then nobody's, and not logged.
        done.add_done_callback(_read_outcome)
        self.commits.append(Commit(ops, keep, done))
        return done

    def settle(
        self,
        error: BaseException | None,
        lost: Sequence[frozenset[TaskKey] | None] = (),
    ) -> None:
        """Each commit's outcome: `error` for all, or its lost tasks (None: written; so for
        a commit that joined while the transaction was being written, with nothing of its
        own in it)."""
        for n, commit in enumerate(self.commits):
            if commit.done.done():
                continue
            if isinstance(error, asyncio.CancelledError):
                # The writer was cancelled (the process stops): so is each commit's wait, and
                # a cancelled future, unlike an exception nobody retrieves, logs nothing.
                commit.done.cancel()
            elif error is not None:
                commit.done.set_exception(error)
            else:
                commit.done.set_result(lost[n] if n < len(lost) else None)
