"""`GET /healthz` (the process answers) and `GET /readyz` (send it traffic), for load balancers
and orchestrators.

Ready means: the peer is started (its runtime runs), it is not draining, and its store can
write (the last commit did not fail, and a store that can probe a write — SQLite — starts one).
Not ready answers 503 with the failing checks, so an orchestrator's log says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

from synapse.logs import get_logger
from synapse.runtime.listener import RuntimeListener

if TYPE_CHECKING:
    from synapse.runtime.protocol import P2PProtocol
    from synapse.transport.peer import Peer

log = get_logger("synapse.ops")

HEALTHZ_PATH = "/healthz"
READYZ_PATH = "/readyz"
#: How long one store probe may take before the store counts as unable to write.
PROBE_TIMEOUT = 2.0
#: A probe result is reused this long (readiness checks come every few seconds, per prober).
PROBE_CACHE = 1.0


def is_draining(protocol: P2PProtocol) -> bool:
    """The runtime's drain flag (one seam, so a richer drain lifecycle plugs in here)."""
    return protocol.view.draining


@dataclass(frozen=True, slots=True)
class Readiness:
    ready: bool
    checks: dict[str, Any]


class Health(RuntimeListener):
    """Liveness and readiness of one `Peer` (see `enable_health`)."""

    def __init__(self, peer: Peer, *, probe_cache: float = PROBE_CACHE) -> None:
        self.peer = peer
        self.probe_cache = probe_cache
        #: The error of the last failed commit, until a commit succeeds again.
        self.commit_error: str | None = None
        self._probe: asyncio.Task[str | None] | None = None
        self._probed: tuple[float, str | None] | None = None

    # --- RuntimeListener --------------------------------------------------------------------

    def on_commit(self, seconds: float, error: BaseException | None) -> None:
        self.commit_error = None if error is None else f"{type(error).__name__}: {error}"

    # --- checks -----------------------------------------------------------------------------

    def _protocol(self) -> P2PProtocol | None:
        return getattr(self.peer, "_protocol", None)

    async def readiness(self) -> Readiness:
        protocol = self._protocol()
        started = protocol is not None and protocol.running
        draining = protocol is not None and is_draining(protocol)
        store = await self._store_status(protocol) if protocol is not None and started else None
        checks: dict[str, Any] = {
            "started": started,
            "draining": draining,
            "store": store or "ok",
        }
        return Readiness(started and not draining and store is None, checks)

    async def _store_status(self, protocol: P2PProtocol) -> str | None:
        """None if the store can write, else why not."""
        if self.commit_error is not None:
            # Try again rather than wait for traffic a balancer no longer sends us.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(protocol.commit(), PROBE_TIMEOUT)
            if self.commit_error is not None:
                return self.commit_error
        probe = getattr(self.peer.store, "probe_write", None)
        if probe is None:
            return None
        now = time.monotonic()
        if self._probed is not None and now - self._probed[0] < self.probe_cache:
            return self._probed[1]
        if self._probe is None or self._probe.done():
            self._probe = asyncio.create_task(self._run_probe(probe))
        try:
            result = await asyncio.wait_for(asyncio.shield(self._probe), PROBE_TIMEOUT)
        except TimeoutError:
            result = "store write probe timed out"
        self._probed = (time.monotonic(), result)
        return result

    @staticmethod
    async def _run_probe(probe: Any) -> str | None:
        try:
            await probe()
        except Exception as exc:
            log.warning("store_not_writable", error=repr(exc))
            return f"{type(exc).__name__}: {exc}"
        return None

    # --- HTTP -------------------------------------------------------------------------------

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "alive"})

    async def readyz(self, request: web.Request) -> web.Response:
        readiness = await self.readiness()
        body = {"status": "ready" if readiness.ready else "not_ready", "checks": readiness.checks}
        return web.json_response(body, status=200 if readiness.ready else 503)

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get(HEALTHZ_PATH, self.healthz)
        app.router.add_get(READYZ_PATH, self.readyz)


def enable_health(peer: Peer, *, probe_cache: float = PROBE_CACHE) -> Health:
    """Serve `/healthz` and `/readyz` on `peer`'s app; call before `start()` / `attach()`."""
    health = Health(peer, probe_cache=probe_cache)
    peer.protocol_hooks.append(lambda protocol: protocol.listeners.append(health))
    peer.app_hooks.append(health.add_routes)
    return health


__all__ = ["HEALTHZ_PATH", "READYZ_PATH", "Health", "Readiness", "enable_health", "is_draining"]
