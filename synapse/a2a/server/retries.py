"""A `SendMessage` retried after a network error returns the task its first attempt started.

A client that lost the answer to its `SendMessage` (a connection cut, a timeout) cannot know
whether the task was started; it sends the same message again, with the same `messageId`.
The service deduplicates new messages by (authenticated principal, `messageId`): the first
one starts a task and records, in the store and in the same commit as the task, the message's
fingerprint (SHA-256 of the message as received) and the task's id, for `dedup_window`
seconds; a retry with the same fingerprint gets that task (whatever it has become), on this
process or, through the shared store, on any replica and after a restart; a message that
reuses the id with a different body is refused (`-32602`, `message_id_reused`). Retries that
arrive while the first attempt is still being processed wait for it.

Only authenticated principals are deduplicated: anonymous callers are indistinguishable, and
answering one with the task another started because it guessed a `messageId` would hand over
someone else's task.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict

from synapse.a2a import wire
from synapse.a2a.errors import A2ACode, A2AError
from synapse.p2p.dedup import DedupKey, StoredReply
from synapse.store.base import DedupEntry, TaskStore
from synapse.store.dedup import read_dedup

#: The dedup table's message ids of A2A messages (Synapse messages' ids never look so).
MESSAGE_PREFIX = "a2a-message:"


def fingerprint(message: wire.Message) -> bytes:
    return hashlib.sha256(wire.encode(message)).digest()


def reused(message_id: str) -> A2AError:
    return A2AError(
        A2ACode.INVALID_PARAMS,
        f"messageId {message_id!r} was already used for another message",
        {"reason": "message_id_reused", "messageId": message_id},
    )


class SentMessages:
    """The new messages being started here, and the lookups of those already started."""

    def __init__(self, window: float) -> None:
        self.window = window
        #: Key → (fingerprint, the task id once started, or None if the attempt failed).
        self._starting: dict[DedupKey, tuple[bytes, asyncio.Future[str | None]]] = {}
        #: The entries, oldest first, when the store keeps none (the memory store).
        self._kept: OrderedDict[DedupKey, DedupEntry] = OrderedDict()

    @staticmethod
    def key(partner: str, message: wire.Message) -> DedupKey:
        return partner, MESSAGE_PREFIX + message.message_id

    async def begin(self, store: TaskStore, key: DedupKey, print_: bytes) -> str | None:
        """The id of the task this message already started, or None: then start it, and
        say how it went (`started` or `failed`)."""
        while True:
            pending = self._starting.get(key)
            if pending is None:
                break
            if pending[0] != print_:
                raise reused(key[1].removeprefix(MESSAGE_PREFIX))
            task_id = await asyncio.shield(pending[1])
            if task_id is not None:
                return task_id
            # The first attempt failed (and left nothing): this one starts it.
        done: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        self._starting[key] = (print_, done)
        try:
            entry = await read_dedup(store, key) if store.durable else self._kept.get(key)
        except BaseException:
            self.failed(key)
            raise
        if entry is None or entry.expires_at <= time.time():
            return None
        if entry.fingerprint != print_:
            self.failed(key)
            raise reused(key[1].removeprefix(MESSAGE_PREFIX))
        task_id = entry.reply.body.decode()
        self._finish(key, task_id)
        return task_id

    def record(self, store: TaskStore, key: DedupKey, print_: bytes, task_id: str) -> None:
        """Buffer the entry of a message starting task `task_id`: the commit that makes the
        task durable makes it durable too."""
        now = time.time()
        entry = DedupEntry(key, print_, now + self.window, StoredReply(200, task_id.encode(), ()))
        if store.durable:
            store.put_dedup(entry)
            return
        kept = self._kept
        kept[key] = entry
        while kept:  # forget what expired (entries expire in the order they were made)
            oldest = next(iter(kept.values()))
            if oldest.expires_at > now:
                break
            kept.popitem(last=False)

    def started(self, key: DedupKey, task_id: str) -> None:
        self._finish(key, task_id)

    def failed(self, key: DedupKey, store: TaskStore | None = None) -> None:
        """The attempt left no task: its entry (if buffered) goes, and a retry waiting for
        it starts the task itself."""
        if store is not None:
            store.delete_dedup([key])
            self._kept.pop(key, None)
        self._finish(key, None)

    def _finish(self, key: DedupKey, task_id: str | None) -> None:
        pending = self._starting.pop(key, None)
        if pending is not None and not pending[1].done():
            pending[1].set_result(task_id)


__all__ = ["MESSAGE_PREFIX", "SentMessages", "fingerprint", "reused"]
