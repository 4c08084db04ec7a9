"""`P2PConfig`: the settings of specs/protocol.md, 'Peer interfaces and configuration', and more.

Defaults are the specification's where it gives one.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class P2PConfig:
    """Every duration is in seconds."""

    #: Retries of one POST after its first attempt (default 5, as specified).
    max_retries: int = 5
    #: First backoff delay, doubled on each retry: 2, 4, 8, 16, 32 s (default 2 s, as specified).
    retry_base_delay: float = 2.0
    #: Ceiling of one backoff delay, and of a `Retry-After` we honour.
    retry_max_delay: float = 120.0
    #: Executing time a task may use before it fails with `execution_timeout` (specified: 5 min).
    task_timeout: float = 300.0
    #: Between heartbeats to a partner we have tasks in flight with (specified: 30 s).
    heartbeat_interval: float = 30.0
    #: Heartbeat intervals without an answer before a partner is marked unreachable.
    missed_heartbeat_limit: int = 3
    #: Executor tasks in flight at once; beyond it a new `task_request` is answered
    #: `task_reject` with `rate_limited` and `alternatives.retry_after` (specs/protocol.md,
    #: 'Choices of this implementation': requests are not queued).
    max_concurrent_tasks: int = 100
    #: `alternatives.retry_after` advised when at capacity.
    capacity_retry_after: int = 5
    #: Largest accepted distance between a message's `timestamp` and our clock (specs/protocol.md,
    #: 'Signatures').
    replay_window: float = 300.0
    #: How long a (sender, message id) is remembered; at least twice the replay window.
    dedup_window: float = 600.0
    #: Client timeout of one HTTP exchange (specs/protocol.md, 'Transport': 30 s).
    request_timeout: float = 30.0
    #: Largest accepted HTTP body (specs/protocol.md, 'Transport': 1 MiB).
    max_body_size: int = 1024 * 1024
    #: Time an undeliverable callback may stay in the outbox before it is dead-lettered.
    dead_letter_after: float = 3600.0
    #: A `task_request` whose deliveries ran out (`max_retries`) fails its task at once,
    #: `undeliverable` (the handle raises `TaskUndeliverable`); False keeps it waiting for
    #: the partner's next heartbeat, as every other message does.
    fail_undelivered_requests: bool = True
    #: How long finished tasks, their history and their dead letters are kept (7 days).
    retain: float = 7 * 86400.0
    #: Finished tasks a memory store keeps at most (the oldest go first).
    max_finished_in_memory: int = 10_000
    #: Longest wait for a `task_info_provided` or `human_decision` when the message names no
    #: `required_by` / `deadline`; then the task fails with `execution_timeout`.
    input_timeout: float = 3600.0
    #: Executor tasks in flight one partner may hold (None: up to `max_concurrent_tasks`).
    max_tasks_per_partner: int | None = None
    #: Requests per second accepted from one partner (None: no limit); beyond it, 429.
    rate_limit: float | None = None
    #: Requests a partner may send at once above `rate_limit` before it is limited.
    rate_burst: float = 50.0
    #: On SIGTERM/SIGINT: how long running tasks may take to finish before they fail.
    drain_timeout: float = 30.0
    #: After the drain: how long queued callbacks may take to be delivered.
    outbox_grace: float = 5.0
    #: Replicas sharing a PostgreSQL store: how long a task's lease lasts unrenewed, so how
    #: soon another replica takes over the tasks of one that died (renewed every third).
    lease_ttl: float = 10.0

    def __post_init__(self) -> None:
        if self.dedup_window < 2 * self.replay_window:
            raise ValueError(
                "dedup_window must be at least twice replay_window "
                "(specs/protocol.md, 'Deduplication')"
            )
        if self.max_retries < 0 or self.retry_base_delay < 0:
            raise ValueError("max_retries and retry_base_delay must not be negative")
        if self.missed_heartbeat_limit < 1 or self.heartbeat_interval <= 0:
            raise ValueError("heartbeats need a positive interval and limit")
        if self.retain < 0 or self.input_timeout <= 0:
            raise ValueError("retain must not be negative and input_timeout must be positive")
        if self.lease_ttl <= 0:
            raise ValueError("lease_ttl must be positive")
        if self.drain_timeout < 0 or self.outbox_grace < 0:
            raise ValueError("drain_timeout and outbox_grace must not be negative")
        if self.max_tasks_per_partner is not None and self.max_tasks_per_partner < 1:
            raise ValueError("max_tasks_per_partner must be at least 1")
        if self.rate_limit is not None and (self.rate_limit <= 0 or self.rate_burst < 1):
            raise ValueError("rate_limit must be positive and rate_burst at least 1")
        if self.max_finished_in_memory < 0:
            raise ValueError("max_finished_in_memory must not be negative")
