"""The one retry helper (tenacity after the first failure) that partner callbacks and A2A push
notifications share; clock-free: the sleeps are recorded, never slept."""

from __future__ import annotations

import pytest

import synapse.a2a.server.push
import synapse.transport.client
from synapse.p2p.config import P2PConfig
from synapse.transport.retry import (
    RetriesExhausted,
    Transient,
    backoff_delay,
    retrying,
    retrying_after,
)

CONFIG = P2PConfig(retry_base_delay=2.0, retry_max_delay=120.0)


class Script:
    """Attempts that fail as scripted (a Transient, or any exception), then succeed."""

    def __init__(self, *failures: BaseException) -> None:
        self.failures = list(failures)
        self.numbers: list[int] = []
        self.slept: list[float] = []
        self.told: list[tuple[int, float]] = []

    async def attempt(self, number: int) -> str:
        self.numbers.append(number)
        if self.failures:
            raise self.failures.pop(0)
        return f"ok after {number}"

    async def sleep(self, delay: float) -> None:
        self.slept.append(delay)

    async def run(self, retries: int) -> str:
        return await retrying(
            self.attempt,
            retries=retries,
            config=CONFIG,
            sleep=self.sleep,
            jitter=lambda: 0.5,
            before_retry=lambda n, d: self.told.append((n, d)),
        )


async def test_the_first_attempt_needs_no_retry_machinery() -> None:
    script = Script()
    assert await script.run(5) == "ok after 1"
    assert script.slept == [] and script.told == []


async def test_transient_failures_back_off_exponentially_then_succeed() -> None:
    script = Script(Transient("a"), Transient("b"), Transient("c"))
    assert await script.run(5) == "ok after 4"
    assert script.numbers == [1, 2, 3, 4]
    assert script.slept == [2.0, 4.0, 8.0]
    assert script.told == [(1, 2.0), (2, 4.0), (3, 8.0)]


async def test_retry_after_is_honoured_and_capped() -> None:
    script = Script(Transient("503", retry_after=7.0), Transient("429", retry_after=10_000.0))
    assert await script.run(5) == "ok after 3"
    assert script.slept == [7.0, 120.0]


async def test_running_out_raises_with_the_last_failure_and_the_count() -> None:
    script = Script(*(Transient(f"fail {n}", status=503) for n in range(1, 4)))
    with pytest.raises(RetriesExhausted) as raised:
        await script.run(2)
    assert raised.value.attempts == 3 and str(raised.value.last) == "fail 3"
    assert raised.value.last.status == 503
    with pytest.raises(RetriesExhausted) as once:
        await Script(Transient("x")).run(0)
    assert once.value.attempts == 1


async def test_anything_else_is_final_at_once() -> None:
    script = Script(Transient("a"), ValueError("final"))
    with pytest.raises(ValueError, match="final"):
        await script.run(5)
    assert script.numbers == [1, 2]


def test_callbacks_and_push_share_the_helper() -> None:
    # The client makes its first attempt itself, then hands the failure to the same helper.
    assert synapse.transport.client.retrying_after is retrying_after
    assert synapse.a2a.server.push.retrying is retrying
    assert backoff_delay(3, CONFIG) == 8.0
