"""TLS and mutual TLS for the gRPC binding, from the same `TLSConfig` as everything else.

gRPC's TLS is its own (BoringSSL inside grpcio), not Python's `ssl`: the files of the
`TLSConfig` are read here into gRPC credentials.

- **server**: `cert` + `key`; with `client_ca`, every client must present a certificate of
  that CA (`require_client_auth`), or the handshake fails. grpcio has no CRL option: with
  `crl`, the binding checks the verified client certificate against `RevocationList` before
  any method runs (`why_revoked`), and refuses a revoked one (UNAUTHENTICATED).
- **client**: the server is verified against `ca` (else gRPC's default roots), and
  `client_cert` + `client_key` are presented. With `crl`, the certificate the server presents
  is checked first by Python's `ssl` (`VERIFY_CRL_CHECK_LEAF`) in a handshake of its own
  (`check_server_revocation`), since gRPC's client cannot show it to us.

Encrypted keys are decrypted in memory (`key_password`): gRPC takes unencrypted PEM only.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from pathlib import Path

import grpc

from synapse.transport.tls import TLSConfig


def _read(path: str | Path, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read {what} {path}: {exc}") from exc


def _private_key(path: str | Path, password: str | None, what: str) -> bytes:
    raw = _read(path, what)
    if password is None:
        return raw
    from cryptography.hazmat.primitives import serialization

    try:
        key = serialization.load_pem_private_key(raw, password.encode())
    except (ValueError, TypeError) as exc:
        raise ValueError(f"cannot load {what} {path}: {exc}") from exc
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def server_credentials(tls: TLSConfig) -> grpc.ServerCredentials | None:
    """The credentials of the gRPC port, or None when the peer serves no TLS."""
    if tls.cert is None or tls.key is None:
        return None
    pair = (_private_key(tls.key, tls.key_password, "--tls-key"), _read(tls.cert, "--tls-cert"))
    if tls.client_ca is None:
        return grpc.ssl_server_credentials([pair])
    return grpc.ssl_server_credentials(
        [pair],
        root_certificates=_read(tls.client_ca, "--tls-client-ca"),
        require_client_auth=True,
    )


def channel_credentials(tls: TLSConfig | None) -> grpc.ChannelCredentials:
    """The credentials of a TLS channel: our CA (or gRPC's roots), our client certificate."""
    if tls is None:
        return grpc.ssl_channel_credentials()
    root = _read(tls.ca, "--tls-ca") if tls.ca is not None else None
    if tls.client_cert is None or tls.client_key is None:
        return grpc.ssl_channel_credentials(root_certificates=root)
    return grpc.ssl_channel_credentials(
        root_certificates=root,
        private_key=_private_key(tls.client_key, tls.key_password, "--tls-client-key"),
        certificate_chain=_read(tls.client_cert, "--tls-client-cert"),
    )


async def check_server_revocation(host: str, port: int, tls: TLSConfig, timeout: float) -> None:
    """Refuse (`ssl.SSLError`) a server whose certificate the CRLs of `tls` revoke.

    A handshake of Python's `ssl` with `VERIFY_CRL_CHECK_LEAF` (the client context of `tls`),
    closed at once: gRPC's client gives no access to the certificate it verified."""
    context = tls.client_context()
    context.set_alpn_protocols(["h2"])
    _reader, writer = await asyncio.wait_for(
        asyncio.open_connection(host, port, ssl=context, server_hostname=host), timeout
    )
    writer.close()
    with contextlib.suppress(ConnectionError, ssl.SSLError):
        await writer.wait_closed()


__all__ = ["channel_credentials", "check_server_revocation", "server_credentials"]
