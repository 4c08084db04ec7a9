"""The runtime's deliveries: one queue per task, one message on the wire at a time,
retried, parked, dead-lettered; the outbox they come from; heartbeats."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from synapse.p2p.delivery import TaskQueue
from synapse.p2p.engine import (
    Outgoing,
    TaskEvent,
    TaskKey,
    TaskNote,
)
from synapse.runtime.runtime_base import (
    RuntimeBase,
    _Queued,
    log,
    p2p_logger,
)
from synapse.runtime.sender import DeliveryError
from synapse.store.base import (
    OutboxItem,
    StoreUnavailable,
)
from synapse.types import (
    Heartbeat,
    encode_message,
)

#: Seconds between commit attempts of a delivery worker while the store cannot write.
_STORE_RETRY_FIRST, _STORE_RETRY_MAX = 0.05, 2.0


def retry_pause(
    failures: int, first: float = _STORE_RETRY_FIRST, most: float = _STORE_RETRY_MAX
) -> float:
    """Seconds to wait after `failures` failed attempts in a row (1 or more) at something
    the store must do before a caller can go on: `first`, doubling each time, up to `most`."""
    doublings: int = min(max(failures, 1) - 1, 16)
    return min(first * (1 << doublings), most)


#: The longest pause before a delivery worker stopped by errors again and again restarts.
_RESTART_PAUSE_MAX = 300.0


def restart_pause(failures: int) -> float:
    """Seconds before a task's delivery worker starts again after `failures` workers of the
    task stopped by an error in a row: 2, 4, 8, ... up to five minutes."""
    return retry_pause(failures, _STORE_RETRY_MAX, _RESTART_PAUSE_MAX)


class Delivering(RuntimeBase):
    """Delivers what the engine says to POST, and runs its timers."""

    @property
    def pending_deliveries(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def delivering(self, key: TaskKey) -> bool:
        """Whether messages about `key` are still queued for delivery."""
        return bool(self._queues.get(key))

    def describe(self) -> list[str]:
        """What this runtime holds now, a line each (for `synapse.runtime.dump`): commits,
        announcements waiting for one, tasks held by a message's commit, handlers, queues."""
        queues = {key: len(queue) for key, queue in self._queues.items() if queue}
        lines = [
            f"commits: started {self._commits_started}, done {self._commits_done}, "
            f"in flight {self._commits_in_flight}",
            f"announcements waiting for a commit: {len(self._unannounced)}",
            f"tasks held by a message's commit: {len(self._committing)}",
        ]
        lines += [f"  {key} ({len(held)} in flight)" for key, held in self._committing.items()]
        lines.append(f"handlers running: {len(self._running)}")
        lines += [f"  {key}" for key in self._running]
        lines.append(f"handlers waiting for an answer: {len(self._waiters)}")
        lines += [f"  {key}" for key in self._waiters]
        lines.append(f"delivery queues: {len(queues)} ({sum(queues.values())} messages)")
        now = self.clock()
        for key, count in sorted(queues.items(), key=lambda kv: str(kv[0])):
            head = self._queues[key].head
            age = now - head.item.created_at if head is not None else 0.0
            worker = "worker running" if key in self._workers else "no worker"
            lines.append(f"  {key}: {count} queued, head {age:.1f} s old, {worker}")
        return lines

    def oldest_pending_since(self) -> float | None:
        """When the oldest message still waiting for delivery was queued (clock time)."""
        heads = [queue.head.item.created_at for queue in self._queues.values() if queue.head]
        return min(heads) if heads else None

    def _outbox(self, out: Outgoing) -> _Queued | Outgoing:
        """The outbox entry of a message about a task (a heartbeat has none)."""
        if out.key is None:
            return out
        item = OutboxItem(
            seq=self.store.next_seq(),
            message_id=out.message.id,
            partner=out.partner,
            key=out.key,
            body=encode_message(out.message),
            created_at=self.clock(),
        )
        self.store.add_outbox(item)
        return _Queued(out, item, self._commits_started + 1)

    def _queue(self, queued: _Queued) -> None:
        key = queued.out.key
        assert key is not None
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = TaskQueue()
        queue.push(queued)
        if key not in self._workers and not self._closed:
            self._workers[key] = asyncio.create_task(self._deliver(key))

    def _drop_queued(self, key: TaskKey) -> None:
        """Nothing more is sent about the task (see `synapse.p2p.delivery`): its queued
        messages leave the outbox, and a POST in progress is not retried (its worker stops)."""
        queue = self._queues.get(key)
        if not queue:
            return
        dropped = queue.drop()
        for queued in dropped:
            self.store.remove_outbox(queued.item.message_id)
        worker = self._workers.get(key)
        if worker is not None and worker is not asyncio.current_task():
            worker.cancel()
            # Gone now, not when its cancellation runs: a message queued next (the
            # requester's task_cancel) gets a worker of its own.
            del self._workers[key]
        log.info(
            "callbacks_dropped", task_id=key.task_id, requester=key.requester, count=len(dropped)
        )

    async def _deliver(self, key: TaskKey, failures: int = 0) -> None:
        """Deliver `key`'s messages one at a time, in order; each waits for its reply.

        A message leaves the outbox only once answered (a refusal is an answer too). When
        retries run out it waits for the partner's next successful heartbeat; past
        `dead_letter_after` it becomes a dead letter, listed until a person retries or
        drops it (`synapse outbox`). `failures`: workers of the task stopped by an error in a
        row, before this one (see `_start_again_later`).
        """
        queue = self._queues[key]
        claims_failed = 0
        failed = False
        try:
            while queue and not self._closed:
                queued = queue.head
                assert queued is not None
                out = queued.out
                sender = self._require_sender(out.partner)
                # What the partner is about to see must survive our crash. Once the commit
                # holding its outbox entry is done it does, whatever other commits are in
                # flight (waiting for them would add a transaction to every POST).
                if queued.durable_with > self._commits_done:
                    await self._commit_patiently()
                if self._queues.get(key) is not queue:
                    return  # let go meanwhile: another replica owns the task now
                if queue.head is not queued:
                    continue  # dropped meanwhile: nothing more about it is sent
                if self.delivery_gate is not None:
                    verdict = await self._claim(queued.item, claims_failed)
                    if verdict is None:
                        claims_failed += 1
                        continue  # asked again, the task's other checks made again first
                    claims_failed = 0
                    if verdict == "lost":
                        self.release(key)
                        return
                    if verdict == "gone":  # another replica delivered it
                        queue.answered(queued)
                        continue
                    if queue.head is not queued:
                        continue
                debug = p2p_logger.isEnabledFor(logging.DEBUG)
                try:
                    self._observe("out", out.message, out.partner)
                    if debug:
                        rec = self.engine.get(key)
                        log.debug(
                            "message_out",
                            message_id=out.message.id,
                            type=out.message.message_type.value,
                            to=out.partner,
                            task_id=key.task_id,
                            state=rec.state.value if rec is not None else None,
                        )
                    queue.start_sending()
                    reply = await sender.send_callback(out.partner, out.message)
                except DeliveryError as exc:
                    queue.retry()
                    self.listeners.on_delivery_failed(out.message, out.partner, exc)
                    if not exc.retryable:
                        self._dead_letter(queue, f"unusable reply: {exc}")
                        continue
                    await self.settled(key)
                    self.apply(self.engine.on_undeliverable(out.message, self.clock(), str(exc)))
                    if self._queues.get(key) is not queue or queue.head is not queued:
                        continue  # let go: a request that never arrived failed its task
                    if self.clock() - queued.item.created_at >= self.config.dead_letter_after:
                        self._dead_letter(queue, f"undeliverable: {exc}")
                        continue
                    log.warning("delivery_parked", message_id=out.message.id, partner=out.partner)
                    self.engine.keep_heartbeat(out.partner, self.clock())
                    self._rearm_timer()
                    # Until the partner's next successful heartbeat, or until the message is
                    # due to become a dead letter (one more round of attempts decides).
                    due = queued.item.created_at + self.config.dead_letter_after - self.clock()
                    await self._await_heartbeat(out.partner, timeout=due)
                    continue
                queue.answered(queued)
                failures = 0
                self.store.remove_outbox(out.message.id)
                self._partner_heard(out.partner)  # its other tasks' parked messages go on
                self._observe("reply_in", reply, out.partner, out.message)
                if key in self._committing:  # judged on what holds (see `settled`)
                    await self.settled(key)
                if debug:
                    rec = self.engine.get(key)
                    before = rec.state.value if rec is not None else None
                self.apply(self.engine.on_reply(out.message, reply, self.clock()))
                if debug:
                    log.debug(
                        "reply_in",
                        message_id=reply.id,
                        reply_to=out.message.id,
                        type=reply.message_type.value,
                        task_id=key.task_id,
                        from_state=before,
                        to_state=rec.state.value if rec is not None else None,
                    )
                if not queue or self._claimed_in_order:
                    # Delivered is delivered: the outbox entry's removal is not left to
                    # whichever commit comes next (a restart would send it again meanwhile).
                    with contextlib.suppress(StoreUnavailable):
                        await self._commit()
        except Exception:  # unforeseen (see `_start_again_later`)
            if not self._closed:  # closing: a commit or a claim given up, nothing to redo
                log.exception(
                    "delivery_worker_failed", task_id=key.task_id, requester=key.requester
                )
                failed = True
        finally:
            if self._workers.get(key) is asyncio.current_task():
                self._workers.pop(key, None)
            if not queue and self._queues.get(key) is queue:
                self._queues.pop(key, None)
                if key in self._finals:
                    self._evict(key)
            elif failed:
                self._start_again_later(key, queue, failures + 1)

    @property
    def _claimed_in_order(self) -> bool:
        """Between replicas (a delivery gate), a task's next message is not claimable until
        the row of the one before is gone from the database, so each removal is committed
        at once: an idle replica may make no other commit for as long as it stays idle."""
        return self.delivery_gate is not None

    async def _claim(self, item: OutboxItem, failed_before: int) -> str | None:
        """The delivery gate's verdict on `item` (between replicas: its outbox row claimed in
        the database), or None when the gate could not be asked (the database away): the
        caller asks again, after a pause that grows with `failed_before`. Not a verdict: the
        worker is all that will send the task's messages while this replica holds it."""
        assert self.delivery_gate is not None
        try:
            return await self.delivery_gate(item)
        except Exception as exc:
            if self._closed:
                raise
            if not failed_before:
                log.warning("delivery_claim_failed", message_id=item.message_id, error=repr(exc))
            await asyncio.sleep(retry_pause(failed_before + 1))
            return None

    def _start_again_later(self, key: TaskKey, queue: TaskQueue[_Queued], failures: int) -> None:
        """A worker stopped by an error: another starts after a pause, rather than leave the
        task's messages queued with nobody to send them (no later message of the task may
        come to start one). Only after an error: a cancelled worker was stopped on purpose
        (its task dropped or let go, or the peer closing). The pause doubles with each
        worker of the task stopped in a row (an error that comes back every time is logged
        every five minutes at most), and starts again once a message goes out."""
        if self._queues.get(key) is queue and key not in self._workers:
            self._workers[key] = asyncio.create_task(
                self._deliver_later(key, queue, restart_pause(failures), failures)
            )

    async def _deliver_later(
        self, key: TaskKey, queue: TaskQueue[_Queued], pause: float, failures: int
    ) -> None:
        await asyncio.sleep(pause)
        if self._queues.get(key) is queue and not self._closed:
            await self._deliver(key, failures)
        elif self._workers.get(key) is asyncio.current_task():
            del self._workers[key]

    async def _commit_patiently(self) -> None:
        """Commit, waiting out a store that cannot write (it logs the failure episode once);
        the delivery worker resumes where it stopped once the store writes again."""
        failures = 0
        while True:
            try:
                await self._commit()
                return
            except Exception as exc:  # any store's failure, not only SQLite's
                if self._closed:
                    raise
                failures += 1
                if failures == 1 and not isinstance(exc, StoreUnavailable):
                    log.error("commit_failed", error=repr(exc))  # SqliteStore logs its own
                await asyncio.sleep(retry_pause(failures))

    def _dead_letter(self, queue: TaskQueue[_Queued], reason: str) -> None:
        queued = queue.head
        assert queued is not None
        queue.answered(queued)  # it leaves the queue (listed as a dead letter)
        message = queued.out.message
        log.error(
            "dead_letter",
            message_id=message.id,
            type=message.message_type.value,
            partner=queued.out.partner,
            reason=reason,
        )
        self.store.dead_letter(message.id, reason, self.clock())
        key = queued.out.key
        rec = self.engine.get(key) if key is not None else None
        if key is not None and rec is not None:
            rec.dead_letters.append(message.id)
            self.store.put_task(rec, [])
        partner = queued.out.partner

        def announce() -> None:
            self.listeners.on_dead_letter(message, partner, reason)
            handle = self._handles.get(key) if key is not None else None
            if key is not None and rec is not None and handle is not None:
                handle.push(TaskEvent(key, TaskNote.DEAD_LETTER, rec.state, message, reason))

        self.announce_when_durable(announce)

    async def _send_once(self, out: Outgoing) -> None:
        sender = self._require_sender(out.partner)
        self._observe("out", out.message, out.partner)
        try:
            reply = await sender.send_callback(out.partner, out.message, retry=False)
        except DeliveryError as exc:
            self.listeners.on_delivery_failed(out.message, out.partner, exc)
            return  # a missed heartbeat: the engine notices the silence
        self._observe("reply_in", reply, out.partner, out.message)
        if isinstance(reply, Heartbeat):
            self._partner_heard(out.partner)
        self.apply(self.engine.on_reply(out.message, reply, self.clock()))

    def _partner_heard(self, partner: str) -> None:
        """`partner` proved alive (a heartbeat, any message of its own, a reply): the
        deliveries parked for it, waiting to hear from it, go on."""
        event = self._heartbeat_ok.pop(partner, None)
        if event is not None:
            event.set()

    async def _await_heartbeat(self, partner: str, timeout: float | None = None) -> None:
        event = self._heartbeat_ok.setdefault(partner, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)
