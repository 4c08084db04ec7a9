"""`synapse conformance`: run the conformance kit against a running peer from the command line.

    synapse conformance --target http://127.0.0.1:8765/synapse/callback --agent-id agent-e \\
                        --secret-file PATH [--as synapse-conformance] [--listen HOST:PORT] [--json]

Every setting also comes from the environment (SYNAPSE_TARGET, SYNAPSE_AGENT_ID, SYNAPSE_SECRET,
SYNAPSE_AS, SYNAPSE_LISTEN, …) or a TOML file (--config); a flag wins over its variable, a
variable over the file. Exit status: 0 when every check passed, 1 when one failed, 2 for a
usage error (a missing or malformed setting) or a target that cannot be reached.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO, cast

from synapse.conformance.checks import CHECKS, Timing
from synapse.conformance.kit import DEFAULT_KIT_ID, DEFAULT_LISTEN, parse_listen, run_conformance
from synapse.logs import EventHandler
from synapse.types.errors import SynapseException

DESCRIPTION = """\
Check a running Synapse peer against the wire specification (specs/protocol.md in the Synapse
repository), black box, over HTTP: its 'Flows' message by message, 'Signatures', every one of
its 'Error codes', 'Deduplication' and the rules of its 'Task states'. The target must offer
'The demo handler' capabilities and know the kit as a partner: agent id --as, callback URL
http://LISTEN/synapse/callback, secret --secret-file (or --secret).
"""

EPILOG = """\
Exit status: 0 every check passed, 1 a check failed, 2 usage error or the target cannot be
reached.

examples:
  synapse conformance --target http://127.0.0.1:8765/synapse/callback --agent-id agent-e \\
                      --secret-file synapse.secret
  synapse conformance --config kit.toml --only 'flow.*' --json
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
        "--target", metavar="URL", help="the URL the peer receives POSTs on ($SYNAPSE_TARGET)"
    )
    parser.add_argument("--agent-id", metavar="ID", help="the peer's agent id ($SYNAPSE_AGENT_ID)")
    parser.add_argument(
        "--secret",
        metavar="SECRET",
        help="the secret the peer shares with the kit, shown by ps: prefer --secret-file "
        "($SYNAPSE_SECRET)",
    )
    parser.add_argument(
        "--secret-file",
        metavar="PATH",
        help="a file whose first line is that secret ($SYNAPSE_SECRET_FILE)",
    )
    parser.add_argument(
        "--as",
        dest="as_agent",
        metavar="AGENT_ID",
        help=f"the kit's agent id, registered at the peer (default {DEFAULT_KIT_ID}; $SYNAPSE_AS)",
    )
    parser.add_argument(
        "--listen",
        metavar="HOST:PORT",
        help=f"where the kit receives callbacks (default {DEFAULT_LISTEN}; $SYNAPSE_LISTEN)",
    )
    parser.add_argument(
        "--endpoint",
        metavar="URL",
        help="the callback URL the peer registered for the kit, when it reaches the kit "
        "another way than http://LISTEN/synapse/callback: a container, a proxy "
        "($SYNAPSE_ENDPOINT)",
    )
    parser.add_argument(
        "--only",
        metavar="PATTERN",
        action="append",
        default=[],
        help="run only the checks whose id matches (glob, repeatable), e.g. 'flow.*'",
    )
    parser.add_argument(
        "--callback-timeout",
        metavar="SECONDS",
        type=float,
        default=None,
        help=f"the longest wait for one callback (default {Timing.callback_timeout:g}; "
        "$SYNAPSE_CALLBACK_TIMEOUT)",
    )
    # Its first name, kept working for scripts; not shown: `--timeout` is the whole task's
    # bound in `synapse send`, and one flag has one meaning.
    parser.add_argument(
        "--timeout", dest="callback_timeout", type=float, default=None, help=argparse.SUPPRESS
    )
    parser.add_argument(
        "--concurrency",
        metavar="N",
        type=int,
        default=None,
        help="checks running at once, 0 for all; lower it for a peer that takes few tasks "
        "at a time (default 0; $SYNAPSE_CONCURRENCY)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--list", action="store_true", help="list the checks and exit")
    output = parser.add_argument_group("output and settings")
    output.add_argument(
        "--config",
        metavar="PATH",
        help="TOML file with these settings, top level or in a [conformance] table "
        "($SYNAPSE_CONFIG)",
    )
    output.add_argument(
        "--log-json",
        action="store_true",
        default=None,
        help="log JSON lines on stderr instead of console lines ($SYNAPSE_LOG_JSON)",
    )
    output.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=None,
        help="log every check to stderr as it ends ($SYNAPSE_VERBOSE)",
    )


#: Setting → (its flag's attribute, its variable, its key in the config file).
_SETTINGS = {
    "target": ("target", "SYNAPSE_TARGET", "target"),
    "agent_id": ("agent_id", "SYNAPSE_AGENT_ID", "agent_id"),
    "secret": ("secret", "SYNAPSE_SECRET", "secret"),
    "secret_file": ("secret_file", "SYNAPSE_SECRET_FILE", "secret_file"),
    "kit_id": ("as_agent", "SYNAPSE_AS", "as"),
    "listen": ("listen", "SYNAPSE_LISTEN", "listen"),
    "endpoint": ("endpoint", "SYNAPSE_ENDPOINT", "endpoint"),
    "timeout": ("callback_timeout", "SYNAPSE_CALLBACK_TIMEOUT", "callback_timeout"),
    "old_timeout": ("callback_timeout", "SYNAPSE_TIMEOUT", "timeout"),
    "concurrency": ("concurrency", "SYNAPSE_CONCURRENCY", "concurrency"),
    "log_json": ("log_json", "SYNAPSE_LOG_JSON", "log_json"),
    "verbose": ("verbose", "SYNAPSE_VERBOSE", "verbose"),
}
_TRUE = {"1", "true", "yes", "on"}


class _UsageError(SynapseException):
    pass


def _file_settings(path: str | None) -> dict[str, Any]:
    """The config file's settings: its top level, then its [conformance] table over them."""
    if not path:
        return {}
    try:
        with open(path, "rb") as file:
            data = tomllib.load(file)
    except OSError as exc:
        raise _UsageError(f"cannot read --config {path}: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise _UsageError(f"--config {path} is not valid TOML: {exc}") from exc
    merged = {k: v for k, v in data.items() if not isinstance(v, dict)}
    table = data.get("conformance")
    if isinstance(table, dict):
        merged.update(table)
    return merged


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    """Every setting from its flag, else its variable, else the config file."""
    file = _file_settings(getattr(args, "config", None) or os.environ.get("SYNAPSE_CONFIG"))
    found: dict[str, Any] = {}
    for name, (attribute, env, key) in _SETTINGS.items():
        value = getattr(args, attribute, None)
        if value is None:
            value = os.environ.get(env) or None
        if value is None:
            value = file.get(key)
        found[name] = value
    for flag in ("log_json", "verbose"):
        value = found[flag]
        found[flag] = value if isinstance(value, bool) else str(value or "").lower() in _TRUE
    found["timeout"] = found["timeout"] or found.pop("old_timeout")
    try:
        found["timeout"] = float(found["timeout"] or Timing.callback_timeout)
        found["concurrency"] = max(0, int(found["concurrency"] or 0))
    except (TypeError, ValueError) as exc:
        raise _UsageError(f"--callback-timeout and --concurrency take numbers: {exc}") from exc
    return found


class _Stderr:
    """`sys.stderr` as it is when written to (a test may swap it)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


@contextlib.contextmanager
def _logging(verbose: bool, json: bool = False) -> Iterator[None]:
    """Kit events on stderr (warnings only unless `verbose`) for the run, unless the calling
    program configured logging itself; the configuration is put back afterwards."""
    root = logging.getLogger()
    if root.handlers:
        yield
        return
    synapse_logger = logging.getLogger("synapse")
    handler = EventHandler(cast(TextIO, _Stderr()), json=json)
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
    try:
        settings = _settings(args)
    except _UsageError as exc:
        err.write(f"synapse conformance: error: {exc}\n")
        return USAGE_ERROR
    target, agent_id, secret = settings["target"], settings["agent_id"], settings["secret"]
    if not secret and settings["secret_file"]:
        try:
            secret = _first_line(Path(settings["secret_file"]).expanduser())
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            err.write(f"synapse conformance: error: --secret-file: {exc}\n")
            return USAGE_ERROR
    kit_id = settings["kit_id"] or DEFAULT_KIT_ID
    listen = settings["listen"] or DEFAULT_LISTEN
    missing = [
        flag
        for flag, value in (
            ("--target", target),
            ("--agent-id", agent_id),
            ("--secret or --secret-file", secret),
        )
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
    timing = Timing(callback_timeout=settings["timeout"])
    try:
        with _logging(settings["verbose"], json=settings["log_json"]):
            report = asyncio.run(
                run_conformance(
                    target,
                    agent_id,
                    secret,
                    kit_id=kit_id,
                    listen=listen,
                    endpoint=settings["endpoint"],
                    timing=timing,
                    only=tuple(getattr(args, "only", None) or ()),
                    concurrency=settings["concurrency"],
                )
            )
    except OSError as exc:  # the listen address is taken or not ours
        err.write(f"synapse conformance: error: cannot listen on {listen}: {exc}\n")
        return USAGE_ERROR
    except KeyboardInterrupt:
        err.write("synapse conformance: interrupted\n")
        return 130
    out.write((report.to_json() if args.json else report.table()) + "\n")
    if report.unreachable:
        # As for every command that cannot reach its peer: a connection error, not a verdict.
        err.write(f"synapse conformance: {report.setup_failure}\n")
        return USAGE_ERROR
    return 0 if report.ok else 1


def main(argv: list[str] | None = None) -> int:
    """`python -m synapse.conformance` until `synapse conformance` is wired in."""
    parser = argparse.ArgumentParser(prog="synapse conformance", **_TEXTS)
    configure_parser(parser)
    return run(parser.parse_args(argv))


__all__ = ["add_parser", "configure_parser", "main", "run"]


def _first_line(path: Path) -> str:
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            return line.strip()
    raise ValueError(f"{path} is empty")
