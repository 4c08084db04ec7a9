"""`synapse serve`: the reference peer of specs/protocol.md, 'The `synapse serve` command line',
until SIGINT or SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib
import os
import signal
import sqlite3
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from synapse._distribution import install
from synapse.cli.client import start_peer
from synapse.cli.errors import CliError, Exit
from synapse.cli.ops import OpsOptions, log_console, serve_ops
from synapse.cli.parsers import is_loopback
from synapse.demo.handler import DemoHandler
from synapse.humans import HumansConfig, enable_humans
from synapse.logs import get_logger
from synapse.p2p.audit import AuditKeys
from synapse.p2p.config import P2PConfig
from synapse.runtime.dump import dump
from synapse.runtime.handler import TaskHandler
from synapse.store import TaskStore, is_postgres_url, open_store
from synapse.transport.client import SenderMode
from synapse.transport.guard import HttpLimits
from synapse.transport.partners import Partner
from synapse.transport.peer import Peer
from synapse.types import LocalProtocolError

if TYPE_CHECKING:
    from synapse.a2a import A2AServer
    from synapse.mcp.handler import McpToolsHandler
    from synapse.router import Router
    from synapse.transport.tls import TLSConfig

log = get_logger("synapse.cli")


@dataclass(frozen=True, slots=True)
class A2AOptions:
    """`serve --a2a`: the arguments of `synapse.a2a.enable_a2a` (docs/a2a.md)."""

    default_task_type: str | None = "echo"
    push_allow: tuple[str, ...] = ()
    #: Signs push notifications: the serve secret (`--secret`).
    push_secret: str | None = None
    #: Bearer token → principal name; empty: no authentication.
    tokens: Mapping[str, str] = field(default_factory=dict)
    public_url: str | None = None
    #: The schemes enforced (`synapse.a2a.server.security.SecurityPolicy`), if more than `tokens`.
    security: Any = None
    #: Signs the card (`synapse.a2a.card_signing.CardSigner`).
    card_signer: Any = None
    #: The bindings served, in the card's order of preference (None: the default order).
    bindings: tuple[str, ...] | None = None
    #: Serve gRPC on this port (0: any free one) of this host.
    grpc_port: int | None = None
    grpc_host: str = "127.0.0.1"
    #: The `host:port` the card gives for gRPC (default: the public URL's host, that port).
    grpc_public_address: str | None = None
    #: Principal → the tenants it may name (None: any tenant is the caller's own namespace).
    tenants: Mapping[str, list[str]] | None = None
    #: Disable a push configuration whose last N attempts failed (None: never).
    push_disable_after: int | None = None
    #: `--a2a-v03-card`: the 0.3 members on the 1.0 card too.
    card_v03_members: bool = False
    #: The A2A extensions declared (`synapse.a2a.server.extensions.Extension`).
    extensions: tuple[Any, ...] = ()


@dataclass(frozen=True, slots=True)
class ServeOptions:
    agent_id: str
    host: str
    port: int
    endpoint: str | None
    partners: list[Partner]
    handler: str | None
    store: str
    signing: SenderMode
    config: P2PConfig
    a2a: A2AOptions | None = None
    tls: TLSConfig | None = None
    allow_shared_secrets: bool = False
    #: Flags of this run that carried a secret itself (warned about: `ps` shows them).
    secret_flags: tuple[str, ...] = ()
    http: HttpLimits = field(default_factory=HttpLimits)
    ops: OpsOptions = field(default_factory=OpsOptions)
    #: `--route POOL.toml`: be a router over that pool (docs/routing.md).
    route: str | None = None
    #: `--handler-mcp COMMAND|URL`: the tools of that MCP server are the task types.
    handler_mcp: str | None = None
    #: `[humans]` and `[[notify]]` of the config file: people told of questions.
    humans: HumansConfig | None = None
    #: `--audit-key-file`: the secrets audit trails are keyed with (None: unkeyed).
    audit_keys: AuditKeys | None = None


def load_handler(spec: str | None) -> TaskHandler:
    """`MODULE:ATTR` → a `TaskHandler` (a class is instantiated); the demo handler by default."""
    if spec is None:
        return DemoHandler()
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise CliError(f"bad --handler {spec!r}: expected MODULE:ATTR, e.g. mypkg.handlers:Mine")
    # Like other servers (uvicorn, gunicorn), find modules of the current directory too.
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        target: object = importlib.import_module(module_name)
    except ImportError as exc:
        raise CliError(f"cannot import handler module {module_name!r}: {exc}") from exc
    except Exception as exc:
        raise CliError(f"importing handler module {module_name!r} failed: {exc!r}") from exc
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError as exc:
            raise CliError(f"handler {spec!r}: {module_name} has no {attr!r}") from exc
    if isinstance(target, type):
        try:
            target = target()
        except Exception as exc:
            raise CliError(f"handler {spec!r}: creating it failed: {exc!r}") from exc
    if isinstance(target, TaskHandler):
        return target
    from synapse.frameworks import as_handler, framework_of

    if framework_of(target) is None:
        raise CliError(
            f"handler {spec!r} is not a TaskHandler (it needs execute_task, validate_task and "
            "get_capabilities), nor a Pydantic AI agent, a LangGraph graph or an OpenAI agent"
        )
    try:
        return as_handler(target)
    except ImportError as exc:  # the framework is there, the adapter's needs are not
        raise CliError(f"handler {spec!r}: {exc}") from exc


def freeze_startup_heap() -> None:
    """Move everything alive after start-up (modules, the restored tasks) out of the
    collector's reach: a full collection then scans only what was made since, and stays short
    however large the start-up heap was (`gc.freeze`). For a long-running process only."""
    gc.collect()
    gc.freeze()


def _enable_replicas(peer: Peer, store: TaskStore, ttl: float) -> Callable[[], object]:
    """On a store replicas can share (PostgreSQL's) this process is one replica of the agent
    (docs/deploy.md)."""
    from synapse.store.shared import SharedStore

    if not isinstance(store, SharedStore):
        return lambda: None
    from synapse.transport.replicas import enable_replicas

    return enable_replicas(peer, store, ttl=ttl)


def serve_route(peer: Peer, path: str) -> Router:
    """`Router(peer, PoolConfig.load(path))`, before the peer starts; a bad pool is one line."""
    from synapse.router import PoolConfig, Router

    try:
        return Router(peer, PoolConfig.load(path))
    except OSError as exc:
        raise CliError(f"cannot read pool {path!r}: {exc}") from exc
    except ValueError as exc:
        raise CliError(f"bad pool {path!r}: {exc}") from exc


async def start_mcp_tools(spec: str) -> McpToolsHandler:
    """`--handler-mcp`: connect to the MCP server and list its tools, or say why not."""
    try:
        from synapse.mcp.handler import McpToolsHandler
    except ImportError as exc:
        raise CliError(f"--handler-mcp needs the MCP SDK: {install('mcp')} ({exc})") from exc
    try:
        handler = McpToolsHandler(spec)
        await handler.start()
    except (ValueError, ConnectionError, TimeoutError) as exc:
        raise CliError(f"--handler-mcp {spec!r}: {exc}") from exc
    return handler


def open_task_store(spec: str) -> TaskStore:
    try:
        return open_store(spec)
    except (sqlite3.Error, OSError, RuntimeError) as exc:
        why = store_path_problem(spec) or str(exc)
        raise CliError(f"cannot open store {spec!r}: {why}") from exc
    except Exception as exc:  # psycopg's errors (the module is optional)
        if type(exc).__module__.startswith("psycopg"):
            raise CliError(f"cannot open store {spec!r}: {str(exc).strip()}") from exc
        raise


def store_path_problem(spec: str) -> str | None:
    """Why an SQLite store at `spec` cannot be opened, when its path says so (SQLite itself
    says only "unable to open database file", for a missing folder and a read-only one alike)."""
    if spec == "memory" or is_postgres_url(spec):
        return None
    path = Path(spec).expanduser()
    folder = path.parent.resolve()
    if not folder.exists():
        return f"its folder {folder} does not exist (create it, or give another --store)"
    if not folder.is_dir():
        return f"{folder} is not a folder"
    if path.exists() and not os.access(path, os.R_OK | os.W_OK):
        return "the file is read-only for this user"
    if not os.access(folder, os.W_OK | os.X_OK):
        return (
            f"its folder {folder} is read-only for this user (SQLite creates the file and "
            "its journal there)"
        )
    return None


def serve_a2a(peer: Peer, options: A2AOptions) -> A2AServer:
    """`enable_a2a(peer, ...)`, before the peer starts; a bad setting is one line."""
    from synapse.a2a import enable_a2a

    try:
        return enable_a2a(
            peer,
            default_task_type=options.default_task_type,
            push_allowlist=options.push_allow,
            push_secret=options.push_secret,
            # The policy holds the tokens as its `bearer` scheme when there is one.
            tokens=(dict(options.tokens) or None) if options.security is None else None,
            public_url=options.public_url,
            security=options.security,
            card_signer=options.card_signer,
            bindings=options.bindings,
            grpc_port=options.grpc_port,
            grpc_host=options.grpc_host,
            grpc_public_address=options.grpc_public_address,
            tenants=options.tenants,
            push_disable_after=options.push_disable_after,
            card_v03_members=options.card_v03_members,
            extensions=options.extensions,
        )
    except ValueError as exc:
        raise CliError(f"bad A2A settings: {exc}") from exc


def anonymous_a2a(host: str, a2a: A2AOptions) -> bool:
    """True if A2A clients beyond this machine are served with no authentication at all."""
    return not is_loopback(host) and not a2a.tokens and a2a.security is None


async def run_serve(options: ServeOptions) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    stop_now = asyncio.Event()
    received: list[str] = []

    def on_signal(signum: signal.Signals) -> None:
        received.append(signum.name)
        if stop.is_set():
            stop_now.set()  # a second signal: stop at once
        stop.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
    dumped: list[Peer] = []

    def on_dump() -> None:
        # What a hang is waiting on, for whoever looks (kill -USR1 PID): nothing changes.
        runtime = None
        with contextlib.suppress(LocalProtocolError):  # not started yet
            runtime = dumped[0].protocol if dumped else None
        sys.stderr.write(dump(runtime))
        sys.stderr.flush()

    loop.add_signal_handler(signal.SIGUSR1, on_dump)
    mcp_tools = await start_mcp_tools(options.handler_mcp) if options.handler_mcp else None
    handler = mcp_tools or load_handler(options.handler)
    store = open_task_store(options.store)
    peer = Peer(
        options.agent_id,
        partners=options.partners,
        handler=handler,
        host=options.host,
        port=options.port,
        endpoint=options.endpoint,
        config=options.config,
        signing_mode=options.signing,
        store=store,
        tls=options.tls,
        allow_shared_secrets=options.allow_shared_secrets,
        http_limits=options.http,
    )
    dumped.append(peer)
    if options.audit_keys is not None:
        keys = options.audit_keys
        peer.protocol_hooks.append(lambda protocol: setattr(protocol, "audit_keys", keys))
    _enable_replicas(peer, store, options.config.lease_ttl)  # no-op unless PostgreSQL
    try:
        # The router first: it becomes the peer's handler, which the A2A card describes.
        router = serve_route(peer, options.route) if options.route is not None else None
        a2a = serve_a2a(peer, options.a2a) if options.a2a is not None else None
        humans = enable_humans(peer, options.humans) if options.humans is not None else None
        console_token = serve_ops(peer, options.ops, a2a, humans)
        await start_peer(peer, (options.host, options.port))  # logs `listening` first
        if humans is not None:
            await humans.start()
            log.info(
                "serving_humans",
                routes=[r.name for r in humans.config.routes],
                channels=sorted(humans.config.channels),
                links=humans.public_url() + humans.config.path + "/links/",
            )
        if router is not None:
            await router.start()
            log.info("serving_routes", pool=options.route, partners=router.status())
        freeze_startup_heap()
        log.info(
            "serving",
            agent_id=options.agent_id,
            partners=[p.agent_id for p in options.partners],
            handler=options.handler
            or (f"mcp:{options.handler_mcp}" if options.handler_mcp else None)
            or ("synapse.router" if options.route else "synapse.demo.handler:DemoHandler"),
            store=options.store,
            signing=options.signing,
            tls=options.tls is not None and options.tls.serves_tls,
            mtls=options.tls is not None and options.tls.requires_client_cert,
            event_loop=type(loop).__module__,
        )
        for flag in options.secret_flags:
            log.warning(
                "secret_on_command_line",
                flag=flag,
                hint="any user of this machine can read it with ps: use a file or the environment",
            )
        if a2a is not None and options.a2a is not None:
            from synapse.a2a import AGENT_CARD_PATH

            log.info(
                "serving_a2a",
                url=a2a.url,
                card=a2a.url.removesuffix(a2a.path) + AGENT_CARD_PATH,
                default_task_type=options.a2a.default_task_type,
                push_allow=list(options.a2a.push_allow),
                principals=sorted(set(options.a2a.tokens.values())) or None,
                bindings=[i.protocol_binding for i in a2a.interfaces()],
                grpc=next((i.url for i in a2a.interfaces() if i.protocol_binding == "GRPC"), None),
                extensions=[
                    e.uri + (" (required)" if e.required else "") for e in options.a2a.extensions
                ]
                or None,
            )
            if anonymous_a2a(options.host, options.a2a):
                log.warning(
                    "a2a_anonymous",
                    host=options.host,
                    hint="any client that reaches this address may send tasks and read them: "
                    "give --a2a-token (or [a2a_security]), or listen on 127.0.0.1",
                )
        log_console(peer, options.ops, console_token)
        await stop.wait()
        log.info(
            "shutting_down",
            signal=received[0] if received else None,
            drain_timeout=options.config.drain_timeout,
            outbox_grace=options.config.outbox_grace,
        )
        if humans is not None:
            await humans.close()  # before the peer: no notification half-recorded
        graceful = await peer.shutdown(now=stop_now)
        if router is not None:
            await router.close()  # after the peer: routed tasks still cancel their partners
        if mcp_tools is not None:
            await mcp_tools.close()  # after the peer: its last tasks still call tools
        log.info("stopped", agent_id=options.agent_id, graceful=graceful)
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
            loop.remove_signal_handler(signum)
    return Exit.OK
