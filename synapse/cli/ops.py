"""`synapse serve`'s operations: health, metrics (always on), the console and tracing (flags).

Kept apart from `main.py` and `serve.py` so the serve command gains them through two calls:
`add_ops_arguments(parser)` and `serve_ops(peer, options)`.
"""

from __future__ import annotations

import argparse
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from synapse._distribution import install
from synapse.cli.errors import CliError
from synapse.cli.options import CONSOLE, CONSOLE_TOKENS, OTEL, add_setting
from synapse.cli.settings import Settings
from synapse.logs import get_logger

if TYPE_CHECKING:
    from synapse.a2a.server.app import A2AServer
    from synapse.humans import Humans
    from synapse.p2p.engine import TaskRecord
    from synapse.transport.peer import Peer

log = get_logger("synapse.cli")

CONSOLE_PATH = "/console"


@dataclass(frozen=True, slots=True)
class OpsOptions:
    console: bool = False
    #: Sign-in token → reviewer id; empty: one random token, logged at start-up.
    console_tokens: Mapping[str, str] = field(default_factory=dict)
    otel: bool = False


def add_ops_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "operations (docs/operations.md in the Synapse repository)",
        "/healthz, /readyz and /metrics are always served.",
    )
    group.add_argument(
        CONSOLE.flag,
        dest=CONSOLE.dest,
        action="store_true",
        default=None,
        help=f"serve the web console at {CONSOLE_PATH}, where people answer need_info and "
        "need_human ($SYNAPSE_CONSOLE)",
    )
    add_setting(group, CONSOLE_TOKENS)
    add_setting(group, OTEL)


def ops_serve_options(s: Settings) -> OpsOptions:
    console = s.switch(CONSOLE)
    tokens = dict(s.get_list(CONSOLE_TOKENS))
    if tokens and not console:
        raise CliError("--console-token needs --console")
    short = [name for token, name in tokens.items() if len(token) < 16]
    if short:
        raise CliError(f"the console token of {short[0]!r} is shorter than 16 characters")
    return OpsOptions(console=console, console_tokens=tokens, otel=s.switch(OTEL))


def serve_ops(
    peer: Peer,
    options: OpsOptions,
    a2a: A2AServer | None = None,
    humans: Humans | None = None,
) -> str | None:
    """Switch on what `options` says, before the peer starts (`a2a`'s push deliveries are
    counted in the metrics too); the generated console token (None if tokens were given or
    there is no console)."""
    from synapse.ops import enable_health, enable_metrics
    from synapse.ops.console import Reviewer, TokenAuth, enable_console

    enable_health(peer)
    metrics = enable_metrics(peer)
    if a2a is not None:
        a2a.register_metrics(metrics.registry)
    generated: str | None = None
    if options.console:
        tokens = dict(options.console_tokens)
        if not tokens:
            generated = secrets.token_urlsafe(24)
            tokens = {generated: "operator"}
        console = enable_console(
            peer, TokenAuth({t: Reviewer(user_id=n) for t, n in tokens.items()})
        )
        if a2a is not None:
            console.add_panel("push", "Push deliveries", push_panel(a2a))
        if humans is not None:
            humans.attach_console(console)
    if options.otel:
        try:
            from synapse.ops.tracing import enable_tracing
        except ImportError as exc:
            raise CliError(f"--otel needs the otel extra ({install('otel')}): {exc}") from exc
        enable_tracing(peer)
    return generated


def push_panel(a2a: A2AServer) -> Callable[[TaskRecord], list[dict[str, Any]]]:
    """The console's panel of an A2A task's push configurations: how each one's deliveries go
    (last success, last failure and why, consecutive failures, disabled)."""

    def rows(rec: TaskRecord) -> list[dict[str, Any]]:
        if not rec.key.requester.startswith("a2a:"):
            return []
        return [
            {"config": config, **{k: _when(k, v) for k, v in status.items()}}
            for config, status in a2a.push_status(rec.task_id).items()
        ]

    return rows


def _when(name: str, value: Any) -> Any:
    """A timestamp column as RFC 3339 (the page shows it as is)."""
    if name.startswith("last_") and isinstance(value, int | float):
        return datetime.fromtimestamp(value, UTC).isoformat(timespec="seconds")
    return value


def log_console(peer: Peer, options: OpsOptions, generated: str | None) -> None:
    if not options.console:
        return
    url = f"http://{peer.host}:{peer.port}{CONSOLE_PATH}"
    if generated is not None:
        # Like a notebook server: the one way in, shown once to whoever started the peer.
        log.info("serving_console", url=url, token=generated, reviewer="operator")
    else:
        log.info("serving_console", url=url, reviewers=sorted(set(options.console_tokens.values())))
