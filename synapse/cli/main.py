"""Entry point of the `synapse` command: argument parsing, settings, errors, exit statuses.

Every subcommand takes `--help`; a flag means the same in every subcommand that has it, and
each setting may also come from a `SYNAPSE_…` environment variable or the `--config` TOML
file (flags > environment > file). Errors are one line on stderr, never a traceback, and the
exit status says what happened (`synapse.cli.errors.Exit`; docs/cli.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import difflib
import os
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

from synapse import __version__
from synapse.cli.errors import CliError, Exit
from synapse.cli.logs import LEVELS, configure_logging, parse_log_level
from synapse.cli.ops import add_ops_arguments, ops_serve_options
from synapse.cli.parsers import (
    parse_a2a_binding,
    parse_a2a_bindings,
    parse_a2a_token,
    parse_bool,
    parse_count,
    parse_http_url,
    parse_listen,
    parse_port,
    parse_signing,
    parse_url,
)
from synapse.cli.security_settings import (
    A2A_CLIENT_FLAGS,
    add_a2a_client_flags,
    add_a2a_serve_flags,
    add_secret_flags,
    add_tls_flags,
)
from synapse.cli.settings import Settings, parse_positive
from synapse.p2p.config import P2PConfig
from synapse.p2p.durations import parse_duration
from synapse.types import MessageType, Priority

if TYPE_CHECKING:
    from synapse.cli.conversation import SendOptions
    from synapse.cli.serve import A2AOptions


class Parser(argparse.ArgumentParser):
    """argparse, with usage errors as one line (and exit status 2) instead of usage + error."""

    #: The subcommands' names (set on the top-level parser by `build_parser`).
    command_names: tuple[str, ...] = ()

    def error(self, message: str) -> NoReturn:
        raise CliError(f"{message} (see '{self.prog} --help')", Exit.USAGE)


def _typed(parse: Callable[[str], Any], name: str) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc

    convert.__name__ = name
    return convert


PORT = _typed(parse_port, "port")
A2A_BINDING = _typed(parse_a2a_binding, "A2A binding")
A2A_BINDINGS = _typed(parse_a2a_bindings, "A2A bindings")
URL = _typed(parse_url, "URL")
HTTP_URL = _typed(parse_http_url, "URL")
LISTEN = _typed(parse_listen, "HOST:PORT")
COUNT = _typed(parse_count, "count")
SIGNING = _typed(parse_signing, "signing")
DURATION = _typed(parse_duration, "duration")
POSITIVE = _typed(parse_positive, "number")

EPILOG = "Exit status: 0 success, 1 task failed/rejected/cancelled, 2 usage or connection error."


def _common(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("output and settings")
    group.add_argument(
        "--config",
        metavar="PATH",
        help="TOML file with settings and [[peer]] tables ($SYNAPSE_CONFIG)",
    )
    group.add_argument(
        "--log-json",
        action="store_true",
        default=None,
        help="log JSON lines on stderr instead of console lines ($SYNAPSE_LOG_JSON)",
    )
    group.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=None,
        help="log every transition and HTTP attempt ($SYNAPSE_VERBOSE)",
    )


def _secrets(group: argparse._ArgumentGroup, *, serve: bool = False) -> None:
    add_secret_flags(group, serve=serve)
    group.add_argument(
        "--secret",
        metavar="SECRET",
        help="secret shared with every partner without a --peer-secret-file ($SYNAPSE_SECRET)",
    )
    group.add_argument(
        "--peer-secret-file",
        action="append",
        metavar="PARTNER_ID=PATH",
        help="that partner's secrets, one a line, newest first; repeatable "
        "($SYNAPSE_PEER_SECRET_FILES, comma-separated)",
    )


def _signing(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--signing",
        type=SIGNING,
        metavar="{header,body}",
        help="where our signatures go: X-Synapse-Signature header or body `signature` "
        "(default header; $SYNAPSE_SIGNING)",
    )
    group.add_argument(
        "--retries",
        type=COUNT,
        metavar="N",
        help="retries of a POST after a connection error, timeout, 429 or 5xx "
        "(default: 5 for serve, 2 for send/caps/ping; $SYNAPSE_RETRIES)",
    )


def _client(parser: argparse.ArgumentParser, *, listen_help: str) -> None:
    group = parser.add_argument_group("who talks to whom")
    group.add_argument(
        "--target",
        type=URL,
        metavar="URL",
        help="the executor's callback URL, e.g. http://127.0.0.1:8080/synapse/callback "
        "($SYNAPSE_TARGET; or a [[peer]] of --config)",
    )
    group.add_argument(
        "--agent-id",
        metavar="ID",
        help="the executor's agent id ($SYNAPSE_AGENT_ID; or the [[peer]] at --target)",
    )
    group.add_argument(
        "--as",
        dest="as_",
        metavar="AGENT_ID",
        help="our own agent id, as the executor knows us ($SYNAPSE_AS)",
    )
    _secrets(group)
    group.add_argument("--listen", type=LISTEN, metavar="HOST:PORT", help=listen_help)
    group.add_argument(
        "--endpoint",
        type=URL,
        metavar="URL",
        help="our callback URL as the executor has it, if not http://HOST:PORT/synapse/callback "
        "of --listen ($SYNAPSE_ENDPOINT)",
    )
    _signing(group)
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    add_tls_flags(parser)


def build_parser() -> Parser:
    parser = Parser(
        prog="synapse",
        description="Synapse agent-to-agent P2P protocol: serve a peer, send it tasks, "
        "watch the flows.",
        epilog="Run 'synapse COMMAND --help' for a command's options. " + EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"synapse {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)

    serve = commands.add_parser(
        "serve",
        help="run a peer: serve POST /synapse/callback with a TaskHandler",
        description="Run a peer that serves POST /synapse/callback on HOST:PORT with the demo "
        "handler (or --handler), until SIGINT or SIGTERM. Logs go to stderr; the first line "
        "is `listening` with the URL.",
        epilog="Exit status: 0 stopped by SIGINT or SIGTERM, 2 usage error or the port cannot be "
        "bound.",
    )
    group = serve.add_argument_group("identity and partners")
    group.add_argument("--agent-id", metavar="ID", help="our agent id ($SYNAPSE_AGENT_ID)")
    group.add_argument("--port", type=PORT, help="port to listen on, 0 for any ($SYNAPSE_PORT)")
    group.add_argument("--host", help="address to listen on (default 127.0.0.1; $SYNAPSE_HOST)")
    group.add_argument(
        "--endpoint",
        type=URL,
        metavar="URL",
        help="our callback URL as partners see it (default http://HOST:PORT/synapse/callback; "
        "$SYNAPSE_ENDPOINT)",
    )
    _secrets(group, serve=True)
    group.add_argument(
        "--peer",
        action="append",
        metavar="PARTNER_ID=CALLBACK_URL",
        help="a partner and the URL it receives POSTs on; repeatable "
        "($SYNAPSE_PEERS, comma-separated)",
    )
    group = serve.add_argument_group("behaviour")
    group.add_argument(
        "--store",
        metavar="PATH|URL|memory",
        help="where tasks, the outbox and dedup records live: an SQLite file, a "
        "postgresql://USER@HOST:PORT/DB database (replicas may share one), or memory "
        "(default; $SYNAPSE_STORE)",
    )
    group.add_argument(
        "--handler",
        metavar="MODULE:ATTR",
        help="the TaskHandler to run, a class or an instance (default: the demo handler; "
        "$SYNAPSE_HANDLER)",
    )
    _signing(group)
    group = serve.add_argument_group(
        "running for months (docs/durability.md in the Synapse repository)"
    )
    group.add_argument(
        "--retain",
        type=DURATION,
        metavar="DURATION",
        help="how long finished tasks, their history and dead letters are kept: 30s, 15m, 12h, "
        "7d or seconds (default 7d; $SYNAPSE_RETAIN; [p2p] retain)",
    )
    group.add_argument(
        "--drain-timeout",
        type=DURATION,
        metavar="DURATION",
        help="on SIGTERM/SIGINT, how long running tasks may take to finish before they fail "
        "with 'agent shutting down' (default 30s; $SYNAPSE_DRAIN_TIMEOUT; [p2p] drain_timeout)",
    )
    group.add_argument(
        "--lease-ttl",
        type=DURATION,
        metavar="DURATION",
        help="replicas on one PostgreSQL --store: how soon a dead replica's tasks are taken "
        "over (default 10s; $SYNAPSE_LEASE_TTL; [p2p] lease_ttl)",
    )
    group.add_argument(
        "--rate-limit",
        type=POSITIVE,
        metavar="PER_SECOND",
        help="requests per second accepted from one partner, beyond which it gets 429 with "
        "Retry-After (default: no limit; $SYNAPSE_RATE_LIMIT; [p2p] rate_limit)",
    )
    group.add_argument(
        "--max-tasks-per-partner",
        type=COUNT,
        metavar="N",
        help="executor tasks in flight one partner may hold, so that one partner cannot take "
        "all of the capacity (default: no share; $SYNAPSE_MAX_TASKS_PER_PARTNER; "
        "[p2p] max_tasks_per_partner)",
    )
    group = serve.add_argument_group("A2A (docs/a2a.md in the Synapse repository)")
    group.add_argument(
        "--a2a",
        action="store_true",
        default=None,
        help="also speak Linux Foundation A2A v1.0: GET /.well-known/agent-card.json and "
        "JSON-RPC at POST /a2a ($SYNAPSE_A2A)",
    )
    group.add_argument(
        "--a2a-push-allow",
        action="append",
        type=HTTP_URL,
        metavar="URL_PREFIX",
        help="a URL prefix push notifications may go to, signed with --secret; repeatable; "
        "none: push notifications off ($SYNAPSE_A2A_PUSH_ALLOW, comma-separated)",
    )
    group.add_argument(
        "--a2a-token",
        action="append",
        metavar="TOKEN[=NAME]",
        help="a bearer token A2A clients must present, and the name of whom it identifies; "
        "repeatable; none: no authentication ($SYNAPSE_A2A_TOKENS, comma-separated)",
    )
    group.add_argument(
        "--a2a-default-task-type",
        metavar="TYPE",
        help="the task type of a message without metadata.taskType (default echo; '' refuses "
        "such messages; $SYNAPSE_A2A_DEFAULT_TASK_TYPE)",
    )
    group.add_argument(
        "--a2a-public-url",
        type=URL,
        metavar="URL",
        help="the base URL A2A clients reach us at, for the card (default: the origin of "
        "--endpoint; $SYNAPSE_A2A_PUBLIC_URL)",
    )
    group.add_argument(
        "--a2a-bindings",
        type=A2A_BINDINGS,
        metavar="LIST",
        help="the A2A bindings to serve, comma-separated, in the order the card lists them "
        "(the order clients should prefer): JSONRPC, HTTP+JSON (or REST), GRPC (default "
        "JSONRPC,HTTP+JSON, and GRPC with --a2a-grpc-port; $SYNAPSE_A2A_BINDINGS)",
    )
    group.add_argument(
        "--a2a-grpc-port",
        type=PORT,
        metavar="PORT",
        help="also serve the A2A gRPC binding on this port of --host (0: any free port; "
        "needs the grpc extra; $SYNAPSE_A2A_GRPC_PORT)",
    )
    group.add_argument(
        "--a2a-grpc-public-address",
        metavar="HOST:PORT",
        help="the gRPC address the card gives (default: the host of --a2a-public-url or of "
        "--endpoint, and the gRPC port; $SYNAPSE_A2A_GRPC_PUBLIC_ADDRESS)",
    )
    add_a2a_serve_flags(group)
    add_tls_flags(serve)
    add_ops_arguments(serve)
    group = serve.add_argument_group("routing (docs/routing.md in the Synapse repository)")
    group.add_argument(
        "--route",
        metavar="POOL.toml",
        help="be a router: execute every task by requesting it of a capable partner of the "
        "pool this TOML file describes, instead of running a handler ($SYNAPSE_ROUTE)",
    )
    _common(serve)
    serve.add_argument(
        "--log-level",
        type=_typed(parse_log_level, "log level"),
        metavar="{" + ",".join(LEVELS) + "}",
        help="info (default): startup, one line a task with its outcome, refusals, retries, "
        "warnings; debug adds every message and transition ($SYNAPSE_LOG_LEVEL)",
    )
    serve.set_defaults(run=_run_serve)

    send = commands.add_parser(
        "send",
        help="request a task and follow it to its end",
        description="Request one task of the executor at --target and follow it: progress, "
        "questions (--field, --approve/--reject, else asked on the terminal or read from "
        "stdin lines), and the result on stdout. Ctrl-C cancels the task.",
        epilog="Exit status: 0 completed, 1 failed/rejected/cancelled, 2 usage or connection "
        "error or refused request.",
    )
    send.add_argument("task_type", metavar="TASK_TYPE", help="e.g. echo, slow, text_generation")
    send.add_argument(
        "payload",
        metavar="PAYLOAD_JSON",
        nargs="?",
        default="{}",
        help="the task's payload, a JSON object (default {})",
    )
    _client(
        send,
        listen_help="where we receive the executor's callbacks: its --peer for us must be "
        "http://HOST:PORT/synapse/callback ($SYNAPSE_LISTEN)",
    )
    group = send.add_argument_group("answers and task")
    group.add_argument(
        "--field",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="answer to a task_need_info field (VALUE as JSON if it parses, else text); repeatable",
    )
    decision = group.add_mutually_exclusive_group()
    decision.add_argument(
        "--approve",
        action="store_const",
        const="approve",
        dest="decision",
        help="approve a task_need_human without asking",
    )
    decision.add_argument(
        "--reject",
        action="store_const",
        const="reject",
        dest="decision",
        help="reject a task_need_human without asking",
    )
    group.add_argument("--notes", default="", help="notes sent with --approve or --reject")
    group.add_argument("--task-id", metavar="ID", help="the task's id (default: a new one)")
    group.add_argument(
        "--timeout",
        type=DURATION,
        metavar="DURATION",
        help="give up when the task has not ended after DURATION (30s, 15m, 2h or seconds): "
        "cancel it and exit 1 (default: wait for its end)",
    )
    group.add_argument(
        "--priority",
        choices=[p.value for p in Priority],
        help="the task's priority (default normal)",
    )
    group = send.add_argument_group(
        "A2A (docs/a2a.md in the Synapse repository)",
        "With --a2a URL the task goes to that A2A v1.0 agent instead: --target, --agent-id, "
        "--as, --secret, --peer-secret-file, --listen, --endpoint, --signing, --task-id and "
        "--priority have no meaning there and are refused as flags (their environment and "
        "config values are ignored).",
    )
    group.add_argument(
        "--a2a",
        type=URL,
        metavar="URL",
        dest="a2a_url",
        help="send to the A2A agent at URL (its base URL or its agent card's URL)",
    )
    group.add_argument(
        "--a2a-token",
        metavar="TOKEN",
        help="the bearer token the A2A agent expects ($SYNAPSE_A2A_TOKEN)",
    )
    group.add_argument(
        "--a2a-binding",
        type=A2A_BINDING,
        metavar="NAME",
        help="use only this A2A binding (JSONRPC, HTTP+JSON or REST, GRPC); default: the "
        "first of the agent card's interfaces this client speaks ($SYNAPSE_A2A_BINDING)",
    )
    add_a2a_client_flags(group)
    _common(send)
    send.set_defaults(run=_run_send)

    for name, summary in (
        ("caps", "ask an executor for its capabilities (capability_query)"),
        ("ping", "send a heartbeat; print the round trip and the partner's status"),
    ):
        sub = commands.add_parser(
            name,
            help=summary,
            description=summary + ".",
            epilog="Exit status: 0 answered, 2 usage or connection error or a refused request.",
        )
        _client(
            sub,
            listen_help="our address, if our callback URL is http://HOST:PORT/synapse/callback "
            "(nothing listens there: the answer is the HTTP reply; $SYNAPSE_LISTEN)",
        )
        if name == "caps":
            sub.add_argument("--task-type", metavar="TYPE", help="only this capability")
        _common(sub)
        sub.set_defaults(run=_run_caps if name == "caps" else _run_ping)

    outbox = commands.add_parser(
        "outbox",
        help="list, retry or drop the undelivered messages of a --store file",
        description="Work on the outbox of a peer's SQLite store, offline (the peer need not "
        "run): `list` (the default) shows the messages not yet delivered and the dead letters; "
        "`retry MESSAGE_ID` makes a dead letter pending again (delivered at the peer's next "
        "start); `drop MESSAGE_ID` deletes a pending message or a dead letter for good.",
        epilog="Exit status: 0 done, 2 usage error, no store at PATH or an unknown MESSAGE_ID.",
    )
    outbox.add_argument(
        "action",
        nargs="?",
        choices=("list", "retry", "drop"),
        default="list",
        metavar="{list,retry,drop}",
        help="what to do (default list)",
    )
    outbox.add_argument("message_id", nargs="?", metavar="MESSAGE_ID", help="for retry and drop")
    outbox.add_argument(
        "--store",
        metavar="PATH",
        help="the SQLite file of `synapse serve --store PATH` ($SYNAPSE_STORE)",
    )
    outbox.add_argument("--json", action="store_true", help="print JSON lines instead of a table")
    _common(outbox)
    outbox.set_defaults(run=_run_outbox)

    schema = commands.add_parser(
        "schema",
        help="print the JSON Schema of the messages",
        description="Print the JSON Schema of every message (the union, discriminated by "
        "`type`), of one TYPE, or write one file per schema into --out DIR.",
        epilog="Exit status: 0 printed (or written), 2 usage error or an unknown TYPE.",
    )
    schema.add_argument(
        "type", metavar="TYPE", nargs="?", help="one message type, e.g. task_request"
    )
    schema.add_argument("--out", metavar="DIR", help="write message.json and <type>.json here")
    _common(schema)
    schema.set_defaults(run=_run_schema)

    demo = commands.add_parser(
        "demo",
        help="two peers in this process walk through every flow, printed as a timeline",
        description="Start two peers on loopback ports and run the flows of "
        "specs/protocol.md, 'Flows' between them (normal, progress, need_info, need_human, "
        "cancel), a failure and a rejection, printing every message with each side's state. "
        "Takes about a second.",
        epilog="Exit status: 0 every flow ran, 2 usage error (or no loopback port to listen on).",
    )
    demo.add_argument(
        "--signing", type=SIGNING, metavar="{header,body}", help="signature mode (default header)"
    )
    _common(demo)
    demo.set_defaults(run=_run_demo)

    from synapse.cli.migrate import add_parser as add_migrate

    add_migrate(commands)  # `synapse migrate` parses its own flags (PostgreSQL store)

    try:  # `synapse conformance` lives with the conformance kit, which owns its flags
        from synapse.conformance.cli import add_parser as add_conformance
    except ImportError:
        pass
    else:
        add_conformance(commands)
    parser.command_names = tuple(commands.choices)
    return parser


# --- commands -----------------------------------------------------------------------------


class Context:
    """What a command runs with: its arguments, settings and streams."""

    def __init__(
        self, args: argparse.Namespace, env: Mapping[str, str], out: TextIO, err: TextIO
    ) -> None:
        self.args = args
        self.env = env
        self.out = out
        self.err = err
        self.settings = Settings.load(args, env)

    def logging(self, *, quiet: bool) -> None:
        """Logs on stderr; client commands stay quiet unless --verbose."""
        verbose = self.settings.get("verbose", "SYNAPSE_VERBOSE", "verbose", parse_bool, False)
        as_json = self.settings.get("log_json", "SYNAPSE_LOG_JSON", "log_json", parse_bool, False)
        level = self.settings.get("log_level", "SYNAPSE_LOG_LEVEL", "log_level", parse_log_level)
        configure_logging(
            level=level,
            json=bool(as_json),
            verbose=bool(verbose),
            quiet=quiet and not verbose,
            stream=self.err,
        )


def serve_p2p_config(s: Settings) -> P2PConfig:
    """`serve`'s engine settings: `[p2p]`, then `--retries`, then the flags (or their
    variables) of running for months."""
    return s.p2p_config(
        overrides={
            "retain": s.get("retain", "SYNAPSE_RETAIN", None, parse_duration),
            "drain_timeout": s.get("drain_timeout", "SYNAPSE_DRAIN_TIMEOUT", None, parse_duration),
            "lease_ttl": s.get("lease_ttl", "SYNAPSE_LEASE_TTL", None, parse_duration),
            "rate_limit": s.get("rate_limit", "SYNAPSE_RATE_LIMIT", None, parse_positive),
            "max_tasks_per_partner": s.get(
                "max_tasks_per_partner", "SYNAPSE_MAX_TASKS_PER_PARTNER", None, parse_count
            ),
        }
    )


def _run_serve(ctx: Context) -> int:
    from synapse.cli.security_settings import (
        allow_shared_secret,
        secrets_on_command_line,
        tls_config,
    )
    from synapse.cli.serve import ServeOptions, run_serve
    from synapse.cli.speed import run_server

    s = ctx.settings
    a2a = _a2a_serve_options(s)
    if a2a is not None and a2a.grpc_port is not None:  # gRPC listens on --host too
        a2a = dataclasses.replace(
            a2a, grpc_host=s.get("host", "SYNAPSE_HOST", "host", str) or "127.0.0.1"
        )
    options = ServeOptions(
        agent_id=s.require("agent_id", "SYNAPSE_AGENT_ID", "agent_id", str, flag="--agent-id"),
        host=s.get("host", "SYNAPSE_HOST", "host", str) or "127.0.0.1",
        port=s.require("port", "SYNAPSE_PORT", "port", parse_port, flag="--port"),
        endpoint=s.get("endpoint", "SYNAPSE_ENDPOINT", "endpoint", parse_url),
        partners=s.partners(),
        handler=s.get("handler", "SYNAPSE_HANDLER", "handler", str),
        store=s.get("store", "SYNAPSE_STORE", "store", str) or "memory",
        signing="body"
        if s.get("signing", "SYNAPSE_SIGNING", "signing", parse_signing) == "body"
        else "header",
        config=serve_p2p_config(s),
        a2a=a2a,
        tls=tls_config(s, serving=True),
        allow_shared_secrets=allow_shared_secret(s),
        secret_flags=tuple(secrets_on_command_line(ctx.args)),
        http=s.http_limits(),
        ops=ops_serve_options(s),
        route=s.get("route", "SYNAPSE_ROUTE", "route", str),
    )
    if options.route is not None and options.handler is not None:
        raise CliError("--route and --handler exclude each other: a router runs no handler")
    if not options.partners and a2a is None:
        raise CliError(
            "no partner: give at least one --peer PARTNER_ID=CALLBACK_URL "
            "(or SYNAPSE_PEERS, or [[peer]] in --config), or serve A2A clients only with --a2a"
        )
    ctx.logging(quiet=False)
    return run_server(run_serve(options))


#: `serve`'s A2A flags, which mean nothing without `--a2a`.
A2A_SERVE_FLAGS = {
    "a2a_push_allow": "--a2a-push-allow",
    "a2a_token": "--a2a-token",
    "a2a_default_task_type": "--a2a-default-task-type",
    "a2a_public_url": "--a2a-public-url",
    "a2a_bindings": "--a2a-bindings",
    "a2a_grpc_port": "--a2a-grpc-port",
    "a2a_grpc_public_address": "--a2a-grpc-public-address",
    "a2a_token_file": "--a2a-token-file",
    "a2a_card_signing_key": "--a2a-card-signing-key",
    "a2a_card_signing_kid": "--a2a-card-signing-kid",
}


def _a2a_serve_options(s: Settings) -> A2AOptions | None:
    """`serve`'s A2A settings, or None without `--a2a` (or `SYNAPSE_A2A`, or `a2a = true`)."""
    from synapse.cli.serve import A2AOptions

    if not s.switch("a2a", "SYNAPSE_A2A", "a2a"):
        for dest, flag in A2A_SERVE_FLAGS.items():
            if getattr(s.args, dest, None) is not None:
                raise CliError(f"{flag} needs --a2a")
        return None
    push_allow = s.get_list(
        "a2a_push_allow",
        "SYNAPSE_A2A_PUSH_ALLOW",
        "a2a_push_allow",
        parse_http_url,
        flag="--a2a-push-allow",
    )
    from synapse.cli.security_settings import a2a_policy, a2a_token_file, card_signer

    tokens = dict(
        s.get_list(
            "a2a_token", "SYNAPSE_A2A_TOKENS", "a2a_tokens", parse_a2a_token, flag="--a2a-token"
        )
    )
    tokens.update(a2a_token_file(s, parse_a2a_token))
    default = s.get(
        "a2a_default_task_type", "SYNAPSE_A2A_DEFAULT_TASK_TYPE", "a2a_default_task_type", str
    )
    secret = s.default_secret()
    if push_allow and not secret:
        raise CliError(
            "--a2a-push-allow needs --secret (or SYNAPSE_SECRET): it signs every push notification"
        )
    return A2AOptions(
        default_task_type="echo" if default is None else (default.strip() or None),
        push_allow=tuple(push_allow),
        push_secret=secret if push_allow else None,
        tokens=tokens,
        public_url=s.get("a2a_public_url", "SYNAPSE_A2A_PUBLIC_URL", "a2a_public_url", parse_url),
        bindings=s.get("a2a_bindings", "SYNAPSE_A2A_BINDINGS", "a2a_bindings", parse_a2a_bindings),
        grpc_port=s.get("a2a_grpc_port", "SYNAPSE_A2A_GRPC_PORT", "a2a_grpc_port", parse_port),
        grpc_public_address=s.get(
            "a2a_grpc_public_address",
            "SYNAPSE_A2A_GRPC_PUBLIC_ADDRESS",
            "a2a_grpc_public_address",
            str,
        ),
        security=a2a_policy(s, tokens),
        card_signer=card_signer(s),
    )


def _run_send(ctx: Context) -> int:
    from synapse.cli.send import SendOptions, parse_payload
    from synapse.cli.terminal import parse_field

    args = ctx.args
    payload = parse_payload(args.payload)
    fields = dict(parse_field(item) for item in args.field)
    options = SendOptions(
        task_type=args.task_type,
        payload=payload,
        task_id=args.task_id,
        priority=Priority(args.priority or Priority.NORMAL.value),
        fields=fields,
        decision=args.decision,
        notes=args.notes,
        as_json=bool(args.json),
        timeout=args.timeout,
    )
    if args.a2a_url is not None:
        return _run_send_a2a(ctx, options)
    if args.a2a_token is not None:
        raise CliError("--a2a-token needs --a2a URL")
    if args.a2a_binding is not None:
        raise CliError("--a2a-binding needs --a2a URL")
    for dest, flag in A2A_CLIENT_FLAGS.items():
        if getattr(args, dest, None) is not None:
            raise CliError(f"{flag} needs --a2a URL")

    from synapse.cli.client import client_setup
    from synapse.cli.send import run_send

    setup = client_setup(ctx.settings, listen_required=True)
    ctx.logging(quiet=True)
    return asyncio.run(run_send(setup, options, out=ctx.out, err=ctx.err))


#: `send`'s flags that name the Synapse side of a task, refused with `--a2a`.
SYNAPSE_SEND_FLAGS = {
    "target": "--target",
    "agent_id": "--agent-id",
    "as_": "--as",
    "secret": "--secret",
    "peer_secret_file": "--peer-secret-file",
    "listen": "--listen",
    "endpoint": "--endpoint",
    "signing": "--signing",
    "task_id": "--task-id",
    "priority": "--priority",
}


def _run_send_a2a(ctx: Context, options: SendOptions) -> int:
    from synapse.cli.client import CLIENT_P2P
    from synapse.cli.security_settings import a2a_client_options
    from synapse.cli.send_a2a import run_send_a2a

    for dest, flag in SYNAPSE_SEND_FLAGS.items():
        if getattr(ctx.args, dest, None) not in (None, []):
            raise CliError(
                f"{flag} does not apply to --a2a (an A2A agent needs only its URL, and "
                "--a2a-token if it asks for one)"
            )
    s = ctx.settings
    token = s.get("a2a_token", "SYNAPSE_A2A_TOKEN", "a2a_token", str)
    binding = s.get("a2a_binding", "SYNAPSE_A2A_BINDING", "a2a_binding", parse_a2a_binding)
    config = s.p2p_config(**CLIENT_P2P)
    client_options = a2a_client_options(s)
    ctx.logging(quiet=True)
    return asyncio.run(
        run_send_a2a(
            ctx.args.a2a_url,
            token,
            options,
            config=config,
            out=ctx.out,
            err=ctx.err,
            bindings=(binding,) if binding else None,
            client_options=client_options,
        )
    )


def _run_caps(ctx: Context) -> int:
    from synapse.cli.client import client_setup
    from synapse.cli.query import run_caps

    setup = client_setup(ctx.settings, listen_required=False)
    ctx.logging(quiet=True)
    return asyncio.run(
        run_caps(setup, ctx.out, task_type=ctx.args.task_type, as_json=bool(ctx.args.json))
    )


def _run_ping(ctx: Context) -> int:
    from synapse.cli.client import client_setup
    from synapse.cli.query import run_ping

    setup = client_setup(ctx.settings, listen_required=False)
    ctx.logging(quiet=True)
    return asyncio.run(run_ping(setup, ctx.out, as_json=bool(ctx.args.json)))


def _run_outbox(ctx: Context) -> int:
    from synapse.cli.outbox import run_outbox

    args = ctx.args
    if args.action == "list" and args.message_id is not None:
        raise CliError(f"`list` takes no MESSAGE_ID (did you mean `retry {args.message_id}`?)")
    if args.action != "list" and args.message_id is None:
        raise CliError(f"`{args.action}` needs the MESSAGE_ID of a message `list` shows")
    store = ctx.settings.require("store", "SYNAPSE_STORE", "store", str, flag="--store")
    ctx.logging(quiet=True)
    return asyncio.run(
        run_outbox(store, args.action, args.message_id, out=ctx.out, as_json=bool(args.json))
    )


def _run_schema(ctx: Context) -> int:
    from synapse.types.schema import UNION_FILE, message_schemas, render

    schemas = message_schemas()
    if ctx.args.out is not None:
        directory = Path(ctx.args.out)
        try:
            directory.mkdir(parents=True, exist_ok=True)
            for name, schema in schemas.items():
                (directory / name).write_text(render(schema), encoding="utf-8")
        except OSError as exc:
            raise CliError(f"cannot write schemas to {directory}: {exc.strerror or exc}") from exc
        ctx.err.write(f"wrote {len(schemas)} schemas to {directory}\n")
        return Exit.OK
    name = UNION_FILE
    if ctx.args.type is not None:
        short = ctx.args.type.removeprefix("p2p:")
        if f"p2p:{short}" not in {t.value for t in MessageType}:
            known = ", ".join(t.short for t in MessageType)
            raise CliError(f"unknown message type {ctx.args.type!r} (one of: {known})")
        name = f"{short}.json"
    ctx.out.write(render(schemas[name]))
    return Exit.OK


def _run_demo(ctx: Context) -> int:
    from synapse.cli.demo import run_demo

    ctx.logging(quiet=True)
    signing = ctx.args.signing or "header"
    return asyncio.run(run_demo(ctx.out, signing="body" if signing == "body" else "header"))


# --- main -----------------------------------------------------------------------------------


def _unknown_command(parser: Parser, argv: list[str]) -> str | None:
    """What to say when the first word is no command (`synapse sned`): the nearest ones."""
    if not argv or argv[0].startswith("-"):
        return None
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    word = argv[0]
    if word in commands:
        return None
    near = difflib.get_close_matches(word, list(commands), n=2, cutoff=0.6)
    hint = f" (did you mean {' or '.join(repr(n) for n in near)}?)" if near else ""
    return f"unknown command {word!r}{hint}; run 'synapse --help' for the commands"


def main(
    argv: Sequence[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    env = os.environ if env is None else env
    verbose = False
    try:
        parser = build_parser()
        argv = list(sys.argv[1:] if argv is None else argv)
        unknown = _unknown_command(parser, argv)
        if unknown is not None:
            err.write(f"synapse: {unknown}\n")
            return Exit.USAGE
        args = parser.parse_args(argv)
        verbose = bool(getattr(args, "verbose", False))
        if args.command is None:
            parser.print_help(err)
            return Exit.USAGE
        if not hasattr(args, "run"):  # a command that parses its own settings (conformance)
            func: Callable[[argparse.Namespace], int] = args.func
            return int(func(args))
        run: Callable[[Context], int] = args.run
        return int(run(Context(args, env, out, err)))
    except CliError as exc:
        err.write(f"synapse: {exc.message}\n")
        return int(exc.status)
    except KeyboardInterrupt:
        err.write("synapse: interrupted\n")
        return 130
    except BrokenPipeError:
        # The reader went away (`synapse schema | head`): nothing left to say to anyone.
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return Exit.OK
    except Exception as exc:
        if verbose:
            traceback.print_exc(file=err)
        err.write(
            f"synapse: internal error: {type(exc).__name__}: {exc} "
            "(run with --verbose for the traceback)\n"
        )
        return Exit.INTERNAL


if __name__ == "__main__":
    sys.exit(main())
