"""`synapse serve` and `synapse send` over mutual TLS, with a test CA (trustme), as processes.

The serve side requires client certificates of the CA; `send` presents the requester's
certificate, verifies the server against the CA, and serves its own callback endpoint over
https for the executor's callbacks.
"""

from __future__ import annotations

from pathlib import Path

import trustme
from clikit import EXECUTOR, REQUESTER, SECRET, error_lines, free_port, run, serve


def issue(ca: trustme.CA, directory: Path, name: str) -> tuple[str, str]:
    cert = ca.issue_cert("127.0.0.1", name, common_name=name)
    cert_file, key_file = directory / f"{name}.crt", directory / f"{name}.key"
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    return str(cert_file), str(key_file)


def test_serve_and_send_over_mutual_tls(tmp_path: Path) -> None:
    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    e_cert, e_key = issue(ca, tmp_path, EXECUTOR)
    r_cert, r_key = issue(ca, tmp_path, REQUESTER)
    (tmp_path / "secret").write_text(SECRET + "\n")
    requester_port = free_port()
    tls = ["--tls-ca", str(ca_file), "--tls-client-ca", str(ca_file)]
    with serve(
        "--agent-id",
        EXECUTOR,
        "--secret-file",
        str(tmp_path / "secret"),
        "--peer",
        f"{REQUESTER}=https://127.0.0.1:{requester_port}/synapse/callback",
        "--tls-cert",
        e_cert,
        "--tls-key",
        e_key,
        *tls,
    ) as server:
        assert "https://127.0.0.1:" in server.lines[0]
        target = f"https://127.0.0.1:{server.port}/synapse/callback"
        common = ["--target", target, "--agent-id", EXECUTOR, "--as", REQUESTER]
        common += ["--secret-file", str(tmp_path / "secret")]
        common += ["--listen", f"127.0.0.1:{requester_port}"]
        sent = run(
            "send", *common, "--tls-cert", r_cert, "--tls-key", r_key, *tls,
            "echo", '{"text": "mtls"}',
        )  # fmt: skip
        assert (sent.returncode, sent.stdout) == (0, "mtls\n"), sent.stderr
        # Without a client certificate the executor's TLS handshake refuses us.
        bare = run("ping", *common, "--tls-ca", str(ca_file))
        assert bare.returncode == 2
        assert error_lines(bare.stderr), bare.stderr


def test_bad_tls_settings_are_one_line(tmp_path: Path) -> None:
    result = run(
        "serve", "--agent-id", "e", "--port", "0", "--peer", "r=http://127.0.0.1:1/x",
        "--secret", "s" * 32, "--tls-cert", str(tmp_path / "none.crt"),
    )  # fmt: skip
    assert result.returncode == 2
    assert error_lines(result.stderr) == [
        "synapse: bad TLS settings: TLS needs both a certificate and its key "
        "(--tls-cert, --tls-key)"
    ]
