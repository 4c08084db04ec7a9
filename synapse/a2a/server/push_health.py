"""How each push configuration's deliveries go, and a policy for the ones that keep failing.

Every attempt to POST a notification to a configuration's webhook is recorded against that
configuration: its last success, its last failure and why, how many attempts failed in a row,
how many notifications were delivered. With `disable_after=N`, a configuration whose last N
attempts failed is disabled: its later notifications are dropped (logged `push_dropped`,
reason `disabled`) instead of being retried for ever against a dead webhook. Creating the
configuration again (same id) enables it afresh; deleting it forgets its record.

`A2AServer.push_status(task_id)` reads the records of a task's configurations; the metrics
(`synapse_a2a_push_*`, docs/operations.md) count deliveries, failed attempts and disabled
configurations. Records live in memory: a restart starts them afresh (the notifications
themselves are in the outbox, durable).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from synapse.logs import get_logger

log = get_logger("synapse.a2a.server.push")


@dataclass(slots=True)
class PushHealth:
    """One configuration's deliveries."""

    delivered: int = 0
    failed_attempts: int = 0
    consecutive_failures: int = 0
    last_success: float | None = None
    last_failure: float | None = None
    last_failure_reason: str = ""
    #: Why the configuration was disabled ("" while it is enabled).
    disabled: str = ""
    #: Notifications dropped because it was disabled.
    dropped: int = 0

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


class PushHealthBook:
    """The records of every configuration, by (task id, configuration id)."""

    def __init__(
        self,
        *,
        disable_after: int | None = None,
        clock: Callable[[], float] = time.time,
        max_records: int = 10_000,
    ) -> None:
        if disable_after is not None and disable_after < 1:
            raise ValueError("disable_after must be at least 1 (None: never disable)")
        self.disable_after = disable_after
        self.clock = clock
        #: The records kept, oldest first: beyond `max_records` the oldest is forgotten (its
        #: task long finished, as a rule; a record forgotten starts afresh if needed again).
        self.max_records = max_records
        self._records: dict[tuple[str, str], PushHealth] = {}
        #: Totals since start, for the metrics.
        self.delivered = 0
        self.failed_attempts = 0
        self.disabled_total = 0
        self.dropped = 0

    def of(self, task_id: str, config_id: str) -> PushHealth:
        key = (task_id, config_id)
        record = self._records.get(key)
        if record is None:
            if len(self._records) >= self.max_records:
                del self._records[next(iter(self._records))]
            record = self._records[key] = PushHealth()
        return record

    def status(self, task_id: str) -> dict[str, PushHealth]:
        return {c: r for (t, c), r in self._records.items() if t == task_id}

    def is_disabled(self, task_id: str, config_id: str) -> bool:
        record = self._records.get((task_id, config_id))
        return record is not None and bool(record.disabled)

    def drop(self, task_id: str, config_id: str) -> bool:
        """Whether a notification to this configuration is to be dropped (it is disabled);
        counted if so."""
        record = self._records.get((task_id, config_id))
        if record is None or not record.disabled:
            return False
        record.dropped += 1
        self.dropped += 1
        return True

    def succeeded(self, task_id: str, config_id: str) -> None:
        record = self.of(task_id, config_id)
        record.delivered += 1
        record.consecutive_failures = 0
        record.last_success = self.clock()
        self.delivered += 1

    def failed(self, task_id: str, config_id: str, reason: str) -> None:
        record = self.of(task_id, config_id)
        record.failed_attempts += 1
        record.consecutive_failures += 1
        record.last_failure = self.clock()
        record.last_failure_reason = reason
        self.failed_attempts += 1
        limit = self.disable_after
        if limit is not None and not record.disabled and record.consecutive_failures >= limit:
            record.disabled = f"{record.consecutive_failures} attempts failed in a row: {reason}"
            self.disabled_total += 1
            log.warning("push_config_disabled", task_id=task_id, config_id=config_id, reason=reason)

    def reset(self, task_id: str, config_id: str) -> None:
        """The configuration was created (again): a clean record, enabled."""
        self._records.pop((task_id, config_id), None)

    @property
    def disabled_now(self) -> int:
        return sum(1 for record in self._records.values() if record.disabled)


def register_push_metrics(book: PushHealthBook, registry: Any) -> None:
    """Count `book`'s deliveries in a Prometheus `registry` (the `ops` extra's client):
    `synapse_a2a_push_deliveries_total`, `synapse_a2a_push_failed_attempts_total`,
    `synapse_a2a_push_dropped_total`, `synapse_a2a_push_disabled_total` and the gauge
    `synapse_a2a_push_configs_disabled`."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    from prometheus_client.registry import Collector

    class PushMetrics(Collector):
        def collect(self) -> Iterator[Any]:
            for name, text, value in (
                ("deliveries", "Push notifications delivered.", book.delivered),
                ("failed_attempts", "Push delivery attempts that failed.", book.failed_attempts),
                ("dropped", "Push notifications dropped: their configuration was disabled.",
                 book.dropped),
                ("disabled", "Push configurations disabled by the failure policy.",
                 book.disabled_total),
            ):  # fmt: skip
                yield CounterMetricFamily(f"synapse_a2a_push_{name}", text, value=value)
            yield GaugeMetricFamily(
                "synapse_a2a_push_configs_disabled",
                "Push configurations disabled now.",
                value=book.disabled_now,
            )

    registry.register(PushMetrics())


__all__ = ["PushHealth", "PushHealthBook", "register_push_metrics"]
