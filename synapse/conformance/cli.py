"""`synapse conformance`: run the conformance kit against a running peer from the command line.

    synapse conformance --target http://127.0.0.1:8765/synapse/callback --agent-id agent-e \\
                        --secret S [--as synapse-conformance] [--listen 127.0.0.1:8766] [--json]

Every flag also comes from the environment (SYNAPSE_TARGET, SYNAPSE_AGENT_ID, SYNAPSE_SECRET,
SYNAPSE_AS, SYNAPSE_LISTEN); a flag wins over its variable. Exit status: 0 when every check
passed, 1 when one failed, 2 for a usage error (a missing or malformed setting).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any, TextIO, cast

from synapse.conformance.checks import CHECKS, Timing
from synapse.conformance.kit import DEFAULT_KIT_ID, DEFAULT_LISTEN, parse_listen, run_conformance
from synapse.p2p.logs import EventHandler

DESCRIPTION = """\
Check a running Synapse peer against the wire specification (specs/protocol.md in the Synapse
repository), black box, over HTTP: its 'Flows' message by message, 'Signatures', every one of
its 'Error codes', 'Deduplication' and the rules of its 'Task states'. The target must offer
'The demo handler' capabilities and know the kit as a partner: agent id --as, callback URL
http://LISTEN/synapse/callback, secret --secret.
"""

EPILOG = """\
example, against a reference peer started with
  synapse serve --agent-id agent-e --port 8765 --secret S \\
                --peer synapse-conformance=http://127.0.0.1:8766/synapse/callback
run
  synapse conformance --target http://127.0.0.1:8765/synapse/callback --agent-id agent-e \\
                      --secret S
"""

USAGE_ERROR = 2


#: What `--help` says, the same under `synapse conformance` and `python -m synapse.conformance`.
_TEXTS: dict[str, Any] = {
    "description": DESCRIPTION,
    "epilog": EPILOG,
    "formatter_class": argparse.RawDescriptionHelpFormatter,
}


def add_parser(subparsers: Any) -> None:
    """Add the `conformance` subcommand to `subparsers` (from `ArgumentParser.add_subparsers`)."""
    parser = subparsers.add_parser(
        "conformance", help="check a running peer against specs/protocol.md", **_TEXTS
    )
    configure_parser(parser)
    parser.set_defaults(func=run)


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """The flags of `synapse conformance`, on any parser."""
    parser.add_argument(
        "--target",
        metavar="URL",
        help="the URL the peer receives POSTs on [env SYNAPSE_TARGET]",
    )
    parser.add_argument(
        "--agent-id", metavar="ID", help="the peer's agent id [env SYNAPSE_AGENT_ID]"
    )
    parser.add_argument(
        "--secret",
        metavar="S",
        help="the secret the peer shares with the kit [env SYNAPSE_SECRET]",
    )
    parser.add_argument(
        "--as",
        dest="as_agent",
        metavar="AGENT_ID",
        help=f"the kit's agent id, registered at the peer [env SYNAPSE_AS; {DEFAULT_KIT_ID}]",
    )
    parser.add_argument(
        "--listen",
        metavar="HOST:PORT",
        help=f"where the kit receives callbacks [env SYNAPSE_LISTEN; {DEFAULT_LISTEN}]",
    )
    parser.add_argument(
        "--endpoint",
        metavar="URL",
        help="the callback URL the peer registered for the kit, when it reaches the kit "
        "another way than http://LISTEN/synapse/callback (a container, a proxy)",
    )
    parser.add_argument(
        "--only",
        metavar="PATTERN",
        action="append",
        default=[],
        help="run only the checks whose id matches (glob, repeatable), e.g. 'flow.*'",
    )
    parser.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=float,
        default=Timing.callback_timeout,
        help="the longest wait for one callback [%(default)g]",
    )
    parser.add_argument(
        "--concurrency",
        metavar="N",
        type=int,
        default=0,
        help="checks running at once, 0 for all; lower it for a peer that takes few tasks "
        "at a time [%(default)s]",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--list", action="store_true", help="list the checks and exit")
    parser.add_argument(
        "--verbose", "-v", action="store_true", help="log every check to stderr as it ends"
    )


def _setting(args: argparse.Namespace, name: str, env: str, default: str | None = None) -> Any:
    value = getattr(args, name, None)
    if value is None:
        value = os.environ.get(env) or default
    return value


class _Stderr:
    """`sys.stderr` as it is when written to (a test may swap it)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


@contextlib.contextmanager
def _logging(verbose: bool) -> Iterator[None]:
    """Kit events on stderr (warnings only unless `verbose`) for the run, unless the calling
    program configured logging itself; the configuration is put back afterwards."""
    root = logging.getLogger()
    if root.handlers:
        yield
        return
    synapse_logger = logging.getLogger("synapse")
    handler = EventHandler(cast(TextIO, _Stderr()))
    saved_level, saved_propagate = synapse_logger.level, synapse_logger.propagate
    synapse_logger.addHandler(handler)
    synapse_logger.setLevel(logging.INFO if verbose else logging.WARNING)
    synapse_logger.propagate = False
    try:
        yield
    finally:
        synapse_logger.removeHandler(handler)
        synapse_logger.setLevel(saved_level)
        synapse_logger.propagate = saved_propagate


def run(args: argparse.Namespace) -> int:
    """Run `synapse conformance` with parsed `args`; return the exit status."""
    out, err = sys.stdout, sys.stderr
    if getattr(args, "list", False):
        for check in CHECKS:
            out.write(f"{check.id:<26} {check.section:<24} {check.title}\n")
        return 0
    target = _setting(args, "target", "SYNAPSE_TARGET")
    agent_id = _setting(args, "agent_id", "SYNAPSE_AGENT_ID")
    secret = _setting(args, "secret", "SYNAPSE_SECRET")
    kit_id = _setting(args, "as_agent", "SYNAPSE_AS", DEFAULT_KIT_ID)
    listen = _setting(args, "listen", "SYNAPSE_LISTEN", DEFAULT_LISTEN)
    missing = [
        flag
        for flag, value in (("--target", target), ("--agent-id", agent_id), ("--secret", secret))
        if not value
    ]
    if missing:
        err.write(f"synapse conformance: error: missing {', '.join(missing)}\n")
        return USAGE_ERROR
    try:
        parse_listen(listen)
    except ValueError as exc:
        err.write(f"synapse conformance: error: --listen: {exc}\n")
        return USAGE_ERROR
    if not str(target).startswith(("http://", "https://")):
        err.write(f"synapse conformance: error: --target must be an http(s) URL: {target!r}\n")
        return USAGE_ERROR
    timing = Timing(callback_timeout=float(getattr(args, "timeout", Timing.callback_timeout)))
    try:
        with _logging(bool(getattr(args, "verbose", False))):
            report = asyncio.run(
                run_conformance(
                    target,
                    agent_id,
                    secret,
                    kit_id=kit_id,
                    listen=listen,
                    endpoint=getattr(args, "endpoint", None),
                    timing=timing,
                    only=tuple(getattr(args, "only", None) or ()),
                    concurrency=max(0, int(getattr(args, "concurrency", 0) or 0)),
                )
            )
    except OSError as exc:  # the listen address is taken or not ours
        err.write(f"synapse conformance: error: cannot listen on {listen}: {exc}\n")
        return USAGE_ERROR
    except KeyboardInterrupt:
        err.write("synapse conformance: interrupted\n")
        return 130
    out.write((report.to_json() if args.json else report.table()) + "\n")
    return 0 if report.ok else 1


def main(argv: list[str] | None = None) -> int:
    """`python -m synapse.conformance` until `synapse conformance` is wired in."""
    parser = argparse.ArgumentParser(prog="synapse conformance", **_TEXTS)
    configure_parser(parser)
    return run(parser.parse_args(argv))


__all__ = ["add_parser", "configure_parser", "main", "run"]
