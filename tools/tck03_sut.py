"""A system under test for the official A2A TCK's 0.3 suite (its `0.3.x` branch): a Synapse
peer whose agent answers like the TCK's own 0.3 reference agent (a greeting, after about a
second of work reported as status updates), served over JSON-RPC and HTTP+JSON/REST, and
with `--grpc-port` over gRPC, which speak 0.3 beside 1.0.

Run by hand (the TCK is not a dependency of this repository):

    python tools/tck03_sut.py --port 9999 --grpc-port 10000 &
    cd a2a-tck && git checkout 0.3.x && ./run_tck.py --sut-url http://127.0.0.1:9999/a2a \\
        --category all --transports jsonrpc,rest,grpc

With `--auth-token T` the card declares a Bearer scheme and every call needs `T`: the run of
the TCK's authentication and security tests (its other tests send no credentials):

    SUT_URL=http://127.0.0.1:9999/a2a pytest tests/mandatory/authentication \\
        tests/mandatory/security tests/optional/capabilities/test_a2a_v030_authentication.py
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from tck_sut import members_card  # the 1.0 SUT's, beside this file

from synapse import ExecutionContext, Peer, TaskResult, Validation
from synapse.a2a import enable_a2a
from synapse.a2a.server.security import (
    HttpBearerScheme,
    JwksSource,
    JwtValidator,
    OAuth2Scheme,
    SecurityPolicy,
)
from synapse.p2p.config import P2PConfig
from synapse.transport.tls import TLSConfig


class GreetingHandler:
    """Greets, after working a little: long enough for the TCK to see and cancel a task
    (about a second, as the reference agent; `--work` sets it)."""

    def __init__(self, work_seconds: float) -> None:
        self.step_seconds = work_seconds / 2

    def get_capabilities(self) -> list[str]:
        return ["greeting"]

    def validate_task(self, task_type: str, payload: dict[str, Any]) -> Validation:
        return Validation()

    async def execute_task(
        self, ctx: ExecutionContext, task_type: str, payload: dict[str, Any]
    ) -> TaskResult:
        text = str(payload.get("text") or "")
        for step, percent in ((1, 40), (2, 80)):
            await asyncio.sleep(self.step_seconds)
            await ctx.progress(percent, f"working ({step}/2)")
        reply = (
            "Hello World! Nice to meet you!"
            if "hello" in text.lower()
            else (f"Hello World! You said: '{text}'. Thanks for your message!")
        )
        return TaskResult(output_type="text", output=reply)


async def main(
    port: int,
    work_seconds: float,
    grpc_port: int | None,
    extended: bool,
    auth_token: str | None,
    tls: tuple[str, str, str] | None,
    oauth2: bool,
) -> None:
    handler = GreetingHandler(work_seconds)
    # With TLS, the peer serves HTTPS under a name of the operator's (the TCK skips its
    # certificate tests for a host named like a test or a loopback address).
    endpoint = f"https://{tls[2]}:{port}/synapse/callback" if tls is not None else None
    peer = Peer(
        "tck03-sut",
        handler=handler,
        port=port,
        config=P2PConfig(),
        endpoint=endpoint,
        tls=TLSConfig(cert=tls[0], key=tls[1]) if tls is not None else None,
    )
    enable_a2a(
        peer,
        default_task_type="greeting",
        push_allowlist=["http://127.0.0.1", "http://localhost", "https://example.com/"],
        bindings=["JSONRPC", "HTTP+JSON", *(["GRPC"] if grpc_port is not None else [])],
        grpc_port=grpc_port,
        name="Synapse TCK 0.3 SUT",
        # The 0.3 TCK reads /.well-known/agent-card.json first: the 0.3 members there too.
        card_v03_members=True,
        # The 0.3 card then says supportsAuthenticatedExtendedCard, and the TCK's tests of
        # agent/getAuthenticatedExtendedCard run.
        extended_card=members_card if extended else None,
        # The TCK's authentication and security tests run against a card that declares a
        # scheme (Bearer here, enforced on every call); its other tests send no credentials
        # and are then refused, as they must be: a run of their own.
        tokens={auth_token: "tck"} if auth_token is not None and not oauth2 else None,
        security=_with_oauth2(auth_token, endpoint or f"http://127.0.0.1:{port}")
        if oauth2
        else None,
    )
    await peer.start()
    print(f"listening on http://127.0.0.1:{port}/a2a (A2A 1.0 and 0.3)", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await peer.close()


def _with_oauth2(auth_token: str | None, base: str) -> SecurityPolicy:
    """Bearer (`auth_token`) or OAuth 2.0 (JWTs of a key made for the run, which no test
    holds), either accepted, with the OAuth 2.0 scheme's metadata URL declared."""
    from joserfc.jwk import KeySet, RSAKey

    origin = base.split("/synapse/")[0]
    keys = KeySet([RSAKey.generate_key(2048, parameters={"kid": "tck-run"})])
    validator = JwtValidator(
        issuer=f"{origin}/issuer",
        audience=f"{origin}/a2a",
        jwks=JwksSource(keys=keys.as_dict(private=False)),
    )
    schemes: dict[str, Any] = {
        "oauth2": OAuth2Scheme(
            validator,
            token_url=f"{origin}/issuer/token",
            metadata_url=f"{origin}/issuer/.well-known/oauth-authorization-server",
        )
    }
    if auth_token is not None:
        schemes["bearer"] = HttpBearerScheme({auth_token: "tck"})
    return SecurityPolicy(schemes)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=9999)
    parser.add_argument(
        "--work",
        type=float,
        default=1.0,
        help="seconds each greeting works (the TCK sends follow-ups up to 3 s after a task "
        "starts: a task that ended by then refuses them)",
    )
    parser.add_argument("--grpc-port", type=int, default=None, help="also serve gRPC here")
    parser.add_argument(
        "--extended-card", action="store_true", help="serve an authenticated extended card"
    )
    parser.add_argument(
        "--auth-token",
        default=None,
        help="declare a Bearer scheme and require this token on every call (for the TCK's "
        "authentication tests, run on their own)",
    )
    parser.add_argument(
        "--tls",
        nargs=3,
        metavar=("CERT", "KEY", "HOST"),
        default=None,
        help="serve HTTPS with this certificate and key, under this host name",
    )
    parser.add_argument(
        "--oauth2",
        action="store_true",
        help="declare an OAuth 2.0 scheme (with its metadata URL) beside the Bearer one",
    )
    args = parser.parse_args()
    asyncio.run(
        main(
            args.port,
            args.work,
            args.grpc_port,
            args.extended_card,
            args.auth_token,
            tuple(args.tls) if args.tls else None,
            args.oauth2,
        )
    )
