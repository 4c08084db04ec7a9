"""Helpers of the security tests: a test CA (trustme), certificates per agent, free ports."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

import trustme

from benchmarks.ports import free_port as free_port  # re-exported
from synapse.transport.tls import TLSConfig

#: The audience the tests' issuer mints tokens for (our agent).
AUDIENCE = "https://agent.test/a2a"


@dataclass
class Pki:
    """A CA of the tests and the PEM files of its certificates, in `directory`."""

    ca: trustme.CA
    directory: Path

    @property
    def ca_file(self) -> Path:
        path = self.directory / "ca.pem"
        if not path.exists():
            self.ca.cert_pem.write_to_path(str(path))
        return path

    def issue(self, name: str, *identities: str) -> tuple[Path, Path]:
        """(cert, key) files for `name`: valid for 127.0.0.1 and `identities` (SANs)."""
        cert = self.ca.issue_cert("127.0.0.1", *identities, common_name=name)
        cert_file = self.directory / f"{name}.crt"
        key_file = self.directory / f"{name}.key"
        cert.cert_chain_pems[0].write_to_path(str(cert_file))
        for extra in cert.cert_chain_pems[1:]:
            extra.write_to_path(str(cert_file), append=True)
        cert.private_key_pem.write_to_path(str(key_file))
        return cert_file, key_file

    def crl(
        self, *revoked: Path, name: str = "crl.pem", expired: bool = False, age: float = 300
    ) -> Path:
        """A CRL of this CA (made and signed with `cryptography`) revoking the certificates
        in the `revoked` files; `expired`: its nextUpdate is in the past; `age`: seconds
        since its lastUpdate (of two current CRLs, the younger one is used)."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization

        ca_cert = x509.load_pem_x509_certificate(self.ca.cert_pem.bytes())
        ca_key = serialization.load_pem_private_key(self.ca.private_key_pem.bytes(), None)
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateRevocationListBuilder()
            .issuer_name(ca_cert.subject)
            .last_update(now - datetime.timedelta(days=2 if expired else 0, seconds=age))
            .next_update(now + datetime.timedelta(days=-1 if expired else 7))
        )
        for path in revoked:
            cert = x509.load_pem_x509_certificate(path.read_bytes())
            builder = builder.add_revoked_certificate(
                x509.RevokedCertificateBuilder()
                .serial_number(cert.serial_number)
                .revocation_date(now - datetime.timedelta(minutes=1))
                .build()
            )
        crl = builder.sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
        path = self.directory / name
        path.write_bytes(crl.public_bytes(serialization.Encoding.PEM))
        return path

    def peer_tls(self, agent_id: str, *, require_clients: bool = True) -> TLSConfig:
        """A peer's TLS: serves https with its own cert, requires client certs of this CA,
        verifies servers against this CA and presents the same cert as a client."""
        cert, key = self.issue(agent_id, agent_id)
        return TLSConfig(
            cert=cert,
            key=key,
            client_ca=self.ca_file if require_clients else None,
            ca=self.ca_file,
            client_cert=cert,
            client_key=key,
        )
