"""What `send`, `caps` and `ping` share: who we are, whom we talk to, and the peer that does it.

Each of them runs a short-lived requester `Peer` named `--as`, with one partner: the agent
`--agent-id` at `--target`. The executor checks that our messages come from the callback URL it
has registered for us, so that URL (`--endpoint`, default from `--listen HOST:PORT`) must match
its `--peer` for us. The command line uses a small retry budget (2 retries from 0.2 s, instead
of the specification's 5 from 2 s), so that an unreachable target is reported within a second.
"""

from __future__ import annotations

import contextlib
import errno
from dataclasses import dataclass
from typing import Any

import msgspec

from synapse.cli.errors import CliError
from synapse.cli.options import AGENT_ID, AS, ENDPOINT, LISTEN, SIGNING, TARGET
from synapse.cli.security_settings import tls_config
from synapse.cli.settings import NO_SECRET, Missing, PeerEntry, Settings, callback_url
from synapse.p2p.config import P2PConfig
from synapse.runtime.sender import DeliveryError
from synapse.store import StoreInUse, StoreUnavailable
from synapse.transport.client import SenderMode
from synapse.transport.partners import Partner, same_endpoint
from synapse.transport.peer import Peer
from synapse.transport.tls import TLSConfig
from synapse.types import HTTP_STATUS, ErrorCode, NackError

#: The command line's retry budget and timeouts (overridable: `--retries`, `[p2p]`).
CLIENT_P2P: dict[str, Any] = {
    "max_retries": 2,
    "retry_base_delay": 0.2,
    "retry_max_delay": 2.0,
    "request_timeout": 10.0,
}


@dataclass(frozen=True, slots=True)
class ClientSetup:
    """A requester named `me`, reachable at `endpoint`, talking to `target`."""

    me: str
    target: Partner
    endpoint: str
    listen: tuple[str, int] | None
    signing: SenderMode
    config: P2PConfig
    tls: TLSConfig | None = None

    def peer(self, *, serve: bool) -> Peer:
        host, port = self.listen or ("127.0.0.1", 0)
        return Peer(
            self.me,
            partners=[self.target],
            host=host,
            port=port,
            endpoint=self.endpoint,
            config=self.config,
            signing_mode=self.signing,
            serve=serve,
            tls=self.tls,
        )

    @property
    def where(self) -> str:
        return f"{self.target.agent_id} at {self.target.endpoint}"


def client_setup(settings: Settings, *, listen_required: bool) -> ClientSetup:
    """Resolve the shared flags of `send`, `caps` and `ping` (flags > environment > file)."""
    missing = Missing()
    me = settings.wanted(AS, missing, "ID", "our agent id, as the executor knows us")
    url = settings.get(TARGET)
    target_id = settings.get(AGENT_ID)
    entries = settings.peer_entries()
    # Either one can come from a configured partner: its endpoint, or the id at that URL.
    if target_id is None and url is not None:
        target_id = next(
            (e.agent_id for e in entries.values() if e.endpoint and same_endpoint(e.endpoint, url)),
            None,
        )
    if url is None and target_id is not None and target_id in entries:
        url = entries[target_id].endpoint
    if url is None:
        missing.add("--target URL (the executor's callback URL; or SYNAPSE_TARGET)")
    if target_id is None:
        missing.add("--agent-id ID (the agent id of the executor at --target; or SYNAPSE_AGENT_ID)")
    known = entries.get(target_id) if target_id is not None else None
    entry = PeerEntry(
        target_id or "", url, known.secrets if known else None, known.secret_env if known else None
    )
    files, default = settings.own_secret_files(), settings.default_secret()
    if settings.secrets_of(entry, files, default) is None:
        missing.add(f"a secret shared with the executor: {NO_SECRET}")
    listen = settings.get(LISTEN)
    endpoint = settings.get(ENDPOINT)
    if listen is None and (listen_required or endpoint is None):
        missing.add(
            "--listen HOST:PORT (where the executor reaches us: its --peer "
            f"{me or 'OUR_ID'}=URL must name this address; or SYNAPSE_LISTEN)"
        )
    missing.check()
    assert me is not None
    target = settings.partner(entry, files, default)

    tls = tls_config(settings, serving=True)
    if endpoint is None:
        assert listen is not None
        endpoint = callback_url(*listen)
        if tls is not None and tls.serves_tls:
            endpoint = "https://" + endpoint.removeprefix("http://")
    signing = settings.get(SIGNING) or "header"
    return ClientSetup(
        me=me,
        target=target,
        endpoint=endpoint,
        listen=listen,
        signing="body" if signing == "body" else "header",
        config=settings.p2p_config(**CLIENT_P2P),
        tls=tls,
    )


async def start_peer(peer: Peer, listen: tuple[str, int] | None) -> None:
    """Start `peer`; a port in use, a bad address or a store another process serves is a
    usage error, not a traceback."""
    try:
        await peer.start()
    except (StoreInUse, StoreUnavailable) as exc:
        with contextlib.suppress(Exception):
            await peer.close(0)
        raise CliError(f"cannot serve the store: {exc}") from exc
    except OSError as exc:
        with contextlib.suppress(Exception):
            await peer.close(0)
        host, port = listen or (peer.host, peer.port)
        if exc.errno == errno.EADDRINUSE:
            raise CliError(f"cannot listen on {host}:{port}: address already in use") from exc
        raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc


def refusal_line(code: str, message: str) -> str:
    """How a `nack` reads: `403 permission_denied: <its message>`."""
    try:
        status = HTTP_STATUS[ErrorCode(code)]
    except ValueError:
        return f"{code}: {message}"
    return f"{status} {code}: {message}"


def exchange_error(exc: Exception, setup: ClientSetup) -> CliError:
    """A refused or failed exchange with the target, as one line."""
    if isinstance(exc, NackError):
        return CliError(f"{exc.http_status} {exc.code.value}: {exc.message}")
    if isinstance(exc, DeliveryError) and exc.retryable:
        return CliError(f"cannot reach {setup.where}: {root_cause(exc)}")
    return CliError(f"no usable answer from {setup.where}: {exc}")


def root_cause(exc: BaseException) -> str:
    """The innermost cause of a delivery failure (`Connect call failed …`, `HTTP 503`)."""
    attempts = exc.attempts if isinstance(exc, DeliveryError) else None
    while exc.__cause__ is not None:
        exc = exc.__cause__
    text = str(exc) or type(exc).__name__
    return f"{text} (after {attempts} attempts)" if attempts else text


def to_json(value: Any) -> str:
    """One line of JSON (UTF-8 kept as is), for `--json` output."""
    return msgspec.json.encode(msgspec.to_builtins(value)).decode()
