"""`ConformanceKit`: start the listener, run the checks against the target, make the report.

    async with ConformanceKit(KitConfig(target_url, agent_id, secret)) as kit:
        report = await kit.run()

The target must know the kit beforehand: a partner with the kit's agent id (`kit_id`), the
kit's callback URL (`kit.callback_url`, `http://LISTEN/synapse/callback`) and the shared secret.
"""

from __future__ import annotations

import asyncio
import fnmatch
import inspect
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace

from synapse.conformance.checks import CHECKS, Check, CheckContext, Timing
from synapse.conformance.listener import CALLBACK_PATH, CallbackListener
from synapse.conformance.report import CheckResult, Report, Status
from synapse.conformance.wire import (
    CheckFailed,
    Clock,
    Identity,
    RawClient,
    Skip,
    TargetUnreachable,
)
from synapse.logs import get_logger

log = get_logger("synapse.conformance")

#: The kit's agent id unless told otherwise (`--as`).
DEFAULT_KIT_ID = "synapse-conformance"
#: Where the kit listens for callbacks unless told otherwise (`--listen`).
DEFAULT_LISTEN = "127.0.0.1:8766"


def parse_listen(text: str) -> tuple[str, int]:
    """`HOST:PORT` (IPv6 in brackets) → (host, port)."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    if not 0 <= int(port) <= 65535:
        raise ValueError(f"bad port in {text!r}")
    return host.strip("[]"), int(port)


@dataclass(frozen=True)
class KitConfig:
    """Who the kit checks and how."""

    #: The URL the target receives POSTs on (its `/synapse/callback`).
    target_url: str
    #: The target's agent id.
    target_id: str
    #: The secret the target shares with the kit.
    secret: str
    #: The kit's own agent id, registered as a partner at the target.
    kit_id: str = DEFAULT_KIT_ID
    #: Where the kit listens for callbacks (port 0: any free port; see `on_listening`).
    listen_host: str = "127.0.0.1"
    listen_port: int = 8766
    #: The callback URL the target registered for the kit, when it is not
    #: `http://LISTEN/synapse/callback` (behind a proxy, say).
    endpoint: str | None = None
    timing: Timing = field(default_factory=Timing)
    #: Only the checks whose id matches one of these `fnmatch` patterns (all when empty).
    only: tuple[str, ...] = ()
    #: Checks running at once (0: all of them). Each holds at most two tasks of the target's
    #: at a time; lower it for a target with a small `max_concurrent_tasks`.
    concurrency: int = 0

    def selected(self, checks: Sequence[Check]) -> list[Check]:
        if not self.only:
            return list(checks)
        return [
            c
            for c in checks
            if c.phase == "setup" or any(fnmatch.fnmatchcase(c.id, p) for p in self.only)
        ]


class ConformanceKit:
    """The kit against one target; use as an async context manager, then `run()`."""

    def __init__(self, config: KitConfig) -> None:
        self.config = config
        self.clock = Clock()
        self._identity = Identity(
            kit_id=config.kit_id,
            kit_endpoint=config.endpoint or "",
            target_id=config.target_id,
            target_url=config.target_url,
            secret=config.secret,
        )
        timing = config.timing
        self.listener = CallbackListener(self._identity, self.clock, ack_delay=timing.ack_delay)
        self.client = RawClient(self._identity, self.clock, timeout=timing.http_timeout)
        self._started = False
        #: The target never answered (its setup check could not reach it).
        self.unreachable = False

    @property
    def callback_url(self) -> str:
        """Where the kit receives callbacks: the URL the target must have registered."""
        if not self._started:
            raise RuntimeError("start the kit first")
        return self._identity.kit_endpoint

    async def start(self) -> str:
        """Start listening; return the callback URL."""
        if not self._started:
            config = self.config
            port = await self.listener.start(config.listen_host, config.listen_port)
            host = config.listen_host
            if ":" in host:
                host = f"[{host}]"
            endpoint = config.endpoint or f"http://{host}:{port}{CALLBACK_PATH}"
            self._identity = replace(self._identity, kit_endpoint=endpoint)
            self.listener.identity = self._identity
            self.client.identity = self._identity
            await self.client.start()
            self._started = True
            log.info("conformance_listening", url=endpoint, target=config.target_url)
        return self._identity.kit_endpoint

    async def close(self) -> None:
        await self.client.close()
        await self.listener.close()
        self._started = False

    async def __aenter__(self) -> ConformanceKit:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def run(self) -> Report:
        """Run the selected checks: setup, then the others concurrently, then the final ones
        once callbacks had `timing.settle` seconds to arrive."""
        await self.start()
        started = time.monotonic()
        timing = self.config.timing
        ctx = CheckContext(self.client, self.listener, timing)
        checks = self.config.selected(CHECKS)
        results: dict[str, CheckResult] = {}
        for check in (c for c in checks if c.phase == "setup"):
            results[check.id] = await self._run_one(check, ctx)
        setup_failed = [r.id for r in results.values() if r.status is Status.FAIL]
        rest = [c for c in checks if c.phase != "setup"]
        if setup_failed:
            for check in rest:
                results[check.id] = CheckResult(
                    check.id,
                    check.title,
                    check.section,
                    Status.SKIP,
                    f"not run: {', '.join(setup_failed)} failed",
                )
        else:
            main = [c for c in rest if c.phase == "main"]
            limit = asyncio.Semaphore(self.config.concurrency or len(main) or 1)

            async def bounded(check: Check) -> CheckResult:
                async with limit:
                    return await self._run_one(check, ctx)

            done = await asyncio.gather(*(bounded(c) for c in main))
            results.update((r.id, r) for r in done)
            await asyncio.sleep(timing.settle)
            for check in (c for c in rest if c.phase == "final"):
                results[check.id] = await self._run_one(check, ctx)
        config = self.config
        return Report(
            target=config.target_url,
            agent_id=config.target_id,
            kit_agent_id=config.kit_id,
            callback_url=self._identity.kit_endpoint,
            results=[results[c.id] for c in checks],
            duration=time.monotonic() - started,
            unreachable=self.unreachable,
        )

    async def _run_one(self, check: Check, ctx: CheckContext) -> CheckResult:
        started = time.monotonic()
        timeout = self.config.timing.check_timeout
        status, reason = Status.PASS, None
        try:
            await asyncio.wait_for(check.run(ctx), timeout)
        except TargetUnreachable as exc:
            status, reason = Status.FAIL, str(exc)
            self.unreachable = True
        except CheckFailed as exc:
            status, reason = Status.FAIL, str(exc)
        except Skip as exc:
            status, reason = Status.SKIP, str(exc)
        except TimeoutError:
            status, reason = Status.FAIL, f"did not finish within {timeout:g} s"
        except Exception as exc:  # a target may provoke anything; report it, do not crash
            log.exception("conformance_check_crashed", check=check.id)
            status, reason = Status.FAIL, f"the check crashed: {exc!r}"
        duration = time.monotonic() - started
        log.info("conformance_check", check=check.id, status=status.value, reason=reason)
        return CheckResult(check.id, check.title, check.section, status, reason, duration)


OnListening = Callable[[str], Awaitable[None] | None]


async def run_conformance(
    target_url: str,
    agent_id: str,
    secret: str,
    *,
    kit_id: str = DEFAULT_KIT_ID,
    listen: str = DEFAULT_LISTEN,
    endpoint: str | None = None,
    timing: Timing | None = None,
    only: Sequence[str] = (),
    concurrency: int = 0,
    on_listening: OnListening | None = None,
) -> Report:
    """Run the conformance checks against the peer at `target_url` (agent id `agent_id`).

    The target must have `kit_id` registered as a partner with the kit's callback URL and
    `secret`. With `listen` on port 0 the URL is only known once listening: `on_listening(url)`
    is called (and awaited if it returns an awaitable) before any check runs, so that an
    in-process target can register the kit then. `concurrency` bounds the checks running at
    once (0: all), `only` selects checks by id (`fnmatch` patterns).
    """
    host, port = parse_listen(listen)
    config = KitConfig(
        target_url=target_url,
        target_id=agent_id,
        secret=secret,
        kit_id=kit_id,
        listen_host=host,
        listen_port=port,
        endpoint=endpoint,
        timing=timing or Timing(),
        only=tuple(only),
        concurrency=concurrency,
    )
    async with ConformanceKit(config) as kit:
        if on_listening is not None:
            outcome = on_listening(kit.callback_url)
            if inspect.isawaitable(outcome):
                await outcome
        return await kit.run()


__all__ = [
    "DEFAULT_KIT_ID",
    "DEFAULT_LISTEN",
    "ConformanceKit",
    "KitConfig",
    "parse_listen",
    "run_conformance",
]
