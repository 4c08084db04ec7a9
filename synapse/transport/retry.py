"""The one retry policy of every POST Synapse makes (specs/protocol.md, 'Transport').

A POST that fails with a connection error, a timeout, 408, 429, 502, 503 or 504 is tried again with
exponential backoff and jitter from `retry_base_delay` (2, 4, 8, 16, 32 s by default), or after
the partner's `Retry-After`, both capped at `retry_max_delay`, up to `max_retries` times.
Partner callbacks (`synapse.transport.client`) and A2A push notifications
(`synapse.a2a.server.push`) both go through `retrying`: an attempt raises `Transient` when it
is worth trying again.

The first attempt runs with no retry machinery at all (it is by far the most common path, and a
tenacity controller per message costs tens of microseconds); tenacity drives only the retries.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_attempt

from synapse.p2p.config import P2PConfig
from synapse.types.errors import SynapseException

T = TypeVar("T")
Sleep = Callable[[float], Awaitable[Any]]

#: The jitter factor range: a delay is multiplied by a factor in [1−JITTER, 1+JITTER).
JITTER = 0.25


class Transient(SynapseException, Generic[T]):
    """One attempt failed in a way worth retrying; `reply` is what came back, if anything."""

    def __init__(
        self,
        reason: str,
        *,
        status: int | None = None,
        retry_after: float | None = None,
        reply: T | None = None,
    ) -> None:
        super().__init__(reason)
        self.status = status
        self.retry_after = retry_after
        self.reply = reply


class RetriesExhausted(SynapseException):
    """Every attempt failed transiently: `last` is the last failure, `attempts` their number."""

    def __init__(self, last: Transient[Any], attempts: int) -> None:
        super().__init__(f"after {attempts} attempts: {last}")
        self.last = last
        self.attempts = attempts


def backoff_delay(retry: int, config: P2PConfig, jitter: float = 0.5) -> float:
    """The delay before retry number `retry` (1-based): `retry_base_delay`·2^(retry−1),
    times a jitter factor (`jitter` in [0, 1) maps to [1−JITTER, 1+JITTER)), capped."""
    nominal = config.retry_base_delay * 2.0 ** min(retry - 1, 62)
    return min(config.retry_max_delay, nominal * (1 - JITTER + 2 * JITTER * jitter))


def retry_delay(failure: Transient[Any], attempt: int, config: P2PConfig, jitter: float) -> float:
    """The pause after failed attempt number `attempt`: the partner's `Retry-After` (capped),
    else the jittered exponential backoff."""
    if failure.retry_after is not None:
        return min(failure.retry_after, config.retry_max_delay)
    return backoff_delay(attempt, config, jitter)


async def retrying(
    attempt: Callable[[int], Awaitable[T]],
    *,
    retries: int,
    config: P2PConfig,
    sleep: Sleep,
    jitter: Callable[[], float],
    before_retry: Callable[[int, float], None] | None = None,
) -> T:
    """`await attempt(1)`; while it raises `Transient`, wait and try again, up to `retries`
    more times (`attempt(n)` gets the attempt's number). `before_retry(n, delay)` is told of
    each pause after attempt `n`. Raises `RetriesExhausted` once the last attempt failed;
    anything but `Transient` propagates at once."""
    if retries < 0:
        raise ValueError("retries must not be negative")
    try:
        return await attempt(1)
    except Transient as failure:
        first = failure
    return await retrying_after(
        first,
        attempt,
        retries=retries,
        config=config,
        sleep=sleep,
        jitter=jitter,
        before_retry=before_retry,
    )


async def retrying_after(
    failure: Transient[Any],
    attempt: Callable[[int], Awaitable[T]],
    *,
    retries: int,
    config: P2PConfig,
    sleep: Sleep,
    jitter: Callable[[], float],
    before_retry: Callable[[int, float], None] | None = None,
) -> T:
    """`retrying` once its first attempt has failed with `failure`: for a caller that makes
    the first attempt itself (the usual POST succeeds at once, and needs no closures)."""
    if retries == 0:
        raise RetriesExhausted(failure, 1) from failure
    last: Transient[Any] = failure
    attempts = 1

    async def again() -> T:
        nonlocal attempts, last
        attempts += 1
        try:
            return await attempt(attempts)
        except Transient as failure:
            last = failure
            raise

    def wait(state: RetryCallState) -> float:
        # `state` counts tenacity's own attempts; ours include the first one.
        return retry_delay(last, attempts, config, jitter())

    def tell(state: RetryCallState) -> None:
        if before_retry is not None and state.next_action is not None:
            before_retry(attempts, state.next_action.sleep)

    controller = AsyncRetrying(
        stop=stop_after_attempt(retries),
        wait=wait,
        retry=retry_if_exception_type(Transient),
        sleep=sleep,
        before_sleep=tell,
        reraise=True,
    )
    first_delay = retry_delay(last, 1, config, jitter())
    if before_retry is not None:
        before_retry(1, first_delay)
    await sleep(first_delay)
    try:
        result: T = await controller(again)
    except Transient:
        raise RetriesExhausted(last, attempts) from last
    return result


__all__ = [
    "JITTER",
    "RetriesExhausted",
    "Transient",
    "backoff_delay",
    "retry_delay",
    "retrying",
]
