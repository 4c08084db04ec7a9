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
from typing import TYPE_CHECKING, Any, TextIO

from synapse.cli.errors import CliError, Exit
from synapse.cli.logs import configure_logging
from synapse.cli.ops import ops_serve_options
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
    AUDIT_KEY_FILE,
    DRAIN_TIMEOUT,
    ENDPOINT,
    HANDLER,
    HANDLER_MCP,
    HOST,
    LEASE_TTL,
    LOG_JSON,
    LOG_LEVEL,
    MAX_TASKS_PER_PARTNER,
    PORT,
    RATE_LIMIT,
    RETAIN,
    ROUTE,
    SIGNING,
    STORE,
    VERBOSE,
)
from synapse.cli.parsers import (
    parse_a2a_token,
)
from synapse.cli.security_settings import (
    A2A_CLIENT_FLAGS,
)
from synapse.cli.settings import Missing, Settings
from synapse.p2p.config import P2PConfig
from synapse.types import MessageType, Priority

if TYPE_CHECKING:
    from synapse.cli.conversation import SendOptions
    from synapse.cli.serve import A2AOptions


from synapse.cli import parser as cli_parser
from synapse.cli.parser import Parser

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
        self.settings.warnings = err

    def logging(self, *, quiet: bool) -> None:
        """Logs on stderr; client commands stay quiet unless --verbose."""
        verbose = self.settings.get(VERBOSE, False)
        as_json = self.settings.get(LOG_JSON, False)
        level = self.settings.get(LOG_LEVEL)
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
            "retain": s.get(RETAIN),
            "drain_timeout": s.get(DRAIN_TIMEOUT),
            "lease_ttl": s.get(LEASE_TTL),
            "rate_limit": s.get(RATE_LIMIT),
            "max_tasks_per_partner": s.get(MAX_TASKS_PER_PARTNER),
        }
    )


def _run_serve(ctx: Context) -> int:
    from synapse.cli.audit import audit_keys
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
        a2a = dataclasses.replace(a2a, grpc_host=s.get(HOST) or "127.0.0.1")
    missing = Missing()
    agent_id = s.wanted(AGENT_ID, missing, "ID", "our agent id, as partners know us")
    port = s.wanted(PORT, missing, "PORT", "the port to listen on; 0 picks a free one")
    missing.check()
    assert agent_id is not None and port is not None
    options = ServeOptions(
        agent_id=agent_id,
        host=s.get(HOST) or "127.0.0.1",
        port=port,
        endpoint=s.get(ENDPOINT),
        partners=s.partners(),
        handler=s.get(HANDLER),
        handler_mcp=s.get(HANDLER_MCP),
        store=s.get(STORE) or "memory",
        signing="body" if s.get(SIGNING) == "body" else "header",
        config=serve_p2p_config(s),
        a2a=a2a,
        tls=tls_config(s, serving=True),
        allow_shared_secrets=allow_shared_secret(s),
        secret_flags=tuple(secrets_on_command_line(ctx.args)),
        http=s.http_limits(),
        ops=ops_serve_options(s),
        route=s.get(ROUTE),
        humans=s.humans_config(),
        audit_keys=audit_keys(s.get_list(AUDIT_KEY_FILE)),
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
    "a2a_tenant": "--a2a-tenant",
    "a2a_push_disable_after": "--a2a-push-disable-after",
    "a2a_v03_card": "--a2a-v03-card",
    "a2a_extension": "--a2a-extension",
    "a2a_required_extension": "--a2a-required-extension",
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

    if not s.switch(A2A):
        for dest, flag in A2A_SERVE_FLAGS.items():
            if getattr(s.args, dest, None) is not None:
                raise CliError(f"{flag} needs --a2a")
        return None
    push_allow = s.get_list(A2A_PUSH_ALLOW)
    from synapse.cli.security_settings import a2a_policy, a2a_token_file, card_signer

    tokens = dict(s.get_list(A2A_TOKENS))
    tokens.update(a2a_token_file(s, parse_a2a_token))
    default = s.get(A2A_DEFAULT_TASK_TYPE)
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
        public_url=s.get(A2A_PUBLIC_URL),
        bindings=s.get(A2A_BINDINGS),
        grpc_port=s.get(A2A_GRPC_PORT),
        grpc_public_address=s.get(A2A_GRPC_PUBLIC_ADDRESS),
        security=a2a_policy(s, tokens),
        card_signer=card_signer(s),
        tenants=_tenants(s.get_list(A2A_TENANTS)),
        push_disable_after=s.get(A2A_PUSH_DISABLE_AFTER),
        card_v03_members=s.switch(A2A_V03_CARD),
        extensions=_extensions(s.get_list(A2A_EXTENSIONS), s.get_list(A2A_REQUIRED_EXTENSIONS)),
    )


def _extensions(optional: list[str], required: list[str]) -> tuple[Any, ...]:
    """`--a2a-extension` and `--a2a-required-extension` URIs → the extensions declared (the
    A2A samples' timestamp extension with its stamp)."""
    from synapse.a2a.server.extensions import TIMESTAMP_URI, Extension, timestamp_extension

    both = set(optional) & set(required)
    if both:
        raise CliError(f"{sorted(both)[0]} is given as optional and as required")
    made: list[Any] = []
    for uri, needed in [*((u, False) for u in optional), *((u, True) for u in required)]:
        if uri in (e.uri for e in made):
            continue
        made.append(
            timestamp_extension(required=needed)
            if uri == TIMESTAMP_URI
            else Extension(uri, required=needed)
        )
    return tuple(made)


def _tenants(pairs: list[tuple[str, str]]) -> dict[str, list[str]] | None:
    """NAME=TENANT pairs → principal → its tenants (None: none given, any tenant goes)."""
    if not pairs:
        return None
    allowed: dict[str, list[str]] = {}
    for name, tenant in pairs:
        allowed.setdefault(name, []).append(tenant)
    return allowed


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
        deadline=args.deadline,
    )
    if args.a2a_url is not None:
        return _run_send_a2a(ctx, options)
    if args.a2a_token is not None:
        raise CliError("--a2a-token needs --a2a-agent URL")
    if args.a2a_binding is not None:
        raise CliError("--a2a-binding needs --a2a-agent URL")
    for dest, flag in A2A_CLIENT_FLAGS.items():
        if getattr(args, dest, None) is not None:
            raise CliError(f"{flag} needs --a2a-agent URL")

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
    "deadline": "--deadline",
}


def _run_send_a2a(ctx: Context, options: SendOptions) -> int:
    from synapse.cli.client import CLIENT_P2P
    from synapse.cli.security_settings import a2a_client_options
    from synapse.cli.send_a2a import run_send_a2a

    for dest, flag in SYNAPSE_SEND_FLAGS.items():
        if getattr(ctx.args, dest, None) not in (None, []):
            raise CliError(
                f"{flag} does not apply to --a2a-agent (an A2A agent needs only its URL, and "
                "--a2a-token if it asks for one)"
            )
    s = ctx.settings
    token = s.get(A2A_TOKEN)
    binding = s.get(A2A_BINDING)
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
    store = ctx.settings.require(STORE)
    ctx.logging(quiet=True)
    return asyncio.run(
        run_outbox(store, args.action, args.message_id, out=ctx.out, as_json=bool(args.json))
    )


def _run_audit(ctx: Context) -> int:
    from synapse.cli.audit import audit_keys, run_audit

    args = ctx.args
    store = ctx.settings.require(STORE)
    keys = audit_keys(ctx.settings.get_list(AUDIT_KEY_FILE))
    ctx.logging(quiet=True)
    return run_audit(
        store,
        args.task_id,
        requester=args.requester,
        export=args.export,
        head=args.head,
        out=ctx.out,
        keys=keys,
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
    signing = ctx.settings.get(SIGNING) or "header"
    return asyncio.run(run_demo(ctx.out, signing="body" if signing == "body" else "header"))


def _run_mcp(ctx: Context) -> int:
    from synapse.cli.mcp_server import mcp_options, run_mcp

    options = mcp_options(ctx.settings)
    ctx.logging(quiet=False)  # on stderr: over stdio, stdout is the MCP channel
    return asyncio.run(run_mcp(options, err=ctx.err))


def build_parser() -> Parser:
    """The `synapse` command's parser, each command bound to the function that runs it."""
    return cli_parser.build_parser(
        {
            "serve": _run_serve,
            "send": _run_send,
            "caps": _run_caps,
            "ping": _run_ping,
            "outbox": _run_outbox,
            "audit": _run_audit,
            "schema": _run_schema,
            "demo": _run_demo,
            "mcp": _run_mcp,
        }
    )


# --- main -----------------------------------------------------------------------------------


def _unknown_command(parser: Parser, argv: list[str]) -> str | None:
    """What to say when the first word is no command (`synapse sned`): the nearest ones."""
    if not argv or argv[0].startswith("-"):
        return None
    commands = parser.commands()
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
        args = parser.parse_command_line(argv)
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
