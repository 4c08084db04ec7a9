"""Prometheus metrics of one peer at `GET /metrics` (`prometheus-client`).

Each peer gets its own `CollectorRegistry` (never the process-global one), so that several
peers in one process, as in tests or an A2A gateway, do not collide. Counters and histograms
are fed by the runtime's `RuntimeListener` calls, the transport's nack and retry hooks and an
aiohttp middleware; gauges (tasks by state, outbox, partners) are read from the runtime at
scrape time. docs/operations.md lists every metric.
"""

from __future__ import annotations

import hmac
import threading
import time
from bisect import bisect_left
from collections import Counter as Tally
from collections.abc import Awaitable, Callable, Iterator
from enum import Enum
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from synapse.runtime.listener import RuntimeListener
from synapse.transport.http1_server import LEAN_CALLBACKS
from synapse.types import Message, Nack, NackError

if TYPE_CHECKING:
    from synapse.p2p.engine import TaskKey, Transition
    from synapse.runtime.protocol import MessageEvent, P2PProtocol
    from synapse.runtime.sender import DeliveryError
    from synapse.transport.peer import Peer

METRICS_PATH = "/metrics"

#: Handler runs last from milliseconds to hours (a person may be asked on the way).
HANDLER_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, float("inf"))
#: HTTP requests and store commits: sub-millisecond to seconds.
LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    float("inf"),
)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _type(message: Message) -> str:
    return message.message_type.value


class _Children:
    """A metric's children by label values, looked up once: `labels()` takes a lock and
    checks its arguments on every call, a cost paid per message otherwise. Keys may hold
    enums (their `.value` is the label)."""

    __slots__ = ("_cache", "_metric")

    def __init__(self, metric: Any) -> None:
        self._metric = metric
        self._cache: dict[tuple[Any, ...], Any] = {}

    def __call__(self, *key: Any) -> Any:
        child = self._cache.get(key)
        if child is None:
            values = [k.value if isinstance(k, Enum) else str(k) for k in key]
            child = self._cache[key] = self._metric.labels(*values)
        return child


class _Tally:
    """A counter's increments, by label values, in a plain dict: what the runtime bumps a
    dozen times a task. Added to the prometheus counter whenever the registry is collected
    (`_FlushTallies`, registered ahead of the counters), so every scrape and every
    `get_sample_value` reads exact totals; `Counter.inc` would take a lock and check its
    argument on every event instead."""

    __slots__ = ("_children", "_counts", "_flushed", "_lock")

    def __init__(self, metric: Any) -> None:
        self._children = _Children(metric)
        #: Every increment ever counted, by key: only ever grows, so a flush in another
        #: thread can never lose one (it adds the difference to what it added before).
        self._counts: dict[tuple[Any, ...], int] = {}
        self._flushed: dict[tuple[Any, ...], int] = {}
        self._lock = threading.Lock()

    def __call__(self, *key: Any) -> None:
        self._counts[key] = self._counts.get(key, 0) + 1

    def flush(self) -> None:
        with self._lock:
            for key, count in list(self._counts.items()):  # one step in C: no size change
                done = self._flushed.get(key, 0)
                if count != done:
                    self._children(*key).inc(count - done)
                    self._flushed[key] = count


class _Observations:
    """A histogram's observations, by label values, counted per bucket in plain lists: what
    the runtime observes five times a task (commits, the handler, the HTTP request). Added to
    the prometheus histogram whenever the registry is collected, as `_Tally` adds to a
    counter; `Histogram.observe` would check the metric, take two locks and walk the bucket
    bounds in Python on every observation instead."""

    __slots__ = ("_bounds", "_children", "_counts", "_flushed", "_lock", "_sums")

    def __init__(self, metric: _Histogram, buckets: tuple[float, ...]) -> None:
        self._children = _Children(metric)
        self._bounds = buckets if buckets[-1] == float("inf") else (*buckets, float("inf"))
        #: Observations per bucket and their sum, by key: both only ever grow (durations are
        #: not negative), so a flush adds the difference to what it added before.
        self._counts: dict[tuple[Any, ...], list[int]] = {}
        self._sums: dict[tuple[Any, ...], float] = {}
        self._flushed: dict[tuple[Any, ...], tuple[list[int], float]] = {}
        self._lock = threading.Lock()

    def __call__(self, value: float, *key: Any) -> None:
        counts = self._counts.get(key)
        if counts is None:
            counts = self._counts[key] = [0] * len(self._bounds)
            self._sums[key] = 0.0
        counts[bisect_left(self._bounds, value)] += 1  # the first bound >= value
        self._sums[key] += value

    def flush(self) -> None:
        with self._lock:
            for key, counts in list(self._counts.items()):  # one step in C: no size change
                total = self._sums.get(key, 0.0)  # the loop may be adding the key
                done, done_sum = self._flushed.get(key) or ([0] * len(counts), 0.0)
                # The sum too: an observation counted while this read its sum adds its value
                # to the next flush, even if no other observation comes before it.
                if counts == done and total == done_sum:
                    continue
                now = list(counts)  # a copy: the loop may add to `counts` meanwhile
                added = [n - before for n, before in zip(now, done, strict=True)]
                self._children(*key).add_counted(added, total - done_sum)
                self._flushed[key] = (now, total)


class _Histogram(Histogram):
    """prometheus_client's `Histogram`, whose children also take observations counted per
    bucket elsewhere (`_Observations`). Its buckets count observations per bucket, not
    cumulatively, and its sum is one value (`test_observations_match_observe` holds this to
    what `observe` gives, should the library change)."""

    def add_counted(self, counts: list[int], total: float) -> None:
        for bucket, n in zip(self._buckets, counts, strict=True):
            if n:
                bucket.inc(n)
        self._sum.inc(total)


class _FlushTallies(Collector):
    """Brings the counters and histograms up to date with their tallies before they are
    collected."""

    def __init__(self, tallies: list[_Tally | _Observations]) -> None:
        self._tallies = tallies

    def describe(self) -> list[Metric]:
        return []  # no metric of its own (and the registry need not collect it to know)

    def collect(self) -> Iterator[Metric]:
        for tally in self._tallies:
            tally.flush()
        return iter(())


class _RuntimeGauges(Collector):
    """Gauges read from the runtime when Prometheus scrapes."""

    def __init__(self, metrics: PeerMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        protocol = self._metrics.protocol
        tasks = GaugeMetricFamily(
            "synapse_tasks", "Tasks this peer knows, by role and state.", labels=["role", "state"]
        )
        depth = GaugeMetricFamily(
            "synapse_outbox_messages", "Messages queued for delivery, not yet answered."
        )
        age = GaugeMetricFamily(
            "synapse_outbox_oldest_age_seconds",
            "Age of the oldest message queued for delivery (0 when none is queued).",
        )
        dead = GaugeMetricFamily(
            "synapse_outbox_dead_letters",
            "Messages given up on and still listed (see `synapse outbox`), per task record.",
        )
        reachable = GaugeMetricFamily(
            "synapse_partner_reachable",
            "1 if the partner answers, 0 once it missed its heartbeats.",
            labels=["partner"],
        )
        if protocol is not None:
            # In flight from memory; finished ones from the store, which keeps them once they
            # leave memory (docs/durability.md, "Running for months").
            counts = Tally(
                (rec.role.value, rec.state.value)
                for rec in protocol.view.records()
                if not rec.is_final
            )
            for (role, final), n in protocol.store.count_finished().items():
                counts[(role, final.value)] += n
            for (role, state), count in sorted(counts.items()):
                tasks.add_metric([role, state], count)
            depth.add_metric([], protocol.pending_deliveries)
            oldest = protocol.oldest_pending_since()
            age.add_metric([], max(0.0, protocol.clock() - oldest) if oldest is not None else 0.0)
            dead.add_metric([], sum(len(rec.dead_letters) for rec in protocol.view.records()))
            for partner, ok in sorted(protocol.partner_status().items()):
                reachable.add_metric([partner], 1 if ok else 0)
        yield from (tasks, depth, age, dead, reachable)


class PeerMetrics(RuntimeListener):
    """The metrics of one peer, in `registry` (a new one by default). See `enable_metrics`."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.protocol: P2PProtocol | None = None
        r = self.registry
        # First in the registry: collected, hence flushed, before the counters it feeds.
        tallies: list[_Tally | _Observations] = []
        r.register(_FlushTallies(tallies))
        self.transitions = Counter(
            "synapse_task_transitions",
            "Task state changes.",
            ["role", "from_state", "to_state"],
            registry=r,
        )
        self.received = Counter(
            "synapse_messages_received",
            "Authenticated messages received, by type and outcome (accepted, refused).",
            ["type", "outcome"],
            registry=r,
        )
        self.sent = Counter(
            "synapse_messages_sent",
            "Messages we POSTed, by type and outcome (answered, refused, failed).",
            ["type", "outcome"],
            registry=r,
        )
        self.nacks_sent = Counter(
            "synapse_nacks_sent", "Nacks we answered with, by error code.", ["code"], registry=r
        )
        self.nacks_received = Counter(
            "synapse_nacks_received",
            "Nacks our partners answered our POSTs with, by error code.",
            ["code"],
            registry=r,
        )
        self.retries = Counter(
            "synapse_post_retries",
            "HTTP retries of our POSTs after a transient failure, by message type.",
            ["type"],
            registry=r,
        )
        self.dead_letters = Counter(
            "synapse_dead_letters", "Messages given up on.", ["type"], registry=r
        )
        self.handler_seconds = _Histogram(
            "synapse_handler_duration_seconds",
            "Run time of TaskHandler.execute_task, by task type and outcome.",
            ["task_type", "outcome"],
            buckets=HANDLER_BUCKETS,
            registry=r,
        )
        self.http_seconds = _Histogram(
            "synapse_http_request_duration_seconds",
            "Time to answer an HTTP request, by method, route and status.",
            ["method", "route", "status"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.commit_seconds = _Histogram(
            "synapse_store_commit_duration_seconds",
            "Time to make buffered store writes durable, by outcome (ok, error).",
            ["outcome"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        r.register(_RuntimeGauges(self))

        def tally(counter: Counter) -> _Tally:
            counted = _Tally(counter)
            tallies.append(counted)
            return counted

        self._transitions = tally(self.transitions)
        self._received = tally(self.received)
        self._sent = tally(self.sent)
        self._nacks_received = tally(self.nacks_received)
        self._nacks_sent = tally(self.nacks_sent)
        self._retries = tally(self.retries)
        self._commits = _Observations(self.commit_seconds, LATENCY_BUCKETS)
        self._handlers = _Observations(self.handler_seconds, HANDLER_BUCKETS)
        self._http = _Observations(self.http_seconds, LATENCY_BUCKETS)
        tallies += (self._commits, self._handlers, self._http)

    # --- RuntimeListener --------------------------------------------------------------------

    def on_transition(self, transition: Transition) -> None:
        self._transitions(transition.role, transition.from_state, transition.to_state)

    def on_refused(self, message: Message, error: NackError) -> None:
        self._received(message.message_type, "refused")

    def on_handler_done(
        self, key: TaskKey, task_type: str, started: float, seconds: float, outcome: str
    ) -> None:
        self._handlers(seconds, task_type, outcome)

    def on_delivery_failed(self, message: Message, partner: str, error: DeliveryError) -> None:
        self._sent(message.message_type, "failed")

    def on_dead_letter(self, message: Message, partner: str, reason: str) -> None:
        self.dead_letters.labels(_type(message)).inc()

    def on_commit(self, seconds: float, error: BaseException | None) -> None:
        self._commits(seconds, "ok" if error is None else "error")

    def on_message(self, event: MessageEvent) -> None:
        # A reply's event names the message it answers: each exchange is counted once, by
        # the type of its request, when its reply crosses.
        direction = event.direction
        if direction == "reply_out":
            # The answer to an accepted message (a refusal raises and goes to `on_refused`).
            if event.answering is not None:
                self._received(event.answering.message_type, "accepted")
        elif direction == "reply_in":
            sent_type = event.answering.message_type if event.answering is not None else "unknown"
            message = event.message
            if isinstance(message, Nack):
                self._nacks_received(message.payload.code)
                self._sent(sent_type, "refused")
            else:
                self._sent(sent_type, "answered")

    # --- transport hooks --------------------------------------------------------------------

    def on_nack_sent(self, error: NackError) -> None:
        self._nacks_sent(error.code)

    def on_retry(self, message: Any, attempt: int) -> None:
        self._retries(message.type)

    def middleware(self) -> Any:
        observe = self._http

        @web.middleware
        async def timed(request: web.Request, handler: Handler) -> web.StreamResponse:
            started = time.perf_counter()
            status = 500
            try:
                response = await handler(request)
                status = response.status
                return response
            except web.HTTPException as exc:
                status = exc.status
                raise
            finally:
                resource = request.match_info.route.resource
                route = resource.canonical if resource is not None else "unmatched"
                observe(time.perf_counter() - started, request.method, route, status)

        # Callbacks the lean server answers without aiohttp reach `on_http_request` instead.
        setattr(timed, LEAN_CALLBACKS, True)
        return timed

    def on_http_request(self, method: str, route: str, status: int, seconds: float) -> None:
        self._http(seconds, method, route, status)

    # --- exposition -------------------------------------------------------------------------

    def render(self, accept: str | None = None) -> tuple[bytes, str]:
        """The exposition in the format `accept` asks for (text or OpenMetrics)."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type


def enable_metrics(
    peer: Peer, *, registry: CollectorRegistry | None = None, token: str | None = None
) -> PeerMetrics:
    """Serve `GET /metrics` on `peer`'s app (call before `start()` / `attach()`).

    `token`: if set, scrapes must send `Authorization: Bearer <token>`.
    """
    metrics = PeerMetrics(registry)

    def on_protocol(protocol: P2PProtocol) -> None:
        metrics.protocol = protocol
        protocol.listeners.append(metrics)

    async def scrape(request: web.Request) -> web.Response:
        if token is not None:
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
                return web.Response(status=401, headers={"WWW-Authenticate": "Bearer"})
        body, content_type = metrics.render(request.headers.get("Accept"))
        return web.Response(body=body, headers={"Content-Type": content_type})

    def on_app(app: web.Application) -> None:
        app.middlewares.append(metrics.middleware())
        app.router.add_get(METRICS_PATH, scrape)

    peer.protocol_hooks.append(on_protocol)
    peer.app_hooks.append(on_app)
    return metrics


__all__ = ["METRICS_PATH", "PeerMetrics", "enable_metrics"]
