"""`GET /metrics`: scraped and parsed with prometheus_client's parser after known traffic."""

from __future__ import annotations

import aiohttp
from opskit import WAIT, E, R, base_url, eventually, peer_pair, scrape, value
from prometheus_client import CollectorRegistry

from synapse.ops.metrics import PeerMetrics, enable_metrics
from synapse.transport.peer import Peer
from synapse.types import TaskState


async def test_metrics_count_known_traffic_exactly() -> None:
    metrics: dict[str, PeerMetrics] = {}

    def setup(peer: Peer) -> None:
        metrics[peer.agent_id] = enable_metrics(peer)

    async with peer_pair(setup_r=setup, setup_e=setup) as pair:
        ok = [await pair.r.submit(E, "echo", {"text": f"hi {i}"}) for i in range(2)]
        failing = await pair.r.submit(E, "fail")
        invalid = await pair.r.submit(E, "echo", {})  # refused synchronously: task_reject
        for handle in [*ok, failing, invalid]:
            await handle.result(timeout=WAIT)
        assert [h.state for h in ok] == [TaskState.COMPLETED] * 2
        assert failing.state is TaskState.FAILED
        assert invalid.state is TaskState.REJECTED
        # A forged POST: refused before the runtime sees it, with a nack.
        async with aiohttp.ClientSession() as session:
            forged = b'{"not": "an envelope"}'
            async with session.post(
                pair.e.endpoint, data=forged, headers={"Content-Type": "application/json"}
            ) as response:
                assert response.status == 400

        await eventually(lambda: pair.e.protocol.pending_deliveries == 0)
        rs = await scrape(pair.r)
        es = await scrape(pair.e)

    # Requester: four task_requests answered (3 confirms, 1 task_reject); the executor
    # POSTed two task_complete and one task_failed, all accepted.
    assert (
        value(rs, "synapse_messages_sent_total", type="p2p:task_request", outcome="answered") == 4
    )
    assert (
        value(rs, "synapse_messages_received_total", type="p2p:task_complete", outcome="accepted")
        == 2
    )
    assert (
        value(rs, "synapse_messages_received_total", type="p2p:task_failed", outcome="accepted")
        == 1
    )
    assert (
        value(
            rs, "synapse_messages_received_total", type="p2p:task_status_update", outcome="accepted"
        )
        == 3
    )
    # Each executed task: a status update (executing), then its end; all answered with 200.
    assert (
        value(
            rs,
            "synapse_http_request_duration_seconds_count",
            method="POST",
            route="/synapse/callback",
            status="200",
        )
        == 6
    )
    assert value(rs, "synapse_tasks", role="requester", state="completed") == 2
    assert value(rs, "synapse_tasks", role="requester", state="failed") == 1
    assert value(rs, "synapse_tasks", role="requester", state="rejected") == 1
    assert (
        value(
            rs,
            "synapse_task_transitions_total",
            role="requester",
            from_state="idle",
            to_state="pending",
        )
        == 4
    )
    assert (
        value(
            rs,
            "synapse_task_transitions_total",
            role="requester",
            from_state="pending",
            to_state="rejected",
        )
        == 1
    )
    assert value(rs, "synapse_partner_reachable", partner=E) == 1
    assert value(rs, "synapse_outbox_messages") == 0
    assert value(rs, "synapse_outbox_oldest_age_seconds") == 0

    assert (
        value(es, "synapse_messages_received_total", type="p2p:task_request", outcome="accepted")
        == 4
    )
    assert (
        value(es, "synapse_messages_sent_total", type="p2p:task_complete", outcome="answered") == 2
    )
    assert value(es, "synapse_messages_sent_total", type="p2p:task_failed", outcome="answered") == 1
    assert value(es, "synapse_tasks", role="executor", state="completed") == 2
    assert value(es, "synapse_tasks", role="executor", state="failed") == 1
    assert value(es, "synapse_tasks", role="executor", state="rejected") == 1
    assert value(es, "synapse_nacks_sent_total", code="message_format_invalid") == 1
    assert (
        value(es, "synapse_handler_duration_seconds_count", task_type="echo", outcome="completed")
        == 2
    )
    assert (
        value(es, "synapse_handler_duration_seconds_count", task_type="fail", outcome="failed") == 1
    )
    assert (
        value(
            es,
            "synapse_http_request_duration_seconds_count",
            method="POST",
            route="/synapse/callback",
            status="200",
        )
        == 4
    )
    assert (
        value(
            es,
            "synapse_http_request_duration_seconds_count",
            method="POST",
            route="/synapse/callback",
            status="400",
        )
        == 1
    )
    # The executor answers each task_request and each callback's reply after a commit.
    assert value(es, "synapse_store_commit_duration_seconds_count", outcome="ok") >= 4
    assert value(es, "synapse_store_commit_duration_seconds_count", outcome="error") == 0


async def test_each_peer_has_its_own_registry() -> None:
    """Two peers in one process: separate registries, nothing in the global one."""
    from prometheus_client import REGISTRY

    def setup(peer: Peer) -> None:
        enable_metrics(peer)

    async with peer_pair(setup_r=setup, setup_e=setup) as pair:
        handle = await pair.r.submit(E, "echo", {"text": "x"})
        await handle.result(timeout=WAIT)
        rs, es = await scrape(pair.r), await scrape(pair.e)
    assert (
        value(rs, "synapse_messages_sent_total", type="p2p:task_request", outcome="answered") == 1
    )
    assert (
        value(es, "synapse_messages_sent_total", type="p2p:task_request", outcome="answered") == 0
    )
    assert REGISTRY.get_sample_value("synapse_messages_sent_total") is None
    assert isinstance(PeerMetrics().registry, CollectorRegistry)


async def test_retries_nacks_received_and_unreachable_partner() -> None:
    """A partner that is down: retries counted, then the delivery fails and is counted."""
    metrics: list[PeerMetrics] = []

    def setup(peer: Peer) -> None:
        metrics.append(enable_metrics(peer))

    from dataclasses import replace

    from opskit import FAST

    # The request waits in the outbox for the partner (else its task fails once the
    # deliveries run out: `fail_undelivered_requests`).
    config = replace(FAST, fail_undelivered_requests=False)
    async with peer_pair(setup_r=setup, config=config) as pair:
        # Point R at a port nobody listens on.
        pair.r.add_partner("agent-gone", "http://127.0.0.1:9/synapse/callback", ("s",))
        handle = await pair.r.submit("agent-gone", "echo", {"text": "x"})
        sent_failed = {"type": "p2p:task_request", "outcome": "failed"}
        registry = metrics[0].registry
        await eventually(
            lambda: (
                (registry.get_sample_value("synapse_messages_sent_total", sent_failed) or 0) >= 1
            )
        )
        samples = await scrape(pair.r)
        await handle.cancel()
    # FAST: 2 retries per delivery attempt.
    assert value(samples, "synapse_post_retries_total", type="p2p:task_request") == 2
    assert (
        value(samples, "synapse_messages_sent_total", type="p2p:task_request", outcome="failed")
        == 1
    )
    assert value(samples, "synapse_outbox_messages") == 1
    assert value(samples, "synapse_outbox_oldest_age_seconds") > 0


async def test_nack_received_is_counted_by_code() -> None:
    def setup(peer: Peer) -> None:
        enable_metrics(peer)

    async with peer_pair(setup_r=setup) as pair:
        # E does not know this task: its task_info_provided is refused with task_not_found.
        handle = await pair.r.submit(E, "text_generation", {"prompt": "p"})
        await eventually(lambda: handle.state is TaskState.INFO_NEEDED)
        pair.e.protocol.engine.tasks.clear()
        await handle.provide_info({"style": "x"})
        await eventually(lambda: pair.r.protocol.pending_deliveries == 0)
        rs = await scrape(pair.r)
        await handle.cancel()
    assert value(rs, "synapse_nacks_received_total", code="task_not_found") == 1
    assert (
        value(rs, "synapse_messages_sent_total", type="p2p:task_info_provided", outcome="refused")
        == 1
    )


async def test_metrics_token_guards_the_scrape() -> None:
    def setup(peer: Peer) -> None:
        enable_metrics(peer, token="scrape-me")

    async with peer_pair(setup_r=setup) as pair:
        async with (
            aiohttp.ClientSession() as session,
            session.get(base_url(pair.r) + "/metrics") as response,
        ):
            assert response.status == 401
        samples = await scrape(pair.r, token="scrape-me")
    assert value(samples, "synapse_partner_reachable", partner=R) == 0


async def test_dead_letters_and_an_unreachable_partner() -> None:
    """A partner that never answers: heartbeats missed (reachable 0), the request given up on."""
    from dataclasses import replace

    from opskit import FAST

    config = replace(
        FAST,
        heartbeat_interval=0.05,
        missed_heartbeat_limit=1,
        dead_letter_after=0.5,
        fail_undelivered_requests=False,  # the request waits for the partner, then dies
    )
    metrics: list[PeerMetrics] = []

    def setup(peer: Peer) -> None:
        metrics.append(enable_metrics(peer))

    async with peer_pair(setup_r=setup, config=config) as pair:
        pair.r.add_partner("agent-gone", "http://127.0.0.1:9/synapse/callback", ("s",))
        await pair.r.submit("agent-gone", "echo", {"text": "x"})
        registry = metrics[0].registry

        def sample(name: str, **labels: str) -> float | None:
            return registry.get_sample_value(name, labels)

        await eventually(
            lambda: (sample("synapse_dead_letters_total", type="p2p:task_request") or 0) >= 1
        )
        await eventually(lambda: sample("synapse_partner_reachable", partner="agent-gone") == 0)
        samples = await scrape(pair.r)
    assert value(samples, "synapse_dead_letters_total", type="p2p:task_request") == 1
    assert value(samples, "synapse_outbox_dead_letters") == 1
    assert value(samples, "synapse_outbox_messages") == 0
    assert value(samples, "synapse_partner_reachable", partner="agent-gone") == 0


def test_tallied_counters_read_exact_totals_while_another_thread_scrapes() -> None:
    """Counters are bumped in a plain dict and added to prometheus at collection: a reader
    sees every increment made before it collects, and a scrape racing the increments from
    another thread neither loses nor doubles one."""
    import threading

    from synapse.p2p.engine import TaskKey, Transition
    from synapse.p2p.states import Event, Role

    metrics = PeerMetrics()
    move = Transition(
        TaskKey("r", "t"),
        Role.EXECUTOR,
        TaskState.IDLE,
        TaskState.CONFIRMED,
        Event.SEND_TASK_CONFIRM,
        None,
        0.0,
    )
    labels = {"role": "executor", "from_state": "idle", "to_state": "confirmed"}
    name = "synapse_task_transitions_total"
    metrics.on_transition(move)
    assert metrics.registry.get_sample_value(name, labels) == 1.0
    stop = threading.Event()
    seen: list[float] = []

    def scrape_all_the_time() -> None:
        while not stop.is_set():
            seen.append(metrics.registry.get_sample_value(name, labels) or 0.0)

    scraper = threading.Thread(target=scrape_all_the_time)
    scraper.start()
    try:
        for _ in range(20_000):
            metrics.on_transition(move)
    finally:
        stop.set()
        scraper.join()
    assert metrics.registry.get_sample_value(name, labels) == 20_001.0
    assert seen == sorted(seen) and seen[-1] <= 20_001.0  # never ahead, never backwards


def test_observations_match_observe() -> None:
    """Durations are counted per bucket in plain lists and added to the histograms at
    collection: every sample (each bucket, the count, the sum) equals what prometheus's own
    `Histogram.observe` gives for the same values, bucket bounds included, and a scrape
    racing the observations from another thread neither loses nor doubles one."""
    import random
    import threading

    from prometheus_client import Histogram

    from synapse.ops.metrics import HANDLER_BUCKETS, LATENCY_BUCKETS

    metrics = PeerMetrics()
    reference = CollectorRegistry()
    commits = Histogram("c", "", ["outcome"], buckets=LATENCY_BUCKETS, registry=reference)
    handlers = Histogram("h", "", ["t", "o"], buckets=HANDLER_BUCKETS, registry=reference)
    http = Histogram("r", "", ["m", "r", "s"], buckets=LATENCY_BUCKETS, registry=reference)
    rng = random.Random(7)
    # Each bound itself (`le` is inclusive), just above it, zero, and values past the last.
    values = [*LATENCY_BUCKETS[:-1], *(b * 1.000001 for b in LATENCY_BUCKETS[:-1]), 0.0, 1e6]
    values += [rng.expovariate(1 / 0.01) for _ in range(2_000)]
    stop = threading.Event()

    def scrape_all_the_time() -> None:
        while not stop.is_set():
            metrics.registry.get_sample_value(
                "synapse_store_commit_duration_seconds_count", {"outcome": "ok"}
            )

    scraper = threading.Thread(target=scrape_all_the_time)
    scraper.start()
    try:
        for n, seconds in enumerate(values):
            outcome = "ok" if n % 3 else "error"
            metrics.on_commit(seconds, None if outcome == "ok" else RuntimeError())
            commits.labels(outcome).observe(seconds)
            metrics.on_handler_done(None, "echo", 0.0, seconds * 1000, "completed")  # type: ignore[arg-type]
            handlers.labels("echo", "completed").observe(seconds * 1000)
            metrics.on_http_request("POST", "/synapse/callback", 200, seconds)
            http.labels("POST", "/synapse/callback", "200").observe(seconds)
    finally:
        stop.set()
        scraper.join()

    def samples(registry: CollectorRegistry, name: str) -> dict[tuple[str, ...], float]:
        found = {}
        for family in registry.collect():
            if family.name == name:
                for sample in family.samples:
                    key = (sample.name.removeprefix(name), *sorted(sample.labels.values()))
                    if not sample.name.endswith("_created"):
                        found[key] = sample.value
        return found

    for ours, theirs in (
        ("synapse_store_commit_duration_seconds", "c"),
        ("synapse_handler_duration_seconds", "h"),
        ("synapse_http_request_duration_seconds", "r"),
    ):
        got, expected = samples(metrics.registry, ours), samples(reference, theirs)
        assert len(got) == len(expected) > 0
        for key, count in expected.items():
            if key[0] == "_sum":
                assert abs(got[key] - count) <= 1e-9 * max(1.0, count), key
            else:
                assert got[key] == count, key
