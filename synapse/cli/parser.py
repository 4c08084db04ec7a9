"""The `synapse` command's argument parser: every subcommand, flag and help text
(`build_parser`). A flag means the same in every subcommand that has it; `synapse.cli.main`
runs what it parses.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from synapse import __version__
from synapse.cli.audit import add_audit_key_argument
from synapse.cli.errors import CliError, Exit
from synapse.cli.flags import (
    EXAMPLES,
    PEER_CONFIG,
    PEER_VERBOSE,
    QUIET_VERBOSE,
    STORE_CONFIG,
    HelpFormatter,
    add_output_flags,
    add_secret_options,
    add_signing_options,
    epilog,
)
from synapse.cli.logs import LEVELS
from synapse.cli.mcp_flags import add_mcp_parser
from synapse.cli.ops import add_ops_arguments
from synapse.cli.options import (
    A2A,
    A2A_BINDING,
    A2A_BINDINGS,
    A2A_DEFAULT_TASK_TYPE,
    A2A_EXTENSIONS,
    A2A_GRPC_PORT,
    A2A_GRPC_PUBLIC_ADDRESS,
    A2A_PUBLIC_URL,
    A2A_PUSH_ALLOW,
    A2A_PUSH_DISABLE_AFTER,
    A2A_REQUIRED_EXTENSIONS,
    A2A_TENANTS,
    A2A_TOKEN,
    A2A_TOKENS,
    A2A_V03_CARD,
    AGENT_ID,
    AS,
    DRAIN_TIMEOUT,
    ENDPOINT,
    HANDLER,
    HANDLER_MCP,
    HOST,
    LEASE_TTL,
    LISTEN,
    LOG_LEVEL,
    MAX_TASKS_PER_PARTNER,
    PEER,
    PORT,
    RATE_LIMIT,
    RETAIN,
    ROUTE,
    SIGNING,
    STORE,
    TARGET,
    add_setting,
)
from synapse.cli.parsers import (
    parse_url,
    parse_when,
)
from synapse.cli.security_settings import (
    add_a2a_client_flags,
    add_a2a_serve_flags,
    add_tls_flags,
)
from synapse.p2p.durations import parse_duration
from synapse.types import Priority

if TYPE_CHECKING:
    pass


class Parser(argparse.ArgumentParser):
    """argparse, with usage errors as one line (and exit status 2) instead of usage + error."""

    #: The subcommands' names (set on the top-level parser by `build_parser`).
    command_names: tuple[str, ...] = ()

    def error(self, message: str) -> NoReturn:
        raise CliError(f"{message} (see '{self.prog} --help')", Exit.USAGE)

    def parse_command_line(self, argv: Sequence[str]) -> argparse.Namespace:
        """`parse_args`, but an unknown flag points to its command's help: argparse finds it
        only once the command's parser is done, and reports it as the top-level parser's."""
        args, extras = self.parse_known_args(argv)
        if extras:
            command = getattr(args, "command", None)
            prog = f"{self.prog} {command}" if command else self.prog
            raise CliError(
                f"unrecognized arguments: {' '.join(extras)} (see '{prog} --help')", Exit.USAGE
            )
        return args

    def commands(self) -> Mapping[str, argparse.ArgumentParser]:
        """The subcommands and their parsers (empty for a parser without any)."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                return dict(action.choices)
        return {}


def _typed(parse: Callable[[str], Any], name: str) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc

    convert.__name__ = name
    return convert


URL = _typed(parse_url, "URL")
DURATION = _typed(parse_duration, "duration")
WHEN = _typed(parse_when, "deadline")

EPILOG = "Exit status: 0 success, 1 task failed/rejected/cancelled, 2 usage or connection error."


def _client(parser: argparse.ArgumentParser, *, listen_help: str) -> None:
    group = parser.add_argument_group("who talks to whom")
    add_setting(group, TARGET)
    add_setting(group, AGENT_ID)
    add_setting(group, AS)
    add_secret_options(group)
    group.add_argument(
        LISTEN.flag,
        dest=LISTEN.dest,
        type=LISTEN.argument_type(),
        metavar="HOST:PORT",
        help=listen_help,
    )
    add_setting(group, ENDPOINT)
    add_signing_options(group)
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    add_tls_flags(parser)


def build_parser(runs: Mapping[str, Callable[[Any], int]]) -> Parser:
    """The parser; `runs` maps each command (`serve`, `send`, `caps`, `ping`, `outbox`,
    `schema`, `demo`) to the function that runs it (`synapse.cli.main`)."""
    parser = Parser(
        prog="synapse",
        description="Synapse agent-to-agent P2P protocol: serve a peer, send it tasks, "
        "watch the flows.",
        epilog="Run 'synapse COMMAND --help' for a command's options. " + EPILOG,
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"synapse {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)

    _add_serve(commands, runs)
    _add_send(commands, runs)
    _add_queries(commands, runs)
    _add_outbox(commands, runs)
    _add_audit(commands, runs)
    _add_schema(commands, runs)
    _add_demo(commands, runs)

    if "mcp" in runs:
        add_mcp_parser(commands, runs["mcp"])

    from synapse.cli.migrate import add_parser as add_migrate

    add_migrate(commands)  # `synapse migrate` parses its own flags (PostgreSQL store)

    try:  # `synapse conformance` lives with the conformance kit, which owns its flags
        from synapse.conformance.cli import add_parser as add_conformance
    except ImportError:
        pass
    else:
        add_conformance(commands)
        # Its texts are laid out for `python -m synapse.conformance`; here they read as every
        # other command's do.
        commands.choices["conformance"].formatter_class = HelpFormatter
    parser.command_names = tuple(commands.choices)
    return parser


def _add_serve(commands: Any, runs: Mapping[str, Callable[[Any], int]]) -> None:
    """`synapse serve`: run a peer."""
    serve = commands.add_parser(
        "serve",
        help="run a peer: serve POST /synapse/callback with a TaskHandler",
        description="Run a peer that serves POST /synapse/callback on HOST:PORT with the demo "
        "handler (or --handler), until SIGINT or SIGTERM. Logs go to stderr; the first line "
        "is `listening` with the URL.",
        epilog=epilog(
            "Exit status: 0 stopped by SIGINT or SIGTERM, 2 usage error or the port cannot be "
            "bound.",
            EXAMPLES["serve"],
        ),
        formatter_class=HelpFormatter,
    )
    group = serve.add_argument_group("identity and partners")
    add_setting(group, AGENT_ID, help="our agent id")
    add_setting(group, PORT)
    add_setting(group, HOST)
    add_setting(
        group,
        ENDPOINT,
        help="our callback URL as partners see it (default http://HOST:PORT/synapse/callback)",
    )
    add_secret_options(group, serve=True)
    add_setting(group, PEER)
    group = serve.add_argument_group("behaviour")
    add_setting(group, STORE)
    add_setting(group, HANDLER)
    add_setting(group, HANDLER_MCP)
    add_signing_options(group)
    group = serve.add_argument_group(
        "running for months (docs/durability.md in the Synapse repository)"
    )
    add_setting(group, RETAIN)
    add_setting(group, DRAIN_TIMEOUT)
    add_setting(group, LEASE_TTL)
    add_setting(group, RATE_LIMIT)
    add_setting(group, MAX_TASKS_PER_PARTNER)
    group = serve.add_argument_group("A2A (docs/a2a.md in the Synapse repository)")
    add_setting(group, A2A)
    add_setting(group, A2A_PUSH_ALLOW)
    add_setting(group, A2A_TOKENS)
    add_setting(group, A2A_PUSH_DISABLE_AFTER)
    add_setting(group, A2A_V03_CARD)
    add_setting(group, A2A_TENANTS)
    add_setting(group, A2A_EXTENSIONS)
    add_setting(group, A2A_REQUIRED_EXTENSIONS)
    add_setting(group, A2A_DEFAULT_TASK_TYPE)
    add_setting(group, A2A_PUBLIC_URL)
    add_setting(group, A2A_BINDINGS)
    add_setting(group, A2A_GRPC_PORT)
    add_setting(group, A2A_GRPC_PUBLIC_ADDRESS)
    add_a2a_serve_flags(group)
    add_tls_flags(serve)
    add_ops_arguments(serve)
    add_audit_key_argument(serve, verify=False)
    group = serve.add_argument_group("routing (docs/routing.md in the Synapse repository)")
    add_setting(group, ROUTE)
    add_output_flags(serve, config_holds=PEER_CONFIG, verbose_logs=PEER_VERBOSE)
    serve.add_argument(
        LOG_LEVEL.flag,
        dest=LOG_LEVEL.dest,
        type=LOG_LEVEL.argument_type(),
        metavar="{" + ",".join(LEVELS) + "}",
        help="info (default): startup, one line a task with its outcome, refusals, retries, "
        "warnings; debug adds every message and transition ($SYNAPSE_LOG_LEVEL)",
    )
    serve.set_defaults(run=runs["serve"])


def _add_send(commands: Any, runs: Mapping[str, Callable[[Any], int]]) -> None:
    """`synapse send`: request a task and follow it."""
    send = commands.add_parser(
        "send",
        help="request a task and follow it to its end",
        description="Request one task of the executor at --target and follow it: progress, "
        "questions (--field, --approve/--reject, else asked on the terminal or read from "
        "stdin lines), and the result on stdout. Ctrl-C cancels the task.",
        epilog=epilog(
            "Exit status: 0 completed, 1 failed/rejected/cancelled, 2 usage or connection "
            "error or refused request.",
            EXAMPLES["send"],
        ),
        formatter_class=HelpFormatter,
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
        "--deadline",
        type=WHEN,
        metavar="WHEN",
        help="the task's deadline, sent with it: a duration from now (30s, 15m, 2h) or an RFC "
        "3339 time with its offset; the executor fails the task with execution_timeout once "
        "it passes (default: none)",
    )
    group.add_argument(
        "--priority",
        choices=[p.value for p in Priority],
        help="the task's priority (default normal)",
    )
    group = send.add_argument_group(
        "A2A (docs/a2a.md in the Synapse repository)",
        "With --a2a-agent URL the task goes to that A2A v1.0 agent instead: --target, --agent-id, "
        "--as, --secret, --peer-secret-file, --listen, --endpoint, --signing, --task-id and "
        "--priority have no meaning there and are refused as flags (their environment and "
        "config values are ignored).",
    )
    group.add_argument(
        "--a2a-agent",
        type=URL,
        metavar="URL",
        dest="a2a_url",
        help="send to the A2A agent at URL (its base URL or its agent card's URL)",
    )
    # Its first name, kept working for scripts; not shown: in `serve`, `--a2a` is a switch.
    group.add_argument("--a2a", type=URL, dest="a2a_url", help=argparse.SUPPRESS)
    add_setting(group, A2A_TOKEN)
    add_setting(group, A2A_BINDING)
    add_a2a_client_flags(group)
    add_output_flags(send, config_holds=PEER_CONFIG, verbose_logs=PEER_VERBOSE)
    send.set_defaults(run=runs["send"])


def _add_queries(commands: Any, runs: Mapping[str, Callable[[Any], int]]) -> None:
    """`synapse caps` and `synapse ping`: one exchange each."""
    for name, summary, examples in (
        (
            "caps",
            "ask an executor for its capabilities (capability_query)",
            [
                "synapse caps --config r.toml",
                "synapse caps --config r.toml --task-type echo --json",
            ],
        ),
        (
            "ping",
            "send a heartbeat; print the round trip and the partner's status",
            EXAMPLES["ping"],
        ),
    ):
        sub = commands.add_parser(
            name,
            help=summary,
            description=summary[0].upper() + summary[1:] + ".",
            epilog=epilog(
                "Exit status: 0 answered, 2 usage or connection error or a refused request.",
                examples,
            ),
            formatter_class=HelpFormatter,
        )
        _client(
            sub,
            listen_help="our address, if our callback URL is http://HOST:PORT/synapse/callback "
            "(nothing listens there: the answer is the HTTP reply; $SYNAPSE_LISTEN)",
        )
        if name == "caps":
            sub.add_argument("--task-type", metavar="TYPE", help="only this capability")
        add_output_flags(sub, config_holds=PEER_CONFIG, verbose_logs="log every HTTP attempt")
        sub.set_defaults(run=runs["caps"] if name == "caps" else runs["ping"])


def _add_outbox(commands: Any, runs: Mapping[str, Callable[[Any], int]]) -> None:
    """`synapse outbox`: the undelivered messages of a store."""
    outbox = commands.add_parser(
        "outbox",
        help="list, retry or drop the undelivered messages of a --store file",
        description="Work on the outbox of a peer's SQLite store, offline (the peer need not "
        "run): `list` (the default) shows the messages not yet delivered and the dead letters; "
        "`retry MESSAGE_ID` makes a dead letter pending again (delivered at the peer's next "
        "start); `drop MESSAGE_ID` deletes a pending message or a dead letter for good.",
        epilog=epilog(
            "Exit status: 0 done, 2 usage error, no store at PATH or an unknown MESSAGE_ID.",
            EXAMPLES["outbox"],
        ),
        formatter_class=HelpFormatter,
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
    add_setting(
        outbox, STORE, help="the SQLite file of `synapse serve --store PATH`", metavar="PATH"
    )
    outbox.add_argument("--json", action="store_true", help="print JSON lines instead of a table")
    add_output_flags(outbox, config_holds=STORE_CONFIG, verbose_logs=QUIET_VERBOSE)
    outbox.set_defaults(run=runs["outbox"])


def _add_audit(commands: Any, runs: Mapping[str, Callable[[Any], int]]) -> None:
    """`synapse audit`: a task's audit trail."""
    audit = commands.add_parser(
        "audit",
        help="print a task's audit trail and verify its hash chain",
        description="Print the audit trail of task TASK_ID from a store (who was told, who "
        "opened which link, who decided what) and verify its hash chain: each entry carries "
        "the digest of the one before, so a changed, removed or moved entry is found where it "
        "is. `--head` checks that the chain still holds a digest printed before (so that "
        "entries removed from its end are found too).",
        epilog=epilog(
            "Exit status: 0 the chain holds, 1 it is broken, 2 usage error or no such task.",
            EXAMPLES["audit"],
        ),
        formatter_class=HelpFormatter,
    )
    audit.add_argument("task_id", metavar="TASK_ID", help="the task's id")
    add_setting(
        audit,
        STORE,
        help="the store of `synapse serve --store SPEC`: an SQLite file or a postgresql:// URL",
        metavar="SPEC",
    )
    audit.add_argument(
        "--requester", metavar="AGENT_ID", help="whose task, if several agents used TASK_ID"
    )
    audit.add_argument(
        "--export", metavar="FILE", help="also write the entries as JSON Lines to FILE"
    )
    audit.add_argument(
        "--head", metavar="DIGEST", help="a digest the chain must still hold (kept elsewhere)"
    )
    add_audit_key_argument(audit, verify=True)
    add_output_flags(audit, config_holds=STORE_CONFIG, verbose_logs=QUIET_VERBOSE)
    audit.set_defaults(run=runs["audit"])


def _add_schema(commands: Any, runs: Mapping[str, Callable[[Any], int]]) -> None:
    """`synapse schema`: the messages' JSON Schema."""
    schema = commands.add_parser(
        "schema",
        help="print the JSON Schema of the messages",
        description="Print the JSON Schema of every message (the union, discriminated by "
        "`type`), of one TYPE, or write one file per schema into --out DIR.",
        epilog=epilog(
            "Exit status: 0 printed (or written), 2 usage error or an unknown TYPE.",
            EXAMPLES["schema"],
        ),
        formatter_class=HelpFormatter,
    )
    schema.add_argument(
        "type", metavar="TYPE", nargs="?", help="one message type, e.g. task_request"
    )
    schema.add_argument("--out", metavar="DIR", help="write message.json and <type>.json here")
    add_output_flags(schema, config_holds="settings", verbose_logs=QUIET_VERBOSE)
    schema.set_defaults(run=runs["schema"])


def _add_demo(commands: Any, runs: Mapping[str, Callable[[Any], int]]) -> None:
    """`synapse demo`: every flow between two peers in this process."""
    demo = commands.add_parser(
        "demo",
        help="two peers in this process walk through every flow, printed as a timeline",
        description="Start two peers on loopback ports and run the flows of "
        "specs/protocol.md, 'Flows' between them (normal, progress, need_info, need_human, "
        "cancel), a failure and a rejection, printing every message with each side's state. "
        "Takes about a second.",
        epilog=epilog(
            "Exit status: 0 every flow ran, 2 usage error (or no loopback port to listen on).",
            EXAMPLES["demo"],
        ),
        formatter_class=HelpFormatter,
    )
    add_setting(demo, SIGNING)
    add_output_flags(demo, config_holds="settings", verbose_logs=QUIET_VERBOSE)
    demo.set_defaults(run=runs["demo"])
